"""``trioq stress``: load Postgres through real worker processes, measure, verify exactly-once.

The run, in order::

    reset the stress schema (migrate; recreate the ledger; truncate)   one advisory lock
    start P `trioq serve` workers; wait until each one's LISTEN is active
    burn-down: enqueue N jobs in one transaction  |  steady: producer at R jobs/s for S s
      |- monitor: a snapshot of the queue twice a second -> the progress line
      |- chaos:   kill workers / terminate their connections / restart Postgres /
      |           starve connection slots / pin the xmin horizon / SIGTERM every worker
    wait until nothing is left in the queue (bounded by --timeout)
    stop the workers (SIGTERM, bounded); read timings from the ledger; verify;
    recovery time of each fault, from the ledger

Modules: `app` (the workers' task), `ledger` (its table and timings),
`workers` (processes), `load` (enqueueing), `monitor` and
`progress` (watching), `chaos` and `faults` (faults and recovery),
`cpu`, `verify`, `report`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import shlex
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TextIO

import attrs
import trio
from psycopg import sql
from psycopg.conninfo import make_conninfo

from .._db.statements import qualified, validate_schema_name
from .._pg.connection import connect as pg_connect
from .._pg.embedded import EmbeddedPostgres
from .._pg.errors import redact_dsn
from .._queue import Queue
from .chaos import ChaosLog, kill_at, kill_host_at, kill_loop, restart_at, terminate_loop
from .cpu import ServerMeter, machine_busy, postmaster_of
from .failover import Pair, failover_at
from .faults import (
    GracefulStop,
    HeldJobs,
    Starvation,
    XminPin,
    graceful_stop,
    host_kill_failures,
    pin_xmin,
    recovery,
    recovery_summary,
    starve,
    vacuum_after,
)
from .ledger import LEDGER_TABLE, reset, timings
from .load import IdRanges, Producer, Workload, enqueue_backlog
from .monitor import Monitor
from .progress import Progress, ProgressLine
from .report import CpuStats, Rate, StressReport
from .verify import verify
from .workers import LOCAL, Host, StressError, WorkerGroup, open_workers

__all__ = ["StressError", "StressOptions", "Target", "run_stress"]

MODES = ("burn-down", "steady")
TRANSACTIONS = ("own", "shared", "one", "one-shared")
#: Lease, heartbeat and sweep intervals (s): the runtime's defaults, and short ones for chaos.
CALM_TIMINGS = (30.0, 5.0, 5.0)
CHAOS_TIMINGS = (2.0, 0.5, 0.5)
READY_TIMEOUT = 60.0
WORKER_GRACE = 5.0
DRIVER_APP_NAME = "trioq-stress-driver"
HOG_APP_NAME = "trioq-stress-hog"
#: How long --starve-at and --pin-xmin-at last unless --starve-for / --pin-xmin-for say.
FAULT_WINDOW = 10.0
#: Connection slots --starve-at leaves per worker process unless --starve-leave says: its
#: LISTEN, one runtime connection (claims, heartbeats, outcomes) and one for a handler.
STARVE_LEAVE_PER_PROCESS = 3


#: The largest number any option takes (jobs, bytes, seconds: 31 years): beyond it a value is
#: a typo (10**30 jobs would be enqueued until memory ran out).
MAX_OPTION = 1e9


def _positive(_inst: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and not 0 < value <= MAX_OPTION:  # NaN too
        raise ValueError(f"--{attribute.name.replace('_', '-')} must be positive and at most "
                         f"{MAX_OPTION:g}, got {value}")  # fmt: skip


def _non_negative(_inst: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and not 0 <= value <= MAX_OPTION:  # NaN too
        raise ValueError(f"--{attribute.name.replace('_', '-')} must be from 0 to "
                         f"{MAX_OPTION:g}, got {value}")  # fmt: skip


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class StressOptions:
    """Everything a run needs; errors name the command-line flag."""

    mode: str = attrs.field(default="burn-down", validator=attrs.validators.in_(MODES))
    jobs: int = attrs.field(default=20_000, validator=_positive)
    processes: int = attrs.field(default=2, validator=_positive)
    concurrency: int = attrs.field(default=50, validator=_positive)
    rate: float | None = attrs.field(default=None, validator=_positive)
    duration: float | None = attrs.field(default=None, validator=_positive)
    work_ms: float = attrs.field(default=0.0, validator=_non_negative)
    payload_bytes: int = attrs.field(default=0, validator=_non_negative)
    schema: str = "trioq_stress"
    timeout: float = attrs.field(default=600.0, validator=_positive)
    kill_every: float | None = attrs.field(default=None, validator=_positive)
    terminate_every: float | None = attrs.field(default=None, validator=_positive)
    restart_postgres_at: float | None = attrs.field(default=None, validator=_non_negative)
    #: SIGKILL the primary of a pair of the run's own and promote its standby
    #: (`trioq._stress.failover`).
    failover_at: float | None = attrs.field(default=None, validator=_non_negative)
    kill_at: float | None = attrs.field(default=None, validator=_non_negative)
    starve_at: float | None = attrs.field(default=None, validator=_non_negative)
    starve_for: float | None = attrs.field(default=None, validator=_positive)
    starve_leave: int | None = attrs.field(default=None, validator=_non_negative)
    pin_xmin_at: float | None = attrs.field(default=None, validator=_non_negative)
    pin_xmin_for: float | None = attrs.field(default=None, validator=_positive)
    sigterm_at: float | None = attrs.field(default=None, validator=_non_negative)
    grace: float = attrs.field(default=WORKER_GRACE, validator=_non_negative)
    lease: float | None = attrs.field(default=None, validator=_positive)
    heartbeat: float | None = attrs.field(default=None, validator=_positive)
    sweep: float | None = attrs.field(default=None, validator=_positive)
    pool_size: int = attrs.field(default=8, validator=_positive)
    app_pool_size: int = attrs.field(default=10, validator=_positive)
    #: Where each job's ledger row commits: ``own`` (a transaction per job), ``shared``
    #: (job.transaction(shared=True)), ``one`` (job.complete_with(the statement)) or
    #: ``one-shared`` (complete_with(..., shared=True)). Exactly once every way.
    transactions: str = attrs.field(default="own", validator=attrs.validators.in_(TRANSACTIONS))
    #: ``--launcher``: one command prefix per host the workers run on (none: this host).
    launchers: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    #: ``--host-dsn``: per launcher, the DSN its workers connect with (none: the run's).
    host_dsns: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    kill_host_at: float | None = attrs.field(default=None, validator=_non_negative)
    quiet: bool = False

    def __attrs_post_init__(self) -> None:
        validate_schema_name(self.schema)
        steady = self.mode == "steady"
        if steady and (self.rate is None or self.duration is None):
            raise ValueError("--mode steady needs --rate and --duration")
        if not steady and (self.rate is not None or self.duration is not None):
            raise ValueError("--rate and --duration are for --mode steady")
        lease, heartbeat, _ = self.timings
        if heartbeat * 3 > lease:
            raise ValueError(f"--heartbeat ({heartbeat} s) must be at most a third of --lease")
        if self.starve_at is None and (self.starve_for, self.starve_leave) != (None, None):
            raise ValueError("--starve-for and --starve-leave need --starve-at")
        if self.pin_xmin_at is None and self.pin_xmin_for is not None:
            raise ValueError("--pin-xmin-for needs --pin-xmin-at")
        self._check_hosts()

    def _check_hosts(self) -> None:
        if self.host_dsns and len(self.host_dsns) != len(self.launchers):
            raise ValueError(
                f"--host-dsn is given {len(self.host_dsns)} times but --launcher "
                f"{len(self.launchers)} times: one DSN per launcher, in the same order"
            )
        hosts = self.hosts  # parses each --launcher
        if self.processes < len(hosts):
            raise ValueError(
                f"--processes ({self.processes}) must be at least the number of hosts "
                f"({len(hosts)}): every --launcher gets a worker"
            )
        if self.kill_host_at is not None and len(hosts) < 2:
            raise ValueError("--kill-host-at needs two or more --launcher hosts")

    @property
    def hosts(self) -> tuple[Host, ...]:
        """The hosts the workers run on: one per ``--launcher``, else this one."""
        if not self.launchers:
            return (LOCAL,)
        dsns: tuple[str | None, ...] = self.host_dsns or (None,) * len(self.launchers)
        return tuple(
            Host.parse(i, launcher, dsn)
            for i, (launcher, dsn) in enumerate(zip(self.launchers, dsns, strict=True))
        )

    @property
    def chaos(self) -> bool:
        return any(
            x is not None
            for x in (
                self.kill_every, self.terminate_every, self.restart_postgres_at, self.kill_at,
                self.starve_at, self.pin_xmin_at, self.sigterm_at, self.kill_host_at,
                self.failover_at,
            )
        )  # fmt: skip

    @property
    def leave(self) -> int:
        """Connection slots --starve-at leaves free."""
        if self.starve_leave is not None:
            return self.starve_leave
        return STARVE_LEAVE_PER_PROCESS * self.processes

    @property
    def timings(self) -> tuple[float, float, float]:
        """Lease, heartbeat and sweep seconds: as given, else short ones under chaos."""
        defaults = CHAOS_TIMINGS if self.chaos else CALM_TIMINGS
        given = (self.lease, self.heartbeat, self.sweep)
        lease, heartbeat, sweep = (
            g if g is not None else d for g, d in zip(given, defaults, strict=True)
        )
        return lease, heartbeat, sweep

    def workload(self) -> Workload:
        return Workload(work_ms=self.work_ms, payload_bytes=self.payload_bytes)

    def worker_env(self) -> dict[str, str]:
        lease, heartbeat, sweep = self.timings
        return {
            "TRIOQ_STRESS_SCHEMA": self.schema,
            "TRIOQ_STRESS_CONCURRENCY": str(self.concurrency),
            "TRIOQ_STRESS_POOL_SIZE": str(self.pool_size),
            "TRIOQ_STRESS_APP_POOL_SIZE": str(self.app_pool_size),
            "TRIOQ_STRESS_LEASE": str(lease),
            "TRIOQ_STRESS_HEARTBEAT": str(heartbeat),
            "TRIOQ_STRESS_SWEEP": str(sweep),
            "TRIOQ_STRESS_GRACE": str(self.grace),
            "TRIOQ_STRESS_TRANSACTIONS": self.transactions,
        }


@attrs.frozen(kw_only=True)
class Target:
    """The database: a DSN, and the embedded server behind it when no DSN was configured."""

    dsn: str
    #: The workers' pools go through this (a transaction-mode PgBouncer): claims, outcomes,
    #: heartbeats, their handlers' transactions. LISTEN and liveness stay on ``dsn``, and so
    #: does the driver (enqueues, verification). docs/pooling.md.
    pooler_dsn: str | None = None
    embedded: EmbeddedPostgres | None = None
    owned: bool = False  # this run started the embedded server (it was not running)
    #: ``--failover-at``: the run's own primary and standby, ``dsn`` reaching whichever
    #: takes writes.
    pair: Pair | None = None


@attrs.frozen(kw_only=True)
class _CpuMark:
    at: float
    workers: float
    postgres: float
    driver: float
    machine: float | None


@attrs.define
class _Run:
    """The state of one run, shared by its tasks."""

    options: StressOptions
    target: Target
    progress: ProgressLine
    servers: trio.Nursery
    connect: Callable[[], Awaitable[Any]]
    queue: Queue
    ids: IdRanges = attrs.field(factory=IdRanges)
    chaos: ChaosLog = attrs.field(factory=ChaosLog)
    meter: ServerMeter = attrs.field(factory=lambda: ServerMeter(None))
    meter_source: str = "unavailable"
    monitor: Monitor | None = None
    producer: Producer | None = None
    enqueue_seconds: float | None = None
    timed_out: bool = False
    cpu: CpuStats | None = None
    started_at: float = attrs.field(factory=trio.current_time)
    clock_offset: float = 0.0  # the database clock less the wall clock, s
    starvation: Starvation | None = None
    xmin_pin: XminPin | None = None
    graceful: GracefulStop | None = None


async def run_stress(
    options: StressOptions, target: Target, *, stream: TextIO = sys.stderr
) -> StressReport:
    """Run the load test and return its report (see the module docs)."""
    dsn = make_conninfo(target.dsn, application_name=DRIVER_APP_NAME)
    connect = functools.partial(pg_connect, dsn, autocommit=True)
    progress = ProgressLine(stream, enabled=not options.quiet)
    async with trio.open_nursery() as servers:  # a Postgres restarted by the chaos lives here
        run = _Run(
            options=options, target=target, progress=progress, servers=servers, connect=connect,
            queue=Queue(schema=options.schema),
        )  # fmt: skip
        try:
            report = await _run(run)
        finally:
            progress.close()
        servers.cancel_scope.cancel()
    return report


async def _run(run: _Run) -> StressReport:
    options = run.options
    async with _closing(await run.connect()) as conn:
        await _lock_schema(conn, options.schema)
        await _refuse_foreign_schema(conn, options.schema)
        await reset(conn, options.schema)
        database = await _database_info(conn, run.target)
        run.clock_offset = await _clock_offset(conn)
        run.meter, run.meter_source = _server_meter(conn)
        async with open_workers(
            dsn=run.target.dsn, env=options.worker_env(), count=options.processes,
            grace=WORKER_GRACE, pooler_dsn=run.target.pooler_dsn, hosts=options.hosts,
        ) as group:  # fmt: skip
            group.start_all()
            await _wait_ready(conn, group)
            await _workload(run, conn, group)
        workers = _worker_stats(group)
    return await _report(run, database, workers, group)


async def _report(
    run: _Run, database: dict[str, Any], workers: dict[str, Any], group: WorkerGroup
) -> StressReport:
    """Timings and verification, on a fresh connection (the first may not survive chaos)."""
    schema = run.options.schema
    async with await run.connect() as conn:
        timing = await timings(conn, schema)
        if run.options.launchers:
            workers["hosts"] = await _host_stats(conn, schema, group)
        producer_errors = run.producer.errors if run.producer else 0
        verification = await verify(
            conn, schema, run.ids, chaos=run.chaos.any, enqueue_errors=producer_errors
        )
        faults = await recovery(conn, schema, run.chaos.faults, run.clock_offset)
        if run.xmin_pin is not None:
            await vacuum_after(conn, schema, run.xmin_pin)
    if run.graceful is not None and run.graceful.failures():
        failures = verification.failures + run.graceful.failures()
        verification = attrs.evolve(verification, failures=failures)
    if host_failures := host_kill_failures(faults):
        verification = attrs.evolve(verification, failures=verification.failures + host_failures)
    assert run.cpu is not None
    options = attrs.asdict(run.options)
    options["host_dsns"] = [redact_dsn(dsn) for dsn in run.options.host_dsns]  # passwords
    return StressReport(
        options=options,
        database=database,
        enqueue=_enqueue_rate(run),
        steady=_steady_stats(run),
        drain=Rate(jobs=timing.completions, seconds=timing.drain_seconds),
        latency=timing.latency(),
        cpu=run.cpu,
        chaos=_chaos_stats(run, faults),
        workers=workers,
        verification=verification,
        timed_out=run.timed_out,
    )


# -- the workload ----------------------------------------------------------------------------


async def _workload(run: _Run, conn: Any, group: WorkerGroup) -> None:
    """Load, chaos and monitoring until the queue is drained (or the timeout)."""
    options = run.options
    run.monitor = monitor = Monitor(run.connect, options.schema)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_fail_with, group)
        nursery.start_soon(monitor.run, functools.partial(_show_progress, run, group))
        if options.mode == "burn-down":
            run.enqueue_seconds = await enqueue_backlog(
                conn, run.queue, options.workload(), options.jobs, run.ids
            )
        else:
            run.producer = _producer(run)
            nursery.start_soon(run.producer.run, run.connect)
        start = _cpu_mark(group, run.meter)
        _start_chaos(run, nursery, group)
        with trio.move_on_after(options.timeout + (options.duration or 0)) as deadline:
            await _drained(run)
        run.timed_out = deadline.cancelled_caught
        run.cpu = _cpu_stats(start, _cpu_mark(group, run.meter), run.meter_source)
        nursery.cancel_scope.cancel()


def _producer(run: _Run) -> Producer:
    options = run.options
    assert options.rate is not None and options.duration is not None
    return Producer(run.queue, options.workload(), options.rate, options.duration, run.ids)


async def _drained(run: _Run) -> None:
    """Wait until everything is enqueued, every one-shot fault happened, and a later
    snapshot shows an empty queue (a drain faster than `--restart-postgres-at` would
    otherwise end the run before the restart it asked for)."""
    assert run.monitor is not None
    if run.producer is not None:
        await run.producer.done.wait()
    for one_shot in run.chaos.one_shots:  # e.g. a restart later than the drain
        await one_shot.wait()
    snapshot = await run.monitor.wait_newer_than(trio.current_time())
    while snapshot.live:
        snapshot = await run.monitor.wait_newer_than(snapshot.taken_at)


def _restart_scheduled(run: _Run) -> bool:
    return run.options.restart_postgres_at is not None and run.target.embedded is not None


async def _fail_with(group: WorkerGroup) -> None:
    await group.failed.wait()
    raise StressError(group.failure)


def _start_chaos(run: _Run, nursery: trio.Nursery, group: WorkerGroup) -> None:
    options, chaos = run.options, run.chaos
    held = HeldJobs(run.connect, options.schema)
    if options.kill_every is not None:
        nursery.start_soon(kill_loop, group, held, options.kill_every, chaos)
    if options.kill_at is not None:
        nursery.start_soon(kill_at, options.kill_at, group, held, chaos, chaos.one_shot())
    if options.kill_host_at is not None:
        at = options.kill_host_at
        nursery.start_soon(kill_host_at, at, group, held, chaos, chaos.one_shot())
    if options.terminate_every is not None:
        nursery.start_soon(
            terminate_loop, run.connect, group.prefix, options.terminate_every, chaos
        )
    if options.restart_postgres_at is not None:
        if not _restart_scheduled(run):
            chaos.restart_skipped = "a DSN was given: only the embedded server is restarted"
            run.progress.message(f"--restart-postgres-at skipped: {chaos.restart_skipped}")
        else:
            restart = functools.partial(_restart_postgres, run)
            at = options.restart_postgres_at
            nursery.start_soon(restart_at, at, restart, chaos, chaos.one_shot())
    if options.failover_at is not None and run.target.pair is not None:
        at, pair = options.failover_at, run.target.pair
        nursery.start_soon(failover_at, at, pair, chaos, chaos.one_shot(), run.meter)
    _start_faults(run, nursery, group, held)


def _start_faults(run: _Run, nursery: trio.Nursery, group: WorkerGroup, held: HeldJobs) -> None:
    """The one-shot faults of `trioq._stress.faults`; the run waits for each to finish."""
    options, chaos = run.options, run.chaos
    record, note = chaos.fault, _noter(run)
    if options.starve_at is not None:
        run.starvation = Starvation()
        hog = make_conninfo(run.target.dsn, application_name=HOG_APP_NAME)
        fault = functools.partial(
            starve, connect=run.connect, connect_hog=functools.partial(pg_connect, hog),
            prefix=group.prefix, at=options.starve_at, hold=options.starve_for or FAULT_WINDOW,
            leave=options.leave, result=run.starvation, record=record, note=note,
        )  # fmt: skip
        nursery.start_soon(_one_shot, fault, chaos.one_shot())
    if options.pin_xmin_at is not None:
        run.xmin_pin = XminPin()
        fault = functools.partial(
            pin_xmin, connect=run.connect, schema=options.schema, at=options.pin_xmin_at,
            hold=options.pin_xmin_for or FAULT_WINDOW, result=run.xmin_pin, record=record,
            note=note,
        )  # fmt: skip
        nursery.start_soon(_one_shot, fault, chaos.one_shot())
    if options.sigterm_at is not None:
        run.graceful = GracefulStop()
        fault = functools.partial(
            graceful_stop, group=group, held=held, at=options.sigterm_at, grace=options.grace,
            result=run.graceful, record=record, note=note,
        )  # fmt: skip
        nursery.start_soon(_one_shot, fault, chaos.one_shot())


async def _one_shot(fault: Callable[[], Awaitable[None]], done: trio.Event) -> None:
    try:
        await fault()
    finally:
        done.set()


def _noter(run: _Run) -> Callable[[str], None]:
    def note(what: str) -> None:
        run.chaos.note(what)
        run.progress.message(f"[{trio.current_time() - run.started_at:6.1f}s] {what}")

    return note


async def _restart_postgres(run: _Run) -> None:
    """Stop the embedded server, then start it again: owned by this run if it was before."""
    pg = run.target.embedded
    assert pg is not None
    run.meter.before_restart()
    await trio.to_thread.run_sync(pg.stop)
    if run.target.owned:
        await run.servers.start(_own_server, pg)
    else:
        await trio.to_thread.run_sync(pg.start_detached)
    status = await trio.to_thread.run_sync(pg.status)
    run.meter.after_restart(status.pid)


async def _own_server(
    pg: EmbeddedPostgres, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    async with pg.running_async():
        task_status.started()
        await trio.sleep_forever()


# -- readiness, locking, facts ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _closing(conn: Any) -> AsyncIterator[Any]:
    """Close ``conn`` at the end, without the commit of ``async with conn`` (a Postgres
    restart may have broken it)."""
    try:
        yield conn
    finally:
        with trio.move_on_after(1, shield=True):
            await conn.close()


_READY = """
SELECT count(DISTINCT application_name) FROM pg_stat_activity
 WHERE datname = current_database() AND application_name = ANY(%s) AND query LIKE 'LISTEN %%'
