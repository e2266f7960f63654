"""Fragments of statement text that several domains share, and the protocol's constants.

Braces (``{jobs}``, ``{now}``, ``{fence}``) are filled where the statements are composed
(`trioq._db.statements`): tables and functions by their qualified names, fragments by their
text. ``%(name)s`` are parameters, never text.
"""

#: The clock of every statement: ``now()``, or the session's ``trioq.now`` when set.
NOW = (
    "coalesce(nullif(pg_catalog.current_setting('trioq.now', true), '')::timestamptz,"
    " pg_catalog.now())"
)

#: A ``queues`` row whose only setting is a timed pause that has ended (migration 20): on the
#: database's clock, whether or not a governor has tidied the row yet. The plain claim takes
#: such a queue; the settings read shows it as not paused. (Never NULL: a NULL in NOT EXISTS
#: would let the plain claim take an indefinitely paused queue.)
PAUSE_ENDED = f"(paused_until IS NOT NULL AND paused_until <= {NOW})"
PAUSE_OVER = (
    f"({PAUSE_ENDED[1:-1]} AND global_concurrency IS NULL AND rate_limit IS NULL"
    " AND key_concurrency IS NULL AND key_rate_limit IS NULL AND NOT fair)"
)

LIVE = "('scheduled', 'available', 'running')"

#: Notification payload for a job enqueued for later: wakes schedulers, not fetchers.
#: (Queue names cannot contain '@'.)
SCHEDULED_PAYLOAD = "@scheduled"

#: Notification payload prefix for a running job whose cancel was requested: its worker
#: stops the handler at once instead of at its next heartbeat. ``@cancel:<job id>``.
CANCEL_PAYLOAD = "@cancel:"

#: Notification payload when a queue's settings changed (paused, resumed, limits).
QUEUES_PAYLOAD = "@queues"

#: Notification payload when a cron entry of the database was added, replaced or removed:
#: every scheduler reads the entries again (``trioq/_db/sql/cron.py``).
CRON_PAYLOAD = "@cron"

#: SQLSTATE of `lease_lost` when a lease was lost (its DETAIL: the job ids).
LEASE_LOST_SQLSTATE = "TQ001"

# Columns a worker needs of a claimed job, by the names of `trioq.Job`'s row and in its order
# (``trioq._job.CLAIMED_COLUMNS``, checked where the claim is composed). They are the cheapest
# types for psycopg to decode: args as JSON text (trioq runs json.loads on it: psycopg's
# jsonb loader costs ~4 µs more per row), times as int8 microseconds since the Unix epoch
# (`Job` makes datetimes of them when asked; most handlers never ask), through migration
# 12's `epoch_us`: date_part (float8: exact to the µs within 285 years of 1970; extract is
# numeric, which costs Postgres twice as much) of the time clamped into what Python's
# datetime holds, so a time the schema's checks refuse that got in anyway (a check dropped
# by hand) is claimed as a time at an end of that range instead of failing the whole claim
# with "bigint out of range". It is inlined (STABLE SQL): two comparisons per time.
CLAIMED = {
    "id": "j.id",
    "queue": "j.queue",
    "task": "j.task",
    "args": "j.args::text",
    "priority": "j.priority",
    "run_at": "{epoch_us}(j.run_at)",
    "attempt": "j.attempt",
    "max_attempts": "j.max_attempts",
    "enqueued_at": "{epoch_us}(j.enqueued_at)",
    "lease_expires_at": "{epoch_us}(j.lease_expires_at)",
    "trace_context": "j.trace_context::text",
    "cost": "j.cost",  # weighted slots (migration 24); NULL: its task's
}

# The fence of the statements that act on leased jobs (id, attempt, owner, running) and
# join `unnest` for more per job (results, delays, errors). The `j.id = ANY (...)` repeats
# the ids as an index condition on the primary key: from the join alone, Postgres estimated
# the running jobs from statistics taken while none ran and scanned the whole table for
# them (EXPLAIN ANALYZE, 100 jobs among 20,000: 3.1 ms against 1.9 ms; docs/benchmarks.md).
FENCE = (
    "j.id = ANY (%(ids)s::int8[]) AND j.id = f.id AND j.attempt = f.attempt"
    " AND j.lease_owner = %(owner)s AND j.state = 'running'"
)

# The same for statements that need nothing else per job (heartbeat, complete, cancel):
# no join at all, each row's attempt looked up by its id's position (ids are unique in a
# batch; a repeated id can only match less, never more). An index scan of the primary key:
# the same complete took 0.19 ms.
FENCE_BY_ID = (
    "j.id = ANY (%(ids)s::int8[])"
    " AND j.attempt = (%(attempts)s::int4[])[pg_catalog.array_position(%(ids)s::int8[], j.id)]"
    " AND j.lease_owner = %(owner)s AND j.state = 'running'"
)

# One job's fence, by its id (`job.transaction()`, `job.complete_with()`), every parameter
# typed so that the prepared statement's generic plan is the custom one.
FENCE_ONE = (
    "id = %(id)s::int8 AND attempt = %(attempt)s::int4"
    " AND lease_owner = %(owner)s::text AND state = 'running'"
)

# The end of the statements that fence jobs inside their handler's transaction: a call of
# migration 11's `lease_lost` (SQLSTATE TQ001, the lost ids in its DETAIL) when the CTE
# `fenced` holds fewer rows than the jobs asked for (a shared transaction's) or none (one
# job's); the error keeps the rest of the pipeline, COMMIT included, from running.
LOST_UNLESS_ALL = """
SELECT CASE WHEN count(*) < pg_catalog.cardinality(%(ids)s::int8[])
            THEN {lease_lost}(%(ids)s::int8[], pg_catalog.array_agg(fenced.id)) END
  FROM fenced
"""
LOST_UNLESS_ONE = """
SELECT CASE WHEN count(*) = 0 THEN {lease_lost}(ARRAY[%(id)s::int8], NULL) END FROM fenced
"""

# A job's progress as readers take it (`trioq._progress.read_progress`): its JSON text only
# when it is at most 2 MiB (the worker writes at most 1 MiB), else NULL; its stored size; and
# when it was written. A value of over 8 MiB where it is stored (what migration 18's checks
# refuse, in a row whose check was dropped by hand) is not even turned into text: its size
# is read from its header. `{row}` is the table's alias.
PROGRESS_COLUMNS = (
    "CASE WHEN pg_catalog.pg_column_size({row}.progress) > 8388608 THEN NULL "
    "WHEN pg_catalog.octet_length({row}.progress::text) > 2097152 THEN NULL "
    "ELSE {row}.progress::text END AS progress, "
    "pg_catalog.pg_column_size({row}.progress) AS progress_stored, {row}.progress_at"
)

# The columns of `trioq.JobStatus`, in order, for a row of jobs (`j`); the progress last
# (`PROGRESS_COLUMNS`: three columns, read into two fields).
STATUS_COLUMNS = (
    "j.id, j.state, j.queue, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.run_at, "
    "j.enqueued_at, j.finished_at, j.lease_owner, j.lease_expires_at, j.cancel_requested, "
    "j.dedup_key, j.result, j.last_error, NULL::text AS reason, NULL::text AS traceback, "
    "j.start_by, j.sequence_key, "
    + PROGRESS_COLUMNS.replace("{row}", "j")
)
