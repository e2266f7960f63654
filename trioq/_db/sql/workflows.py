"""Jobs that wait for others (migration 8): the dependencies locked and flagged, graphs of
jobs and their edges inserted, ended dependencies resolved, batches."""

# Existing jobs that new jobs will wait for, locked in id order (so enqueuers of overlapping
# dependencies never deadlock) until the enqueue commits: a dependency that ends meanwhile
# waits, then sees its new edges. Each id's state: a live or kept row's, 'dead', or
# 'unknown'; and what names it in a cancelled dependant's reason.
DEPENDENCIES_LOCK = """
WITH want AS (
    SELECT DISTINCT w.id FROM pg_catalog.unnest(%(ids)s::int8[]) AS w(id)
), live AS (
    SELECT j.id, j.state, j.task, j.last_error, j.queue, j.has_dependants FROM {jobs} j
     WHERE j.id IN (SELECT id FROM want)
     ORDER BY j.id
       FOR NO KEY UPDATE
)
SELECT w.id, coalesce(l.state, CASE WHEN d.id IS NOT NULL THEN 'dead' ELSE 'unknown' END),
       coalesce(l.task, d.task),
       CASE WHEN d.id IS NOT NULL THEN d.reason || coalesce(': ' || d.last_error, '')
            ELSE l.last_error END,
       l.queue, coalesce(l.has_dependants, false)
  FROM want w
  LEFT JOIN live l ON l.id = w.id
  LEFT JOIN {dead} d ON d.id = w.id AND l.id IS NULL
 ORDER BY w.id
"""

# Flags the locked dependencies that had no dependant yet. A claim that met one of them
# locked skipped it: the queue's notification (sent at this commit) makes it claim again.
DEPENDENCIES_FLAG = """
WITH flagged AS (
    UPDATE {jobs} SET has_dependants = true
     WHERE id = ANY(%(ids)s::int8[]) AND NOT has_dependants
    RETURNING queue, state
)
SELECT pg_catalog.count(pg_catalog.pg_notify(%(channel)s, q.queue))
  FROM (SELECT DISTINCT queue FROM flagged WHERE state = 'available' AND %(notify)s) AS q
"""

# Jobs of a graph (ids reserved by _RESERVE_IDS): those with dependencies wait; no dedup keys.
INSERT_GRAPH = """
INSERT INTO {jobs} (id, queue, task, args, priority, run_at, state, max_attempts,
                    max_attempts_unset, concurrency_key, has_dependants, dependencies_left,
                    dependency_policy, batch_id, trace_context, start_by, cost)
SELECT i, q, t, a::jsonb, p, r,
       CASE WHEN n > 0 THEN 'waiting' WHEN r > {now} THEN 'scheduled' ELSE 'available' END,
       m, mu, ck, hd, CASE WHEN n > 0 THEN n END, CASE WHEN n > 0 THEN pol END, b,
       %(trace)s::jsonb, sb, c
  FROM unnest(%(ids)s::int8[], %(queues)s::text[], %(tasks)s::text[], %(args)s::text[],
              %(priorities)s::int2[], %(run_ats)s::timestamptz[], %(max_attempts)s::int4[],
              %(max_attempts_unset)s::bool[], %(concurrency_keys)s::text[],
              %(dependants)s::bool[], %(waits)s::int4[], %(policies)s::text[],
              %(batches)s::int8[], %(start_bys)s::timestamptz[], %(costs)s::int2[])
              AS u(i, q, t, a, p, r, m, mu, ck, hd, n, pol, b, sb, c)
"""

INSERT_EDGES = """
INSERT INTO {deps} (job_id, depends_on)
SELECT * FROM unnest(%(jobs)s::int8[], %(depends_on)s::int8[])
"""