"""


async def _wait_ready(conn: Any, group: WorkerGroup) -> None:
    """Until every worker's LISTEN is active (it then fetches); a dying worker fails the run."""
    with trio.move_on_after(READY_TIMEOUT) as scope:
        while True:  # the workers cannot tell us; their connections can
            cur = await conn.execute(_READY, (group.app_names(),))
            row = await cur.fetchone()
            if row is not None and row[0] >= group.count:
                return
            if group.unexpected_exits:
                raise StressError(
                    "a worker exited while starting; its output:\n" + "\n".join(group.log.lines)
                )
            await trio.sleep(0.05)
    if scope.cancelled_caught:
        raise StressError(f"the workers were not ready after {READY_TIMEOUT:g} s")


async def _lock_schema(conn: Any, schema: str) -> None:
    """One run per schema at a time (a session lock, held while ``conn`` is open)."""
    cur = await conn.execute(
        "SELECT pg_try_advisory_lock(hashtext('trioq.stress'), hashtext(%s))", (schema,)
    )
    row = await cur.fetchone()
    if not (row and row[0]):
        raise StressError(f"another trioq stress run is using schema {schema!r}")


async def _refuse_foreign_schema(conn: Any, schema: str) -> None:
    """Never empty a schema whose trioq tables are not a stress run's (the app's jobs)."""
    cur = await conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
        (f"{schema}.jobs", f"{schema}.{LEDGER_TABLE}"),
    )
    row = await cur.fetchone()
    if row is not None and row[0] and not row[1]:
        raise StressError(
            f"schema {schema!r} holds trioq tables that no stress run created: a stress run "
            "empties its schema, so pick another --schema (or drop this one yourself)"
        )


