"""Every statement the dashboard runs, composed once per schema (as `trioq._db.statements` does).

They live here rather than in `trioq._db.statements` because only the dashboard runs them, and
because they follow one rule of their own: **each one has a bounded cost on a table of
any size**. ``tests/test_web_explain.py`` explains every statement below, with every
filter combination the pages send, on a table of a million jobs and a million dead
jobs, and fails on a sequential scan of ``jobs`` or ``dead_jobs``. How:

- counts are exact up to a cap (`COUNT_CAP`) and say "cap+" above it: a ``LIMIT`` inside
  an index scan, never ``count(*)`` over a queue (a later issue's counters can make them
  exact);
- the queue names come from skip scans of the indexes that lead with the queue (the claim
  index, ``dead_jobs_queue_idx``), a recursive CTE that probes each queue once;
- job lists read at most `WINDOW` rows of one index in its order, then filter them
  (task, args search, and the queue where no index leads with it) and take a page. A
  filter that matches nothing in the window finds nothing, and the page says so;
- running jobs (the workers' leases) come from ``jobs_lease_idx``: as many rows as jobs
  are running, which the fleet's slots bound.

The dashboard's connections never prepare statements (``prepare_threshold=None``), so
each one is planned with its parameter values: ``%(queue)s IS NULL OR queue = ...``
folds away when the filter is not given, and the planner sees the real queue name.
"""

from __future__ import annotations

import functools

import attrs
from psycopg import sql

from .._db.obs_statements import obs_statements
from .._db.statements import NOW, qualified, validate_schema_name

__all__ = ["COUNT_CAP", "LEASE_CAP", "MAX_QUEUES", "WINDOW", "WebStatements", "web_statements"]

#: Counts above this show as "1,000+". Each capped count reads up to this many index
#: entries, and on a busy table as many heap pages (the visibility map is rarely set), so
#: the overview of 20 queues with big backlogs costs 20 x 2 x COUNT_CAP row reads.
COUNT_CAP = 1000
#: Running jobs the workers table reads at most (they are bounded by the fleet's slots).
LEASE_CAP = 10_000
#: Registered workers the overview lists at most.
WORKER_CAP = 1_000
#: A registered worker that has not pinged for this long is shown as gone (it pings twice a
#: second; the sweepers take it for dead after a second without pings and its lock free).
STALE_PING = 5.0
#: Rows of one index a job list reads before filtering.
WINDOW = 10_000
#: Queues the overview lists at most (each is one probe per index).
MAX_QUEUES = 200

# -- the overview -------------------------------------------------------------------------------

# Scheduled jobs among the next `cap` due, per queue (the last column: the window was full).
_QUEUES_SCHEDULED = """
WITH w AS (
    SELECT queue FROM {jobs} WHERE state = 'scheduled' ORDER BY run_at LIMIT %(cap)s
)
SELECT queue, count(*), (SELECT count(*) FROM w) >= %(cap)s FROM w GROUP BY queue
"""

# Running jobs per lease owner and queue, from the lease index (one row per running job
# read, at most `cap`): the workers, their queues and busy slots, the nearest expiry.
_LEASES = """
SELECT lease_owner, queue, count(*), extract(epoch FROM min(lease_expires_at) - {now}),
       extract(epoch FROM max(lease_expires_at) - {now})
  FROM (SELECT lease_owner, queue, lease_expires_at FROM {jobs}
         WHERE lease_expires_at IS NOT NULL AND state = 'running'
         ORDER BY lease_expires_at LIMIT %(lease_cap)s) AS r
 GROUP BY 1, 2 ORDER BY 1, 2
"""

# The registered workers (a row each, pinged every liveness_interval): small, read whole.
_WORKERS = """
SELECT name, host, pid, queues, running, extract(epoch FROM {now} - seen_at)
  FROM {workers} ORDER BY name LIMIT %(worker_cap)s
"""

