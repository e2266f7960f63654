-- trioq schema: sequences, strict FIFO per key (docs/flow-control.md, "Sequences"). Runs
-- with search_path set to the target schema; names here are unqualified.
--
-- A job with a `sequence_key` runs only once every earlier job of its key has finished: it
-- is inserted `waiting` while its key has an unfinished job (waiting, scheduled, available
-- or running: a job retrying or snoozed is unfinished), and the earliest waiting job of the
-- key (by id: enqueue order) is freed when the key has no other unfinished job. A job leaves
-- the unfinished set when it completes, dies (moved to dead_jobs), is cancelled or deleted;
-- triggers free the next in the same transaction, so every path does it, producers in any
-- language and rows written by hand included. The claims never see a waiting job: they do
-- not change.
ALTER TABLE jobs ADD COLUMN sequence_key text
    CONSTRAINT jobs_sequence_key_check CHECK (length(sequence_key) BETWEEN 1 AND 500);

-- A waiting job waits for dependencies, or for the earlier jobs of its sequence.
ALTER TABLE jobs DROP CONSTRAINT jobs_dependencies_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_dependencies_check
    CHECK (state <> 'waiting' OR sequence_key IS NOT NULL
           OR (dependencies_left IS NOT NULL AND dependencies_left >= 1
               AND dependency_policy IS NOT NULL));

-- The unfinished jobs of each key, in enqueue order: the enqueue's "is one unfinished?" and
-- the next to free are one probe each. Jobs without a key are not in it.
CREATE INDEX jobs_sequence_idx ON jobs (sequence_key, id)
    WHERE sequence_key IS NOT NULL AND state IN ('waiting', 'scheduled', 'available', 'running');

-- One row per key with unfinished jobs: the lock that puts an enqueue and the freeing of the
-- next job of one key one after the other (INSERT ... ON CONFLICT DO UPDATE waits for the
-- other in READ COMMITTED, and fails to serialize in REPEATABLE READ, where the other's job
-- would be invisible). It holds no count: a TRUNCATE of jobs cannot leave it wrong. The
-- freeing deletes it once its key has nothing unfinished.
CREATE TABLE sequences (
    key     text        PRIMARY KEY,
    used_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION sequence_enqueued() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO sequences AS s (key) VALUES (NEW.sequence_key)
    ON CONFLICT (key) DO UPDATE SET used_at = now();
    IF NEW.state IN ('scheduled', 'available')
       AND EXISTS (SELECT FROM jobs j
                    WHERE j.sequence_key = NEW.sequence_key
                      AND j.state IN ('waiting', 'scheduled', 'available', 'running')) THEN
        NEW.state := 'waiting';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_sequence_enqueued BEFORE INSERT ON jobs
    FOR EACH ROW WHEN (NEW.sequence_key IS NOT NULL)
    EXECUTE FUNCTION sequence_enqueued();

-- A job of a sequence finished (or left by hand): if its key has no other unfinished job
-- that is not waiting, free the earliest waiting one (scheduled if its run_at is ahead, else
-- available, and its queue's workers told). Called for a waiting job too (a cancel): then
-- the head is still there and nothing is freed.
CREATE FUNCTION sequence_advance(p_key text, p_channel text) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    t      timestamptz := coalesce(nullif(current_setting('trioq.now', true), '')::timestamptz,
                                   now());
    freed  record;
BEGIN
    PERFORM 1 FROM sequences s WHERE s.key = p_key FOR UPDATE;
    IF EXISTS (SELECT FROM jobs j
                WHERE j.sequence_key = p_key
                  AND j.state IN ('scheduled', 'available', 'running')) THEN
        RETURN;  -- the key's head is still unfinished
    END IF;
    UPDATE jobs j
       SET state = CASE WHEN j.run_at > t THEN 'scheduled' ELSE 'available' END
     WHERE j.id = (SELECT w.id FROM jobs w
                    WHERE w.sequence_key = p_key AND w.state = 'waiting'
                    ORDER BY w.id LIMIT 1
                      FOR UPDATE)
    RETURNING j.queue, j.state INTO freed;
    IF FOUND THEN
        PERFORM pg_notify(p_channel, CASE WHEN freed.state = 'scheduled' THEN '@scheduled'
                                          ELSE freed.queue END);
    ELSE
        DELETE FROM sequences s WHERE s.key = p_key;  -- nothing unfinished is left
    END IF;
END
$$;

CREATE FUNCTION sequence_job_ended() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM sequence_advance(OLD.sequence_key, 'trioq_' || TG_TABLE_SCHEMA);
    ELSE
        PERFORM sequence_advance(NEW.sequence_key, 'trioq_' || TG_TABLE_SCHEMA);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_sequence_ended_update AFTER UPDATE OF state ON jobs
    FOR EACH ROW
    WHEN (NEW.sequence_key IS NOT NULL
          AND OLD.state IN ('waiting', 'scheduled', 'available', 'running')
          AND NEW.state NOT IN ('waiting', 'scheduled', 'available', 'running'))
    EXECUTE FUNCTION sequence_job_ended();

CREATE TRIGGER jobs_sequence_ended_delete AFTER DELETE ON jobs
    FOR EACH ROW
    WHEN (OLD.sequence_key IS NOT NULL
          AND OLD.state IN ('waiting', 'scheduled', 'available', 'running'))
    EXECUTE FUNCTION sequence_job_ended();
