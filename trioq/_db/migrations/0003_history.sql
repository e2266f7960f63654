-- trioq schema: per-minute job history, for charts (`trioq web`).
-- Finished jobs are deleted, so each worker process aggregates the outcomes it writes
-- (trioq/_history.py) and upserts them here every few seconds (trioq/_history_writer.py),
-- which also prunes rows older than Config.history_retention (default 7 days).
-- Self-contained: it names only its own table, so it applies after any other migration.

CREATE TABLE job_history (
    minute      timestamptz NOT NULL,          -- the UTC minute the runs ended in
    queue       text        NOT NULL,
    task        text        NOT NULL,
    completed   bigint      NOT NULL DEFAULT 0,
    retried     bigint      NOT NULL DEFAULT 0, -- failed attempts that will run again
    dead        bigint      NOT NULL DEFAULT 0,
    cancelled   bigint      NOT NULL DEFAULT 0,
    runs        bigint      NOT NULL DEFAULT 0, -- runs timed below (their handler ran)
    -- execution time (handler start to return) and queue wait (due to start), in µs
    exec_us_sum bigint      NOT NULL DEFAULT 0,
    exec_us_max bigint      NOT NULL DEFAULT 0,
    wait_us_sum bigint      NOT NULL DEFAULT 0,
    wait_us_max bigint      NOT NULL DEFAULT 0,
    -- 24 log buckets: 0 below 1 ms, i from 2^(i-1) to 2^i ms, the last one open-ended
    exec_hist   bigint[]    NOT NULL CHECK (cardinality(exec_hist) = 24),
    wait_hist   bigint[]    NOT NULL CHECK (cardinality(wait_hist) = 24),
    PRIMARY KEY (minute, queue, task)
);
