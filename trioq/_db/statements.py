"""Every SQL statement trioq runs, composed in one place.

The text of each statement is written once, in the module of its domain under
``trioq/_db/sql/`` (as River keeps its queries by table in ``dbsqlc/*.sql``): what gets
rows in (``enqueue``), the claim and the fenced writes on leased jobs (``leases``), the
sweeps and retention (``maintenance``), one job and its result (``jobs``), counts and
depths (``status``), the job lists of the dashboard and the CLI (``lists``), dead letters,
queue settings, workers, cron, the job history, workflows, and the schema's version and
migrations (``schema``); ``common`` has the fragments several of them share. This module
composes them: `Statements` names each statement on one line (`Statement`), and composes
it for a schema the first time it is read. Adding a statement is its text in its domain
and one line here.

Statements are composed with ``psycopg.sql`` (the schema name is a validated identifier,
never text); everything else is a parameter. Times come from ``NOW``, which is the
transaction's ``now()`` unless the session sets ``trioq.now`` (tests use it to move the
clock without sleeping).

Every write after the claim is fenced by id, attempt and lease owner, so a worker whose
lease was reclaimed changes nothing.

Every function call is qualified (``pg_catalog.now()``): statements also run on the
caller's connection, whose ``search_path`` may put another schema before ``pg_catalog``,
and a function of the same name there must not change what trioq does. (``unnest`` of
several arrays is syntax that Postgres resolves in pg_catalog itself; types and operators
still follow the ``search_path``: ``docs/security.md``.)

The library and its dashboard run only what `statements` returns. The exceptions are not
about trioq's tables: the Postgres layer's health check (``SELECT 1`` in
`trioq._pg.pool`), and the embedded server's ``CREATE DATABASE`` (before any schema
exists). The other tools keep their own (the load tester's ledger, the demo's counts).
Two statements of the database's own live in the migrations, which are history and never
change: the limited claim and the windowed unique insert (PL/pgSQL functions of migration
6, which `Statements.claim_limited` and `Statements.enqueue_unique` call; the session
reset of migration 13 is a third, `Statements.reset_session`); the limited
claim returns the columns of `trioq.Job` by the same names as `Statements.claim`
(``tests/test_layout.py`` checks both).
"""

from __future__ import annotations

import functools
import re
from typing import Any, overload

from psycopg import sql

from .._job import CLAIMED_COLUMNS
from .._rules import name
from .sql import (
    common,
    cron,
    dead,
    durable,
    enqueue,
    history,
    jobs,
    leases,
    lists,
    maintenance,
    queues,
    schema,
    status,
    workers,
    workflows,
)
from .sql.common import (
    CANCEL_PAYLOAD,
    LEASE_LOST_SQLSTATE,
    NOW,
    QUEUES_PAYLOAD,
    SCHEDULED_PAYLOAD,
)

__all__ = [
    "CANCEL_PAYLOAD",
    "CLEAR_CLOCK",
    "GENERIC_PLANS",
    "LEASE_LOST_SQLSTATE",
    "NOW",
    "QUEUES_PAYLOAD",
    "SCHEDULED_PAYLOAD",
    "SCHEMA_NAME_RE",
    "WRITABLE",
    "Statement",
    "Statements",
    "qualified",
    "rendered",
    "session_reset",
    "statements",
    "validate_schema_name",
]

#: Lower-case identifiers only: they need no quoting in psql and cannot smuggle anything.
#: Matched with ``fullmatch``: ``match`` would also accept a trailing newline (``$``).
SCHEMA_NAME_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")


#: Whether a new transaction could write (names no table, so one for every schema).
WRITABLE = sql.SQL(schema.WRITABLE)
#: The session's ``trioq.now`` unset, as a command to defer (no table, no parameter).
CLEAR_CLOCK = jobs.CLEAR_CLOCK.encode()
#: The session plans prepared statements once (the worker's own pool, direct connections).
GENERIC_PLANS = jobs.GENERIC_PLANS.encode()


def session_reset(schema: str) -> tuple[bytes, ...]:
    """The reset of a connection of the worker's app pool before each of its users, for
    ``schema`` (``trioq/_db/sql/jobs.py``, ``RESET_SESSION``)."""
    reset = rendered(schema, "reset_session")
    return (jobs.RESET_ROLE.encode(), jobs.RESET_SETTINGS.encode(), reset)