async def _database_info(conn: Any, target: Target) -> dict[str, Any]:
    cur = await conn.execute(
        "SELECT current_setting('server_version'), current_setting('fsync'),"
        " current_setting('synchronous_commit')"
    )
    row = await cur.fetchone()
    assert row is not None
    return {
        "target": redact_dsn(target.dsn),
        "pooler": None if target.pooler_dsn is None else redact_dsn(target.pooler_dsn),
        "embedded": target.embedded is not None,
        "server_version": row[0],
        "fsync": row[1],
        "synchronous_commit": row[2],
    }


async def _clock_offset(conn: Any) -> float:
    """The database clock less this host's wall clock, in seconds (faults are timed on the
    wall clock, completions on the database's)."""
    before = time.time()
    cur = await conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
    row = await cur.fetchone()
    after = time.time()
    assert row is not None
    return float(row[0]) - (before + after) / 2


def _server_meter(conn: Any) -> tuple[ServerMeter, str]:
    host = conn.info.host or ""
    local = host.startswith("/") or host in ("localhost", "127.0.0.1", "::1")
    postmaster = postmaster_of(conn.info.backend_pid) if local else None
    if postmaster is None:
        return ServerMeter(None), "unavailable: the server's processes are not on this host"
    return ServerMeter(postmaster), (
        f"/proc: postmaster {postmaster} and its children, reaped ones included "
        "(the whole cluster: background processes and other databases too)"
    )


