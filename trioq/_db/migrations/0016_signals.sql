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