def validate_schema_name(schema: str, field: str = "schema") -> str:
    """``schema`` if it is a valid trioq schema name; else TypeError or ValueError."""
    return name(schema, f"{field} name", SCHEMA_NAME_RE, "1-63 lower-case letters, digits and "
                "underscores, not starting with a digit")  # fmt: skip


def qualified(schema: str, name: str) -> sql.Identifier:
    """``"schema"."name"`` as a composable identifier."""
    return sql.Identifier(validate_schema_name(schema), name)


#: The tables and functions of a schema, by the name the statements give them in braces.
_OBJECTS = {
    "jobs": "jobs",
    "dead": "dead_jobs",
    "ticks": "cron_ticks",
    "cron_entries": "cron_entries",
    "history": "job_history",
    "migrations": "migrations",
    "workers": "workers",
    "queues": "queues",
    "rate_starts": "rate_starts",
    "deps": "job_dependencies",
    "batches": "batches",
    "steps": "job_steps",
    "signals": "job_signals",
    "claim_limited": "claim_limited",
    "enqueue_unique": "enqueue_unique",
    "jobs_ended": "jobs_ended",
    "lease_lost": "lease_lost",
    "epoch_us": "epoch_us",
    "reset_session": "reset_session",
    "sequences": "sequences",
    "sequence_advance": "sequence_advance",
}

#: The claim's RETURNING columns, by the names of `trioq.Job`'s row (`CLAIMED_COLUMNS`).
_JOB_COLUMNS = ", ".join(
    expression if expression == f"j.{name}" else f"{expression} AS {name}"
    for name, expression in common.CLAIMED.items()
)
assert tuple(common.CLAIMED) == CLAIMED_COLUMNS, "the claim's columns are Job's row"

#: Fragments of text the statements share, by the name they give them in braces (a fragment
#: may name the schema's objects in braces too).
_FRAGMENTS = {
    "now": NOW,
    "live": common.LIVE,
    "pause_ended": common.PAUSE_ENDED,
    "pause_over": common.PAUSE_OVER,
    "fence": common.FENCE,
    "fence_by_id": common.FENCE_BY_ID,
    "fence_one": common.FENCE_ONE,
    "lost_unless_all": common.LOST_UNLESS_ALL.strip(),
    "lost_unless_one": common.LOST_UNLESS_ONE.strip(),
    "job_columns": _JOB_COLUMNS,
    "status_columns": common.STATUS_COLUMNS,
    "dead_progress": common.PROGRESS_COLUMNS.replace("{row}", "d"),
    "job_row": lists.JOB_ROW,
    "dead_row": lists.DEAD_ROW,
    "filters": lists.FILTERS,
    "exec_sums": history.bucket_sums("exec_hist"),
    "wait_sums": history.bucket_sums("wait_hist"),
}


class Statement:
    """One statement of `Statements`: its text (from ``trioq/_db/sql/``), composed for the
    schema of the `Statements` it is read from, once (the result is kept on the instance).
    ``parts`` fill braces of the text that are not among the shared names: a `sql.Composable`,
    or the name of one of the schema's objects (``table="dead"``)."""

    def __init__(self, text: str, /, **parts: sql.Composable | str) -> None:
        self.text = text.strip()
        self.parts = parts
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> Statement: ...
    @overload
    def __get__(self, obj: Statements, owner: type) -> sql.Composed: ...
    def __get__(self, obj: Statements | None, owner: type) -> Statement | sql.Composed:
        if obj is None:
            return self
        composed = obj.compose(self.text, **self.parts)
        obj.__dict__[self.name] = composed  # read once: the instance attribute wins from now
        return composed


