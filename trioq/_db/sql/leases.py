"""The claim, and every write fenced by a lease: the heartbeat, the outcomes (complete,
keep, fail, release, unknown task, cancelled), and the fence and completion that run inside
a handler's own transaction. `trioq._db.driver` runs them (the transactions' ones run from
`trioq._job_transaction` and `trioq._complete_with`)."""

# The claim. The UPDATE finds its rows by `id = ANY (ARRAY(...))`, an index scan of the
# primary key, not by joining the CTE: with the join, Postgres planned a hash join over a
# sequential scan of the whole jobs table once it held a few tens of thousands of rows
# (EXPLAIN ANALYZE, 20,000 jobs, batch 100: 5.1 ms against 0.79 ms; docs/benchmarks.md).
# A queue with settings is refused (`claim_limited` claims it), unless all it has is a timed
# pause whose time has passed (migration 20): the database's clock ends it, not a timer.
#
# Weighted slots (migration 24): %(limit)s is the worker's free units, and a job costs
# `cost` of them (NULL: its task's, counted 1 here). Both statements take the due jobs in
# order while the units taken before each are fewer than asked (the last may go past the
# limit: it waits in the worker's buffer until enough units free), and none is skipped, so a
# big job is never passed by small ones behind it.
# - CLAIM takes up to %(limit)s jobs, each returned with its cost, and `Driver.claim` gives
#   back at once (place kept) those past the units: a queue whose jobs cost 1 runs the
#   statement it ran before weighted slots.
# - CLAIM_WEIGHTED counts the units in SQL (a window over the batch), for a queue whose jobs
#   have costs (the worker switches to it once it sees one, or when a task of the queue
#   costs more than 1): nothing to give back, and 0.04 ms more server time a claim, 8 % of
#   it (EXPLAIN ANALYZE, 300 interleaved runs), which is why it is not the only one.
#
# Every claim clears its worker's suspicion (`maintenance.RECLAIM_EXPIRED`), as a ping does:
# an idle worker proves its liveness connection alive by watching it, not by asking
# (`trioq._worker.services.liveness`), so a suspicion raised while it was idle must not
# outlive the claim that ends its idleness: else the verdict a grace later could take the
# jobs just claimed from a live worker. A suspicion the claim's snapshot does not see yet
# gives its verdict no earlier than a grace after the claim, by when the worker, busy now,
# has proved itself (or pinged through its pool). Writes only a suspected row; reads one
# row of `workers` by its unique name otherwise.
_CLEAR_SUSPICION = """
WITH proved AS (
    UPDATE {workers} SET suspected_at = NULL
     WHERE name = %(owner)s AND suspected_at IS NOT NULL
)"""
_CLAIM_DUE = """
     WHERE queue = %(queue)s AND state = 'available' AND run_at <= {now}
       AND (start_by IS NULL OR start_by >= {now})  -- a deadline to start passed: never
       AND NOT EXISTS (SELECT 1 FROM {queues} WHERE name = %(queue)s AND controlled
                          AND NOT {pause_over})
     ORDER BY priority, run_at, id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)"""
_CLAIM_TAKE = """
UPDATE {jobs} j
   SET state = 'running', attempt = j.attempt + 1,
       lease_owner = %(owner)s, lease_expires_at = {now} + %(lease)s,
       start_by = NULL,  -- met: no retry, snooze or sleep is judged by it
       debounce_key = NULL  -- started: the next enqueue of its key makes a new job
 WHERE j.id = ANY (ARRAY("""
_CLAIM_RETURN = """))
RETURNING {job_columns}
"""
CLAIM = (
    _CLEAR_SUSPICION + ", c AS (\n    SELECT id FROM {jobs}" + _CLAIM_DUE
    + _CLAIM_TAKE + "SELECT id FROM c" + _CLAIM_RETURN
)  # fmt: skip
CLAIM_WEIGHTED = (
    _CLEAR_SUSPICION + ", c AS (\n    SELECT id, priority, run_at, cost FROM {jobs}" + _CLAIM_DUE
    + """, k AS (
    SELECT id, pg_catalog.sum(coalesce(cost, 1)) OVER (ORDER BY priority, run_at, id)
               - coalesce(cost, 1) AS before
      FROM c
)"""
    + _CLAIM_TAKE + "SELECT id FROM k WHERE before < %(limit)s" + _CLAIM_RETURN
)  # fmt: skip

