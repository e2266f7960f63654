"""Every SQL statement the library runs, in one place.

Statements are composed once per schema with ``psycopg.sql`` (the schema name
is a validated identifier, never text); everything else is a parameter. Times
come from `NOW`, which is the transaction's ``now()`` unless the session sets
``trioq.now`` (tests use it to move the clock without sleeping).

Every write after the claim is fenced by id, attempt and lease owner, so a
worker whose lease was reclaimed changes nothing.

Every function call is qualified (``pg_catalog.now()``): statements also run on the
caller's connection, whose ``search_path`` may put another schema before
``pg_catalog``, and a function of the same name there must not change what trioq
does. (``unnest`` of several arrays is syntax that Postgres resolves in pg_catalog
itself; types and operators still follow the ``search_path``: ``docs/security.md``.)

The rest of the library runs only what `statements` returns. The exceptions
are not about trioq's tables: the Postgres layer's health check (``SELECT 1``
in `trioq._pg.pool`), and the embedded server's ``CREATE DATABASE`` (before any
schema exists). The tools keep their own (the load tester's ledger, the demo's
counts).
"""

from __future__ import annotations

import functools
import re

import attrs
from psycopg import sql

__all__ = [
    "CANCEL_PAYLOAD",
    "LEASE_LOST_SQLSTATE",
    "NOW",
    "QUEUES_PAYLOAD",
    "SCHEDULED_PAYLOAD",
    "SCHEMA_NAME_RE",
    "WRITABLE",
    "Statements",
    "qualified",
    "rendered",
    "statements",
    "validate_schema_name",
]

#: Lower-case identifiers only: they need no quoting in psql and cannot smuggle anything.
#: Matched with ``fullmatch``: ``match`` would also accept a trailing newline (``$``).
SCHEMA_NAME_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def validate_schema_name(schema: str, field: str = "schema") -> str:
    """``schema`` if it is a valid trioq schema name; else TypeError or ValueError."""
    if not isinstance(schema, str):
        raise TypeError(f"{field} name must be a string, got {schema!r}")
    if not SCHEMA_NAME_RE.fullmatch(schema):
        raise ValueError(
            f"{field} name {schema!r} is invalid: use 1-63 lower-case letters, digits and "
            "underscores, not starting with a digit"
        )
    return schema


def qualified(schema: str, name: str) -> sql.Identifier:
    """``"schema"."name"`` as a composable identifier."""
    return sql.Identifier(validate_schema_name(schema), name)


#: The clock of every statement: ``now()``, or the session's ``trioq.now`` when set.
NOW = (
    "coalesce(nullif(pg_catalog.current_setting('trioq.now', true), '')::timestamptz,"
    " pg_catalog.now())"
)

_LIVE = "('scheduled', 'available', 'running')"

#: Notification payload for a job enqueued for later: wakes schedulers, not fetchers.
#: (Queue names cannot contain '@'.)
SCHEDULED_PAYLOAD = "@scheduled"
#: Notification payload prefix for a running job whose cancel was requested: its worker
#: stops the handler at once instead of at its next heartbeat. ``@cancel:<job id>``.
CANCEL_PAYLOAD = "@cancel:"
#: Notification payload when a queue's settings changed (paused, resumed, limits).
QUEUES_PAYLOAD = "@queues"

# Columns a worker needs of a claimed job, in `Job.COLUMNS` order. They are the cheapest
# types for psycopg to decode: args as JSON text (trioq runs json.loads on it: psycopg's
# jsonb loader costs ~4 µs more per row), times as int8 microseconds since the Unix epoch
# (`Job` makes datetimes of them when asked; most handlers never ask).
_JOB_COLUMNS = (
    "j.id, j.queue, j.task, j.args::text AS args, j.priority, {epoch_us_run_at} AS run_at, "
    "j.attempt, j.max_attempts, {epoch_us_enqueued_at} AS enqueued_at, "
    "{epoch_us_lease_expires_at} AS lease_expires_at, j.trace_context::text AS trace_context"
).format(
    **{
        # date_part is float8: exact to the µs within 285 years of 1970 (a claimed job's times
        # are about now, unless run_at was set centuries back: then a few µs off);
        # extract is numeric, which costs Postgres twice as much
        f"epoch_us_{c}": f"(pg_catalog.date_part('epoch', j.{c}) * 1000000)::int8"
        for c in ("run_at", "enqueued_at", "lease_expires_at")
    }
)

_INSERT = """
WITH v AS (
    SELECT coalesce(%(run_at)s, {now} + %(delay)s) AS run_at
), ins AS (
    INSERT INTO {jobs} (queue, task, args, priority, run_at, state, max_attempts, dedup_key,
                        concurrency_key {trace_column})
    SELECT %(queue)s, %(task)s, %(args)s::jsonb, %(priority)s, v.run_at,
           CASE WHEN v.run_at > {now} THEN 'scheduled' ELSE 'available' END,
           %(max_attempts)s, %(dedup_key)s, %(concurrency_key)s {trace_value}
      FROM v
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL AND state IN {live} DO NOTHING
    RETURNING id, queue, state
)
SELECT id, CASE WHEN %(notify)s THEN pg_catalog.pg_notify(
           %(channel)s, CASE WHEN state = 'scheduled' THEN '@scheduled' ELSE queue END)::text
       END
  FROM ins
"""

# Rows carry ids reserved with _RESERVE_IDS, so the caller knows which spec got which id.
_INSERT_MANY = """
INSERT INTO {jobs} (id, queue, task, args, priority, run_at, state, max_attempts, dedup_key,
                    concurrency_key {trace_column})
SELECT i, q, t, a::jsonb, p, r, CASE WHEN r > {now} THEN 'scheduled' ELSE 'available' END, m, k,
       ck {trace_value}
  FROM unnest(%(ids)s::int8[], %(queues)s::text[], %(tasks)s::text[], %(args)s::text[],
              %(priorities)s::int2[], %(run_ats)s::timestamptz[], %(max_attempts)s::int4[],
              %(dedup_keys)s::text[], %(concurrency_keys)s::text[])
              AS u(i, q, t, a, p, r, m, k, ck)
 ORDER BY k, i  -- one lock order for every transaction (overlapping batches wait, never
              -- deadlock); among twins in one batch the first (lowest reserved id) wins
ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL AND state IN {live} DO NOTHING
RETURNING id
"""

