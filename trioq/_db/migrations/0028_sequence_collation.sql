-- trioq schema: sequence_advance (migration 26) reads its key with the column's collation, so
-- that its probes use their indexes. Runs with search_path set to the target schema; names
-- here are unqualified.
--
-- A plpgsql parameter takes the collation the call derives from all its arguments: the
-- triggers call sequence_advance(OLD.sequence_key, 'trioq_' || TG_TABLE_SCHEMA), and
-- TG_TABLE_SCHEMA is a `name`, collation "C", which wins over the key's implicit default.
-- p_key was then COLLATE "C", and every `= p_key` (sequences' primary key, the probe of an
-- unfinished head) could not use an index built with the default collation: a scan of the
-- whole table at each finish of a sequence's job (2.3 ms a completion with 10,000 keyed
-- jobs, and growing with the table). A local variable of type text has the type's default
-- collation: the statements compare with it. The body is otherwise migration 26's.
CREATE OR REPLACE FUNCTION sequence_advance(p_key text, p_channel text) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    t      timestamptz := coalesce(nullif(current_setting('trioq.now', true), '')::timestamptz,
                                   now());
    k      text COLLATE "default" := p_key;  -- the columns' collation (above)
    freed  record;
BEGIN
    PERFORM 1 FROM sequences s WHERE s.key = k FOR UPDATE;
    IF EXISTS (SELECT FROM jobs j
                WHERE j.sequence_key = k
                  AND j.state IN ('scheduled', 'available', 'running')) THEN
        RETURN;  -- the key's head is still unfinished
    END IF;
    UPDATE jobs j
       SET state = CASE WHEN j.run_at > t THEN 'scheduled' ELSE 'available' END
     WHERE j.id = (SELECT w.id FROM jobs w
                    WHERE w.sequence_key = k AND w.state = 'waiting'
                    ORDER BY w.id LIMIT 1
                      FOR UPDATE)
    RETURNING j.queue, j.state INTO freed;
    IF FOUND THEN
        PERFORM pg_notify(p_channel, CASE WHEN freed.state = 'scheduled' THEN '@scheduled'
                                          ELSE freed.queue END);
    ELSE
        DELETE FROM sequences s WHERE s.key = k;  -- nothing unfinished is left
    END IF;
END
$$;
