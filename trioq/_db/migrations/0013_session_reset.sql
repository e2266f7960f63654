-- trioq schema: the app pool's session reset in one call (docs/transactions.md, "The
-- session a handler gets"). Runs with search_path set to the target schema; names here are
-- unqualified.
--
-- Every connection the worker's app pool lends a handler is reset first: what DISCARD ALL
-- undoes but the prepared statements (which psycopg keeps for the connection and which
-- carry nothing of a user's), and the session's trioq.now unset. Sent as seven commands,
-- each with a result for the client to read, the reset cost 48 µs of worker CPU per job on
-- the one-row job.transaction() path, a fifth of its rate. Now the role and RESET ALL are
-- commands of their own before this call (trioq/_db/sql/jobs.py says why), and the rest is
-- this function: one result.
--
-- No SET clause: a function's SET restores its setting when the function returns. Every
-- call is qualified (the caller's search_path is its own). CLOSE ALL skips the portal
-- running this call (it is active).
CREATE FUNCTION reset_session() RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    EXECUTE 'CLOSE ALL';
    EXECUTE 'UNLISTEN *';
    PERFORM pg_catalog.pg_advisory_unlock_all();
    EXECUTE 'DISCARD TEMP';
    EXECUTE 'DISCARD SEQUENCES';
    PERFORM pg_catalog.set_config('trioq.now', '', false);
END
$$;