# The sequence is looked up once (MATERIALIZED), not once per reserved id.
_RESERVE_IDS = """
WITH s AS MATERIALIZED (SELECT pg_catalog.pg_get_serial_sequence(%(jobs)s, 'id') AS seq)
SELECT {now}, pg_catalog.array_agg(pg_catalog.nextval(s.seq))
  FROM s, pg_catalog.generate_series(1, %(n)s)
"""

_COPY_JOBS = """
COPY {jobs} (id, queue, task, args, priority, run_at, state, max_attempts {trace_column})
FROM STDIN
"""

# Many jobs sharing every field but args: one statement, args as one JSON array (encoded by
# one json call on the client). Ids are drawn in a MATERIALIZED CTE next to each job's
# position, so the mapping is exact; when they are consecutive (the usual case) only the
# offset comes back, else the array in input order. pg_notify payloads are deduplicated per
# transaction by Postgres, so several statements in one transaction still notify once.
_INSERT_BULK = """
WITH v AS (
    SELECT coalesce(%(run_at)s::timestamptz, {now} + %(delay)s::interval) AS run_at, {now} AS now
), s AS MATERIALIZED (
    SELECT pg_catalog.pg_get_serial_sequence(%(jobs)s, 'id')::regclass AS seq
), a AS MATERIALIZED (
    SELECT pg_catalog.nextval(s.seq) AS id, x.args, x.o
      FROM s, pg_catalog.jsonb_array_elements(%(args)s::jsonb) WITH ORDINALITY AS x(args, o)
), ins AS (
    INSERT INTO {jobs} (id, queue, task, args, priority, run_at, state, max_attempts
                        {trace_column})
    SELECT a.id, %(queue)s, %(task)s, a.args, %(priority)s, v.run_at,
           CASE WHEN v.run_at > v.now THEN 'scheduled' ELSE 'available' END, %(max_attempts)s
           {trace_value}
      FROM a, v
)
SELECT pg_catalog.count(*), pg_catalog.min(a.id - a.o),
       CASE WHEN pg_catalog.min(a.id - a.o) <> pg_catalog.max(a.id - a.o)
            THEN (SELECT pg_catalog.array_agg(id ORDER BY o) FROM a) END,
       (SELECT pg_catalog.count(pg_catalog.pg_notify(%(channel)s,
                               CASE WHEN v.run_at > v.now THEN '@scheduled' ELSE %(queue)s END))
          FROM v WHERE %(notify)s)
  FROM a
"""

_LIVE_TWINS = """
SELECT dedup_key, id FROM {jobs} WHERE dedup_key = ANY(%(keys)s) AND state IN {live}
"""

_NOTIFY = """
SELECT pg_catalog.pg_notify(%(channel)s, q) FROM pg_catalog.unnest(%(queues)s::text[]) AS q
"""

# The claim. The UPDATE finds its rows by `id = ANY (ARRAY(...))`, an index scan of the
# primary key, not by joining the CTE: with the join, Postgres planned a hash join over a
# sequential scan of the whole jobs table once it held a few tens of thousands of rows
# (EXPLAIN ANALYZE, 20,000 jobs, batch 100: 5.1 ms against 0.79 ms; docs/benchmarks.md).
_CLAIM = """
WITH c AS (
    SELECT id FROM {jobs}
     WHERE queue = %(queue)s AND state = 'available' AND run_at <= {now}
       AND NOT EXISTS (SELECT 1 FROM {queues} WHERE name = %(queue)s AND controlled)
     ORDER BY priority, run_at, id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE {jobs} j
   SET state = 'running', attempt = j.attempt + 1,
       lease_owner = %(owner)s, lease_expires_at = {now} + %(lease)s
 WHERE j.id = ANY (ARRAY(SELECT id FROM c))
RETURNING {job_columns}
"""

# The fence of the statements that act on leased jobs (id, attempt, owner, running) and
# join `unnest` for more per job (results, delays, errors). The `j.id = ANY (...)` repeats
# the ids as an index condition on the primary key: from the join alone, Postgres estimated
# the running jobs from statistics taken while none ran and scanned the whole table for
# them (EXPLAIN ANALYZE, 100 jobs among 20,000: 3.1 ms against 1.9 ms; docs/benchmarks.md).
_FENCE = (
    "j.id = ANY (%(ids)s::int8[]) AND j.id = f.id AND j.attempt = f.attempt"
    " AND j.lease_owner = %(owner)s AND j.state = 'running'"
)

# The same for statements that need nothing else per job (heartbeat, complete, cancel):
# no join at all, each row's attempt looked up by its id's position (ids are unique in a
# batch; a repeated id can only match less, never more). An index scan of the primary key:
# the same complete took 0.19 ms.
_FENCE_BY_ID = (
    "j.id = ANY (%(ids)s::int8[])"
    " AND j.attempt = (%(attempts)s::int4[])[pg_catalog.array_position(%(ids)s::int8[], j.id)]"
    " AND j.lease_owner = %(owner)s AND j.state = 'running'"
)

_HEARTBEAT = """
UPDATE {jobs} j SET lease_expires_at = {now} + %(lease)s
 WHERE {fence_by_id}
RETURNING j.id, j.attempt, j.cancel_requested
"""

_COMPLETE = """
DELETE FROM {jobs} j
 WHERE {fence_by_id}
RETURNING j.id
"""

# A job's completion inside its handler's transaction (`trioq._job_transaction`): the fenced
# delete of _COMPLETE, then a call of migration 11's `lease_lost` (which raises SQLSTATE
# TQ001) only when fewer rows were deleted than asked for; sent with COMMIT in one pipeline
# (`execute_pipelined`), whose rest the error keeps from running. This form, for the jobs of
# a shared transaction, takes arrays of any length: Postgres plans it each time (custom
# plans), once per transaction of up to `Config.shared_transaction_jobs` jobs.
_COMPLETE_IN_TRANSACTION = """
WITH done AS (
    DELETE FROM {jobs} j WHERE {fence_by_id} RETURNING j.id
)
SELECT CASE WHEN count(*) < pg_catalog.cardinality(%(ids)s::int8[])
            THEN {lease_lost}(%(ids)s::int8[], pg_catalog.array_agg(done.id)) END
  FROM done
"""

