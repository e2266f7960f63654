"""Runtime configuration: frozen, validated at construction, errors name the field."""

from __future__ import annotations

import datetime as dt
import importlib.util
import math
import os
import re
import socket
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from ._cron import CronEntry, check_entries
from ._db.sql.status import DEPTH_CAP
from ._db.statements import validate_schema_name
from ._flow import UNSET, RateLimit, Unset, check_limit, to_aging, to_rate_limit
from ._job import DEFAULT_MAX_PAYLOAD, DEFAULT_MAX_RESULT, check_max_payload, check_queue_name
from ._pg.errors import check_dsn, redact_dsn
from ._progress import DEFAULT_MAX_PROGRESS, DEFAULT_PROGRESS_INTERVAL, check_max_progress
from ._registry import Registry
from ._rules import (
    boolean,
    int_at_most,
    is_number,
    non_negative,
    positive,
    positive_int,
    positive_or_none,
    rule,
    seconds,
    seconds_or_none,
)

__all__ = ["Config", "QueueConfig", "parse_address"]


def _timedelta(value: float | dt.timedelta) -> dt.timedelta:
    if isinstance(value, dt.timedelta):
        return value
    if not is_number(value):
        raise TypeError(f"history_retention must be a timedelta or seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"history_retention must be a positive duration, got {value!r}")
    try:
        return dt.timedelta(seconds=value)
    except OverflowError:
        raise ValueError(f"history_retention is out of range: {value!r} seconds") from None


def _positive_timedelta(
    _inst: object, attribute: attrs.Attribute[Any], value: dt.timedelta
) -> None:
    if not isinstance(value, dt.timedelta) or value <= dt.timedelta(0):
        raise ValueError(f"{attribute.name} must be a positive duration, got {value!r}")


def _limit(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    check_limit(value, attribute.name)


def _rate(value: object) -> RateLimit | None:
    return to_rate_limit(value, "rate_limit")


def _fair(_inst: object, _attribute: object, value: object) -> None:
    if value is not UNSET:
        boolean(value, "fair")


def _aging(value: object) -> dt.timedelta | Unset | None:
    return value if value is UNSET else to_aging(value, "aging")


def _key_rate(value: object) -> RateLimit | None:
    return to_rate_limit(value, "key_rate_limit")


_DAY = 86400.0
#: The job history (``docs/history.md``): written every 5 s, kept for a week.
DEFAULT_HISTORY_INTERVAL = 5.0
DEFAULT_HISTORY_RETENTION = dt.timedelta(days=7)
#: Postgres caches 64 subtransaction ids per backend (PGPROC_MAX_CACHED_SUBXIDS).
MAX_SHARED_JOBS = 64
_positive = rule(positive)
_positive_int = rule(positive_int)
_non_negative = rule(non_negative)
_positive_or_none = rule(positive_or_none)
_shared_jobs = rule(int_at_most(MAX_SHARED_JOBS, (
    " (each job is a savepoint, and a transaction of more than 64 subtransactions slows the "
    "whole server)")))
_depth_cap = rule(int_at_most(1_000_000))


#: HOST:PORT or HOST:FIRST-LAST; ASCII digits only (``isdigit()`` takes "٣").
_ADDRESS = re.compile(r"(?P<host>\S+):(?P<first>[0-9]{1,5})(?:(?P<dash>-)(?P<last>[0-9]{1,5}))?")


def parse_address(value: str, field: str = "metrics") -> tuple[str, int, int]:
    """(host, first port, last port) of ``host:port``, ``[v6]:port`` or ``host:first-last``
    (a range: the first free port of it is taken; port 0 picks any free one)."""
    found = _ADDRESS.fullmatch(value) if isinstance(value, str) else None
    if found is None or not found["host"].isprintable() or not _ports(found):
        raise ValueError(
            f"{field} must look like HOST:PORT (e.g. 127.0.0.1:9100, [::1]:9100, 0.0.0.0:9100) "
            f"or HOST:FIRST-LAST (a range of ports), got {value!r}"
        )
    first = int(found["first"])
    return found["host"].strip("[]"), first, int(found["last"] or first)


def _ports(found: re.Match[str]) -> bool:
    """Ports in order and at most 65535; a range does not start at 0 (any free port)."""
    first, last = int(found["first"]), int(found["last"] or found["first"])
    return first <= last <= 65535 and not (found["dash"] and first == 0)


def _metrics_address(_inst: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None:
        if not isinstance(value, str):
            raise TypeError(f"{attribute.name} must be a 'HOST:PORT' string or None, got {value!r}")
        parse_address(value, attribute.name)


def _tracing(_inst: object, attribute: attrs.Attribute[Any], value: bool | None) -> None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{attribute.name} must be True, False or None, got {value!r}")
    if value is True and importlib.util.find_spec("opentelemetry") is None:
        raise ValueError(
            f"{attribute.name}=True needs OpenTelemetry: pip install 'trioq[otel]'"
        )


@attrs.frozen(kw_only=True)
class QueueConfig:
    """How one queue is served by this process, and the limits it holds across all of them.

    ``concurrency`` is this process's slots. The limits (``global_concurrency``,
    ``rate_limit``, ``key_concurrency``, ``key_rate_limit``) hold across every process;
    they live in the database, and `trioq.serve` writes those given here when it starts
    (None leaves the stored value alone). ``trioq queue set`` changes them at run time.
    So does ``aging`` (anti-starvation), whose None turns it off and which is left alone
    when not given.
    """

    concurrency: int = attrs.field(default=10, validator=_positive_int)
    global_concurrency: int | None = attrs.field(default=None, validator=_limit)
    rate_limit: RateLimit | None = attrs.field(default=None, converter=_rate)
    key_concurrency: int | None = attrs.field(default=None, validator=_limit)
    key_rate_limit: RateLimit | None = attrs.field(default=None, converter=_key_rate)
    #: The wait that earns a waiting job one priority level, across every process
    #: (docs/flow-control.md, "Aging"): a timedelta or seconds, or None to turn aging off.
    #: Left as stored when not given (`trioq.DEFAULT_AGING` if never set).
    aging: dt.timedelta | Unset | None = attrs.field(default=UNSET, converter=_aging)
    #: Claims go round-robin across the jobs' keys, across every process (docs/flow-control.md,
    #: "Fair share"). Left as stored when not given.
    fair: bool | Unset = attrs.field(default=UNSET, validator=_fair)

    def limits(self) -> dict[str, Any]:
        """The limits this config sets (the others are left as stored)."""
        given = {
            "global_concurrency": self.global_concurrency,
            "rate_limit": self.rate_limit,
            "key_concurrency": self.key_concurrency,
            "key_rate_limit": self.key_rate_limit,
        }
        limits: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
        if self.aging is not UNSET:
            limits["aging"] = self.aging
        if self.fair is not UNSET:
            limits["fair"] = self.fair
        return limits


def _queues(
    value: Mapping[str, QueueConfig] | Sequence[str] | str | None,
) -> dict[str, QueueConfig]:
    if value is None:
        return {}
    if isinstance(value, str):
        return {value: QueueConfig()}
    if isinstance(value, Mapping):
        return dict(value)
    return {name: QueueConfig() for name in value}


def _check_queues(_inst: object, attribute: attrs.Attribute[Any], value: dict[str, Any]) -> None:
    for name, cfg in value.items():
        check_queue_name(name, f"{attribute.name}: queue name")
        if not isinstance(cfg, QueueConfig):
            raise TypeError(f"{attribute.name}[{name!r}] must be a QueueConfig, got {cfg!r}")


def _registry(_inst: object, attribute: attrs.Attribute[Any], value: Registry) -> None:
    if not isinstance(value, Registry):
        raise TypeError(f"{attribute.name} must be a trioq.Registry, got {value!r}")


def _dsn(_inst: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None:
        check_dsn(value, what=attribute.name)


def _optional_bool(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{attribute.name} must be True, False or None, got {value!r}")


def _dsn_repr(value: str | None) -> str:
    """``Config``'s repr shows where it connects, never the password."""
    return repr(None if value is None else redact_dsn(value))


def _cron(value: object) -> tuple[Any, ...]:
    if isinstance(value, CronEntry):
        return (value,)
    if value is None:
        return ()
    if isinstance(value, str | bytes | Mapping):
        raise TypeError(
            f"cron must be a sequence of trioq.CronEntry, got {type(value).__name__} {value!r}"
        )
    if not isinstance(value, Iterable):
        raise TypeError(f"cron must be a sequence of trioq.CronEntry, got {value!r}")
    return tuple(value)


def _default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@attrs.frozen(kw_only=True)
class Config:
    """Everything `trioq.serve` needs. Intervals are seconds (or timedeltas)."""

    registry: Registry = attrs.field(validator=_registry)
    #: None: ``TRIOQ_DSN`` / ``DATABASE_URL``, else the embedded Postgres.
    dsn: str | None = attrs.field(default=None, validator=_dsn, repr=_dsn_repr)
    #: Behind a transaction-mode pooler (PgBouncer, docs/pooling.md): a DSN straight to
    #: Postgres (or a session-mode pool) for what needs a session of its own: LISTEN, the
    #: liveness lock, ``serve --migrate``. None: ``TRIOQ_SESSION_DSN``, else ``dsn``.
    session_dsn: str | None = attrs.field(default=None, validator=_dsn, repr=_dsn_repr)
    #: Server-side prepared statements on the pooled connections (psycopg prepares a
    #: statement after 5 runs). None: on, unless a ``session_dsn`` other than ``dsn`` says
    #: ``dsn`` is a pooler (PgBouncer < 1.21 cannot keep them). False: never prepare.
    prepared_statements: bool | None = attrs.field(default=None, validator=_optional_bool)
    schema: str = attrs.field(default="trioq", validator=rule(validate_schema_name))
    #: Queues this process serves; default: every queue a registered task uses.
    queues: dict[str, QueueConfig] = attrs.field(
        factory=dict, converter=_queues, validator=_check_queues
    )
    lease: float = attrs.field(default=30.0, converter=seconds, validator=_positive)
    heartbeat_interval: float = attrs.field(default=5.0, converter=seconds, validator=_positive)
    #: Fallback polling when no notification arrives (notifications are only a hint).
    poll_interval: float = attrs.field(default=2.0, converter=seconds, validator=_positive)
    sweep_interval: float = attrs.field(default=5.0, converter=seconds, validator=_positive)
    #: How often the worker pings its row in ``workers``, and checks for dead workers.
    liveness_interval: float = attrs.field(default=0.5, converter=seconds, validator=_positive)
    #: A worker whose liveness lock is free and that has not pinged for this long is dead:
    #: its jobs are returned at once (a SIGKILLed worker's jobs run again within about 2 s).
    liveness_grace: float = attrs.field(default=1.0, converter=seconds, validator=_positive)
    shutdown_grace: float = attrs.field(default=30.0, converter=seconds, validator=_non_negative)
    cron: tuple[CronEntry, ...] = attrs.field(default=(), converter=_cron)
    #: Threads for sync handlers (shared by all queues).
    sync_threads: int = attrs.field(default=10, validator=_positive_int)
    #: Connections for claims, outcomes, heartbeats and maintenance (LISTEN has its own).
    pool_size: int = attrs.field(default=8, validator=_positive_int)
    #: Connections for handlers: ``job.connection()``, ``job.transaction()``, ``job.enqueue()``.
    #: Separate, so handlers holding connections can never starve the heartbeat.
    app_pool_size: int = attrs.field(default=10, validator=_positive_int)
    max_payload_bytes: int = attrs.field(
        default=DEFAULT_MAX_PAYLOAD, validator=rule(check_max_payload)
    )
    #: The most bytes of JSON a kept result may have (``keep_result=True``): a larger one
    #: fails its job, dead at once, with an error that says so (a 50 MB result stalled the
    #: worker's other jobs for seconds and every dashboard refresh read it whole).
    max_result_bytes: int = attrs.field(
        default=DEFAULT_MAX_RESULT, validator=rule(check_max_payload)
    )
    #: The most bytes of JSON one ``job.progress()`` value may have (at most 1 MiB): a larger
    #: one is a ValueError to the handler, naming both sizes (docs/progress.md).
    max_progress_bytes: int = attrs.field(
        default=DEFAULT_MAX_PROGRESS, validator=rule(check_max_progress)
    )
    #: How often the latest progress of each running job is written: a handler may call
    #: ``job.progress()`` in a tight loop, the database sees one write per job per interval.
    progress_interval: float = attrs.field(
        default=DEFAULT_PROGRESS_INTERVAL, converter=seconds, validator=_positive
    )
    #: Group commit for ``job.transaction()`` without ``shared=``: its block joins a shared
    #: transaction (each job's block under its savepoint and fence, committed with the
    #: others'; docs/transactions.md). False: each block has a transaction of its own, as
    #: ``shared=False`` asks for one block.
    group_commit: bool = attrs.field(default=True, validator=rule(boolean))
    #: ``job.transaction(shared=True)``: how many shared transactions may be open at once,
    #: each on a connection of the app pool (docs/transactions.md).
    shared_transactions: int = attrs.field(default=2, validator=_positive_int)
    #: The most jobs one shared transaction commits. Each job's block is a savepoint, and
    #: past 64 subtransactions Postgres slows every snapshot of the server: at most 64.
    shared_transaction_jobs: int = attrs.field(default=32, validator=_shared_jobs)
    #: A job whose task this process does not know is given back (attempt refunded) for a
    #: worker that knows it; once it has been unknown this long, it goes to dead_jobs.
    unknown_task_timeout: float = attrs.field(
        default=86_400.0, converter=seconds, validator=_positive
    )
    #: Warn (naming the blocking handler, middleware, retry policy or callback, its job, and
    #: the stack) when the trio loop has not run for this long: user code that blocks the
    #: loop stops heartbeats, claims and outcomes.
    loop_blocked_warning: float = attrs.field(default=5.0, converter=seconds, validator=_positive)
    #: Install SIGINT/SIGTERM handlers (main thread only): first = graceful, second = now.
    handle_signals: bool = attrs.field(default=False, validator=rule(boolean))
    #: How often a worker writes its per-minute job history (``job_history``, for charts).
    history_interval: float = attrs.field(
        default=DEFAULT_HISTORY_INTERVAL, converter=seconds, validator=_positive
    )
    #: History rows older than this are pruned (in batches, by every worker).
    history_retention: dt.timedelta = attrs.field(
        default=DEFAULT_HISTORY_RETENTION, converter=_timedelta, validator=_positive_timedelta
    )
    #: Retention (the pruner, docs/results.md#retention): how long kept ``done`` rows,
    #: ``cancelled`` rows and dead jobs stay after they ended; None keeps them forever.
    retain_done: float | None = attrs.field(
        default=_DAY, converter=seconds_or_none, validator=_positive_or_none
    )
    retain_cancelled: float | None = attrs.field(
        default=_DAY, converter=seconds_or_none, validator=_positive_or_none
    )
    retain_dead: float | None = attrs.field(
        default=7 * _DAY, converter=seconds_or_none, validator=_positive_or_none
    )
    #: How often the pruner runs; None: this process runs no pruner.
    prune_interval: float | None = attrs.field(
        default=60.0, converter=seconds_or_none, validator=_positive_or_none
    )
    #: Rows one pruning statement deletes at most (per kind).
    prune_batch: int = attrs.field(default=1000, validator=_positive_int)
    #: How often waiting jobs that can never be freed (rows written by hand: an edge to a
    #: job that never existed, a cycle) are moved to dead_jobs, reason ``stranded``
    #: (docs/workflows.md); one process at a time. None: this process never looks.
    stranded_interval: float | None = attrs.field(
        default=60.0, converter=seconds_or_none, validator=_positive_or_none
    )
    #: The vacuumer (docs/scaling.md, "Bloat"): how often a process that finished jobs since
    #: its last look reads the jobs table's dead tuples (from the statistics), and vacuums it
    #: once they pass ``vacuum_threshold`` plus a tenth of its live tuples. None: this process
    #: never vacuums (autovacuum alone, once a minute at most).
    vacuum_interval: float | None = attrs.field(
        default=1.0, converter=seconds_or_none, validator=_positive_or_none
    )
    vacuum_threshold: int = attrs.field(default=10_000, validator=_positive_int)
    #: Event callbacks (``@registry.on(...)``, docs/observability.md): each is cancelled after
    #: this long; at most ``hook_concurrency`` run at once; at most ``hook_buffer`` events
    #: wait for them (beyond that new ones are dropped and counted).
    hook_timeout: float = attrs.field(default=10.0, converter=seconds, validator=_positive)
    hook_concurrency: int = attrs.field(default=4, validator=_positive_int)
    hook_buffer: int = attrs.field(default=1000, validator=_positive_int)
    #: ``HOST:PORT`` to serve Prometheus metrics on (``/metrics``), or ``HOST:FIRST-LAST``
    #: (the first free port of the range); None: no metrics server.
    metrics: str | None = attrs.field(default=None, validator=_metrics_address)
    #: The queue depths the metrics show are read from the database at most this often
    #: (and only when scraped), each count exact up to ``metrics_depth_cap``.
    metrics_depth_interval: float = attrs.field(
        default=5.0, converter=seconds, validator=_positive
    )
    metrics_depth_cap: int = attrs.field(default=DEPTH_CAP, validator=_depth_cap)
    #: A span per execution (OpenTelemetry, ``pip install 'trioq[otel]'``): None traces
    #: when the application has set a tracer provider before the worker starts, True
    #: always (opentelemetry-api required), False never.
    tracing: bool | None = attrs.field(default=None, validator=_tracing)
    #: Lease owner name; unique per Config object (host:pid:random). Give each concurrently
    #: running `serve` its own Config (``attrs.evolve(config, worker_id=...)``).
    worker_id: str = attrs.field(factory=_default_worker_id)

    def __attrs_post_init__(self) -> None:
        if self.liveness_grace < 2 * self.liveness_interval:
            raise ValueError(
                f"liveness_grace ({self.liveness_grace} s) must be at least twice the "
                f"liveness_interval ({self.liveness_interval} s), so one late ping is not death"
            )
        if self.heartbeat_interval * 3 > self.lease:
            raise ValueError(
                f"heartbeat_interval ({self.heartbeat_interval} s) must be at most a third of "
                f"the lease ({self.lease} s), so a lease survives a missed heartbeat"
            )
        for entry in self.cron:
            if not isinstance(entry, CronEntry):
                raise TypeError(f"cron entries must be trioq.CronEntry, got {entry!r}")
        check_entries(self.cron, max_payload_bytes=self.max_payload_bytes)

    def served_queues(self) -> dict[str, QueueConfig]:
        """The queues to serve: the configured ones, else those of registered tasks."""
        if self.queues:
            return dict(self.queues)
        return {name: QueueConfig() for name in self.registry.queues()} or {
            "default": QueueConfig()
        }
