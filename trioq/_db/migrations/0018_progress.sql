-- trioq schema: a running job's progress (docs/progress.md). Runs with search_path set to the
-- target schema; names here are unqualified.
--
-- `await job.progress(value)` in a handler records any JSON value; the worker writes the
-- latest one to the job's own row at most once per job per `Config.progress_interval`,
-- fenced by the lease like every write after the claim (`trioq._worker.services.progress`).
-- A retry keeps the last progress of the attempt before until it writes its own; a kept
-- result keeps it; a job that dies takes it to dead_jobs (the trigger below), so the last
-- thing a dead job said is on its page.
--
-- The checks refuse what no reader should have to read: a value that takes more than 8 MiB
-- where it is stored (the worker refuses more than `Config.max_progress_bytes` of JSON, at
-- most 1 MiB, long before), and a time Python cannot hold. They cost a row without progress
-- a NULL test, and one with progress the size of a stored value (read from its header).
ALTER TABLE jobs
    ADD COLUMN progress jsonb
        CONSTRAINT jobs_progress_check
        CHECK (progress IS NULL OR pg_catalog.pg_column_size(progress) <= 8388608),
    ADD COLUMN progress_at timestamptz
        CONSTRAINT jobs_progress_at_check
        CHECK (progress_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00');

ALTER TABLE dead_jobs
    ADD COLUMN progress jsonb
        CONSTRAINT dead_jobs_progress_check
        CHECK (progress IS NULL OR pg_catalog.pg_column_size(progress) <= 8388608),
    ADD COLUMN progress_at timestamptz
        CONSTRAINT dead_jobs_progress_at_check
        CHECK (progress_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00');

-- A job with progress that goes to dead_jobs takes it along, whichever statement moves it
-- (a failure, the sweeper, the unknown-task timeout, the stranded sweep, the SQL API): they
-- delete the jobs row and insert the dead one in one statement, and this row trigger fires
-- at the end of that statement, when the dead row is there. Only rows with progress pay for
-- it: for the others the WHEN clause is a NULL test.
CREATE FUNCTION progress_to_dead() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    UPDATE dead_jobs d SET progress = OLD.progress, progress_at = OLD.progress_at
     WHERE d.id = OLD.id AND d.progress IS NULL;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_progress_to_dead
    AFTER DELETE ON jobs FOR EACH ROW WHEN (OLD.progress IS NOT NULL)
    EXECUTE FUNCTION progress_to_dead();
