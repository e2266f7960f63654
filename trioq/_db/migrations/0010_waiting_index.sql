-- trioq schema: a partial index of the jobs waiting for their dependencies, by queue and id.
-- Runs with search_path set to the target schema; names here are unqualified.
-- `trioq status` and the metrics' depth sample count waiting jobs per queue up to a cap
-- (docs/cli.md#trioq-status): without this index a capped count of a state with no rows
-- reads the whole table; and the dashboard lists them from it, in (queue, id) order. It holds
-- only waiting jobs, so a queue without workflows pays nothing for it (an insert of a job
-- that does not wait touches no entry).
CREATE INDEX jobs_waiting_idx ON jobs (queue, id) WHERE state = 'waiting';
