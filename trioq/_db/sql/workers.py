"""The workers table: registration, the liveness lock, pings, the row's removal."""

WORKER_REGISTER = """
INSERT INTO {workers} AS w (name, host, pid, queues, started_at, seen_at)
VALUES (%(name)s, %(host)s, %(pid)s, %(queues)s::jsonb, {now}, {now})
ON CONFLICT (name) DO UPDATE SET seen_at = {now}, suspected_at = NULL
RETURNING id
"""

# Held for the life of the worker's liveness connection (session level, not a transaction).
WORKER_LOCK = "SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtext(%(space)s), %(id)s)"

# Every ping clears a sweeper's suspicion (`maintenance.RECLAIM_EXPIRED`): the worker is
# alive, and a suspicion must start again from a lock found free after this ping.
WORKER_PING = """
UPDATE {workers} SET seen_at = {now}, running = %(running)s, suspected_at = NULL
 WHERE id = %(id)s RETURNING id
"""

# At a graceful stop. A worker that still holds running jobs (outcomes it could not write,
# a claim cut short by the stop) keeps its row, suspected by itself since forever: once its
# liveness lock drops and its last ping is a grace old, the first dead-worker check takes it
# for dead and returns those jobs, without a suspicion's grace of its own, rather than at
# lease expiry. The row comes back only when that is a deletion.
WORKER_REMOVE = """
WITH holding AS MATERIALIZED (
    SELECT EXISTS (SELECT FROM {jobs} j
                    WHERE j.lease_expires_at IS NOT NULL  -- jobs_lease_idx: running jobs
                      AND j.state = 'running'
                      AND j.lease_owner = (SELECT w.name FROM {workers} w
                                            WHERE w.id = %(id)s)) AS jobs
), left_behind AS (
    UPDATE {workers} w SET suspected_at = '-infinity'
     WHERE w.id = %(id)s AND (SELECT jobs FROM holding)
)
DELETE FROM {workers} w
 WHERE w.id = %(id)s AND NOT (SELECT jobs FROM holding)
RETURNING w.id
"""

WORKERS_LIST = """
SELECT id, name, host, pid, queues, started_at, seen_at, running, {now} - seen_at
  FROM {workers} ORDER BY name
"""