# Per-minute totals since `since` (optionally of one queue): counts, sums, maxima and the
# histograms summed element-wise (24 columns each, from constant text).
_HISTORY = """
SELECT extract(epoch FROM minute)::int8, sum(completed)::int8, sum(retried)::int8,
       sum(dead)::int8, sum(cancelled)::int8, sum(runs)::int8,
       sum(exec_us_sum)::int8, max(exec_us_max), sum(wait_us_sum)::int8, max(wait_us_max),
       ARRAY[{exec_sums}], ARRAY[{wait_sums}]
  FROM {history}
 WHERE minute >= to_timestamp(%(since)s) AND (%(queue)s::text IS NULL OR queue = %(queue)s)
 GROUP BY minute ORDER BY minute
"""

_HISTORY_QUEUES = """
SELECT DISTINCT queue FROM {history} WHERE minute >= to_timestamp(%(since)s) ORDER BY 1
"""

_CLOCK = "SELECT extract(epoch FROM {now})"

# -- job lists ----------------------------------------------------------------------------------

# The columns of a list row: id, queue, task, state, priority, attempt, max_attempts, run_at,
# enqueued_at, lease_owner, lease_expires_at, finished (finished_at / died_at), error (first
# 200 characters), args (first 200 characters of the JSON).
_JOB_ROW = (
    "id, queue, task, state, priority, attempt, max_attempts, run_at, enqueued_at, "
    "lease_owner, lease_expires_at, finished_at, left(last_error, 200), left(args::text, 200)"
)
_DEAD_ROW = (
    "id, queue, task, 'dead', priority, attempt, max_attempts, NULL::timestamptz, enqueued_at, "
    "NULL::text, NULL::timestamptz, died_at, left(last_error, 200), left(args::text, 200)"
)

# The filters applied to a window: task, args containing a JSON value, args text containing
# a string, and (where the window's index does not lead with it) the queue.
_FILTERS = """
   AND (%(task)s::text IS NULL OR task = %(task)s)
   AND (%(contains)s::jsonb IS NULL OR args @> %(contains)s::jsonb)
   AND (%(text)s::text IS NULL OR strpos(args::text, %(text)s) > 0)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
"""

# One statement per state: the window is read from the index that serves that state.
_LIST = {
    "available": """
SELECT {job_row} FROM (
    SELECT * FROM {jobs}
     WHERE state = 'available' AND (%(queue)s::text IS NULL OR queue = %(queue)s)
     ORDER BY queue, priority, run_at, id LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY queue, priority, run_at, id LIMIT %(limit)s OFFSET %(offset)s
""",
    "scheduled": """
SELECT {job_row} FROM (
    SELECT * FROM {jobs} WHERE state = 'scheduled' ORDER BY run_at LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY run_at, id LIMIT %(limit)s OFFSET %(offset)s
""",
    "running": """
SELECT {job_row} FROM (
    SELECT * FROM {jobs} WHERE lease_expires_at IS NOT NULL AND state = 'running'
     ORDER BY lease_expires_at LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY lease_expires_at, id LIMIT %(limit)s OFFSET %(offset)s
""",
    "waiting": """
SELECT {job_row} FROM (
    SELECT * FROM {jobs}
     WHERE state = 'waiting' AND (%(queue)s::text IS NULL OR queue = %(queue)s)
     ORDER BY queue, id LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY queue, id LIMIT %(limit)s OFFSET %(offset)s
""",
    "done": """
SELECT {job_row} FROM (
    SELECT * FROM {jobs} WHERE state = 'done' ORDER BY finished_at DESC LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY finished_at DESC, id DESC LIMIT %(limit)s OFFSET %(offset)s
""",
    "cancelled": """
SELECT {job_row} FROM (
    SELECT * FROM {jobs} WHERE state = 'cancelled' ORDER BY finished_at DESC LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY finished_at DESC, id DESC LIMIT %(limit)s OFFSET %(offset)s
""",
    "dead": """
SELECT {dead_row} FROM (
    SELECT * FROM {dead}
     WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
     ORDER BY died_at DESC LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY died_at DESC, id DESC LIMIT %(limit)s OFFSET %(offset)s
""",
}

# -- one job ------------------------------------------------------------------------------------

_JOB = """
SELECT id, queue, task, state, args::text, priority, run_at, attempt, max_attempts,
       lease_owner, lease_expires_at, dedup_key, cancel_requested, last_error, result::text,
       enqueued_at, finished_at, {now}
  FROM {jobs} WHERE id = %(id)s
"""