CLAIM_LIMITED = _CLEAR_SUSPICION + """
SELECT * FROM {claim_limited}(%(queue)s, %(owner)s, %(limit)s, %(lease)s)
"""

HEARTBEAT = """
UPDATE {jobs} j SET lease_expires_at = {now} + %(lease)s
 WHERE {fence_by_id}
RETURNING j.id, j.attempt, j.cancel_requested
"""

COMPLETE = """
DELETE FROM {jobs} j
 WHERE {fence_by_id}
RETURNING j.id
"""

COMPLETE_KEEP = """
UPDATE {jobs} j
   SET state = 'done', result = f.result, finished_at = {now},
       lease_owner = NULL, lease_expires_at = NULL
  FROM unnest(%(ids)s::int8[], %(attempts)s::int4[], %(results)s::jsonb[])
       AS f(id, attempt, result)
 WHERE {fence}
RETURNING j.id
"""

# A job's completion inside its handler's transaction (`trioq._job_transaction`): the fenced
# delete of _COMPLETE, then a call of migration 11's `lease_lost` (which raises SQLSTATE
# TQ001) only when fewer rows were deleted than asked for; sent with COMMIT in one pipeline
# (`execute_pipelined`), whose rest the error keeps from running. This form, for the jobs of
# a shared transaction, takes arrays of any length: Postgres plans it each time (custom
# plans), once per transaction of up to `Config.shared_transaction_jobs` jobs.
COMPLETE_IN_TRANSACTION = """
WITH fenced AS (
    DELETE FROM {jobs} j WHERE {fence_by_id} RETURNING j.id
)
{lost_unless_all}
"""

# The same for one job (`job.transaction()`'s own transaction), by its id, so that the
# prepared statement's generic plan is the custom one and Postgres keeps it: planning the
# statement costs the server more than running it (about 130 us against 60 on the jobs
# table and its indexes).
COMPLETE_ONE = """
WITH fenced AS (
    DELETE FROM {jobs} WHERE {fence_one} RETURNING id
)
{lost_unless_one}
"""

# `job.complete_with()` (`trioq._complete_with`) sends these first: the fence, checked, and
# the jobs' rows locked, so that the statement after it runs only for a live lease, sees the
# job's row, and can run past the lease (the sweeper skips locked rows); its completion
# (above) comes after the statement, with COMMIT. Same error as the completions.
LOCK_ONE = """
WITH fenced AS (
    SELECT id FROM {jobs} WHERE {fence_one} FOR UPDATE
)
{lost_unless_one}
"""

# A member of a shared transaction (`job.transaction(shared=True)`) sends this first, after
# its SAVEPOINT: the lease checked (a lost one raises TQ001, and its savepoint rolls back:
# that job alone fails) and the row held with a KEY SHARE lock. The sweeper's reclaims take
# rows FOR UPDATE SKIP LOCKED, so they skip it until the transaction ends, and the
# transaction's completion of the job cannot find it gone; the heartbeat's UPDATE (a
# NO KEY UPDATE lock) does not conflict with it, so heartbeats go on while the job waits for
# the transaction's other members.
LOCK_MEMBER = """
WITH fenced AS (
    SELECT id FROM {jobs} WHERE {fence_one} FOR KEY SHARE
)
{lost_unless_one}
"""

LOCK_IN_TRANSACTION = """
WITH fenced AS (
    SELECT j.id FROM {jobs} j WHERE {fence_by_id} FOR UPDATE
)
{lost_unless_all}
"""

