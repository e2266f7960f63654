-- trioq schema: results (waiting for a job's end) and retention (pruning finished rows).
-- Runs with search_path set to the target schema; names here are unqualified.
-- It adds a column, a function and two triggers.

-- Set by `trioq.result()` on a job someone waits for (and only then): when such a job
-- ends, the triggers below notify `trioq_<schema>` with the payload '@finished:<id>'.
-- A job nobody waits for never notifies: its transactions keep committing in groups.
ALTER TABLE jobs ADD COLUMN notify_finished boolean NOT NULL DEFAULT false;

CREATE FUNCTION notify_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('trioq_' || TG_TABLE_SCHEMA, '@finished:' || OLD.id);
    RETURN NULL;
END
$$;

-- Kept as done, or cancelled. The WHEN clause is evaluated per row without calling the
-- function, so an unflagged row costs a boolean test.
CREATE TRIGGER jobs_finished_notify
    AFTER UPDATE ON jobs FOR EACH ROW
    WHEN (NEW.notify_finished AND NEW.state IN ('done', 'cancelled'))
    EXECUTE FUNCTION notify_finished();

-- Completed without keep_result (the row is deleted), or dead (moved to dead_jobs in the
-- same statement). Deleting a finished row (the pruner) does not notify.
CREATE TRIGGER jobs_deleted_notify
    AFTER DELETE ON jobs FOR EACH ROW
    WHEN (OLD.notify_finished AND OLD.state NOT IN ('done', 'cancelled'))
    EXECUTE FUNCTION notify_finished();

-- The pruner's indexes, jobs_finished_idx (kept done and cancelled rows by finished_at)
-- and dead_jobs_died_idx, came with version 4 (the dashboard needs them too).
