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
INSERT INTO {jobs} (id, queue, task, args, priority, run_at, state, max_attempts, concurrency_key,
                    has_dependants, dependencies_left, dependency_policy, batch_id, trace_context)
SELECT i, q, t, a::jsonb, p, r,
       CASE WHEN n > 0 THEN 'waiting' WHEN r > {now} THEN 'scheduled' ELSE 'available' END,
       m, ck, hd, CASE WHEN n > 0 THEN n END, CASE WHEN n > 0 THEN pol END, b, %(trace)s::jsonb
  FROM unnest(%(ids)s::int8[], %(queues)s::text[], %(tasks)s::text[], %(args)s::text[],
              %(priorities)s::int2[], %(run_ats)s::timestamptz[], %(max_attempts)s::int4[],
              %(concurrency_keys)s::text[], %(dependants)s::bool[], %(waits)s::int4[],
              %(policies)s::text[], %(batches)s::int8[])
              AS u(i, q, t, a, p, r, m, ck, hd, n, pol, b)
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
