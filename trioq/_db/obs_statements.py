"""The statements of the observability surface, composed once per schema (as
`trioq._db.statements`).

They live here rather than in `trioq._db.statements` because only the metrics, the lifecycle events
and the operator CLI run them, and because they follow the dashboard's rule
(``trioq.web._statements``): **each one has a bounded cost on a table of any size**.
``tests/test_explain.py`` explains the depth sample on a million-row backlog.

- the depth sample (`DEPTH_CAP`): per queue and state, a count that is exact up to the cap
  (a ``LIMIT`` inside an index scan), probing each queue once through the indexes that lead
  with it (the claim index, ``dead_jobs_queue_idx``), the scheduled jobs through their own
  index up to the cap, the running ones through the lease index, the waiting ones through
  their partial index (`read_depths` runs them: the metrics and ``trioq status``);
- the details of jobs a sweep killed or cancelled, by id (primary keys);
- the CLI's job list: at most `LIST_WINDOW` rows of one index, in its order, then filtered.
"""

from __future__ import annotations

import functools

import attrs
from psycopg import sql

from .statements import NOW, qualified, validate_schema_name

__all__ = [
    "DEPTH_CAP",
    "LIST_STATES",
    "LIST_WINDOW",
    "MAX_QUEUES",
    "ObsStatements",
    "obs_statements",
]

#: Counts per queue and state are exact up to this (``Config.metrics_depth_cap``), and show
#: as this above it. Each count reads up to this many entries of an index in its order (and,
#: where the visibility map is not set, as many heap rows): a sample costs about 1 us per
#: row read, min(backlog, cap x queues) rows; see docs/observability.md#queue-depth.
DEPTH_CAP = 1_000
#: Queues the depth sample reports at most.
MAX_QUEUES = 500

# Queues with available jobs (one probe of the claim index per queue), each with its capped
# count and the age of the job at its head (the next to be claimed). The counts read the
# index in its own order: an index(-only) scan that stops at the cap (without the ORDER BY
# the planner prefers a bitmap scan, which reads the queue's whole range first).
_DEPTH_AVAILABLE = """
WITH RECURSIVE q(queue) AS (
    (SELECT queue FROM {jobs} WHERE state = 'available' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {jobs} j
             WHERE j.state = 'available' AND j.queue > q.queue ORDER BY j.queue LIMIT 1)
      FROM q WHERE q.queue IS NOT NULL
)
SELECT q.queue,
       (SELECT pg_catalog.count(*) FROM (SELECT 1 FROM {jobs} j
                               WHERE j.queue = q.queue AND j.state = 'available'
                               ORDER BY j.queue, j.priority, j.run_at, j.id LIMIT %(cap)s) AS c),
       extract(epoch FROM {now} - (SELECT pg_catalog.min(j.run_at) FROM (
           SELECT run_at FROM {jobs} j
            WHERE j.queue = q.queue AND j.state = 'available'
            ORDER BY j.priority, j.run_at, j.id LIMIT 1) AS j))
  FROM q WHERE q.queue IS NOT NULL
 LIMIT %(max_queues)s
"""

# Queues with dead jobs, each with its capped count.
_DEPTH_DEAD = """
WITH RECURSIVE q(queue) AS (
    (SELECT queue FROM {dead} ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT d.queue FROM {dead} d WHERE d.queue > q.queue ORDER BY d.queue LIMIT 1)
      FROM q WHERE q.queue IS NOT NULL
)
SELECT q.queue,
       (SELECT pg_catalog.count(*) FROM (SELECT 1 FROM {dead} d WHERE d.queue = q.queue
                               ORDER BY d.queue, d.died_at LIMIT %(cap)s) AS c)
  FROM q WHERE q.queue IS NOT NULL
 LIMIT %(max_queues)s
"""

# Scheduled jobs among the next `cap` due, per queue; running jobs per queue (the lease index:
# as many rows as jobs are running, which the fleet's slots bound, at most `cap`).
_DEPTH_SCHEDULED_RUNNING = """
SELECT 'scheduled', queue, pg_catalog.count(*) FROM (
    SELECT queue FROM {jobs} WHERE state = 'scheduled' ORDER BY run_at LIMIT %(cap)s
) AS s GROUP BY queue
UNION ALL
SELECT 'running', queue, pg_catalog.count(*) FROM (
    SELECT queue FROM {jobs}
     WHERE lease_expires_at IS NOT NULL AND state = 'running'
     ORDER BY lease_expires_at LIMIT %(cap)s
) AS r GROUP BY queue
"""

# Jobs waiting for their dependencies, per queue, among the first `cap` of them (the partial
# index of migration 10: it holds waiting jobs only, so with none the count reads nothing).
_DEPTH_WAITING = """
SELECT queue, pg_catalog.count(*) FROM (
    SELECT queue FROM {jobs} WHERE state = 'waiting' ORDER BY queue LIMIT %(cap)s
) AS w GROUP BY queue
"""

