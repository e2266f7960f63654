"""What keeps a queue moving without a caller: due jobs made available, expired leases and
dead workers' jobs returned (or killed on their last attempt), and retention."""

# Due scheduled jobs become available; the queues that got work are returned (to notify).
# A durable job parked on a wait whose timeout came waits for nothing from now on: its
# waiting_for goes, or a later park (a retry's backoff) would still be woken by the signal
# and counted as waiting (NULL to NULL for every other job: no index sees a change).
PROMOTE = """
WITH due AS (
    SELECT id FROM {jobs}
     WHERE state = 'scheduled' AND run_at <= {now}
     ORDER BY run_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), promoted AS (
    UPDATE {jobs} j SET state = 'available', waiting_for = NULL FROM due WHERE j.id = due.id
    RETURNING j.queue
)
SELECT queue, CASE WHEN %(notify)s THEN pg_catalog.pg_notify(%(channel)s, queue)::text END
  FROM (SELECT DISTINCT queue FROM promoted) AS q
"""

# NULL when nothing is scheduled; else clamped to a day either side, so a time the schema
# refuses that got in anyway (a check dropped by hand, 'infinity') is never an interval
# Python cannot hold (the scheduler looks again by then).
NEXT_DUE = """
SELECT greatest(least(d.due, {now} + interval '1 day'), {now} - interval '1 day') - {now}
  FROM (SELECT pg_catalog.min(run_at) AS due FROM {jobs} WHERE state = 'scheduled') AS d
 WHERE d.due IS NOT NULL
"""

# Expired leases: back to available (the attempt stays spent), or dead on the last attempt.
SWEEP_EXPIRED = """
WITH expired AS (
    SELECT id, attempt >= max_attempts OR cancel_requested AS final, cancel_requested
      FROM {jobs}
     WHERE state = 'running' AND lease_expires_at < {now}
     ORDER BY lease_expires_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)"""

# Jobs whose deadline to start passed before any claim took them (the claim clears start_by,
# and never takes a job past it): to dead_jobs, earliest deadline first, through
# jobs_start_by_idx. The lock is the claim's fence: a job a claim holds is skipped, and one a
# claim took meanwhile no longer matches once locked (READ COMMITTED re-reads the row). The
# delete fires the triggers every death does (dependants, batches, waiters).
EXPIRE_START_BY = """
WITH expired AS (
    SELECT id FROM {jobs}
     WHERE start_by IS NOT NULL AND state IN ('waiting', 'scheduled', 'available')
       AND start_by < {now}
     ORDER BY start_by
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), died AS (
    DELETE FROM {jobs} j USING expired e WHERE j.id = e.id
    RETURNING j.*
), buried AS (
    INSERT INTO {dead} (id, queue, task, args, priority, attempt, max_attempts, dedup_key,
                        reason, last_error, enqueued_at, died_at, concurrency_key, start_by)
    SELECT id, queue, task, args, priority, attempt, max_attempts, dedup_key, %(reason)s,
           'start_by ' || coalesce(pg_catalog.to_char(start_by AT TIME ZONE 'UTC',
                                                      'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
                                   start_by::text)  -- '-infinity', written by hand
           || ' passed before the job (' || state || ') was started',
           enqueued_at, {now}, concurrency_key, start_by
      FROM died
    RETURNING id, queue
)
SELECT id, 'dead', queue FROM buried
"""