# The same for one job (`job.transaction()`'s own transaction), by its id, so that the
# prepared statement's generic plan is the custom one and Postgres keeps it: planning the
# statement costs the server more than running it (about 130 us against 60 on the jobs
# table and its indexes).
_COMPLETE_ONE = """
WITH done AS (
    DELETE FROM {jobs}
     WHERE id = %(id)s::int8 AND attempt = %(attempt)s::int4
       AND lease_owner = %(owner)s::text AND state = 'running'
    RETURNING id
)
SELECT CASE WHEN count(*) = 0 THEN {lease_lost}(ARRAY[%(id)s::int8], NULL) END FROM done
"""

# `job.complete_with()` (`trioq._complete_with`) sends these first: the fence, checked, and
# the jobs' rows locked, so that the statement after it runs only for a live lease, sees the
# job's row, and can run past the lease (the sweeper skips locked rows); its completion
# (above) comes after the statement, with COMMIT. Same error as the completions.
_LOCK_ONE = """
WITH held AS (
    SELECT id FROM {jobs}
     WHERE id = %(id)s::int8 AND attempt = %(attempt)s::int4
       AND lease_owner = %(owner)s::text AND state = 'running'
       FOR UPDATE
)
SELECT CASE WHEN count(*) = 0 THEN {lease_lost}(ARRAY[%(id)s::int8], NULL) END FROM held
"""

_LOCK_IN_TRANSACTION = """
WITH held AS (
    SELECT j.id FROM {jobs} j WHERE {fence_by_id} FOR UPDATE
)
SELECT CASE WHEN count(*) < pg_catalog.cardinality(%(ids)s::int8[])
            THEN {lease_lost}(%(ids)s::int8[], pg_catalog.array_agg(held.id)) END
  FROM held
"""

#: SQLSTATE of `lease_lost` when a lease was lost (its DETAIL: the job ids).
LEASE_LOST_SQLSTATE = "TQ001"


_COMPLETE_KEEP = """
UPDATE {jobs} j
   SET state = 'done', result = f.result, finished_at = {now},
       lease_owner = NULL, lease_expires_at = NULL
  FROM unnest(%(ids)s::int8[], %(attempts)s::int4[], %(results)s::jsonb[])
       AS f(id, attempt, result)
 WHERE {fence}
RETURNING j.id
"""

# A failure retries (attempts left, not fatal) or moves the job to dead_jobs.
_FAIL = """
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
# the attempt refunded; cancelled instead if a cancel was requested meanwhile.
_RELEASE = """
UPDATE {jobs} j
   SET state = CASE WHEN j.cancel_requested THEN 'cancelled'
                    WHEN f.delay > interval '0' THEN 'scheduled'
                    ELSE 'available' END,
       finished_at = CASE WHEN j.cancel_requested THEN {now} END,
       attempt = j.attempt - 1, run_at = {now} + f.delay,
       lease_owner = NULL, lease_expires_at = NULL
  FROM unnest(%(ids)s::int8[], %(attempts)s::int4[], %(delays)s::interval[])
       AS f(id, attempt, delay)
 WHERE {fence}
RETURNING j.id
"""

# A task the worker does not know: given back with the attempt refunded, for a worker that
# knows it, after a delay that grows with how long it has been unknown (5 s to 5 min); moved
# to dead_jobs once unknown for longer than the worker's timeout.
_RELEASE_UNKNOWN = """
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

# A running job whose cancellation was requested and whose handler was stopped.
_CANCEL_RUNNING = """
UPDATE {jobs} j
   SET state = 'cancelled', finished_at = {now}, lease_owner = NULL, lease_expires_at = NULL
 WHERE {fence_by_id}
RETURNING j.id
"""

_CANCEL = """
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

# Due scheduled jobs become available; the queues that got work are returned (to notify).
_PROMOTE = """
WITH due AS (
    SELECT id FROM {jobs}
     WHERE state = 'scheduled' AND run_at <= {now}
     ORDER BY run_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), promoted AS (
    UPDATE {jobs} j SET state = 'available' FROM due WHERE j.id = due.id
    RETURNING j.queue
)
SELECT queue, CASE WHEN %(notify)s THEN pg_catalog.pg_notify(%(channel)s, queue)::text END
  FROM (SELECT DISTINCT queue FROM promoted) AS q