# `trioq status --watch`: per queue, the outcomes of the last `minutes` minutes (the job
# history's rows of those minutes: its primary key leads with the minute).
_RECENT_RATES = """
SELECT queue, pg_catalog.sum(completed)::int8, pg_catalog.sum(retried)::int8,
       pg_catalog.sum(dead)::int8
  FROM {history}
 WHERE minute >= pg_catalog.date_trunc('minute', {now}) - %(minutes)s * interval '1 minute'
 GROUP BY queue ORDER BY queue
"""

# `trioq cron list`: each entry's latest fired tick.
_CRON_LAST = """
SELECT DISTINCT ON (name) name, tick, job_id, fired_at FROM {ticks} ORDER BY name, tick DESC
"""

# What a sweep (of this process) killed or cancelled: the jobs' details, for their events.
_SWEPT_DETAILS = """
SELECT d.id, 'dead', d.queue, d.task, d.attempt, d.args::text, d.reason, d.last_error
  FROM {dead} d WHERE d.id = ANY(%(dead)s::int8[])
UNION ALL
SELECT j.id, 'cancelled', j.queue, j.task, j.attempt, j.args::text, NULL, j.last_error
  FROM {jobs} j WHERE j.id = ANY(%(cancelled)s::int8[]) AND j.state = 'cancelled'
"""

# `trioq jobs list`: one state's jobs, read through the index that serves that state in its
# order (at most `window` rows of it), filtered by queue and task, the first `limit` shown.
# The columns: id, queue, task, state, priority, attempt, max_attempts, run_at, enqueued_at,
# lease_owner, when it ended (finished_at, died_at), the first 200 characters of its error.
_LIST_COLUMNS = (
    "id, queue, task, state, priority, attempt, max_attempts, run_at, enqueued_at, "
    "lease_owner, finished_at, left(last_error, 200)"
)
_LIST_FILTERS = """
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task = %(task)s)
"""
_LISTS = {
    # the next to be claimed first (the claim index)
    "available": """
SELECT {columns} FROM (
    SELECT * FROM {jobs}
     WHERE state = 'available' AND (%(queue)s::text IS NULL OR queue = %(queue)s)
     ORDER BY queue, priority, run_at, id LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY queue, priority, run_at, id LIMIT %(limit)s
""",
    # the next due first
    "scheduled": """
SELECT {columns} FROM (
    SELECT * FROM {jobs} WHERE state = 'scheduled' ORDER BY run_at LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY run_at, id LIMIT %(limit)s
""",
    # the nearest lease expiry first
    "running": """
SELECT {columns} FROM (
    SELECT * FROM {jobs} WHERE lease_expires_at IS NOT NULL AND state = 'running'
     ORDER BY lease_expires_at LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY lease_expires_at, id LIMIT %(limit)s
""",
    # the most recent first
    "done": """
SELECT {columns} FROM (
    SELECT * FROM {jobs} WHERE state = 'done' ORDER BY finished_at DESC LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY finished_at DESC, id DESC LIMIT %(limit)s
""",
    "cancelled": """
SELECT {columns} FROM (
    SELECT * FROM {jobs} WHERE state = 'cancelled' ORDER BY finished_at DESC LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY finished_at DESC, id DESC LIMIT %(limit)s
""",
    "dead": """
SELECT id, queue, task, 'dead', priority, attempt, max_attempts, NULL::timestamptz,
       enqueued_at, NULL::text, died_at, left(last_error, 200) FROM (
    SELECT * FROM {dead}
     WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
     ORDER BY died_at DESC LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY died_at DESC, id DESC LIMIT %(limit)s
""",
}

#: The states `trioq jobs list --state` takes, in the order the help lists them.
LIST_STATES = tuple(_LISTS)
#: Rows of one index a job list reads at most before filtering.
LIST_WINDOW = 10_000


@attrs.frozen
class ObsStatements:
    schema: str
    depth_available: sql.Composed
    depth_dead: sql.Composed
    depth_scheduled_running: sql.Composed
    depth_waiting: sql.Composed
    swept_details: sql.Composed
    recent_rates: sql.Composed
    cron_last: sql.Composed
    clock: sql.Composed
    lists: dict[str, sql.Composed]  # `trioq jobs list`, by state


@functools.cache
def obs_statements(schema: str) -> ObsStatements:
    names = {
        "jobs": qualified(schema, "jobs"),
        "dead": qualified(schema, "dead_jobs"),
        "history": qualified(schema, "job_history"),
        "ticks": qualified(schema, "cron_ticks"),
        "now": sql.SQL(NOW),
        "columns": sql.SQL(_LIST_COLUMNS),
        "filters": sql.SQL(_LIST_FILTERS),
    }

    def compose(text: str) -> sql.Composed:
        return sql.SQL(text.strip()).format(**names)

    return ObsStatements(
        schema=validate_schema_name(schema),
        depth_available=compose(_DEPTH_AVAILABLE),
        depth_dead=compose(_DEPTH_DEAD),
        depth_scheduled_running=compose(_DEPTH_SCHEDULED_RUNNING),
        depth_waiting=compose(_DEPTH_WAITING),
        swept_details=compose(_SWEPT_DETAILS),
        recent_rates=compose(_RECENT_RATES),
        cron_last=compose(_CRON_LAST),
        clock=compose("SELECT {now}"),
        lists={state: compose(text) for state, text in _LISTS.items()},
    )