# Workers that are provably gone, on evidence one flaky connection cannot fake: their
# liveness lock held by no session at all (Postgres drops it when the process or that
# connection dies) and no ping (through the liveness connection or the pool) for longer than
# the grace, found twice, a grace apart. A check that finds a worker's lock free only writes
# when it suspected it (`suspect`), and only if the row is still the version it read (a ping
# or a registration since, which follows a new lock, makes a new version); every ping clears
# the suspicion (`workers.WORKER_PING`). A check that finds the suspicion older than the
# grace, the lock still free and still no ping, takes the worker for dead (`gone`). So a
# worker whose liveness connection is cut always has the grace, from the moment its lock
# was seen free, to ping through its pool, however long ago it last wrote its row (an idle
# worker writes it only every few seconds: its liveness connection proves it alive without
# writing, `trioq._worker.services.liveness`); and a crashed one, busy or idle, is taken a
# grace after the first check that saw its lock free.
#
# The lock is read from pg_locks (once a check: a hashed NOT IN), not tried: behind a
# transaction pooler the sweeper's statement can land on the very server session that holds
# the worker's lock, and an advisory lock is re-entrant per session, so a try-lock would
# take a live worker for dead. After a server restart (or a failover) every lock is gone at
# once, and every session is new: a session judges and suspects nobody until the restart
# grace has passed since its first check (whose time it keeps in a setting of the session:
# reading the session's start from the backends' statuses copies every backend's, its last
# query included, 6.7 ms a check beside 1,200 connections), so every worker has that long
# to reconnect (however long the server took to recover). The delete re-checks the row (a
# ping that commits while it waits for the row lock clears the suspicion and keeps the
# worker), and only the jobs of the rows actually deleted are swept.
RECLAIM_EXPIRED = """
WITH free AS MATERIALIZED (
    SELECT c.id, c.suspected_at, c.xmin AS version FROM {workers} c
     WHERE (SELECT pg_catalog.to_timestamp(coalesce(
                nullif(pg_catalog.current_setting('trioq.judging_since', true), ''),
                pg_catalog.set_config('trioq.judging_since',
                                      pg_catalog.date_part('epoch', pg_catalog.now())::text,
                                      false))::float8)) < {now} - %(restart_grace)s::interval
       AND c.id::oid NOT IN (
        SELECT l.objid FROM pg_catalog.pg_locks l
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
           AND l.classid = pg_catalog.hashtext(%(space)s)::oid
           AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                              WHERE d.datname = pg_catalog.current_database()))
), suspect AS (
    UPDATE {workers} w SET suspected_at = {now} FROM free f
     WHERE w.id = f.id AND f.suspected_at IS NULL AND w.xmin = f.version
    RETURNING w.id
), gone AS (
    DELETE FROM {workers} w USING free f
     WHERE w.id = f.id AND f.suspected_at < {now} - %(grace)s::interval
       AND w.suspected_at < {now} - %(grace)s::interval
       AND w.seen_at < {now} - %(grace)s::interval
    RETURNING w.id, w.name
), expired AS (
    SELECT j.id, j.attempt >= j.max_attempts OR j.cancel_requested AS final, j.cancel_requested
      FROM {jobs} j
     WHERE j.lease_expires_at IS NOT NULL  -- jobs_lease_idx: running jobs only
       AND j.state = 'running' AND j.lease_owner IN (SELECT name FROM gone)
       FOR UPDATE OF j SKIP LOCKED
)"""

# What the sweeper does with `expired` jobs: back to available (the attempt stays spent),
# dead on the last attempt, cancelled if a cancel was requested.
SWEEP_OUTCOMES = """, died AS (
    DELETE FROM {jobs} j USING expired e
     WHERE j.id = e.id AND e.final AND NOT e.cancel_requested
    RETURNING j.*
), buried AS (
    INSERT INTO {dead} (id, queue, task, args, priority, attempt, max_attempts, dedup_key,
                        reason, last_error, enqueued_at, died_at, concurrency_key)
    SELECT id, queue, task, args, priority, attempt, max_attempts, dedup_key,
           %(dead_reason)s, %(lost_error)s, enqueued_at, {now}, concurrency_key
      FROM died
    RETURNING id, queue
), cancelled AS (
    UPDATE {jobs} j
       SET state = 'cancelled', finished_at = {now}, lease_owner = NULL, lease_expires_at = NULL
      FROM expired e
     WHERE j.id = e.id AND e.cancel_requested
    RETURNING j.id, j.queue
), returned AS (
    UPDATE {jobs} j
       SET state = 'available', run_at = {now}, last_error = %(lost_error)s,
           lease_owner = NULL, lease_expires_at = NULL
      FROM expired e
     WHERE j.id = e.id AND NOT e.final
    RETURNING j.id, j.queue
)
SELECT id, 'dead', queue FROM buried
UNION ALL SELECT id, 'cancelled', queue FROM cancelled
UNION ALL SELECT id, 'available', queue FROM returned
"""

# The dead-worker check's last rows: how many workers are left (rows the statement deleted
# are still counted: its snapshot predates them), so that each process knows how often to
# check (`trioq._worker.services.sweeper`), and how many it suspected (it checks again once
# their grace is over).
FLEET_ROW = """UNION ALL SELECT count(*), 'fleet', NULL FROM {workers}
UNION ALL SELECT count(*), 'suspected', NULL FROM suspect
"""

# What a sweep (of this process) killed or cancelled: the jobs' details, for their events.
SWEPT_DETAILS = """
SELECT d.id, 'dead', d.queue, d.task, d.attempt, d.args::text, d.reason, d.last_error
  FROM {dead} d WHERE d.id = ANY(%(dead)s::int8[])
UNION ALL
SELECT j.id, 'cancelled', j.queue, j.task, j.attempt, j.args::text, NULL, j.last_error
  FROM {jobs} j WHERE j.id = ANY(%(cancelled)s::int8[]) AND j.state = 'cancelled'
"""

