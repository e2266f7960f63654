-- trioq schema: a job that did not choose max_attempts gets its task's, resolved by the worker
-- that claims it (docs/tasks.md, "Settings the task declares"). Runs with search_path set to
-- the target schema; names here are unqualified.
--
-- Until this version every insert wrote a number: a producer that enqueued by name without
-- the registry (another service, a script, `trioq.enqueue(conn, "name")`) wrote the default
-- 25, and a task declared with max_attempts=2 ran 25 attempts (its `dead` hooks never fired).
-- Now such a row says so (max_attempts_unset) and still holds a number, 25 until a worker
-- claims it, so every reader (the sweeper, the dashboard, dead_jobs) reads what it always
-- read. The worker that claims it writes its task's max_attempts into the row, fenced by the
-- lease, before the handler runs; the flag stays, so the next claim (after a deploy that
-- changed the task) resolves it again.
--
-- Existing rows are left as they are (false: each keeps the number it holds); the column's
-- default stays false, so a row written by hand with a max_attempts keeps it.
ALTER TABLE jobs ADD COLUMN max_attempts_unset boolean NOT NULL DEFAULT false;

-- A batch's callback may leave it to its task too (NULL: not chosen).
ALTER TABLE batches ALTER COLUMN callback_max_attempts DROP NOT NULL;

-- The windowed unique insert of migration 6, with p_max_attempts NULL meaning "not chosen".
CREATE OR REPLACE FUNCTION enqueue_unique(
    p_key text, p_period interval, p_states text[], p_queue text, p_task text, p_args text,
    p_priority smallint, p_run_at timestamptz, p_delay interval, p_max_attempts integer,
    p_concurrency_key text, p_notify boolean, p_channel text)
RETURNS TABLE (id bigint, duplicate boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    t       timestamptz := coalesce(nullif(current_setting('trioq.now', true), '')::timestamptz,
                                    now());
    k       text := p_key;
    expires timestamptz := 'infinity';
    bucket  double precision;
    holder  bigint;
    st      text;
    due     timestamptz;
    new_id  bigint;
BEGIN
    IF p_period IS NOT NULL THEN
        bucket := floor(extract(epoch FROM t) / extract(epoch FROM p_period));
        k := p_key || '@' || bucket::bigint::text;
        expires := to_timestamp((bucket + 1) * extract(epoch FROM p_period));
    END IF;
    DELETE FROM unique_keys u
     WHERE u.ctid = ANY(ARRAY(SELECT x.ctid FROM unique_keys x WHERE x.expires_at <= t
                               LIMIT 20 FOR UPDATE SKIP LOCKED));
    INSERT INTO unique_keys (key, job_id, expires_at) VALUES (k, NULL, expires)
    ON CONFLICT (key) DO NOTHING;
    IF NOT FOUND THEN
        SELECT u.job_id INTO holder FROM unique_keys u WHERE u.key = k FOR UPDATE;
        SELECT j.state INTO st FROM jobs j WHERE j.id = holder;
        IF st IS NULL THEN
            st := CASE WHEN EXISTS (SELECT 1 FROM dead_jobs d WHERE d.id = holder)
                       THEN 'dead' ELSE 'done' END;
        END IF;
        IF holder IS NOT NULL AND st = ANY(p_states) THEN
            RETURN QUERY SELECT holder, true;
            RETURN;
        END IF;
    END IF;
    due := coalesce(p_run_at, t + p_delay);
    INSERT INTO jobs (queue, task, args, priority, run_at, state, max_attempts,
                      max_attempts_unset, dedup_key, concurrency_key)
    VALUES (p_queue, p_task, p_args::jsonb, p_priority, due,
            CASE WHEN due > t THEN 'scheduled' ELSE 'available' END,
            coalesce(p_max_attempts, 25), p_max_attempts IS NULL, k, p_concurrency_key)
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL
                              AND state IN ('scheduled', 'available', 'running') DO NOTHING
    RETURNING jobs.id INTO new_id;
    IF new_id IS NULL THEN
        SELECT j.id INTO holder FROM jobs j
         WHERE j.dedup_key = k AND j.state IN ('scheduled', 'available', 'running');
        RETURN QUERY SELECT holder, true;
        RETURN;
    END IF;
    UPDATE unique_keys u SET job_id = new_id, expires_at = expires WHERE u.key = k;
    IF p_notify THEN
        PERFORM pg_notify(p_channel, CASE WHEN due > t THEN '@scheduled' ELSE p_queue END);
    END IF;
    RETURN QUERY SELECT new_id, false;
END
$$;

-- The batch counting of migration 8, with a callback that may leave max_attempts to its task.
CREATE OR REPLACE FUNCTION batch_members_ended(p_batches bigint[], p_outcomes text[],
                                               p_channel text, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    b  batches%ROWTYPE;
    cb bigint;
BEGIN
    PERFORM 1 FROM batches x WHERE x.id = ANY(p_batches) ORDER BY x.id FOR UPDATE;
    FOR b IN
        WITH m AS (
            SELECT u.batch, count(*)::integer AS n,
                   (count(*) FILTER (WHERE u.outcome = 'done'))::integer AS ok,
                   (count(*) FILTER (WHERE u.outcome = 'dead'))::integer AS dead
              FROM unnest(p_batches, p_outcomes) AS u(batch, outcome)
             WHERE u.batch IS NOT NULL
             GROUP BY u.batch
        )
        UPDATE batches x
           SET pending = x.pending - m.n, succeeded = x.succeeded + m.ok,
               failed = x.failed + m.dead, cancelled = x.cancelled + m.n - m.ok - m.dead,
               finished_at = CASE WHEN x.pending - m.n <= 0 THEN p_now END
          FROM m
         WHERE x.id = m.batch AND x.pending > 0
        RETURNING x.*
    LOOP
        CONTINUE WHEN b.pending > 0;
        INSERT INTO jobs (queue, task, args, priority, run_at, state, max_attempts,
                          max_attempts_unset, concurrency_key)
        VALUES (b.callback_queue, b.callback_task,
                b.callback_args || jsonb_build_object('batch', jsonb_build_object(
                    'id', b.id, 'total', b.total, 'succeeded', b.succeeded,
                    'failed', b.failed, 'cancelled', b.cancelled)),
                b.callback_priority, p_now, 'available', coalesce(b.callback_max_attempts, 25),
                b.callback_max_attempts IS NULL, b.callback_concurrency_key)
        RETURNING id INTO cb;
        UPDATE batches SET callback_job_id = cb WHERE id = b.id;
        PERFORM pg_notify(p_channel, b.callback_queue);
    END LOOP;
END
$$;