"""

_NEXT_DUE = """
SELECT pg_catalog.min(run_at) - {now} FROM {jobs} WHERE state = 'scheduled'
"""

# Expired leases: back to available (the attempt stays spent), or dead on the last attempt.
_SWEEP_EXPIRED = """
WITH expired AS (
    SELECT id, attempt >= max_attempts OR cancel_requested AS final, cancel_requested
      FROM {jobs}
     WHERE state = 'running' AND lease_expires_at < {now}
     ORDER BY lease_expires_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)"""

# Workers that are provably gone: no ping for longer than the grace, and their liveness
# lock free (Postgres drops it when the process or its connection dies; a live worker
# holds it). After a server restart every lock is gone at once, and every connection is
# new: a sweeper whose own connection is younger than the restart grace judges nobody, so
# every worker has that long to reconnect (however long the server took to recover).
# Their rows go; their running jobs are swept at once.
_RECLAIM_EXPIRED = """
WITH stale AS MATERIALIZED (
    SELECT id, name FROM {workers}
     WHERE seen_at < {now} - %(grace)s::interval
       AND (SELECT a.backend_start FROM pg_catalog.pg_stat_activity a
             WHERE a.pid = pg_catalog.pg_backend_pid()) < {now} - %(restart_grace)s::interval
), dead AS MATERIALIZED (
    SELECT id, name FROM stale
     WHERE pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtext(%(space)s), id)
), gone AS (
    DELETE FROM {workers} w USING dead d WHERE w.id = d.id RETURNING w.id
), expired AS (
    SELECT j.id, j.attempt >= j.max_attempts OR j.cancel_requested AS final, j.cancel_requested
      FROM {jobs} j
     WHERE j.lease_expires_at IS NOT NULL  -- jobs_lease_idx: running jobs only
       AND j.state = 'running' AND j.lease_owner IN (SELECT name FROM dead)
       FOR UPDATE OF j SKIP LOCKED
)"""

# What the sweeper does with `expired` jobs: back to available (the attempt stays spent),
# dead on the last attempt, cancelled if a cancel was requested.
_SWEEP_OUTCOMES = """, died AS (
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

# -- workers: registration, liveness lock, pings --------------------------------------------

_WORKER_REGISTER = """
INSERT INTO {workers} AS w (name, host, pid, queues, started_at, seen_at)
VALUES (%(name)s, %(host)s, %(pid)s, %(queues)s::jsonb, {now}, {now})
ON CONFLICT (name) DO UPDATE SET seen_at = {now}
RETURNING id
"""

# Held for the life of the worker's liveness connection (session level, not a transaction).
_WORKER_LOCK = "SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtext(%(space)s), %(id)s)"

_WORKER_PING = """
UPDATE {workers} SET seen_at = {now}, running = %(running)s WHERE id = %(id)s RETURNING id
"""

# At a graceful stop. A worker that still holds running jobs (outcomes it could not write,
# a claim cut short by the stop) keeps its row: once its liveness lock drops, the sweepers
# take it for dead and return those jobs within the grace rather than at lease expiry.
_WORKER_REMOVE = """
DELETE FROM {workers} w
 WHERE w.id = %(id)s
   AND NOT EXISTS (SELECT FROM {jobs} j
                    WHERE j.lease_expires_at IS NOT NULL  -- jobs_lease_idx: running jobs
                      AND j.state = 'running' AND j.lease_owner = w.name)
RETURNING w.id
"""

_WORKERS_LIST = """
SELECT id, name, host, pid, queues, started_at, seen_at, running, {now} - seen_at
  FROM {workers} ORDER BY name
"""

# Per queue: how many jobs in each live state, dead, and how long the oldest due one waits.
_STATUS_QUEUES = """
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
_STATUS_LEASES = """
SELECT lease_owner, pg_catalog.count(*), pg_catalog.min(lease_expires_at) - {now}
  FROM {jobs} WHERE lease_expires_at IS NOT NULL AND state = 'running'
 GROUP BY lease_owner ORDER BY lease_owner
"""

# args as text: a row another producer wrote may hold jsonb Python cannot decode.
_DEAD_LIST = """
SELECT id, queue, task, args::text, priority, attempt, max_attempts, dedup_key, reason,
       last_error, traceback, enqueued_at, died_at
  FROM {dead}
 WHERE (%(ids)s::int8[] IS NULL OR id = ANY(%(ids)s))
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task = %(task)s)
 ORDER BY died_at, id
 LIMIT %(limit)s
"""

# Back to available with fresh attempts. A dead job whose dedup twin is live stays dead.
_DEAD_RETRY = """
WITH moved AS (
    DELETE FROM {dead} d
     WHERE (%(ids)s::int8[] IS NULL OR d.id = ANY(%(ids)s))
       AND (%(queue)s::text IS NULL OR d.queue = %(queue)s)
       AND (%(task)s::text IS NULL OR d.task = %(task)s)
       AND NOT EXISTS (SELECT 1 FROM {jobs} j
                        WHERE j.dedup_key = d.dedup_key AND j.state IN {live})
    RETURNING d.*
)
INSERT INTO {jobs} (id, queue, task, args, priority, run_at, attempt, max_attempts, dedup_key,
                    enqueued_at, concurrency_key)
SELECT id, queue, task, args, priority, {now}, 0, max_attempts, dedup_key, enqueued_at,
       concurrency_key FROM moved
RETURNING id
"""

_DEAD_PURGE = """
DELETE FROM {dead}
 WHERE (%(ids)s::int8[] IS NULL OR id = ANY(%(ids)s))
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task = %(task)s)
   AND (%(before)s::timestamptz IS NULL OR died_at < %(before)s)
   AND (%(older_than)s::interval IS NULL OR died_at < {now} - %(older_than)s::interval)
RETURNING id
"""

# -- flow control: queue settings, the limited claim, unique windows (migration 6) ------------

_QUEUE_SETTINGS = """
SELECT name, paused, global_concurrency, rate_limit, rate_period, key_concurrency,
       key_rate_limit, key_rate_period
  FROM {queues}
 WHERE %(names)s::text[] IS NULL OR name = ANY(%(names)s::text[])
 ORDER BY name
"""

# Changes only the settings whose set_* flag is true (atomic: two concurrent changes of
# different settings both land). Clearing a rate limit forgets its counted starts. Every
# worker hears of it through one notification.
_CHANGE_QUEUE = """
WITH up AS (
    INSERT INTO {queues} AS q (name, paused, global_concurrency, rate_limit, rate_period,
                               key_concurrency, key_rate_limit, key_rate_period)
    VALUES (%(name)s, coalesce(%(paused)s::bool, false), %(global_concurrency)s::int4,
            %(rate_limit)s::int4, %(rate_period)s::interval, %(key_concurrency)s::int4,
            %(key_rate_limit)s::int4, %(key_rate_period)s::interval)
    ON CONFLICT (name) DO UPDATE SET
        paused = CASE WHEN %(set_paused)s THEN EXCLUDED.paused ELSE q.paused END,
        global_concurrency = CASE WHEN %(set_global_concurrency)s
                                  THEN EXCLUDED.global_concurrency
                                  ELSE q.global_concurrency END,
        rate_limit = CASE WHEN %(set_rate_limit)s THEN EXCLUDED.rate_limit
                          ELSE q.rate_limit END,
        rate_period = CASE WHEN %(set_rate_limit)s THEN EXCLUDED.rate_period
                           ELSE q.rate_period END,
        key_concurrency = CASE WHEN %(set_key_concurrency)s THEN EXCLUDED.key_concurrency
                               ELSE q.key_concurrency END,
        key_rate_limit = CASE WHEN %(set_key_rate_limit)s THEN EXCLUDED.key_rate_limit
                              ELSE q.key_rate_limit END,
        key_rate_period = CASE WHEN %(set_key_rate_limit)s THEN EXCLUDED.key_rate_period
                               ELSE q.key_rate_period END,
        updated_at = now()
    RETURNING q.name, q.paused, q.global_concurrency, q.rate_limit, q.rate_period,
              q.key_concurrency, q.key_rate_limit, q.key_rate_period
), cleared AS (
    DELETE FROM {rate_starts} s USING up
     WHERE s.queue = up.name
       AND ((s.key = '' AND up.rate_limit IS NULL) OR (s.key <> '' AND up.key_rate_limit IS NULL))
)
SELECT up.*, pg_notify(%(channel)s, '@queues')::text FROM up
"""

_CLAIM_LIMITED = """
SELECT * FROM {claim_limited}(%(queue)s, %(owner)s, %(limit)s, %(lease)s)
"""

_ENQUEUE_UNIQUE = """
SELECT * FROM {enqueue_unique}(
    %(key)s, %(period)s::interval, %(states)s::text[], %(queue)s, %(task)s, %(args)s,
    %(priority)s::int2, %(run_at)s::timestamptz, %(delay)s::interval, %(max_attempts)s::int4,
    %(concurrency_key)s, %(notify)s, %(channel)s)
