-- trioq schema: cron entries stored in the database (docs/cron.md, "Entries in the
-- database"). Runs with search_path set to the target schema; names here are unqualified.
--
-- `trioq cron add` and `Queue.add_cron` write a row here (after `trioq.CronEntry` validated
-- it) and notify '@cron' on the schema's channel; every worker's scheduler reads the table at
-- start, on that notification, after its listener reconnects and every poll interval, and
-- schedules these entries with the ones of its code (`Config.cron`). Their ticks are claimed
-- once across processes in `cron_ticks`, as the code entries' are.
--
-- The checks refuse what SQL can judge: the names as trioq's rules (`trioq/_job.py`), the
-- priority and max_attempts ranges, the misfire policy, a positive grace, sizes, and times
-- Python can hold. What it cannot (a schedule croniter refuses, a zone Python does not know,
-- args over the worker's max_payload_bytes) the scheduler finds when it reads the row: that
-- entry is skipped and logged, the others run, and `trioq cron list` shows it as broken.
CREATE TABLE cron_entries (
    name          text        PRIMARY KEY
                  CHECK (name ~ '^[A-Za-z_][A-Za-z0-9_.:-]{0,199}$'),
    schedule      text        NOT NULL CHECK (length(schedule) BETWEEN 1 AND 1000),
    task          text        NOT NULL
                  CHECK (task ~ '^[A-Za-z_][A-Za-z0-9_.:-]{0,199}$'),
    args          jsonb       NOT NULL DEFAULT '{}'
                  CHECK (octet_length(args::text) <= 8388608),
    queue         text        NOT NULL DEFAULT 'default'
                  CHECK (queue ~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}$'),
    priority      integer     NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100),
    max_attempts  integer     CHECK (max_attempts BETWEEN 1 AND 10000),
    misfire       text        NOT NULL DEFAULT 'skip' CHECK (misfire IN ('skip', 'run_once')),
    misfire_grace interval    NOT NULL DEFAULT interval '1 minute'
                  CHECK (misfire_grace > interval '0' AND misfire_grace <= interval '100 years'),
    timezone      text        NOT NULL DEFAULT 'UTC' CHECK (length(timezone) BETWEEN 1 AND 200),
    enabled       boolean     NOT NULL DEFAULT true,
    created_at    timestamptz NOT NULL DEFAULT now()
                  CHECK (created_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00'),
    updated_at    timestamptz NOT NULL DEFAULT now()
                  CHECK (updated_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00')
);
