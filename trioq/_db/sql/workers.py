"""The workers table: registration, the liveness lock, pings, the row's removal."""

WORKER_REGISTER = """
INSERT INTO {workers} AS w (name, host, pid, queues, started_at, seen_at)
VALUES (%(name)s, %(host)s, %(pid)s, %(queues)s::jsonb, {now}, {now})
ON CONFLICT (name) DO UPDATE SET seen_at = {now}
RETURNING id
"""

# Held for the life of the worker's liveness connection (session level, not a transaction).
WORKER_LOCK = "SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtext(%(space)s), %(id)s)"

WORKER_PING = """
UPDATE {workers} SET seen_at = {now}, running = %(running)s WHERE id = %(id)s RETURNING id
"""

# At a graceful stop. A worker that still holds running jobs (outcomes it could not write,
# a claim cut short by the stop) keeps its row: once its liveness lock drops, the sweepers
# take it for dead and return those jobs within the grace rather than at lease expiry.
WORKER_REMOVE = """
DELETE FROM {workers} w
 WHERE w.id = %(id)s
   AND NOT EXISTS (SELECT FROM {jobs} j
                    WHERE j.lease_expires_at IS NOT NULL  -- jobs_lease_idx: running jobs
                      AND j.state = 'running' AND j.lease_owner = w.name)
RETURNING w.id
"""

WORKERS_LIST = """
SELECT id, name, host, pid, queues, started_at, seen_at, running, {now} - seen_at
  FROM {workers} ORDER BY name
"""