"""

# -- cron ---------------------------------------------------------------------------------------

_CRON_LAST_TICKS = """
SELECT name, pg_catalog.max(tick) FROM {ticks} WHERE name = ANY(%(names)s::text[]) GROUP BY name
"""

# Claims the tick: only the transaction that inserts the row goes on to enqueue. The same
# statement prunes the entry's old rows (never its latest), so the table stays small.
_CRON_RECORD_TICK = """
WITH claimed AS (
    INSERT INTO {ticks} (name, tick, fired_at) VALUES (%(name)s, %(tick)s, {now})
    ON CONFLICT (name, tick) DO NOTHING
    RETURNING tick
), pruned AS (
    DELETE FROM {ticks}
     WHERE name = %(name)s AND tick < %(tick)s AND fired_at < {now} - %(keep)s
       AND EXISTS (SELECT 1 FROM claimed)
)
SELECT tick FROM claimed
"""

_CRON_SET_JOB = """
UPDATE {ticks} SET job_id = %(job_id)s WHERE name = %(name)s AND tick = %(tick)s
"""

# -- per-minute history (trioq._obs.history) -----------------------------------------------

# One row per (minute, queue, task) in the batch, sorted by the caller: concurrent writers
# then lock shared rows in the same order and cannot deadlock. The histograms come as one
# flat array, `buckets` elements per row (sliced by the row's ordinal), and are merged
# element-wise into an existing row.
_HISTORY_UPSERT = """
INSERT INTO {history} AS h (minute, queue, task, completed, retried, dead, cancelled, runs,
                            exec_us_sum, exec_us_max, exec_hist,
                            wait_us_sum, wait_us_max, wait_hist)
SELECT to_timestamp(u.minute), u.queue, u.task, u.completed, u.retried, u.dead, u.cancelled,
       u.runs, u.exec_us_sum, u.exec_us_max,
       (%(exec_hists)s::int8[])[(u.o - 1) * %(buckets)s + 1 : u.o * %(buckets)s],
       u.wait_us_sum, u.wait_us_max,
       (%(wait_hists)s::int8[])[(u.o - 1) * %(buckets)s + 1 : u.o * %(buckets)s]
  FROM unnest(%(minutes)s::int8[], %(queues)s::text[], %(tasks)s::text[],
              %(completed)s::int8[], %(retried)s::int8[], %(dead)s::int8[],
              %(cancelled)s::int8[], %(runs)s::int8[], %(exec_us_sum)s::int8[],
              %(exec_us_max)s::int8[], %(wait_us_sum)s::int8[], %(wait_us_max)s::int8[])
       WITH ORDINALITY AS u(minute, queue, task, completed, retried, dead, cancelled, runs,
                            exec_us_sum, exec_us_max, wait_us_sum, wait_us_max, o)
 ORDER BY u.o
ON CONFLICT (minute, queue, task) DO UPDATE SET
    completed = h.completed + EXCLUDED.completed,
    retried = h.retried + EXCLUDED.retried,
    dead = h.dead + EXCLUDED.dead,
    cancelled = h.cancelled + EXCLUDED.cancelled,
    runs = h.runs + EXCLUDED.runs,
    exec_us_sum = h.exec_us_sum + EXCLUDED.exec_us_sum,
    exec_us_max = greatest(h.exec_us_max, EXCLUDED.exec_us_max),
    exec_hist = ARRAY(SELECT a + b FROM unnest(h.exec_hist, EXCLUDED.exec_hist)
                                        WITH ORDINALITY AS x(a, b, i) ORDER BY i),
    wait_us_sum = h.wait_us_sum + EXCLUDED.wait_us_sum,
    wait_us_max = greatest(h.wait_us_max, EXCLUDED.wait_us_max),
    wait_hist = ARRAY(SELECT a + b FROM unnest(h.wait_hist, EXCLUDED.wait_hist)
                                        WITH ORDINALITY AS x(a, b, i) ORDER BY i)
"""

# Rows older than the retention, at most `limit` per statement (SKIP LOCKED: every worker
# prunes, none waits for another).
_HISTORY_PRUNE = """
WITH old AS (
    SELECT minute, queue, task FROM {history}
     WHERE minute < {now} - %(retention)s
     ORDER BY minute
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), pruned AS (
    DELETE FROM {history} h USING old
     WHERE h.minute = old.minute AND h.queue = old.queue AND h.task = old.task
    RETURNING 1
)
SELECT count(*) FROM pruned
"""

# -- the clock, the schema's version, migrations -------------------------------------------------

_CLOCK = "SELECT {now}"

_SCHEMA_EXISTS = "SELECT pg_catalog.to_regclass(%(migrations)s) IS NOT NULL"

_SCHEMA_VERSION = "SELECT coalesce(pg_catalog.max(version), 0) FROM {migrations}"

# Which of the tables a schema should have are missing (the version row can outlive them).
_MISSING_TABLES = """
SELECT t FROM pg_catalog.unnest(%(tables)s::text[]) AS t
 WHERE pg_catalog.to_regclass(
           pg_catalog.quote_ident(%(schema)s) || '.' || pg_catalog.quote_ident(t)) IS NULL
 ORDER BY t