# Claimed jobs that left max_attempts to their task get the claiming worker's (its
# `trioq.Task`'s, or the attempt being run when that is higher), before their handlers run,
# so the failure path and the sweeper (which has no registry) count the task's attempts.
# Fenced like every write after the claim; the flag stays, so the next claim (after a deploy
# that changed the task) resolves it again (docs/tasks.md, "Settings the task declares").
RESOLVE_MAX_ATTEMPTS = """
UPDATE {jobs} j SET max_attempts = f.m
  FROM unnest(%(ids)s::int8[], %(attempts)s::int4[], %(max_attempts)s::int4[]) AS f(id, attempt, m)
 WHERE {fence} AND j.max_attempts_unset
RETURNING j.id, j.max_attempts
"""

# Claimed jobs that left their cost to their task (cost NULL, counted 1 by the claim) get the
# claiming worker's task's cost (weighted slots, migration 24), fenced like every write after
# the claim. A job of a queue with a global limit is given back in the same statement
# (`back`: available again, attempt refunded, its place kept: run_at unchanged), so that the
# next claim counts its cost before anyone runs it: the running jobs never cost more than the
# limit, not even for an instant.
RESOLVE_COST = """
UPDATE {jobs} j
   SET cost = f.cost,
       state = CASE WHEN NOT f.back THEN j.state
                    WHEN j.cancel_requested THEN 'cancelled' ELSE 'available' END,
       finished_at = CASE WHEN f.back AND j.cancel_requested THEN {now} ELSE j.finished_at END,
       attempt = CASE WHEN f.back THEN j.attempt - 1 ELSE j.attempt END,
       lease_owner = CASE WHEN f.back THEN NULL ELSE j.lease_owner END,
       lease_expires_at = CASE WHEN f.back THEN NULL ELSE j.lease_expires_at END
  FROM unnest(%(ids)s::int8[], %(attempts)s::int4[], %(costs)s::int2[], %(back)s::bool[])
       AS f(id, attempt, cost, back)
 WHERE {fence} AND j.cost IS NULL
RETURNING j.id, f.back
"""

# A failure retries (attempts left, not fatal) or moves the job to dead_jobs.
FAIL = """
WITH f AS (
    SELECT * FROM unnest(%(ids)s::int8[], %(attempts)s::int4[], %(delays)s::interval[],
                         %(errors)s::text[], %(tracebacks)s::text[], %(fatal)s::bool[],
                         %(reasons)s::text[])
           AS f(id, attempt, delay, error, traceback, fatal, reason)
), target AS (
    SELECT j.id, (f.fatal OR j.attempt >= j.max_attempts) AS dies,
           f.delay, f.error, f.traceback, f.fatal, f.reason
      FROM {jobs} j JOIN f ON {fence}
       FOR UPDATE OF j
), died AS (
    DELETE FROM {jobs} j USING target t WHERE j.id = t.id AND t.dies
    RETURNING j.*, t.error AS error, t.traceback AS traceback,
              coalesce(t.reason, CASE WHEN t.fatal THEN 'fatal error'
                                      ELSE 'attempts exhausted' END) AS reason
), buried AS (
    INSERT INTO {dead} (id, queue, task, args, priority, attempt, max_attempts, dedup_key,
                        reason, last_error, traceback, enqueued_at, died_at, concurrency_key)
    SELECT id, queue, task, args, priority, attempt, max_attempts, dedup_key,
           reason, error, traceback, enqueued_at, {now}, concurrency_key FROM died
    RETURNING id
), retried AS (
    UPDATE {jobs} j
       SET state = CASE WHEN j.cancel_requested THEN 'cancelled'
                        WHEN t.delay > interval '0' THEN 'scheduled'
                        ELSE 'available' END,
           finished_at = CASE WHEN j.cancel_requested THEN {now} END,
           run_at = {now} + t.delay, last_error = t.error,
           lease_owner = NULL, lease_expires_at = NULL
      FROM target t
     WHERE j.id = t.id AND NOT t.dies
    RETURNING j.id, j.state
)
SELECT id, 'dead' FROM buried
UNION ALL SELECT id, CASE WHEN state = 'cancelled' THEN 'cancelled' ELSE 'retry' END FROM retried
"""