# Dependencies that had ended before the enqueue: resolved at once, for the new jobs only.
RESOLVE_ENDED = """
SELECT {jobs_ended}(%(ids)s::int8[], %(outcomes)s::text[], %(tasks)s::text[],
                    %(details)s::text[], %(batches)s::int8[], %(channel)s, %(only)s::int8[])
"""

INSERT_BATCH = """
INSERT INTO {batches} (total, pending, callback_queue, callback_task, callback_args,
                       callback_priority, callback_max_attempts, callback_concurrency_key,
                       created_at)
VALUES (%(total)s, %(total)s, %(queue)s, %(task)s, %(args)s::jsonb, %(priority)s,
        %(max_attempts)s, %(concurrency_key)s, {now})
RETURNING id
"""

FINISH_EMPTY_BATCH = """
UPDATE {batches} SET callback_job_id = %(job_id)s, finished_at = {now} WHERE id = %(id)s
"""

BATCH_STATUS = """
SELECT id, total, pending, succeeded, failed, cancelled, callback_task, callback_job_id,
       created_at, finished_at
  FROM {batches} WHERE id = %(id)s
"""

# A job's dependencies, with what became of each (the dependency's row, or dead_jobs).
DEPENDENCIES = """
SELECT e.depends_on, coalesce(j.task, d.task, e.task),
       coalesce(e.outcome, 'pending'),
       j.state = 'done' AND e.outcome = 'done',
       CASE WHEN j.state = 'done' THEN j.result END,
       CASE WHEN d.id IS NOT NULL THEN d.reason || coalesce(': ' || d.last_error, '')
            ELSE j.last_error END
  FROM {deps} e
  LEFT JOIN {jobs} j ON j.id = e.depends_on
  LEFT JOIN {dead} d ON d.id = e.depends_on AND j.id IS NULL
 WHERE e.job_id = %(id)s
 ORDER BY e.depends_on
"""

# The ids of a job's dependants (what `trioq jobs show` lists).
DEPENDANTS = """
SELECT job_id FROM {deps} WHERE depends_on = %(id)s ORDER BY job_id LIMIT %(limit)s
"""

# -- stranded: waiting jobs that can never be freed (trioq._worker.services.stranded) ---------

# One sweep at a time across processes (the others skip their round): the second key of
# this advisory lock's space, beside the workers' liveness locks (whose first key differs).
STRANDED_TURN = """
SELECT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtext(%(space)s), 0)
"""

# Waiting jobs no ending can free, and why: a count that is not a count (a check dropped by
# hand), an unresolved edge to a job that is not pending (never existed, dead, or ended
# without resolving it), or more dependencies to wait for than unresolved edges. An edge is
# resolved in the transaction that ends its dependency, and a job's edges are written in the
# transaction that enqueues it, so in one snapshot a pending edge always points at a live
# job: none of these is a race. With ``ids``, only those jobs (the re-check under their
# locks). Cycles are found apart (`STRANDED_EDGES`).
STRANDED = """
SELECT j.id,
       CASE WHEN j.dependencies_left IS NULL OR j.dependencies_left < 1
                 OR j.dependency_policy IS NULL
            THEN pg_catalog.format('it waits with dependencies_left %%s and dependency_policy %%s',
                                   coalesce(j.dependencies_left::text, 'NULL'),
                                   coalesce(j.dependency_policy, 'NULL'))
            WHEN g.id IS NOT NULL
            THEN pg_catalog.format('it waits for job %%s, which %%s', g.id,
                                   CASE WHEN g.state IS NOT NULL
                                        THEN 'has ended (' || g.state || ')'
                                        WHEN g.dead THEN 'is dead'
                                        ELSE 'does not exist' END)
            ELSE pg_catalog.format('it waits for %%s dependencies but only %%s are pending',
                                   j.dependencies_left, p.n)
       END
  FROM {jobs} j
  LEFT JOIN LATERAL (
    SELECT e.depends_on AS id, d.state,
           EXISTS (SELECT FROM {dead} x WHERE x.id = e.depends_on) AS dead
      FROM {deps} e LEFT JOIN {jobs} d ON d.id = e.depends_on
     WHERE e.job_id = j.id AND e.outcome IS NULL
       AND (d.id IS NULL OR d.state IN ('done', 'cancelled'))
     ORDER BY e.depends_on
     LIMIT 1
  ) g ON true
  CROSS JOIN LATERAL (
    SELECT pg_catalog.count(*) AS n FROM {deps} e WHERE e.job_id = j.id AND e.outcome IS NULL
  ) p
 WHERE j.state = 'waiting' AND (%(ids)s::int8[] IS NULL OR j.id = ANY(%(ids)s::int8[]))
   AND j.sequence_key IS NULL  -- waits for its sequence (migration 26): SEQUENCES_STUCK's
   AND (j.dependencies_left IS NULL OR j.dependencies_left < 1 OR j.dependency_policy IS NULL
        OR g.id IS NOT NULL OR j.dependencies_left > p.n)
 ORDER BY j.id
 LIMIT %(limit)s
"""

