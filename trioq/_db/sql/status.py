"""Counts: the queue status of ``Queue.status``, and the depth sample of the metrics, the CLI
and the dashboard's overview.

The depth sample and the overview follow the dashboard's rule: **each statement has a
bounded cost on a table of any size** (``tests/test_explain.py``, ``tests/test_web_explain.py``):

- per queue and state, a count that is exact up to the cap (`DEPTH_CAP`; a ``LIMIT`` inside
  an index scan), probing each queue once through the indexes that lead with it (the claim
  index, ``dead_jobs_queue_idx``), the scheduled jobs through their own index up to the cap,
  the running ones through the lease index, the waiting ones through their partial index;
- running jobs (the workers' leases) come from ``jobs_lease_idx``: as many rows as jobs are
  running, which the fleet's slots bound.
"""

# Per queue: how many jobs in each live state, dead, and how long the oldest due one waits.
STATUS_QUEUES = """
WITH live AS (
    SELECT queue,
           pg_catalog.count(*) FILTER (WHERE state = 'available') AS available,
           pg_catalog.count(*) FILTER (WHERE state = 'scheduled') AS scheduled,
           pg_catalog.count(*) FILTER (WHERE state = 'running') AS running,
           extract(epoch FROM {now} - pg_catalog.min(run_at) FILTER (WHERE state = 'available'))
               AS oldest_wait,
           pg_catalog.count(*) FILTER (WHERE state = 'waiting') AS waiting
      FROM {jobs} WHERE state IN ('waiting', 'scheduled', 'available', 'running') GROUP BY queue
), dead AS (
    SELECT queue, pg_catalog.count(*) AS dead FROM {dead} GROUP BY queue
)
SELECT coalesce(l.queue, d.queue), coalesce(l.available, 0), coalesce(l.scheduled, 0),
       coalesce(l.running, 0), coalesce(d.dead, 0), l.oldest_wait, coalesce(l.waiting, 0)
  FROM live l FULL JOIN dead d ON d.queue = l.queue
 ORDER BY 1
"""

# Live leases per worker: through the lease index (its predicate repeated, or the planner
# reads the whole table: 93 ms and 18k buffers at 1M jobs, bench/bench_backlog.py).
STATUS_LEASES = """
SELECT lease_owner, pg_catalog.count(*), pg_catalog.min(lease_expires_at) - {now}
  FROM {jobs} WHERE lease_expires_at IS NOT NULL AND state = 'running'
 GROUP BY lease_owner ORDER BY lease_owner
"""

#: Counts per queue and state are exact up to this (``Config.metrics_depth_cap``), and show
#: as this above it. Each count reads up to this many entries of an index in its order (and,
#: where the visibility map is not set, as many heap rows): a sample costs about 1 us per
#: row read, min(backlog, cap x queues) rows; see docs/observability.md#queue-depth.
DEPTH_CAP = 1_000

#: Queues the depth sample reports at most.
MAX_DEPTH_QUEUES = 500

# Queues with available jobs (one probe of the claim index per queue), each with its capped
# count and the age of the job at its head (the next to be claimed). The counts read the
# index in its own order: an index(-only) scan that stops at the cap (without the ORDER BY
# the planner prefers a bitmap scan, which reads the queue's whole range first).
DEPTH_AVAILABLE = """
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
DEPTH_DEAD = """
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
DEPTH_SCHEDULED_RUNNING = """
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
DEPTH_WAITING = """
SELECT queue, pg_catalog.count(*) FROM (
    SELECT queue FROM {jobs} WHERE state = 'waiting' ORDER BY queue LIMIT %(cap)s
) AS w GROUP BY queue
"""

# Scheduled jobs among the next `cap` due, per queue (the last column: the window was full).
QUEUES_SCHEDULED = """
WITH w AS (
    SELECT queue FROM {jobs} WHERE state = 'scheduled' ORDER BY run_at LIMIT %(cap)s
)
SELECT queue, count(*), (SELECT count(*) FROM w) >= %(cap)s FROM w GROUP BY queue
"""

# Running jobs per lease owner and queue, from the lease index (one row per running job
# read, at most `cap`): the workers, their queues and busy slots, the nearest expiry.
LEASES = """
SELECT lease_owner, queue, count(*), extract(epoch FROM min(lease_expires_at) - {now}),
       extract(epoch FROM max(lease_expires_at) - {now})
  FROM (SELECT lease_owner, queue, lease_expires_at FROM {jobs}
         WHERE lease_expires_at IS NOT NULL AND state = 'running'
         ORDER BY lease_expires_at LIMIT %(lease_cap)s) AS r
 GROUP BY 1, 2 ORDER BY 1, 2
"""

# The registered workers (a row each, pinged every liveness_interval): small, read whole.
WORKERS = """
SELECT name, host, pid, queues, running, extract(epoch FROM {now} - seen_at)
  FROM {workers} ORDER BY name LIMIT %(worker_cap)s
"""

# Durable jobs parked per queue (migration 16's partial index), among the first `cap`:
# waiting for a signal (true) or not (false: sleeping, or a retry's backoff).
DEPTH_PARKED = """
SELECT queue, waiting_for IS NOT NULL, pg_catalog.count(*) FROM (
    SELECT queue, waiting_for FROM {jobs} WHERE durable AND state = 'scheduled'
     ORDER BY queue LIMIT %(cap)s
) AS p GROUP BY 1, 2
"""
