-- trioq schema: the error of a fenced completion in a handler's transaction, for the
-- completion job.transaction() now sends as plain SQL.
-- Runs with search_path set to the target schema; names here are unqualified.

-- Migration 9's complete_in_transaction deletes the jobs and raises when a lease was lost.
-- Calling a PL/pgSQL function (with a pinned search_path) on every completion cost the
-- server about 50 us per job (docs/transactions.md). The completion is now one statement:
-- a DELETE under the leases in a CTE, and this function, called only when fewer jobs were
-- deleted than asked for, raises the same error (SQLSTATE TQ001, DETAIL: the lost ids in
-- order), so the COMMIT sent after it in the same query string does not run.
-- complete_in_transaction stays for workers of the previous version.
CREATE FUNCTION lease_lost(job_ids bigint[], completed bigint[])
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    lost bigint[];
BEGIN
    SELECT array_agg(id ORDER BY id) INTO lost
      FROM unnest(job_ids) AS id WHERE id <> ALL (coalesce(completed, '{}'));
    RAISE EXCEPTION 'trioq: lease lost: jobs %', lost
          USING ERRCODE = 'TQ001', DETAIL = coalesce(array_to_string(lost, ','), '');
END
$$;