"""

#: Whether a new transaction could write (names no table, so one for every schema).
WRITABLE = sql.SQL(
    "SELECT pg_catalog.pg_is_in_recovery(),"
    " pg_catalog.current_setting('transaction_read_only')::bool"
)

# One migrator per schema at a time, until its transaction ends.
_MIGRATE_LOCK = """
SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('trioq.migrate'),
                                        pg_catalog.hashtext(%(schema)s))
"""

# The same lock without waiting; and who holds it (to say whom `migrate` waits for).
_MIGRATE_TRY_LOCK = """
SELECT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtext('trioq.migrate'),
                                            pg_catalog.hashtext(%(schema)s))
"""
_MIGRATE_LOCK_HOLDER = """
SELECT l.pid, a.application_name, a.client_addr::text,
       extract(epoch FROM pg_catalog.now() - a.xact_start)
  FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
 WHERE l.locktype = 'advisory' AND l.granted
   AND l.classid = pg_catalog.hashtext('trioq.migrate')::oid
   AND l.objid = pg_catalog.hashtext(%(schema)s)::oid AND l.objsubid = 2
 LIMIT 1
"""

_CREATE_SCHEMA = "CREATE SCHEMA IF NOT EXISTS {schema}"

_CREATE_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS {migrations} (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT pg_catalog.now()
)
"""

# A migration file runs with the schema first on the search_path (its names are unqualified).
_MIGRATION_SEARCH_PATH = "SET LOCAL search_path TO {schema}, pg_catalog"

_RECORD_MIGRATION = "INSERT INTO {migrations} (version, name) VALUES (%(version)s, %(name)s)"

_RESET_SEARCH_PATH = "RESET search_path"


# -- results: a job's status, waiting for its end (docs/results.md) ----------------------------

# The columns of `trioq.JobStatus`, in order, for a row of jobs (`j`).
_STATUS_COLUMNS = (
    "j.id, j.state, j.queue, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.run_at, "
    "j.enqueued_at, j.finished_at, j.lease_owner, j.lease_expires_at, j.cancel_requested, "
    "j.dedup_key, j.result, j.last_error, NULL::text AS reason, NULL::text AS traceback"
)

# One snapshot: a job is in jobs or in dead_jobs (they move in one statement), or nowhere.
_JOB_STATUS = """
SELECT {status_columns} FROM {jobs} j WHERE j.id = %(id)s
UNION ALL
SELECT d.id, 'dead', d.queue, d.task, d.args, d.priority, d.attempt, d.max_attempts, NULL,
       d.enqueued_at, d.died_at, NULL, NULL, false, d.dedup_key, NULL, d.last_error, d.reason,
       d.traceback
  FROM {dead} d WHERE d.id = %(id)s
"""

# A waiter flags the job so that its end notifies (the triggers of migration 5). Only a
# job not flagged yet is written. A claim that met the row locked by this statement skipped
# it: the queue's notification, sent at this commit, makes that worker claim again.
_WAIT_FLAG = """
WITH flagged AS (
    UPDATE {jobs} SET notify_finished = true
     WHERE id = %(id)s AND state NOT IN ('done', 'cancelled') AND NOT notify_finished
    RETURNING queue, state
)
SELECT state, CASE WHEN state = 'available' THEN pg_notify(%(channel)s, queue)::text END
  FROM flagged
"""

_LISTENING = "SELECT %(channel)s::text = ANY(ARRAY(SELECT pg_listening_channels()))"

# -- retention: the pruner (docs/results.md#retention) -------------------------------------------

