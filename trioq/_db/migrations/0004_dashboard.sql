-- trioq schema: indexes the dashboard's lists need to stay cheap on big tables (`trioq web`).
-- Self-contained: indexes on the tables of version 1 only, so it applies after any other
-- migration.

-- Kept results and cancelled jobs, newest first (`state = 'done' ORDER BY finished_at DESC`).
-- Partial: rows enter it once, when they finish; the claim, heartbeat and completion of
-- jobs that are deleted never touch it.
CREATE INDEX jobs_finished_idx ON jobs (state, finished_at)
    WHERE state IN ('done', 'cancelled');

-- Dead jobs, newest first, across queues (dead_jobs_queue_idx serves one queue), and of one
-- task: so a filter on either finds its rows without reading the others. dead_jobs is
-- written once per death, so its indexes cost the hot path nothing.
CREATE INDEX dead_jobs_died_idx ON dead_jobs (died_at);
CREATE INDEX dead_jobs_task_idx ON dead_jobs (task, died_at);
