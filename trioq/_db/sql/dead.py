"""Dead letters: list, retry, purge (``Queue.dead_*``), and the dashboard's pages and actions,
which walk them by id in batches."""

# args as text: a row another producer wrote may hold jsonb Python cannot decode.
DEAD_LIST = """
SELECT id, queue, task, args::text, priority, attempt, max_attempts, dedup_key, reason,
       last_error, traceback, enqueued_at, died_at
  FROM {dead}
 WHERE (%(ids)s::int8[] IS NULL OR id = ANY(%(ids)s))
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task = %(task)s)
 ORDER BY died_at, id
 LIMIT %(limit)s
"""

# The dead jobs a filter matches (`DeadFilter.params`), as ``d``.
_MATCHED = """
  FROM {dead} d
 WHERE (%(ids)s::int8[] IS NULL OR d.id = ANY(%(ids)s))
   AND (%(queue)s::text IS NULL OR d.queue = %(queue)s)
   AND (%(task)s::text IS NULL OR d.task = %(task)s)"""

# Those a retry moves: a dead job whose dedup twin is live stays dead (the retry would
# duplicate it). Shared by the retry and its dry run, so the two cannot disagree.
_RETRYABLE = _MATCHED + """
   AND NOT EXISTS (SELECT 1 FROM {jobs} j
                    WHERE j.dedup_key = d.dedup_key AND j.state IN {live})"""

# Back to available with fresh attempts.
DEAD_RETRY = """
WITH moved AS (
    DELETE""" + _RETRYABLE + """
    RETURNING d.*
)
INSERT INTO {jobs} (id, queue, task, args, priority, run_at, attempt, max_attempts, dedup_key,
                    enqueued_at, concurrency_key)
SELECT id, queue, task, args, priority, {now}, 0, max_attempts, dedup_key, enqueued_at,
       concurrency_key FROM moved
RETURNING id
"""

# The ids DEAD_RETRY would move now (``trioq dead retry --dry-run``).
DEAD_RETRYABLE = "SELECT d.id" + _RETRYABLE + "\n ORDER BY d.id"

# Those a purge deletes: matched, and died before ``before`` or ``older_than`` ago.
_PURGEABLE = _MATCHED + """
   AND (%(before)s::timestamptz IS NULL OR d.died_at < %(before)s)
   AND (%(older_than)s::interval IS NULL OR d.died_at < {now} - %(older_than)s::interval)"""

DEAD_PURGE = "DELETE" + _PURGEABLE + "\nRETURNING d.id"

# The ids DEAD_PURGE would delete now (``trioq dead purge --dry-run``).
DEAD_PURGEABLE = "SELECT d.id" + _PURGEABLE + "\n ORDER BY d.id"

# The columns of `trioq.DeadJob`, in its order.
DEAD_JOB = """
SELECT id, queue, task, args, priority, attempt, max_attempts, dedup_key, reason,
       last_error, traceback, enqueued_at, died_at
  FROM {dead} WHERE id = %(id)s
"""

# Dead jobs matching a filter, `batch` at a time in id order after `after` (the actions walk
# them with this, then retry or purge each batch by id).
DEAD_IDS = """
SELECT id FROM {dead}
 WHERE id > %(after)s
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task = %(task)s)
 ORDER BY id LIMIT %(batch)s
"""

# How many dead jobs a filter matches (capped), for the confirmation page. The ORDER BY
# (died_at, which leads no index but dead_jobs_died_idx and follows the queue and the task in
# theirs) keeps the planner on an index: without it, a LIMIT looks cheapest as a seq scan.
DEAD_COUNT = """
SELECT count(*) FROM (
    SELECT 1 FROM {dead}
     WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
     ORDER BY died_at LIMIT %(cap)s
) AS c
"""

# How many of the selected ids are dead jobs (at most MAX_IDS ids).
DEAD_COUNT_IDS = """
SELECT count(*) FROM {dead} WHERE id = ANY(%(ids)s::int8[])
"""
