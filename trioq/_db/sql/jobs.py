"""One job at a time: cancel, its status, waiting for its result, its detail page; the
database's clock (and the session's ``trioq.now``); the listings of ``trioq.testing``."""

CANCEL = """
WITH now_cancelled AS (
    UPDATE {jobs} SET state = 'cancelled', finished_at = {now}
     WHERE id = %(id)s AND state IN ('waiting', 'scheduled', 'available')
    RETURNING id
), flagged AS (
    UPDATE {jobs} SET cancel_requested = true
     WHERE id = %(id)s AND state = 'running'
    RETURNING id
)
SELECT (SELECT pg_catalog.count(*) FROM now_cancelled), (SELECT pg_catalog.count(*) FROM flagged),
       (SELECT pg_catalog.count(pg_catalog.pg_notify(%(channel)s, '@cancel:' || f.id))
          FROM flagged f)
"""

CLOCK = "SELECT {now}"

CLOCK_EPOCH = "SELECT extract(epoch FROM {now})"

# The session's own clock unset (``NOW`` is then the transaction's now()): what the worker's
# pools run on every connection they open, and after every user of the app pool, so that a
# DSN's ``options=-c trioq.now=...`` or a handler's set_config moves no clock of theirs.
CLEAR_CLOCK = "SELECT pg_catalog.set_config('trioq.now', '', false)"

# The worker's own pool plans trioq's statements once per connection (a generic plan), on
# direct connections (a session setting would leak through a transaction pooler). Left to
# itself, Postgres keeps a custom plan for the claim, whose LIMIT a generic plan cannot
# estimate, and plans it again at every claim: 0.3 ms of a 1 ms round trip (90 of 90 claims
# custom-planned in pg_prepared_statements; docs/benchmarks.md, "Generic plans").
# tests/test_explain.py checks every hot statement's generic plan on a big table.
GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"

# What a session can carry from one user of the worker's app pool to the next, undone
# (DISCARD ALL but the prepared statements and plans, which psycopg keeps for the connection
# and which carry nothing of a user's), and the session's trioq.now unset: three commands
# (`trioq._db.statements.session_reset`). The role first: a role a handler switched to may
# not be allowed to call the function. RESET ALL next, on its own: a statement_timeout or
# lock_timeout a handler set applies to the statement it is reset in, not to the ones after.
# Then migration 13's function for the rest (one result to read, not five).
RESET_ROLE = "SET SESSION AUTHORIZATION DEFAULT"
RESET_SETTINGS = "RESET ALL"
RESET_SESSION = "SELECT {reset_session}()"

# Sets (or, with '', unsets) the session's `trioq.now`, which `NOW` reads.
SET_CLOCK = "SELECT set_config('trioq.now', %(now)s, false)"

# One snapshot: a job is in jobs or in dead_jobs (they move in one statement), or nowhere.
JOB_STATUS = """
SELECT {status_columns} FROM {jobs} j WHERE j.id = %(id)s
UNION ALL
SELECT d.id, 'dead', d.queue, d.task, d.args, d.priority, d.attempt, d.max_attempts, NULL,
       d.enqueued_at, d.died_at, NULL, NULL, false, d.dedup_key, NULL, d.last_error, d.reason,
       d.traceback, d.start_by, NULL::text, {dead_progress}
  FROM {dead} d WHERE d.id = %(id)s
"""

# A waiter flags the job so that its end notifies (the triggers of migration 5). Only a
# job not flagged yet is written. A claim that met the row locked by this statement skipped
# it: the queue's notification, sent at this commit, makes that worker claim again.
WAIT_FLAG = """
WITH flagged AS (
    UPDATE {jobs} SET notify_finished = true
     WHERE id = %(id)s AND state NOT IN ('done', 'cancelled') AND NOT notify_finished
    RETURNING queue, state
)
SELECT state, CASE WHEN state = 'available' THEN pg_notify(%(channel)s, queue)::text END
  FROM flagged
"""

LISTENING = "SELECT %(channel)s::text = ANY(ARRAY(SELECT pg_listening_channels()))"

LIST_JOBS = """
SELECT {status_columns} FROM {jobs} j
 WHERE j.state = ANY(%(states)s::text[])
   AND (%(task)s::text IS NULL OR j.task = %(task)s)
   AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
   AND (%(args)s::jsonb IS NULL OR j.args @> %(args)s::jsonb)
   AND (%(priority)s::int2 IS NULL OR j.priority = %(priority)s)
 ORDER BY j.id
"""

FIRST_SCHEDULED = """
SELECT min(run_at) FROM {jobs} WHERE state = 'scheduled' AND queue = ANY(%(queues)s::text[])
"""

# The result only when what is stored of it is at most %(load)s bytes (else NULL, and the page
# says how big it is): a page that refreshes every 2 s must not read a 50 MB value each time.
# pg_column_size is the stored (possibly compressed) size and reads no more than the header.
JOB = """
SELECT id, queue, task, state, args::text, priority, run_at, attempt, max_attempts,
       lease_owner, lease_expires_at, dedup_key, sequence_key, cancel_requested, last_error,
       CASE WHEN pg_catalog.pg_column_size(result) <= %(load)s THEN result::text END,
       enqueued_at, finished_at, {now}, pg_catalog.pg_column_size(result)
  FROM {jobs} WHERE id = %(id)s
"""

# A job's progress alone, from jobs or dead_jobs (the dashboard's job page, every refresh):
# its JSON text when it is at most %(load)s bytes (else NULL: the page says how big it is;
# over 8 MiB stored it is not even turned into text), its stored size, when it was written.
JOB_PROGRESS = """
SELECT CASE WHEN pg_catalog.pg_column_size(progress) > 8388608 THEN NULL
            WHEN pg_catalog.octet_length(progress::text) > %(load)s THEN NULL
            ELSE progress::text END,
       pg_catalog.pg_column_size(progress), progress_at
  FROM {jobs} WHERE id = %(id)s
UNION ALL
SELECT CASE WHEN pg_catalog.pg_column_size(progress) > 8388608 THEN NULL
            WHEN pg_catalog.octet_length(progress::text) > %(load)s THEN NULL
            ELSE progress::text END,
       pg_catalog.pg_column_size(progress), progress_at
  FROM {dead} WHERE id = %(id)s
 LIMIT 1
"""