# Aborted by us (shutdown) or snoozed: back to available (or scheduled, after a delay) with
# the attempt refunded; cancelled instead if a cancel was requested meanwhile. A NULL delay
# keeps the job's run_at, so its place in the queue (the claim's give-back of the jobs past
# its units, weighted slots).
RELEASE = """
UPDATE {jobs} j
   SET state = CASE WHEN j.cancel_requested THEN 'cancelled'
                    WHEN f.delay > interval '0' THEN 'scheduled'
                    ELSE 'available' END,
       finished_at = CASE WHEN j.cancel_requested THEN {now} END,
       attempt = j.attempt - 1,
       run_at = CASE WHEN f.delay IS NULL THEN j.run_at ELSE {now} + f.delay END,
       lease_owner = NULL, lease_expires_at = NULL
  FROM unnest(%(ids)s::int8[], %(attempts)s::int4[], %(delays)s::interval[])
       AS f(id, attempt, delay)
 WHERE {fence}
RETURNING j.id
"""

# A task the worker does not know: given back with the attempt refunded, for a worker that
# knows it, after a delay that grows with how long it has been unknown (5 s to 5 min); moved
# to dead_jobs once unknown for longer than the worker's timeout.
RELEASE_UNKNOWN = """
WITH f AS (
    SELECT * FROM unnest(%(ids)s::int8[], %(attempts)s::int4[], %(errors)s::text[])
           AS f(id, attempt, error)
), target AS (
    SELECT j.id, f.error, j.cancel_requested, coalesce(j.unknown_since, {now}) AS since,
           NOT j.cancel_requested
               AND coalesce(j.unknown_since, {now}) <= {now} - %(timeout)s::interval AS dies
      FROM {jobs} j JOIN f ON {fence}
       FOR UPDATE OF j
), died AS (
    DELETE FROM {jobs} j USING target t WHERE j.id = t.id AND t.dies
    RETURNING j.*, t.error AS error
), buried AS (
    INSERT INTO {dead} (id, queue, task, args, priority, attempt, max_attempts, dedup_key,
                        reason, last_error, enqueued_at, died_at, concurrency_key)
    SELECT id, queue, task, args, priority, attempt - 1, max_attempts, dedup_key,
           'unknown task', error, enqueued_at, {now}, concurrency_key FROM died
    RETURNING id
), released AS (
    UPDATE {jobs} j
       SET state = CASE WHEN t.cancel_requested THEN 'cancelled' ELSE 'scheduled' END,
           finished_at = CASE WHEN t.cancel_requested THEN {now} END,
           attempt = j.attempt - 1,
           run_at = {now} + least(greatest(({now} - t.since) / 10, interval '5 seconds'),
                                  interval '5 minutes'),
           unknown_since = t.since, last_error = t.error,
           lease_owner = NULL, lease_expires_at = NULL
      FROM target t
     WHERE j.id = t.id AND NOT t.dies
    RETURNING j.id, j.state
)
SELECT id, 'dead' FROM buried
UNION ALL SELECT id, state FROM released
"""

# The latest progress of running jobs (`trioq._worker.services.progress`, and before an
# outcome, `trioq._worker.completer`), each value the JSON text `job.progress()` encoded.
# Fenced like every write after the claim: a worker that lost the lease writes nothing.
PROGRESS = """
UPDATE {jobs} j SET progress = f.progress, progress_at = {now}
  FROM unnest(%(ids)s::int8[], %(attempts)s::int4[], %(values)s::text[]::jsonb[])
       AS f(id, attempt, progress)
 WHERE {fence}
RETURNING j.id
"""

# A running job whose cancellation was requested and whose handler was stopped.
CANCEL_RUNNING = """
UPDATE {jobs} j
   SET state = 'cancelled', finished_at = {now}, lease_owner = NULL, lease_expires_at = NULL
 WHERE {fence_by_id}
RETURNING j.id
"""