# One bounded batch, oldest first, rows locked by another pruner skipped. The state is a
# literal (not a parameter), so a generic plan still matches the partial index; the ids go
# through an array, so the delete probes the primary key even when a generic plan guesses
# the batch is 10% of the table (with a join it hashed the whole table instead).
PRUNE_FINISHED = """
WITH doomed AS (
    SELECT id FROM {jobs} x
     WHERE state = {state} AND finished_at < {now} - %(age)s
       AND NOT (x.has_dependants AND EXISTS (  -- a live dependant may still read its result
           SELECT 1 FROM {deps} e JOIN {jobs} d ON d.id = e.job_id
            WHERE e.depends_on = x.id AND d.state NOT IN ('done', 'cancelled')))
     ORDER BY finished_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
DELETE FROM {jobs} WHERE id = ANY(ARRAY(SELECT id FROM doomed))
"""

# The same for a table of ended rows that need no other condition (dead jobs by died_at,
# batches by finished_at): {table} and {ended} are given where it is composed.
PRUNE_ENDED = """
WITH doomed AS (
    SELECT id FROM {table}
     WHERE {ended} < {now} - %(age)s
     ORDER BY {ended}
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
DELETE FROM {table} WHERE id = ANY(ARRAY(SELECT id FROM doomed))
"""

# The vacuumer (docs/scaling.md, "Bloat"): the jobs table's dead and live tuples as the
# statistics say (functions of the stats system: no lock, no table read), whether this role
# may vacuum it (its owner, a member of the owner's role, or a superuser), and how many
# manual vacuums it has had (one that skipped the table for its lock adds none).
VACUUM_LOOK = """
SELECT pg_catalog.pg_stat_get_dead_tuples(c.oid), pg_catalog.pg_stat_get_live_tuples(c.oid),
       pg_catalog.pg_has_role(c.relowner, 'USAGE'), pg_catalog.pg_stat_get_vacuum_count(c.oid)
  FROM pg_catalog.pg_class c WHERE c.oid = '{jobs}'::pg_catalog.regclass
"""

# SKIP_LOCKED: a vacuum already running (autovacuum's, another process's) is enough; this one
# returns at once instead of waiting for its lock.
VACUUM_JOBS = """
VACUUM (SKIP_LOCKED) {jobs}
"""

# Anti-starvation (docs/flow-control.md, "Aging"), one queue a statement: every available
# job that has waited (aged + 1) x the queue's `aging` climbs to the priority its wait has
# earned (one level per `aging`), but never past the best priority waiting in the queue now.
# The levels present are found by a loose index scan of the claim's index (one probe a
# level), and each level's due jobs oldest first, at most %(limit)s a level, rows locked by a
# claim (or another worker's round) skipped: a job aged twice at once is impossible, and the
# claim never waits for aging. %(default)s is the aging of a queue that set none; '0' is off.
# Only priorities trioq writes (%(lowest)s to %(highest)s) are aged or aged to, in int4, so a
# priority or `aged` written by hand out of range never makes the statement fail.
AGE = """
WITH RECURSIVE setting AS (
    SELECT coalesce((SELECT q.aging FROM {queues} q WHERE q.name = %(queue)s),
                    %(default)s::interval) AS step
), best AS (
    SELECT greatest((SELECT j.priority FROM {jobs} j
                      WHERE j.queue = %(queue)s AND j.state = 'available' AND j.run_at <= {now}
                      ORDER BY j.priority LIMIT 1)::int4, %(lowest)s::int4) AS p
      FROM setting s WHERE s.step > interval '0'
), levels AS (
    SELECT b.p FROM best b WHERE b.p IS NOT NULL
    UNION ALL
    SELECT (SELECT j.priority FROM {jobs} j
             WHERE j.queue = %(queue)s AND j.state = 'available' AND j.priority > l.p
               AND j.priority <= %(highest)s::int4
             ORDER BY j.priority LIMIT 1)::int4
      FROM levels l WHERE l.p IS NOT NULL
), due AS (
    SELECT c.id, greatest(b.p, c.original - least(
               pg_catalog.floor(pg_catalog.date_part('epoch', {now} - c.run_at)
                                / pg_catalog.date_part('epoch', s.step)), 1000)::int4) AS p,
           c.original
      FROM setting s, best b, levels l,
           LATERAL (SELECT j.id, j.priority::int4 + j.aged AS original, j.run_at
                      FROM {jobs} j
                     WHERE j.queue = %(queue)s AND j.state = 'available' AND j.priority = l.p
                       AND j.run_at <= {now} - s.step
                       AND j.run_at <= {now} - s.step * (j.aged + 1)
                     ORDER BY j.run_at, j.id
                     LIMIT %(limit)s
                       FOR UPDATE SKIP LOCKED) AS c
     WHERE l.p > b.p
)
UPDATE {jobs} j SET priority = d.p, aged = least(d.original - d.p, %(most)s::int4)
  FROM due d
 WHERE j.id = d.id AND d.p < j.priority
RETURNING j.id
"""