# The columns of `trioq.DeadJob`, in its order.
_DEAD_JOB = """
SELECT id, queue, task, args, priority, attempt, max_attempts, dedup_key, reason,
       last_error, traceback, enqueued_at, died_at
  FROM {dead} WHERE id = %(id)s
"""

# -- actions on dead jobs -------------------------------------------------------------------------

# Dead jobs matching a filter, `batch` at a time in id order after `after` (the actions walk
# them with this, then retry or purge each batch by id).
_DEAD_IDS = """
SELECT id FROM {dead}
 WHERE id > %(after)s
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task = %(task)s)
 ORDER BY id LIMIT %(batch)s
"""

# How many dead jobs a filter matches (capped), for the confirmation page. The ORDER BY
# (died_at, which leads no index but dead_jobs_died_idx and follows the queue and the task in
# theirs) keeps the planner on an index: without it, a LIMIT looks cheapest as a seq scan.
_DEAD_COUNT = """
SELECT count(*) FROM (
    SELECT 1 FROM {dead}
     WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
     ORDER BY died_at LIMIT %(cap)s
) AS c
"""

# How many of the selected ids are dead jobs (at most MAX_IDS ids).
_DEAD_COUNT_IDS = """
SELECT count(*) FROM {dead} WHERE id = ANY(%(ids)s::int8[])
"""

# -- cron -----------------------------------------------------------------------------------------

_CRON = """
SELECT DISTINCT ON (name) name, tick, job_id, fired_at FROM {ticks} ORDER BY name, tick DESC
"""


@attrs.frozen
class WebStatements:
    """The dashboard's composed statements for one schema."""

    schema: str
    queues_available: sql.Composed
    queues_dead: sql.Composed
    queues_scheduled: sql.Composed
    leases: sql.Composed
    workers: sql.Composed
    history: sql.Composed
    history_queues: sql.Composed
    clock: sql.Composed
    lists: dict[str, sql.Composed]  # by state: available, scheduled, running, done, ...
    job: sql.Composed
    dead_job: sql.Composed
    dead_ids: sql.Composed
    dead_count: sql.Composed
    dead_count_ids: sql.Composed
    cron: sql.Composed


@functools.cache
def web_statements(schema: str) -> WebStatements:
    """The dashboard's statements for ``schema`` (validated), composed once."""
    validate_schema_name(schema)
    buckets = range(1, 25)
    names = {
        "jobs": qualified(schema, "jobs"),
        "dead": qualified(schema, "dead_jobs"),
        "ticks": qualified(schema, "cron_ticks"),
        "history": qualified(schema, "job_history"),
        "workers": qualified(schema, "workers"),
        "now": sql.SQL(NOW),
        "job_row": sql.SQL(_JOB_ROW),
        "dead_row": sql.SQL(_DEAD_ROW),
        "filters": sql.SQL(_FILTERS),
        "exec_sums": sql.SQL(", ").join(
            sql.SQL("sum(exec_hist[{}])::int8").format(sql.Literal(i)) for i in buckets
        ),
        "wait_sums": sql.SQL(", ").join(
            sql.SQL("sum(wait_hist[{}])::int8").format(sql.Literal(i)) for i in buckets
        ),
    }

    def compose(text: str) -> sql.Composed:
        return sql.SQL(text.strip()).format(**names)

    depth = obs_statements(schema)
    return WebStatements(
        schema=schema,
        # The same probes as the metrics' depth sample: one copy of each (trioq._db.obs_statements).
        queues_available=depth.depth_available,
        queues_dead=depth.depth_dead,
        queues_scheduled=compose(_QUEUES_SCHEDULED),
        leases=compose(_LEASES),
        workers=compose(_WORKERS),
        history=compose(_HISTORY),
        history_queues=compose(_HISTORY_QUEUES),
        clock=compose(_CLOCK),
        lists={state: compose(text) for state, text in _LIST.items()},
        job=compose(_JOB),
        dead_job=compose(_DEAD_JOB),
        dead_ids=compose(_DEAD_IDS),
        dead_count=compose(_DEAD_COUNT),
        dead_count_ids=compose(_DEAD_COUNT_IDS),
        cron=compose(_CRON),
    )
