-- trioq schema: durable jobs (docs/durable.md). Runs with search_path set to the target
-- schema; names here are unqualified.
--
-- A durable job is an ordinary job whose handler records what it did: each `job.step(...)`
-- (its JSON result) and each `job.sleep(...)` (when it wakes) is a row of job_steps, written
-- fenced by the job's lease. A later run of the same job (a retry, a wake-up after a sleep,
-- a run after a crash) replays the handler from the top: a recorded step returns its
-- recorded result without running, so the job resumes where it left off. Positions are the
-- order the run called them in: a replay that calls something else at a recorded position
-- is refused (the handler changed under a job that had run it) rather than run wrong.
--
-- jobs.durable says a job has step records (set by the first one), so only such jobs pay for
-- the clean-up trigger below: a job without steps costs its DELETE a boolean test.
ALTER TABLE jobs ADD COLUMN durable boolean NOT NULL DEFAULT false;

CREATE TABLE job_steps (
    job_id      bigint      NOT NULL,
    position    integer     NOT NULL CHECK (position BETWEEN 0 AND 9999),
    name        text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    kind        text        NOT NULL
                            CHECK (kind IN ('step', 'sleep', 'wait', 'spawn', 'patch')),
    result      jsonb,
    attempt     integer     NOT NULL CHECK (attempt >= 0),
    recorded_at timestamptz NOT NULL,
    PRIMARY KEY (job_id, position),
    UNIQUE (job_id, name)
);

-- A durable job's steps go with it: when its row is deleted (completed, pruned after it
-- was kept or cancelled, deleted by hand), unless the same statement moved it to dead_jobs
-- (a dead job keeps its steps: `trioq dead retry` resumes it from them).
CREATE FUNCTION durable_job_deleted() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM dead_jobs d WHERE d.id = OLD.id) THEN
        DELETE FROM job_steps s WHERE s.job_id = OLD.id;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_durable_deleted
    AFTER DELETE ON jobs FOR EACH ROW WHEN (OLD.durable)
    EXECUTE FUNCTION durable_job_deleted();

-- Dead jobs purged or pruned: their steps go, unless the job is back in jobs (retried by
-- the same statement's transaction), which is marked durable again (the retry's insert does
-- not know the flag). One statement per purge, whatever its size.
CREATE FUNCTION durable_dead_deleted() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM job_steps s USING gone g
     WHERE s.job_id = g.id AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = g.id);
    UPDATE jobs j SET durable = true FROM gone g
     WHERE j.id = g.id AND NOT j.durable
       AND EXISTS (SELECT 1 FROM job_steps s WHERE s.job_id = g.id);
    RETURN NULL;
END
$$;

CREATE TRIGGER dead_jobs_durable_deleted
    AFTER DELETE ON dead_jobs REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
    EXECUTE FUNCTION durable_dead_deleted();