# -- measuring ---------------------------------------------------------------------------------


def _cpu_mark(group: WorkerGroup, meter: ServerMeter) -> _CpuMark:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return _CpuMark(
        at=trio.current_time(),
        workers=group.cpu_total(),
        postgres=meter.reading(),
        driver=usage.ru_utime + usage.ru_stime,
        machine=machine_busy(),
    )


def _cpu_stats(start: _CpuMark, end: _CpuMark, source: str) -> CpuStats:
    unavailable = source.startswith("unavailable")
    machine = None
    if start.machine is not None and end.machine is not None:
        machine = end.machine - start.machine
    return CpuStats(
        window_seconds=end.at - start.at,
        workers=end.workers - start.workers,
        postgres=None if unavailable else end.postgres - start.postgres,
        postgres_source=source,
        driver=end.driver - start.driver,
        machine_busy=machine,
        cores=os.cpu_count() or 1,
    )


def _enqueue_rate(run: _Run) -> Rate:
    if run.producer is None:
        return Rate(jobs=run.ids.count, seconds=run.enqueue_seconds)
    return Rate(jobs=run.producer.produced, seconds=run.producer.elapsed)


def _steady_stats(run: _Run) -> dict[str, Any] | None:
    p = run.producer
    if p is None:
        return None
    elapsed = p.elapsed
    return {
        "target_rate": p.rate,
        "duration": p.duration,
        "produced": p.produced,
        "achieved_rate": p.produced / elapsed if elapsed else None,
        "max_lag_seconds": p.max_lag,
        "enqueue_errors": p.errors,
    }