# The pending edges between waiting jobs, where cycles are (at most `limit`: a cycle among
# fewer edges is a cycle among all, so a capped read misses cycles, never invents one). With
# ``ids``, only the edges among those jobs (the re-check under their locks).
STRANDED_EDGES = """
SELECT e.job_id, e.depends_on
  FROM {deps} e
  JOIN {jobs} w ON w.id = e.job_id AND w.state = 'waiting'
  JOIN {jobs} d ON d.id = e.depends_on AND d.state = 'waiting'
 WHERE e.outcome IS NULL
   AND (%(ids)s::int8[] IS NULL OR (e.job_id = ANY(%(ids)s::int8[])
                                    AND e.depends_on = ANY(%(ids)s::int8[])))
 LIMIT %(limit)s
"""

# The stranded jobs, locked for the re-check (one that is being freed right now is skipped:
# its ending holds it).
STRANDED_LOCK = """
SELECT id FROM {jobs} WHERE id = ANY(%(ids)s::int8[]) AND state = 'waiting'
 ORDER BY id
   FOR UPDATE SKIP LOCKED
"""

# To dead_jobs, each with why it could never run. The delete's trigger resolves their
# dependants (a dependency that died: cancelled or run, by each one's policy) and their
# edges go with them.
STRANDED_MOVE = """
WITH moved AS (
    DELETE FROM {jobs} j
     USING unnest(%(ids)s::int8[], %(errors)s::text[]) AS f(id, error)
     WHERE j.id = f.id AND j.state = 'waiting'
    RETURNING j.*, f.error
), edges AS (
    DELETE FROM {deps} e WHERE e.job_id IN (SELECT id FROM moved)
)
INSERT INTO {dead} (id, queue, task, args, priority, attempt, max_attempts, dedup_key, reason,
                    last_error, enqueued_at, died_at, concurrency_key)
SELECT id, queue, task, args, priority, attempt, max_attempts, dedup_key, 'stranded', error,
       enqueued_at, {now}, concurrency_key
  FROM moved
RETURNING id, queue, task, last_error
"""

# Sequences (migration 26) whose waiting jobs have no unfinished head: possible only where the
# triggers did not run (a row written with them disabled, a TRUNCATE of part of a key's jobs
# by hand). Each is advanced as a job's end would (`sequence_advance`: its earliest waiting
# job freed); at most `limit` keys a round.
SEQUENCES_STUCK = """
SELECT s.key, {sequence_advance}(s.key, %(channel)s)::text
  FROM {sequences} s
 WHERE EXISTS (SELECT FROM {jobs} w WHERE w.sequence_key = s.key AND w.state = 'waiting')
   AND NOT EXISTS (SELECT FROM {jobs} h
                    WHERE h.sequence_key = s.key
                      AND h.state IN ('scheduled', 'available', 'running'))
 LIMIT %(limit)s
"""