class Statements:
    """The statements of one schema, each composed when first read (`statements` keeps one
    instance per schema). ``traced``: the inserting statements (insert, insert_many,
    insert_bulk, copy_jobs) also write ``trace_context`` (``%(trace)s``, or the last COPY
    field): what an enqueue runs while an OpenTelemetry span is current."""

    def __init__(self, schema: str, *, traced: bool = False) -> None:
        self.schema = validate_schema_name(schema)
        self.traced = traced
        #: The LISTEN/NOTIFY channel of this schema.
        self.channel = f"trioq_{schema}"
        #: The first key of every worker's liveness lock (the second is its id).
        self.lock_space = f"trioq.worker:{schema}"
        objects: dict[str, sql.Composable] = {
            "schema": sql.Identifier(schema),
            "channel": sql.Identifier(self.channel),
            **{key: qualified(schema, table) for key, table in _OBJECTS.items()},
        }
        self._names: dict[str, sql.Composable] = {
            **objects,
            **{key: sql.SQL(text).format(**objects) for key, text in _FRAGMENTS.items()},
            "trace_column": sql.SQL(", trace_context" if traced else ""),
            "trace_value": sql.SQL(", %(trace)s::jsonb" if traced else ""),
        }

    def __repr__(self) -> str:
        return f"Statements({self.schema!r}, traced={self.traced})"

    def compose(self, text: str, **parts: sql.Composable | str) -> sql.Composed:
        """``text`` with its braces filled: the shared names, then ``parts`` (a string part
        names one of the schema's objects)."""
        given = {k: self._names[v] if isinstance(v, str) else v for k, v in parts.items()}
        return sql.SQL(text).format(**self._names, **given)

    def replaced(self, **statements: sql.Composable | str) -> Statements:
        """A copy in which the named statements are these (benchmarks try variants)."""
        copy = Statements(self.schema, traced=self.traced)
        unknown = set(statements) - set(names())
        if unknown:
            raise TypeError(f"no such statements: {sorted(unknown)}")
        copy.__dict__.update(statements)
        return copy

    def schema_exists_params(self) -> dict[str, str]:
        """`schema_exists` looks the bookkeeping table up by its (qualified) name."""
        return {"migrations": f"{self.schema}.migrations"}

    # -- enqueue: every way rows get in (trioq._db.insert) --------------------------------------
    insert = Statement(enqueue.INSERT)
    insert_many = Statement(enqueue.INSERT_MANY)
    reserve_ids = Statement(enqueue.RESERVE_IDS)
    copy_jobs = Statement(enqueue.COPY_JOBS)
    insert_bulk = Statement(enqueue.INSERT_BULK)
    live_twins = Statement(enqueue.LIVE_TWINS)
    notify = Statement(enqueue.NOTIFY)
    enqueue_unique = Statement(enqueue.ENQUEUE_UNIQUE)
    set_start_by = Statement(enqueue.SET_START_BY)
    set_cost = Statement(enqueue.SET_COST)
    debounce = Statement(enqueue.DEBOUNCE)
    # -- the claim and the fenced writes on leased jobs (trioq._db.driver) ----------------------
    claim = Statement(leases.CLAIM)
    claim_weighted = Statement(leases.CLAIM_WEIGHTED)
    claim_limited = Statement(leases.CLAIM_LIMITED)
    resolve_cost = Statement(leases.RESOLVE_COST)
    heartbeat = Statement(leases.HEARTBEAT)
    complete = Statement(leases.COMPLETE)
    complete_keep = Statement(leases.COMPLETE_KEEP)
    complete_in_transaction = Statement(leases.COMPLETE_IN_TRANSACTION)
    complete_one = Statement(leases.COMPLETE_ONE)
    lock_one = Statement(leases.LOCK_ONE)
    lock_in_transaction = Statement(leases.LOCK_IN_TRANSACTION)
    lock_member = Statement(leases.LOCK_MEMBER)
    fail = Statement(leases.FAIL)
    resolve_max_attempts = Statement(leases.RESOLVE_MAX_ATTEMPTS)
    release = Statement(leases.RELEASE)
    release_unknown = Statement(leases.RELEASE_UNKNOWN)
    cancel_running = Statement(leases.CANCEL_RUNNING)
    progress = Statement(leases.PROGRESS)
    # -- maintenance: due jobs, expired leases, dead workers, retention --------------------------
    promote = Statement(maintenance.PROMOTE)
    age = Statement(maintenance.AGE)
    next_due = Statement(maintenance.NEXT_DUE)
    sweep = Statement(maintenance.SWEEP_EXPIRED + maintenance.SWEEP_OUTCOMES)
    reclaim = Statement(
        maintenance.RECLAIM_EXPIRED + maintenance.SWEEP_OUTCOMES + maintenance.FLEET_ROW
    )
    expire_start_by = Statement(maintenance.EXPIRE_START_BY)
    swept_details = Statement(maintenance.SWEPT_DETAILS)
    prune_done = Statement(maintenance.PRUNE_FINISHED, state=sql.Literal("done"))
    prune_cancelled = Statement(maintenance.PRUNE_FINISHED, state=sql.Literal("cancelled"))
    prune_dead = Statement(maintenance.PRUNE_ENDED, table="dead", ended=sql.Identifier("died_at"))
    vacuum_look = Statement(maintenance.VACUUM_LOOK)
    vacuum_jobs = Statement(maintenance.VACUUM_JOBS)
    # -- workers: registration, the liveness lock, pings -----------------------------------------
    worker_register = Statement(workers.WORKER_REGISTER)
    worker_lock = Statement(workers.WORKER_LOCK)
    worker_ping = Statement(workers.WORKER_PING)
    worker_remove = Statement(workers.WORKER_REMOVE)
    workers_list = Statement(workers.WORKERS_LIST)
    # -- one job: cancel, status, its result, the clock, trioq.testing --------------------------
    cancel = Statement(jobs.CANCEL)
    clock = Statement(jobs.CLOCK)
    reset_session = Statement(jobs.RESET_SESSION)
    clock_epoch = Statement(jobs.CLOCK_EPOCH)
    set_clock = Statement(jobs.SET_CLOCK)
    job_status = Statement(jobs.JOB_STATUS)
    wait_flag = Statement(jobs.WAIT_FLAG)
    listen = Statement("LISTEN {channel}")
    unlisten = Statement("UNLISTEN {channel}")
    listening = Statement(jobs.LISTENING)
    list_jobs = Statement(jobs.LIST_JOBS)
    first_scheduled = Statement(jobs.FIRST_SCHEDULED)
    job = Statement(jobs.JOB)
    job_progress = Statement(jobs.JOB_PROGRESS)
    # -- counts: queue status, the depth sample (metrics, CLI, dashboard) ------------------------
    status_queues = Statement(status.STATUS_QUEUES)
    status_leases = Statement(status.STATUS_LEASES)
    depth_available = Statement(status.DEPTH_AVAILABLE)
    depth_dead = Statement(status.DEPTH_DEAD)
    depth_scheduled_running = Statement(status.DEPTH_SCHEDULED_RUNNING)
    depth_waiting = Statement(status.DEPTH_WAITING)
    depth_parked = Statement(status.DEPTH_PARKED)
    queues_scheduled = Statement(status.QUEUES_SCHEDULED)
    lease_rows = Statement(status.LEASES)
    worker_rows = Statement(status.WORKERS)
    # -- job lists, one per state (the dashboard and ``trioq jobs list``: `job_lists`) ----------
    list_available = Statement(lists.LISTS["available"])
    list_scheduled = Statement(lists.LISTS["scheduled"])
    list_running = Statement(lists.LISTS["running"])
    list_waiting = Statement(lists.LISTS["waiting"])
    list_done = Statement(lists.LISTS["done"])
    list_cancelled = Statement(lists.LISTS["cancelled"])
    list_dead = Statement(lists.LISTS["dead"])

    @property
    def job_lists(self) -> dict[str, sql.Composed]:
        """The job list of each state, by state."""
        return {state: getattr(self, f"list_{state}") for state in lists.LISTS}
    # -- dead letters ------------------------------------------------------------------------------
    dead_list = Statement(dead.DEAD_LIST)
    dead_retry = Statement(dead.DEAD_RETRY)
    dead_retryable = Statement(dead.DEAD_RETRYABLE)
    dead_purge = Statement(dead.DEAD_PURGE)
    dead_purgeable = Statement(dead.DEAD_PURGEABLE)
    dead_job = Statement(dead.DEAD_JOB)
    dead_ids = Statement(dead.DEAD_IDS)
    dead_count = Statement(dead.DEAD_COUNT)
    dead_count_ids = Statement(dead.DEAD_COUNT_IDS)
    # -- queue settings (flow control) ------------------------------------------------------------
    queue_settings = Statement(queues.QUEUE_SETTINGS)
    queue_poll = Statement(queues.QUEUE_POLL)
    paused_settings = Statement(queues.PAUSED_SETTINGS)
    change_queue = Statement(queues.CHANGE_QUEUE)
    resume_due = Statement(queues.RESUME_DUE)
    queue_known = Statement(queues.QUEUE_KNOWN)
    queue_names = Statement(queues.QUEUE_NAMES)
    # -- cron --------------------------------------------------------------------------------------
    cron_last_ticks = Statement(cron.CRON_LAST_TICKS)
    cron_record_tick = Statement(cron.CRON_RECORD_TICK)
    cron_set_job = Statement(cron.CRON_SET_JOB)
    cron_last = Statement(cron.CRON_LAST)
    cron_entries = Statement(cron.CRON_ENTRIES)
    cron_entry_add = Statement(cron.CRON_ENTRY_ADD)
    cron_entry_remove = Statement(cron.CRON_ENTRY_REMOVE)
    # -- the job history ---------------------------------------------------------------------------
    history_upsert = Statement(history.HISTORY_UPSERT)
    history_prune = Statement(history.HISTORY_PRUNE)
    history_minutes = Statement(history.HISTORY_MINUTES)
    history_queues = Statement(history.HISTORY_QUEUES)
    recent_rates = Statement(history.RECENT_RATES)
    # -- the schema's version, migrations ----------------------------------------------------------
    schema_exists = Statement(schema.SCHEMA_EXISTS)
    schema_version = Statement(schema.SCHEMA_VERSION)
    missing_tables = Statement(schema.MISSING_TABLES)
    migrate_lock = Statement(schema.MIGRATE_LOCK)
    migrate_try_lock = Statement(schema.MIGRATE_TRY_LOCK)
    migrate_lock_holder = Statement(schema.MIGRATE_LOCK_HOLDER)
    create_schema = Statement(schema.CREATE_SCHEMA)
    create_migrations = Statement(schema.CREATE_MIGRATIONS)
    migration_search_path = Statement(schema.MIGRATION_SEARCH_PATH)
    record_migration = Statement(schema.RECORD_MIGRATION)
    reset_search_path = Statement(schema.RESET_SEARCH_PATH)
    # -- durable jobs: step records ------------------------------------------------------------
    load_steps = Statement(durable.LOAD_STEPS)
    record_step = Statement(durable.RECORD_STEP)
    job_steps = Statement(durable.JOB_STEPS)
    wait_signal = Statement(durable.WAIT)
    signal_job = Statement(durable.SIGNAL)
    set_parent = Statement(durable.SET_PARENT)

    # -- workflows: dependencies and batches -------------------------------------------------------
    dependencies_lock = Statement(workflows.DEPENDENCIES_LOCK)
    dependencies_flag = Statement(workflows.DEPENDENCIES_FLAG)
    insert_graph = Statement(workflows.INSERT_GRAPH)
    insert_edges = Statement(workflows.INSERT_EDGES)
    resolve_ended = Statement(workflows.RESOLVE_ENDED)
    insert_batch = Statement(workflows.INSERT_BATCH)
    finish_empty_batch = Statement(workflows.FINISH_EMPTY_BATCH)
    batch_status = Statement(workflows.BATCH_STATUS)
    dependencies = Statement(workflows.DEPENDENCIES)
    dependants = Statement(workflows.DEPENDANTS)
    stranded_turn = Statement(workflows.STRANDED_TURN)
    stranded = Statement(workflows.STRANDED)
    stranded_edges = Statement(workflows.STRANDED_EDGES)
    stranded_lock = Statement(workflows.STRANDED_LOCK)
    stranded_move = Statement(workflows.STRANDED_MOVE)
    sequences_stuck = Statement(workflows.SEQUENCES_STUCK)
    prune_batches = Statement(maintenance.PRUNE_ENDED, table="batches",
                              ended=sql.Identifier("finished_at"))  # fmt: skip


def names() -> list[str]:
    """The name of every statement of `Statements` (the tests explain or run each)."""
    return [
        name for name, value in vars(Statements).items()
        if isinstance(value, Statement)
    ]  # fmt: skip


@functools.cache
def statements(schema: str, *, traced: bool = False) -> Statements:
    """The statements of ``schema`` (validated); one `Statements` per schema and ``traced``."""
    return Statements(schema, traced=traced)


@functools.cache
def rendered(schema: str, name: str, *, traced: bool = False) -> bytes:
    """The statement ``name`` of `Statements` (``traced``: of the traced set), rendered
    once: for the statements that run once per job or batch (claim, enqueue, heartbeat,
    complete, fail, release). psycopg renders an `sql.Composed` on every execute (about
    11 µs for the claim, 40 µs for the insert); bytes it converts once and caches, and
    prepares after a few executions like any other query."""
    statement: Any = getattr(statements(schema, traced=traced), name)
    assert isinstance(statement, sql.Composed)
    return statement.as_bytes(None)