# One bounded batch, oldest first, rows locked by another pruner skipped. The state is a
# literal (not a parameter), so a generic plan still matches the partial index; the ids go
# through an array, so the delete probes the primary key even when a generic plan guesses
# the batch is 10% of the table (with a join it hashed the whole table instead).
_PRUNE_FINISHED = """
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

_PRUNE_DEAD = """
WITH doomed AS (
    SELECT id FROM {dead}
     WHERE died_at < {now} - %(age)s
     ORDER BY died_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
DELETE FROM {dead} WHERE id = ANY(ARRAY(SELECT id FROM doomed))
"""

# -- workflows: dependencies and batches (migration 0008_workflows.sql, docs/workflows.md) ----

# Existing jobs that new jobs will wait for, locked in id order (so enqueuers of overlapping
# dependencies never deadlock) until the enqueue commits: a dependency that ends meanwhile
# waits, then sees its new edges. Each id's state: a live or kept row's, 'dead', or
# 'unknown'; and what names it in a cancelled dependant's reason.
_DEPENDENCIES_LOCK = """
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
_DEPENDENCIES_FLAG = """
WITH flagged AS (
    UPDATE {jobs} SET has_dependants = true
     WHERE id = ANY(%(ids)s::int8[]) AND NOT has_dependants
    RETURNING queue, state
)
SELECT pg_catalog.count(pg_catalog.pg_notify(%(channel)s, q.queue))
  FROM (SELECT DISTINCT queue FROM flagged WHERE state = 'available' AND %(notify)s) AS q
"""

# Jobs of a graph (ids reserved by _RESERVE_IDS): those with dependencies wait; no dedup keys.
_INSERT_GRAPH = """
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

_INSERT_EDGES = """
INSERT INTO {deps} (job_id, depends_on)
SELECT * FROM unnest(%(jobs)s::int8[], %(depends_on)s::int8[])
"""

# Dependencies that had ended before the enqueue: resolved at once, for the new jobs only.
_RESOLVE_ENDED = """
SELECT {jobs_ended}(%(ids)s::int8[], %(outcomes)s::text[], %(tasks)s::text[],
                    %(details)s::text[], %(batches)s::int8[], %(channel)s, %(only)s::int8[])
"""

_INSERT_BATCH = """
INSERT INTO {batches} (total, pending, callback_queue, callback_task, callback_args,
                       callback_priority, callback_max_attempts, callback_concurrency_key,
                       created_at)
VALUES (%(total)s, %(total)s, %(queue)s, %(task)s, %(args)s::jsonb, %(priority)s,
        %(max_attempts)s, %(concurrency_key)s, {now})
RETURNING id
"""

_FINISH_EMPTY_BATCH = """
UPDATE {batches} SET callback_job_id = %(job_id)s, finished_at = {now} WHERE id = %(id)s
"""

_BATCH_STATUS = """
SELECT id, total, pending, succeeded, failed, cancelled, callback_task, callback_job_id,
       created_at, finished_at
  FROM {batches} WHERE id = %(id)s
"""

# A job's dependencies, with what became of each (the dependency's row, or dead_jobs).
_DEPENDENCIES = """
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
_DEPENDANTS = """
SELECT job_id FROM {deps} WHERE depends_on = %(id)s ORDER BY job_id LIMIT %(limit)s
"""

_PRUNE_BATCHES = """
WITH doomed AS (
    SELECT id FROM {batches}
     WHERE finished_at < {now} - %(age)s
     ORDER BY finished_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
DELETE FROM {batches} WHERE id = ANY(ARRAY(SELECT id FROM doomed))
"""

# -- trioq.testing: listing jobs, the earliest scheduled one, the session's clock ---------------

_LIST_JOBS = """
SELECT {status_columns} FROM {jobs} j
 WHERE j.state = ANY(%(states)s::text[])
   AND (%(task)s::text IS NULL OR j.task = %(task)s)
   AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
   AND (%(args)s::jsonb IS NULL OR j.args @> %(args)s::jsonb)
   AND (%(priority)s::int2 IS NULL OR j.priority = %(priority)s)
 ORDER BY j.id
"""

_FIRST_SCHEDULED = """
SELECT min(run_at) FROM {jobs} WHERE state = 'scheduled' AND queue = ANY(%(queues)s::text[])
"""

# Sets (or, with '', unsets) the session's `trioq.now`, which `NOW` reads.
_SET_CLOCK = "SELECT set_config('trioq.now', %(now)s, false)"


@attrs.frozen
class Statements:
    """The composed statements of one schema."""

    schema: str
    channel: str  # the LISTEN/NOTIFY channel of this schema
    insert: sql.Composed
    insert_many: sql.Composed
    reserve_ids: sql.Composed
    copy_jobs: sql.Composed
    insert_bulk: sql.Composed
    live_twins: sql.Composed
    notify: sql.Composed
    claim: sql.Composed
    heartbeat: sql.Composed
    complete: sql.Composed
    complete_keep: sql.Composed
    complete_one: sql.Composed
    complete_in_transaction: sql.Composed
    lock_one: sql.Composed
    lock_in_transaction: sql.Composed
    fail: sql.Composed
    release: sql.Composed
    cancel_running: sql.Composed
    release_unknown: sql.Composed
    cancel: sql.Composed
    sweep: sql.Composed
    reclaim: sql.Composed
    worker_register: sql.Composed
    worker_lock: sql.Composed
    worker_ping: sql.Composed
    worker_remove: sql.Composed
    workers_list: sql.Composed
    promote: sql.Composed
    next_due: sql.Composed
    status_queues: sql.Composed
    status_leases: sql.Composed
    dead_list: sql.Composed
    dead_retry: sql.Composed
    dead_purge: sql.Composed
    listen: sql.Composed
    clock: sql.Composed
    cron_last_ticks: sql.Composed
    queue_settings: sql.Composed
    change_queue: sql.Composed
    claim_limited: sql.Composed
    enqueue_unique: sql.Composed
    cron_record_tick: sql.Composed
    cron_set_job: sql.Composed
    history_upsert: sql.Composed
    history_prune: sql.Composed
    schema_exists: sql.Composed
    schema_version: sql.Composed
    missing_tables: sql.Composed
    migrate_lock: sql.Composed
    create_schema: sql.Composed
    create_migrations: sql.Composed
    migration_search_path: sql.Composed
    record_migration: sql.Composed
    reset_search_path: sql.Composed
    # results, retention, trioq.testing
    job_status: sql.Composed
    wait_flag: sql.Composed
    listening: sql.Composed
    unlisten: sql.Composed
    prune_done: sql.Composed
    prune_cancelled: sql.Composed
    prune_dead: sql.Composed
    list_jobs: sql.Composed
    first_scheduled: sql.Composed
    set_clock: sql.Composed
    # workflows
    dependencies_lock: sql.Composed
    dependencies_flag: sql.Composed
    insert_graph: sql.Composed
    insert_edges: sql.Composed
    resolve_ended: sql.Composed
    insert_batch: sql.Composed
    finish_empty_batch: sql.Composed
    batch_status: sql.Composed
    dependencies: sql.Composed
    dependants: sql.Composed
    prune_batches: sql.Composed
    migrate_try_lock: sql.Composed
    migrate_lock_holder: sql.Composed

    @property
    def lock_space(self) -> str:
        """The first key of every worker's liveness lock (the second is its id)."""
        return f"trioq.worker:{self.schema}"

    def schema_exists_params(self) -> dict[str, str]:
        """`schema_exists` looks the bookkeeping table up by its (qualified) name."""
        return {"migrations": f"{self.schema}.migrations"}


@functools.cache
def claim_query(schema: str) -> bytes:
    """The claim statement, rendered once.

    psycopg renders a `sql.Composed` again on every execute (~11 µs); the claim
    runs once per batch of jobs, so it is handed over as bytes instead.
    """
    return statements(schema).claim.as_bytes(None)


@functools.cache
def rendered(schema: str, name: str, *, traced: bool = False) -> bytes:
    """The statement ``name`` of `Statements` (``traced``: of the traced set), rendered
    once (see `claim_query`): for the statements that run once per job (enqueue,
    heartbeat, complete, fail, release). psycopg renders an `sql.Composed` on every
    execute (about 40 µs for the insert); bytes it converts once and caches, and prepares
    after a few executions like any other query."""
    statement = getattr(statements(schema, traced=traced), name)
    assert isinstance(statement, sql.Composed)
    return statement.as_bytes(None)


@functools.cache
def statements(schema: str, *, traced: bool = False) -> Statements:
    """All statements for ``schema`` (validated), composed once and cached.

    ``traced``: the inserting statements (insert, insert_many, insert_bulk, copy_jobs) also
    write ``trace_context`` (``%(trace)s``, or the last COPY field): what an enqueue runs
    while an OpenTelemetry span is current (`trioq._worker.tracing`).
    """
    channel = f"trioq_{schema}"
    names = {
        "schema": sql.Identifier(validate_schema_name(schema)),
        "jobs": qualified(schema, "jobs"),
        "dead": qualified(schema, "dead_jobs"),
        "ticks": qualified(schema, "cron_ticks"),
        "history": qualified(schema, "job_history"),
        "migrations": qualified(schema, "migrations"),
        "workers": qualified(schema, "workers"),
        "queues": qualified(schema, "queues"),
        "rate_starts": qualified(schema, "rate_starts"),
        "claim_limited": qualified(schema, "claim_limited"),
        "enqueue_unique": qualified(schema, "enqueue_unique"),
        "deps": qualified(schema, "job_dependencies"),
        "batches": qualified(schema, "batches"),
        "jobs_ended": qualified(schema, "jobs_ended"),
        "lease_lost": qualified(schema, "lease_lost"),
        "channel": sql.Identifier(channel),
        "now": sql.SQL(NOW),
        "live": sql.SQL(_LIVE),
        "fence": sql.SQL(_FENCE),
        "fence_by_id": sql.SQL(_FENCE_BY_ID),
        "job_columns": sql.SQL(_JOB_COLUMNS),
        "trace_column": sql.SQL(", trace_context" if traced else ""),
        "trace_value": sql.SQL(", %(trace)s::jsonb" if traced else ""),
        "status_columns": sql.SQL(_STATUS_COLUMNS),
    }

    def compose(text: str, **more: sql.Composable) -> sql.Composed:
        return sql.SQL(text.strip()).format(**names, **more)

    return Statements(
        schema=schema,
        channel=channel,
        insert=compose(_INSERT),
        insert_many=compose(_INSERT_MANY),
        reserve_ids=compose(_RESERVE_IDS),
        copy_jobs=compose(_COPY_JOBS),
        insert_bulk=compose(_INSERT_BULK),
        live_twins=compose(_LIVE_TWINS),
        notify=compose(_NOTIFY),
        claim=compose(_CLAIM),
        heartbeat=compose(_HEARTBEAT),
        complete=compose(_COMPLETE),
        complete_one=compose(_COMPLETE_ONE),
        complete_in_transaction=compose(_COMPLETE_IN_TRANSACTION),
        lock_one=compose(_LOCK_ONE),
        lock_in_transaction=compose(_LOCK_IN_TRANSACTION),
        complete_keep=compose(_COMPLETE_KEEP),
        fail=compose(_FAIL),
        release=compose(_RELEASE),
        cancel_running=compose(_CANCEL_RUNNING),
        release_unknown=compose(_RELEASE_UNKNOWN),
        cancel=compose(_CANCEL),
        sweep=compose(_SWEEP_EXPIRED + _SWEEP_OUTCOMES),
        reclaim=compose(_RECLAIM_EXPIRED + _SWEEP_OUTCOMES),
        worker_register=compose(_WORKER_REGISTER),
        worker_lock=compose(_WORKER_LOCK),
        worker_ping=compose(_WORKER_PING),
        worker_remove=compose(_WORKER_REMOVE),
        workers_list=compose(_WORKERS_LIST),
        promote=compose(_PROMOTE),
        next_due=compose(_NEXT_DUE),
        status_queues=compose(_STATUS_QUEUES),
        status_leases=compose(_STATUS_LEASES),
        dead_list=compose(_DEAD_LIST),
        dead_retry=compose(_DEAD_RETRY),
        dead_purge=compose(_DEAD_PURGE),
        listen=compose("LISTEN {channel}"),
        clock=compose(_CLOCK),
        cron_last_ticks=compose(_CRON_LAST_TICKS),
        queue_settings=compose(_QUEUE_SETTINGS),
        change_queue=compose(_CHANGE_QUEUE),
        claim_limited=compose(_CLAIM_LIMITED),
        enqueue_unique=compose(_ENQUEUE_UNIQUE),
        cron_record_tick=compose(_CRON_RECORD_TICK),
        cron_set_job=compose(_CRON_SET_JOB),
        history_upsert=compose(_HISTORY_UPSERT),
        history_prune=compose(_HISTORY_PRUNE),
        schema_exists=compose(_SCHEMA_EXISTS),
        schema_version=compose(_SCHEMA_VERSION),
        missing_tables=compose(_MISSING_TABLES),
        migrate_lock=compose(_MIGRATE_LOCK),
        create_schema=compose(_CREATE_SCHEMA),
        create_migrations=compose(_CREATE_MIGRATIONS),
        migration_search_path=compose(_MIGRATION_SEARCH_PATH),
        record_migration=compose(_RECORD_MIGRATION),
        reset_search_path=compose(_RESET_SEARCH_PATH),
        job_status=compose(_JOB_STATUS),
        wait_flag=compose(_WAIT_FLAG),
        listening=compose(_LISTENING),
        unlisten=compose("UNLISTEN {channel}"),
        prune_done=compose(_PRUNE_FINISHED, state=sql.Literal("done")),
        prune_cancelled=compose(_PRUNE_FINISHED, state=sql.Literal("cancelled")),
        prune_dead=compose(_PRUNE_DEAD),
        list_jobs=compose(_LIST_JOBS),
        first_scheduled=compose(_FIRST_SCHEDULED),
        set_clock=compose(_SET_CLOCK),
        dependencies_lock=compose(_DEPENDENCIES_LOCK),
        dependencies_flag=compose(_DEPENDENCIES_FLAG),
        insert_graph=compose(_INSERT_GRAPH),
        insert_edges=compose(_INSERT_EDGES),
        resolve_ended=compose(_RESOLVE_ENDED),
        insert_batch=compose(_INSERT_BATCH),
        finish_empty_batch=compose(_FINISH_EMPTY_BATCH),
        batch_status=compose(_BATCH_STATUS),
        dependencies=compose(_DEPENDENCIES),
        dependants=compose(_DEPENDANTS),
        prune_batches=compose(_PRUNE_BATCHES),
        migrate_try_lock=compose(_MIGRATE_TRY_LOCK),
        migrate_lock_holder=compose(_MIGRATE_LOCK_HOLDER),
    )
