"""Every SQL statement the library runs, in one place.

Statements are composed once per schema with ``psycopg.sql`` (the schema name
is a validated identifier, never text); everything else is a parameter. Times
come from `NOW`, which is the transaction's ``now()`` unless the session sets
``trioq.now`` (tests use it to move the clock without sleeping).

Every write after the claim is fenced by id, attempt and lease owner, so a
worker whose lease was reclaimed changes nothing.

The rest of the library runs only what `statements` returns. The exceptions
are not about trioq's tables: the Postgres layer's health check (``SELECT 1``
in `trioq._pool`), and the embedded server's ``CREATE DATABASE`` (before any
schema exists). The tools keep their own (the load tester's ledger, the demo's
counts).
"""

from __future__ import annotations

import functools
import re

import attrs
from psycopg import sql

__all__ = [
    "NOW",
    "QUEUES_PAYLOAD",
    "SCHEDULED_PAYLOAD",
    "SCHEMA_NAME_RE",
    "WRITABLE",
    "Statements",
    "qualified",
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
NOW = "coalesce(nullif(current_setting('trioq.now', true), '')::timestamptz, now())"

_LIVE = "('scheduled', 'available', 'running')"

#: Notification payload for a job enqueued for later: wakes schedulers, not fetchers.
#: (Queue names cannot contain '@'.)
SCHEDULED_PAYLOAD = "@scheduled"
#: Notification payload when a queue's settings changed (paused, resumed, limits).
QUEUES_PAYLOAD = "@queues"

# Columns a worker needs of a claimed job, in `Job.COLUMNS` order. They are the cheapest
# types for psycopg to decode: args as JSON text (trioq runs json.loads on it: psycopg's
# jsonb loader costs ~4 µs more per row), times as int8 microseconds since the Unix epoch
# (`Job` makes datetimes of them when asked; most handlers never ask).
_JOB_COLUMNS = (
    "j.id, j.queue, j.task, j.args::text AS args, j.priority, {epoch_us_run_at} AS run_at, "
    "j.attempt, j.max_attempts, {epoch_us_enqueued_at} AS enqueued_at, "
    "{epoch_us_lease_expires_at} AS lease_expires_at"
).format(
    **{
        # date_part is float8: exact to the µs within 285 years of 1970 (a claimed job's times
        # are about now, unless run_at was set centuries back: then a few µs off);
        # extract is numeric, which costs Postgres twice as much
        f"epoch_us_{c}": f"(date_part('epoch', j.{c}) * 1000000)::int8"
        for c in ("run_at", "enqueued_at", "lease_expires_at")
    }
)

_INSERT = """
WITH v AS (
    SELECT coalesce(%(run_at)s, {now} + %(delay)s) AS run_at
), ins AS (
    INSERT INTO {jobs} (queue, task, args, priority, run_at, state, max_attempts, dedup_key,
                        concurrency_key)
    SELECT %(queue)s, %(task)s, %(args)s::jsonb, %(priority)s, v.run_at,
           CASE WHEN v.run_at > {now} THEN 'scheduled' ELSE 'available' END,
           %(max_attempts)s, %(dedup_key)s, %(concurrency_key)s
      FROM v
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL AND state IN {live} DO NOTHING
    RETURNING id, queue, state
)
SELECT id, CASE WHEN %(notify)s THEN pg_notify(
           %(channel)s, CASE WHEN state = 'scheduled' THEN '@scheduled' ELSE queue END)::text
       END
  FROM ins
"""

# Rows carry ids reserved with _RESERVE_IDS, so the caller knows which spec got which id.
_INSERT_MANY = """
INSERT INTO {jobs} (id, queue, task, args, priority, run_at, state, max_attempts, dedup_key,
                    concurrency_key)
SELECT i, q, t, a::jsonb, p, r, CASE WHEN r > {now} THEN 'scheduled' ELSE 'available' END, m, k,
       ck
  FROM unnest(%(ids)s::int8[], %(queues)s::text[], %(tasks)s::text[], %(args)s::text[],
              %(priorities)s::int2[], %(run_ats)s::timestamptz[], %(max_attempts)s::int4[],
              %(dedup_keys)s::text[], %(concurrency_keys)s::text[]) AS u(i, q, t, a, p, r, m, k, ck)
ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL AND state IN {live} DO NOTHING
RETURNING id
"""

# The sequence is looked up once (MATERIALIZED), not once per reserved id.
_RESERVE_IDS = """
WITH s AS MATERIALIZED (SELECT pg_get_serial_sequence(%(jobs)s, 'id') AS seq)
SELECT {now}, array_agg(nextval(s.seq))
  FROM s, generate_series(1, %(n)s)
"""

_COPY_JOBS = """
COPY {jobs} (id, queue, task, args, priority, run_at, state, max_attempts) FROM STDIN
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
    SELECT pg_get_serial_sequence(%(jobs)s, 'id')::regclass AS seq
), a AS MATERIALIZED (
    SELECT nextval(s.seq) AS id, x.args, x.o
      FROM s, jsonb_array_elements(%(args)s::jsonb) WITH ORDINALITY AS x(args, o)
), ins AS (
    INSERT INTO {jobs} (id, queue, task, args, priority, run_at, state, max_attempts)
    SELECT a.id, %(queue)s, %(task)s, a.args, %(priority)s, v.run_at,
           CASE WHEN v.run_at > v.now THEN 'scheduled' ELSE 'available' END, %(max_attempts)s
      FROM a, v
)
SELECT count(*), min(a.id - a.o),
       CASE WHEN min(a.id - a.o) <> max(a.id - a.o)
            THEN (SELECT array_agg(id ORDER BY o) FROM a) END,
       (SELECT count(pg_notify(%(channel)s,
                               CASE WHEN v.run_at > v.now THEN '@scheduled' ELSE %(queue)s END))
          FROM v WHERE %(notify)s)
  FROM a
"""

_LIVE_TWINS = """
SELECT dedup_key, id FROM {jobs} WHERE dedup_key = ANY(%(keys)s) AND state IN {live}
"""

_NOTIFY = "SELECT pg_notify(%(channel)s, q) FROM unnest(%(queues)s::text[]) AS q"

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
  FROM c
 WHERE j.id = c.id
RETURNING {job_columns}
"""

_FENCE = (
    "j.id = f.id AND j.attempt = f.attempt AND j.lease_owner = %(owner)s AND j.state = 'running'"
)

_HEARTBEAT = """
UPDATE {jobs} j SET lease_expires_at = {now} + %(lease)s
  FROM unnest(%(ids)s::int8[], %(attempts)s::int4[]) AS f(id, attempt)
 WHERE {fence}
RETURNING j.id, j.attempt, j.cancel_requested
"""

_COMPLETE = """
DELETE FROM {jobs} j
 USING unnest(%(ids)s::int8[], %(attempts)s::int4[]) AS f(id, attempt)
 WHERE {fence}
RETURNING j.id
"""

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
                         %(errors)s::text[], %(tracebacks)s::text[], %(fatal)s::bool[])
           AS f(id, attempt, delay, error, traceback, fatal)
), target AS (
    SELECT j.id, (f.fatal OR j.attempt >= j.max_attempts) AS dies,
           f.delay, f.error, f.traceback, f.fatal
      FROM {jobs} j JOIN f ON {fence}
       FOR UPDATE OF j
), died AS (
    DELETE FROM {jobs} j USING target t WHERE j.id = t.id AND t.dies
    RETURNING j.*, t.error AS error, t.traceback AS traceback,
              CASE WHEN t.fatal THEN 'fatal error' ELSE 'attempts exhausted' END AS reason
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

# A running job whose cancellation was requested and whose handler was stopped.
_CANCEL_RUNNING = """
UPDATE {jobs} j
   SET state = 'cancelled', finished_at = {now}, lease_owner = NULL, lease_expires_at = NULL
  FROM unnest(%(ids)s::int8[], %(attempts)s::int4[]) AS f(id, attempt)
 WHERE {fence}
RETURNING j.id
"""

_CANCEL = """
WITH now_cancelled AS (
    UPDATE {jobs} SET state = 'cancelled', finished_at = {now}
     WHERE id = %(id)s AND state IN ('scheduled', 'available')
    RETURNING id
), flagged AS (
    UPDATE {jobs} SET cancel_requested = true
     WHERE id = %(id)s AND state = 'running'
    RETURNING id
)
SELECT (SELECT count(*) FROM now_cancelled), (SELECT count(*) FROM flagged)
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
SELECT queue, CASE WHEN %(notify)s THEN pg_notify(%(channel)s, queue)::text END
  FROM (SELECT DISTINCT queue FROM promoted) AS q
"""

_NEXT_DUE = """
SELECT min(run_at) - {now} FROM {jobs} WHERE state = 'scheduled'
"""

# Expired leases: back to available (the attempt stays spent), or dead on the last attempt.
_SWEEP = """
WITH expired AS (
    SELECT id, attempt >= max_attempts OR cancel_requested AS final, cancel_requested
      FROM {jobs}
     WHERE state = 'running' AND lease_expires_at < {now}
     ORDER BY lease_expires_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), died AS (
    DELETE FROM {jobs} j USING expired e
     WHERE j.id = e.id AND e.final AND NOT e.cancel_requested
    RETURNING j.*
), buried AS (
    INSERT INTO {dead} (id, queue, task, args, priority, attempt, max_attempts, dedup_key,
                        reason, last_error, enqueued_at, died_at, concurrency_key)
    SELECT id, queue, task, args, priority, attempt, max_attempts, dedup_key,
           'lease expired on the last attempt', 'lease expired: worker lost', enqueued_at, {now},
           concurrency_key
      FROM died
    RETURNING id
), cancelled AS (
    UPDATE {jobs} j
       SET state = 'cancelled', finished_at = {now}, lease_owner = NULL, lease_expires_at = NULL
      FROM expired e
     WHERE j.id = e.id AND e.cancel_requested
    RETURNING j.id
), returned AS (
    UPDATE {jobs} j
       SET state = 'available', run_at = {now}, last_error = 'lease expired: worker lost',
           lease_owner = NULL, lease_expires_at = NULL
      FROM expired e
     WHERE j.id = e.id AND NOT e.final
    RETURNING j.id
)
SELECT id, 'dead' FROM buried
UNION ALL SELECT id, 'cancelled' FROM cancelled
UNION ALL SELECT id, 'available' FROM returned
"""

# Per queue: how many jobs in each live state, dead, and how long the oldest due one waits.
_STATUS_QUEUES = """
WITH live AS (
    SELECT queue,
           count(*) FILTER (WHERE state = 'available') AS available,
           count(*) FILTER (WHERE state = 'scheduled') AS scheduled,
           count(*) FILTER (WHERE state = 'running') AS running,
           extract(epoch FROM {now} - min(run_at) FILTER (WHERE state = 'available'))
               AS oldest_wait
      FROM {jobs} WHERE state IN {live} GROUP BY queue
), dead AS (
    SELECT queue, count(*) AS dead FROM {dead} GROUP BY queue
)
SELECT coalesce(l.queue, d.queue), coalesce(l.available, 0), coalesce(l.scheduled, 0),
       coalesce(l.running, 0), coalesce(d.dead, 0), l.oldest_wait
  FROM live l FULL JOIN dead d ON d.queue = l.queue
 ORDER BY 1
"""

# Live leases per worker.
_STATUS_LEASES = """
SELECT lease_owner, count(*), min(lease_expires_at) - {now}
  FROM {jobs} WHERE state = 'running' GROUP BY lease_owner ORDER BY lease_owner
"""

_DEAD_LIST = """
SELECT id, queue, task, args, priority, attempt, max_attempts, dedup_key, reason,
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
RETURNING id
"""

# -- flow control: queue settings, the limited claim, unique windows (0002, docs/flow-control.md)

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
SELECT name, max(tick) FROM {ticks} WHERE name = ANY(%(names)s::text[]) GROUP BY name
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

# -- the clock, the schema's version, migrations -------------------------------------------------

_CLOCK = "SELECT {now}"

_SCHEMA_EXISTS = "SELECT to_regclass(%(migrations)s) IS NOT NULL"

_SCHEMA_VERSION = "SELECT coalesce(max(version), 0) FROM {migrations}"

#: Whether a new transaction could write (names no table, so one for every schema).
WRITABLE = sql.SQL("SELECT pg_is_in_recovery(), current_setting('transaction_read_only')::bool")

# One migrator per schema at a time, until its transaction ends.
_MIGRATE_LOCK = "SELECT pg_advisory_xact_lock(hashtext('trioq.migrate'), hashtext(%(schema)s))"

_CREATE_SCHEMA = "CREATE SCHEMA IF NOT EXISTS {schema}"

_CREATE_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS {migrations} (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""

# A migration file runs with the schema first on the search_path (its names are unqualified).
_MIGRATION_SEARCH_PATH = "SET LOCAL search_path TO {schema}, pg_catalog"

_RECORD_MIGRATION = "INSERT INTO {migrations} (version, name) VALUES (%(version)s, %(name)s)"

_RESET_SEARCH_PATH = "RESET search_path"


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
    fail: sql.Composed
    release: sql.Composed
    cancel_running: sql.Composed
    cancel: sql.Composed
    sweep: sql.Composed
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
    schema_exists: sql.Composed
    schema_version: sql.Composed
    migrate_lock: sql.Composed
    create_schema: sql.Composed
    create_migrations: sql.Composed
    migration_search_path: sql.Composed
    record_migration: sql.Composed
    reset_search_path: sql.Composed

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
def statements(schema: str) -> Statements:
    """All statements for ``schema`` (validated), composed once and cached."""
    channel = f"trioq_{schema}"
    names = {
        "schema": sql.Identifier(validate_schema_name(schema)),
        "jobs": qualified(schema, "jobs"),
        "dead": qualified(schema, "dead_jobs"),
        "ticks": qualified(schema, "cron_ticks"),
        "migrations": qualified(schema, "migrations"),
        "queues": qualified(schema, "queues"),
        "rate_starts": qualified(schema, "rate_starts"),
        "claim_limited": qualified(schema, "claim_limited"),
        "enqueue_unique": qualified(schema, "enqueue_unique"),
        "channel": sql.Identifier(channel),
        "now": sql.SQL(NOW),
        "live": sql.SQL(_LIVE),
        "fence": sql.SQL(_FENCE),
        "job_columns": sql.SQL(_JOB_COLUMNS),
    }

    def compose(text: str) -> sql.Composed:
        return sql.SQL(text.strip()).format(**names)

    return Statements(
        schema=schema,
        channel=channel,
        insert=compose(_INSERT),
        insert_many=compose(_INSERT_MANY),
        reserve_ids=compose(_RESERVE_IDS),
        copy_jobs=compose(_COPY_JOBS),
        insert_bulk=compose(_INSERT_BULK),
        live_twins=compose(_LIVE_TWINS),
        notify=sql.SQL(_NOTIFY).format(),
        claim=compose(_CLAIM),
        heartbeat=compose(_HEARTBEAT),
        complete=compose(_COMPLETE),
        complete_keep=compose(_COMPLETE_KEEP),
        fail=compose(_FAIL),
        release=compose(_RELEASE),
        cancel_running=compose(_CANCEL_RUNNING),
        cancel=compose(_CANCEL),
        sweep=compose(_SWEEP),
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
        schema_exists=compose(_SCHEMA_EXISTS),
        schema_version=compose(_SCHEMA_VERSION),
        migrate_lock=compose(_MIGRATE_LOCK),
        create_schema=compose(_CREATE_SCHEMA),
        create_migrations=compose(_CREATE_MIGRATIONS),
        migration_search_path=compose(_MIGRATION_SEARCH_PATH),
        record_migration=compose(_RECORD_MIGRATION),
        reset_search_path=compose(_RESET_SEARCH_PATH),
    )
