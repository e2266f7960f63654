-- trioq schema: signals and waits of durable jobs (docs/durable.md, "Waiting for a signal").
-- Runs with search_path set to the target schema; names here are unqualified.
--
-- `trioq.signal(conn, job_id, "approval", payload)` inserts a row here in the sender's
-- transaction: one signal per job and name (a second is a duplicate, not stored). A job that
-- waits for that name (`job.wait_for("approval")`) and found no signal gave its slot and its
-- lease back in the same statement that looked (state scheduled, run_at its timeout,
-- waiting_for the name), under its row's lock; the signal locks that row too, so either the
-- wait sees the signal or the signal sees the wait and wakes the job (available now, its
-- queue notified). No signal is lost between the two.
CREATE TABLE job_signals (
    job_id  bigint      NOT NULL,
    name    text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    payload jsonb,
    sent_at timestamptz NOT NULL,
    PRIMARY KEY (job_id, name)
);

-- The signal a parked job waits for (NULL: none).
ALTER TABLE jobs ADD COLUMN waiting_for text;

-- A durable job's signals go with its steps (a signal marks its job durable).
CREATE OR REPLACE FUNCTION durable_job_deleted() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM dead_jobs d WHERE d.id = OLD.id) THEN
        DELETE FROM job_steps s WHERE s.job_id = OLD.id;
        DELETE FROM job_signals s WHERE s.job_id = OLD.id;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION durable_dead_deleted() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM job_steps s USING gone g
     WHERE s.job_id = g.id AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = g.id);
    DELETE FROM job_signals s USING gone g
     WHERE s.job_id = g.id AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = g.id);
    UPDATE jobs j SET durable = true FROM gone g
     WHERE j.id = g.id AND NOT j.durable
       AND (EXISTS (SELECT 1 FROM job_steps s WHERE s.job_id = g.id)
            OR EXISTS (SELECT 1 FROM job_signals s WHERE s.job_id = g.id));
    RETURN NULL;
END
$$;

-- A child a durable job spawned (`job.spawn`): its parent, told when it ends.
ALTER TABLE jobs ADD COLUMN parent_id bigint;

-- A child ended: its parent gets the signal 'job <id>' (what became of it, and its kept
-- result), in the transaction that ended it, and is woken if it waits for it
-- (`job.wait_for_job`). The outcome is read as job_ended reads it (migration 8): moved to
-- dead_jobs by the same statement, completed (deleted while running), kept as done,
-- cancelled, or deleted by hand.
CREATE FUNCTION child_ended() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    child   jobs%ROWTYPE;
    payload jsonb;
    d       record;
    parent  record;
    t       timestamptz := coalesce(nullif(current_setting('trioq.now', true), '')::timestamptz,
                                    now());
BEGIN
    IF TG_OP = 'UPDATE' THEN
        child := NEW;
        payload := jsonb_build_object('state', NEW.state, 'result', NEW.result);
    ELSE
        child := OLD;
        IF OLD.state IN ('done', 'cancelled') THEN
            RETURN NULL;  -- pruned after it ended: its parent was told then
        END IF;
        SELECT x.reason, x.last_error INTO d FROM dead_jobs x WHERE x.id = OLD.id;
        IF FOUND THEN
            payload := jsonb_build_object('state', 'dead', 'reason', d.reason,
                                          'error', d.last_error);
        ELSIF OLD.state = 'running' THEN
            payload := jsonb_build_object('state', 'done', 'result', NULL);
        ELSE
            payload := jsonb_build_object('state', 'deleted');
        END IF;
    END IF;
    INSERT INTO job_signals (job_id, name, payload, sent_at)
    SELECT p.id, 'job ' || child.id, payload, t FROM jobs p WHERE p.id = child.parent_id
    ON CONFLICT (job_id, name) DO NOTHING;
    UPDATE jobs p SET state = 'available', run_at = t, waiting_for = NULL
     WHERE p.id = child.parent_id AND p.state = 'scheduled'
       AND p.waiting_for = 'job ' || child.id
    RETURNING p.queue INTO parent;
    IF FOUND THEN
        PERFORM pg_notify('trioq_' || TG_TABLE_SCHEMA, parent.queue);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_child_ended_update
    AFTER UPDATE ON jobs FOR EACH ROW
    WHEN (NEW.parent_id IS NOT NULL AND NEW.state IN ('done', 'cancelled')
          AND OLD.state NOT IN ('done', 'cancelled'))
    EXECUTE FUNCTION child_ended();

CREATE TRIGGER jobs_child_ended_delete
    AFTER DELETE ON jobs FOR EACH ROW WHEN (OLD.parent_id IS NOT NULL)
    EXECUTE FUNCTION child_ended();

-- Durable jobs parked (sleeping, waiting for a signal, or backing off before a retry): the
-- metrics count them per queue and kind by this index alone (it holds nothing else, so with
-- none parked the count reads nothing).
CREATE INDEX jobs_parked_idx ON jobs (queue) INCLUDE (waiting_for)
    WHERE durable AND state = 'scheduled';
