-- trioq schema: a job's completion in its handler's own transaction, sent in the round trip
-- of the COMMIT.
-- Runs with search_path set to the target schema; names here are unqualified.

-- Deletes running jobs under their leases (id, attempt, owner), as the completer's
-- complete statement does, but raises (SQLSTATE TQ001) unless every one of them was
-- still ours. `job.transaction()` sends it together with COMMIT (one simple query): when a
-- lease was lost meanwhile, the error aborts the transaction before the COMMIT runs, so
-- the handler's writes roll back with it. A plain DELETE there would let them commit.
-- search_path is pinned to this schema (then pg_catalog): the caller's is never used.
CREATE OR REPLACE FUNCTION complete_in_transaction(
    job_ids bigint[], job_attempts integer[], owner text
)
RETURNS integer LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    completed bigint[];
    lost bigint[];
BEGIN
    WITH done AS (
        DELETE FROM jobs j USING unnest(job_ids, job_attempts) AS f(id, attempt)
         WHERE j.id = f.id AND j.attempt = f.attempt AND j.lease_owner = owner
           AND j.state = 'running'
        RETURNING j.id
    )
    SELECT coalesce(array_agg(id), '{}') INTO completed FROM done;
    IF cardinality(completed) < cardinality(job_ids) THEN
        SELECT array_agg(id ORDER BY id) INTO lost
          FROM unnest(job_ids) AS id WHERE id <> ALL (completed);
        RAISE EXCEPTION 'trioq: lease lost: jobs %', lost
              USING ERRCODE = 'TQ001', DETAIL = array_to_string(lost, ',');
    END IF;
    RETURN cardinality(completed);
END
$$;