def _chaos_stats(run: _Run, faults: list[dict[str, Any]]) -> dict[str, Any]:
    chaos = run.chaos
    return {
        "kills": chaos.kills,
        "host_kills": chaos.host_kills,
        "terminate_rounds": chaos.terminate_rounds,
        "terminated_connections": chaos.terminated_connections,
        "postgres_restarts": chaos.postgres_restarts,
        "restart_skipped": chaos.restart_skipped,
        "events": list(chaos.events),
        "faults": faults,
        "recovery": recovery_summary(faults),
        "starvation": _asdict(run.starvation),
        "xmin_pin": _asdict(run.xmin_pin),
        "graceful_stop": _asdict(run.graceful),
    }


def _asdict(value: Any) -> dict[str, Any] | None:
    return None if value is None else attrs.asdict(value)


_BY_PID = sql.SQL("SELECT worker_pid, count(*) FROM {} GROUP BY 1")


async def _host_stats(conn: Any, schema: str, group: WorkerGroup) -> list[dict[str, Any]]:
    """Per host: its launcher, the pids it ran, the completions they wrote to the ledger."""
    cur = await conn.execute(_BY_PID.format(qualified(schema, LEDGER_TABLE)))
    by_pid = {int(pid): int(n) for pid, n in await cur.fetchall()}
    return [
        {
            "name": host.name,
            "launcher": shlex.join(host.prefix),
            "dsn": None if host.dsn is None else redact_dsn(host.dsn),
            "pids": group.pids[host.name],
            "completed": sum(by_pid.get(pid, 0) for pid in group.pids[host.name]),
            "lost": host.name in group.lost_hosts,
        }
        for host in group.hosts
    ]


def _worker_stats(group: WorkerGroup) -> dict[str, Any]:
    return {
        "started": group.started,
        "unexpected_exits": group.unexpected_exits,
        "log_warnings": group.log.warnings,
        "log_lease_lost": group.log.lease_lost,
        "log_errors": group.log.errors,
        "last_log_lines": list(group.log.lines),
    }


def _show_progress(run: _Run, group: WorkerGroup) -> None:
    monitor = run.monitor
    if monitor is None or monitor.latest is None:
        return
    snap = monitor.latest
    errors = group.log.warnings + group.log.errors + group.unexpected_exits + monitor.db_errors
    run.progress.show(
        Progress(
            elapsed=trio.current_time() - run.started_at,
            enqueued=run.ids.count,
            completed=snap.completed,
            rate=monitor.rate(),
            available=snap.available,
            running=snap.running,
            scheduled=snap.scheduled,
            dead=snap.dead,
            workers=len(group.live()),
            processes=group.count,
            kills=run.chaos.kills,
            terminated=run.chaos.terminated_connections,
            restarts=run.chaos.postgres_restarts,
            errors=errors + (run.producer.errors if run.producer else 0),
            db_down=monitor.db_down,
        )
    )
