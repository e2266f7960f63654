"""The queue as a library: enqueue, cancel, status, results, flow control, cron entries of
the database, dead letters.

Everything runs on a connection the caller passes in, inside whatever transaction the
caller has open (or autocommit). Applications mostly call `Queue.enqueue` (and the
functions of `trioq._enqueue`, which are its methods on the default queue). A `Queue`
checks what goes in (the payload limit, the schema's version) and hands the rows to
`trioq._db.insert`; the claim and the fenced writes on leased jobs are the worker's
(`trioq._db.driver.Driver`), offered here too for users who drive the queue by hand
(``docs/queue.md``).
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import attrs

from ._cron import CronEntry
from ._cron_store import StoredCronEntry, add_entry, read_entries, remove_entry
from ._db import insert
from ._db.adapters import tuple_rows
from ._db.driver import Driver, FailResult, HeartbeatResult, SweepResult
from ._db.insert import GraphJob
from ._db.migrate import latest_version
from ._db.statements import Statements, statements, validate_schema_name
from ._db.version import check_schema, migrated, schema_version
from ._dead import DeadFilter, DeadJob, list_dead, purge_dead, retry_dead
from ._dependencies import Dependency, read_dependencies
from ._durable import StepRecord, job_steps, send_signal
from ._flow import (
    UNSET,
    QueueSettings,
    RateLimit,
    Unset,
    age_queue,
    change_settings,
    read_settings,
)
from ._job import (
    DEFAULT_MAX_PAYLOAD,
    EnqueueResult,
    JobSpec,
    JSONValue,
    check_job_id,
    check_max_payload,
    check_payload,
    encode_args_runs,
)
from ._obs.carrier import carrier
from ._obs.depth import read_depths
from ._pg.conn import Conn
from ._result import DEFAULT_POLL_INTERVAL, JobStatus, wait_result
from ._result import job_status as read_job_status
from ._rules import rule
from ._unique import Debounce, Unique, unique_key

__all__ = [
    "CancelOutcome",
    "FailResult",
    "HeartbeatResult",
    "Queue",
    "QueueStatus",
    "SweepResult",
    "WorkerLeases",
]

P = ParamSpec("P")
R = TypeVar("R")


@attrs.frozen(kw_only=True)
class QueueStatus:
    queue: str
    available: int
    scheduled: int
    running: int
    dead: int
    oldest_wait_seconds: float | None  # how long the oldest due job has waited
    waiting: int = 0  # waiting for their dependencies
    #: The states whose count stopped at the cap of `Queue.status` (there are at least
    #: that many); empty when every count is exact.
    at_cap: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class WorkerLeases:
    worker: str
    running: int
    next_expiry_seconds: float  # negative: a lease already expired (a crashed worker)


@attrs.frozen
class CancelOutcome:
    """``cancelled`` (it was available), ``requested`` (running: the runtime will stop it),
    or ``not_found`` (no such job, or already finished)."""

    status: str


def _on_driver(
    method: Callable[Concatenate[Driver, P], Awaitable[R]],
) -> Callable[Concatenate[Queue, P], Awaitable[R]]:
    """`Driver`'s ``method`` as a method of `Queue`, with its signature and docstring."""

    async def call(self: Queue, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await method(self.driver, *args, **kwargs)

    functools.update_wrapper(call, method)
    call.__qualname__ = f"Queue.{method.__name__}"
    return call


@attrs.frozen(kw_only=True)
class Queue:
    """trioq's tables in one schema, and the limits applied on the way in."""

    schema: str = attrs.field(default="trioq", validator=rule(validate_schema_name))
    max_payload_bytes: int = attrs.field(
        default=DEFAULT_MAX_PAYLOAD, validator=rule(check_max_payload)
    )
    #: The claim and the fenced writes on leased jobs, in this schema.
    driver: Driver = attrs.field(init=False, repr=False, eq=False)
    #: Connections whose schema version was found current (see `_check_version`).
    _current: weakref.WeakKeyDictionary[Conn, bool] = attrs.field(
        factory=weakref.WeakKeyDictionary, init=False, repr=False, eq=False
    )

    @driver.default
    def _driver(self) -> Driver:
        return Driver(self.schema)

    @property
    def sql(self) -> Statements:
        return statements(self.schema)

    # -- enqueue (trioq._db.insert) ------------------------------------------------------------

    async def enqueue(
        self,
        conn: Conn,
        task: str,
        args: JSONValue = None,
        *,
        queue: str = "default",
        priority: int = 0,
        run_at: dt.datetime | None = None,
        delay: dt.timedelta | float | None = None,
        start_by: dt.datetime | dt.timedelta | float | None = None,
        max_attempts: int | None = None,
        dedup_key: str | None = None,
        unique: bool | Unique = False,
        concurrency_key: str | None = None,
        after: Sequence[int] | None = None,
        on_dependency_failure: str = "cancel",
        debounce: Debounce | dt.timedelta | float | None = None,
        cost: int | None = None,
        sequence_key: str | None = None,
        notify: bool = True,
    ) -> EnqueueResult:
        """Insert one job on ``conn``, in the caller's transaction if one is open.

        The job (and its wake-up notification) becomes visible when the caller
        commits. With ``dedup_key`` (scoped by task), ``unique=True`` or
        ``unique=trioq.Unique(...)`` a job whose twin holds the key is not inserted: the
        result says ``duplicate`` and carries the twin's id (docs/flow-control.md says
        which enqueue wins). ``concurrency_key`` is the job's key for the per-key limits
        of its queue. With ``after`` (ids of existing jobs) the job waits until they have
        all ended; ``on_dependency_failure`` says what one that dies or is cancelled does
        to it: ``cancel`` it too, or ``run`` it anyway (docs/workflows.md). With
        ``start_by`` (a datetime, or a timedelta or seconds from the database's clock) a job
        not started by then is dead-lettered instead of run late (docs/flow-control.md,
        "Deadlines to start"). With ``debounce`` (and a key: ``dedup_key`` or ``unique=``)
        a burst of enqueues of one key makes one job, run after the burst with the last
        args (docs/flow-control.md, "Debounce"); the result of an enqueue that found the
        key's job waiting is that job's id, ``duplicate=True``. ``cost`` is how many of its
        worker's slots (and of its queue's global limit) the job occupies while it runs, 1 to
        1000; None: its task's, resolved by the worker that claims it (docs/flow-control.md,
        "Weighted slots"). With ``sequence_key`` the job runs only once every earlier job of
        that key has finished, in enqueue order (docs/flow-control.md, "Sequences").
        """
        spec = JobSpec(
            task=task, args=args, queue=queue, priority=priority, run_at=run_at, delay=delay,
            start_by=start_by, max_attempts=max_attempts, dedup_key=dedup_key, unique=unique,
            concurrency_key=concurrency_key, after=after,
            on_dependency_failure=on_dependency_failure, debounce=debounce, cost=cost,
            sequence_key=sequence_key,
        )  # fmt: skip
        check_payload(spec.args_json, task=spec.task, max_bytes=self.max_payload_bytes)
        with migrated(conn, self.schema), insert.refusals():
            await self._check_version(conn)
            if spec.after:
                ids = await insert.graph(conn, self.sql, [GraphJob(spec=spec)], notify=notify,
                                         trace=carrier())  # fmt: skip
                return EnqueueResult(ids[0])
            if spec.debounce is not None:
                return await insert.debounced(conn, self.sql, spec, notify=notify,
                                              trace=carrier())  # fmt: skip
            found = spec.uniqueness()
            if found is not None and found.windowed:
                return await insert.windowed(conn, self.sql, spec, notify=notify)
            return await insert.one(conn, self.sql, spec, notify=notify, trace=carrier())

    async def enqueue_many(
        self, conn: Conn, jobs: Iterable[JobSpec], *, notify: bool = True
    ) -> list[EnqueueResult]:
        """Insert many jobs in a few statements; results are in input order.

        Every job is checked before any SQL (errors name ``jobs[i]``). A batch
        without dedup keys whose jobs differ only in args is one statement (as
        `enqueue_bulk`); other batches without dedup keys reserve their ids, then
        go through COPY; a batch with dedup keys uses one ``INSERT ... SELECT FROM
        unnest`` with ``ON CONFLICT DO NOTHING``. One notification per distinct
        queue (and one ``@scheduled`` for jobs due later), whatever the batch size.
        """
        specs = list(jobs)
        if not specs:
            return []
        for i, spec in enumerate(specs):
            if not isinstance(spec, JobSpec):
                raise TypeError(f"jobs[{i}] must be a JobSpec, got {spec!r}")
            check_payload(spec.args_json, task=spec.task, max_bytes=self.max_payload_bytes,
                          where=f"jobs[{i}].args")  # fmt: skip
        with migrated(conn, self.schema), insert.refusals():
            await self._check_version(conn)
            return await insert.many(conn, self.sql, specs, notify=notify, trace=carrier())

    async def enqueue_graph(
        self, conn: Conn, jobs: Sequence[GraphJob], *, notify: bool = True
    ) -> list[int]:
        """Insert jobs that may wait for each other (``jobs[i].waits_for``, positions in
        ``jobs``) and for existing jobs (``spec.after``), in one transaction; their ids.
        What `trioq.Workflow` and `trioq.Batch` enqueue through (``docs/workflows.md``)."""
        for i, job in enumerate(jobs):
            check_payload(job.spec.args_json, task=job.spec.task,
                          max_bytes=self.max_payload_bytes, where=f"jobs[{i}].args")  # fmt: skip
        with migrated(conn, self.schema), insert.refusals():
            await self._check_version(conn)
            return await insert.graph(conn, self.sql, jobs, notify=notify, trace=carrier())

    async def enqueue_bulk(
        self,
        conn: Conn,
        task: str,
        args: Iterable[JSONValue],
        *,
        queue: str = "default",
        priority: int = 0,
        run_at: dt.datetime | None = None,
        delay: dt.timedelta | float | None = None,
        start_by: dt.datetime | dt.timedelta | float | None = None,
        max_attempts: int | None = None,
        after: Sequence[int] | None = None,
        on_dependency_failure: str = "cancel",
        cost: int | None = None,
        sequence_key: str | None = None,
        notify: bool = True,
    ) -> list[int]:
        """Insert one job of ``task`` per item of ``args``; their ids, in input order.

        The jobs share every other field, validated once as for `enqueue`; each
        ``args[i]`` is checked (JSON, no NUL, the payload limit) before any SQL,
        errors naming ``args[i]``. No dedup keys (use `enqueue_many`). The rows go
        in by one statement per 20,000 jobs, in the caller's transaction (or one of
        their own in autocommit), with one notification. With ``after``, every job waits
        for those jobs (as `enqueue`'s ``after``).
        """
        if isinstance(args, str | bytes | Mapping):
            raise TypeError(f"args must be a sequence with one job's args per item, got {args!r}")
        spec = JobSpec(
            task=task, queue=queue, priority=priority, run_at=run_at, delay=delay,
            start_by=start_by, max_attempts=max_attempts, after=after,
            on_dependency_failure=on_dependency_failure, cost=cost, sequence_key=sequence_key,
        )  # fmt: skip
        values = args if isinstance(args, Sequence) else list(args)
        runs = encode_args_runs(values, task=spec.task, max_bytes=self.max_payload_bytes)
        if spec.after:
            graph = [GraphJob(spec=attrs.evolve(spec, args=value)) for value in values]
            return await self.enqueue_graph(conn, graph, notify=notify)
        with migrated(conn, self.schema), insert.refusals():
            await self._check_version(conn)
            return await insert.bulk(conn, self.sql, spec, runs, notify=notify, trace=carrier())

    async def _check_version(self, conn: Conn) -> None:
        """Refuse to enqueue into a schema of another version than this trioq's (a newer
        trioq may have changed what a row means), as ``serve`` refuses to start. Checked
        once per connection; a schema that does not exist is left to the insert to report."""
        if conn in self._current:
            return
        version = await schema_version(conn, self.schema)
        if version is None:
            return
        if version != latest_version():
            await check_schema(conn, self.schema, latest_version(), writable=False)
        self._current[conn] = True

    # -- the worker's calls (trioq._db.driver), for users who drive the queue by hand --------

    claim = _on_driver(Driver.claim)
    claim_limited = _on_driver(Driver.claim_limited)
    heartbeat = _on_driver(Driver.heartbeat)
    complete_many = _on_driver(Driver.complete_many)
    fail_many = _on_driver(Driver.fail_many)
    release_many = _on_driver(Driver.release_many)
    release_unknown_many = _on_driver(Driver.release_unknown_many)
    cancel_running_many = _on_driver(Driver.cancel_running_many)
    sweep = _on_driver(Driver.sweep)
    reclaim_dead_workers = _on_driver(Driver.reclaim_dead_workers)
    notify_queues = _on_driver(Driver.notify_queues)
    promote_due = _on_driver(Driver.promote_due)
    clock = _on_driver(Driver.clock)
    next_due = _on_driver(Driver.next_due)

    # -- cancel --------------------------------------------------------------------------------

    async def cancel(self, conn: Conn, job_id: int) -> CancelOutcome:
        """Cancel a scheduled or available job at once; flag a running one for the runtime,
        and notify its worker (``@cancel:<id>``), which stops the handler at once."""
        cur = await conn.execute(self.sql.cancel, {"id": job_id, "channel": self.sql.channel})
        row = await cur.fetchone()
        assert row is not None
        if row[0]:
            return CancelOutcome("cancelled")
        return CancelOutcome("requested" if row[1] else "not_found")

    # -- status --------------------------------------------------------------------------------

    async def status(
        self, conn: Conn, *, cap: int | None = None
    ) -> tuple[list[QueueStatus], list[WorkerLeases]]:
        """Per queue counts and the oldest wait; live leases per worker.

        ``cap=None`` counts every job (a read of the whole jobs table: it grows with the
        backlog). With a ``cap``, each count per queue and state is exact up to ``cap`` and
        stops there (`QueueStatus.at_cap` names those), read through the indexes at a
        bounded cost whatever the backlog (`trioq._obs.depth`, as the metrics do); the oldest
        wait is then that of the queue's next job to be claimed.
        """
        if cap is None:
            cur = await conn.execute(self.sql.status_queues)
            queues = [
                QueueStatus(queue=q, available=a, scheduled=s, running=r, dead=d,
                            oldest_wait_seconds=None if w is None else float(w), waiting=waiting)
                for q, a, s, r, d, w, waiting in await cur.fetchall()
            ]  # fmt: skip
        else:
            queues = await self._capped_status(conn, _check_cap(cap))
        cur = await conn.execute(self.sql.status_leases)
        leases = [
            WorkerLeases(worker=w, running=n, next_expiry_seconds=e.total_seconds())
            for w, n, e in await cur.fetchall()
        ]
        return queues, leases

    async def _capped_status(self, conn: Conn, cap: int) -> list[QueueStatus]:
        depths = await read_depths(conn, self.sql, cap)
        names = sorted({queue for queue, _ in depths.counts})

        def count(queue: str, state: str) -> int:
            return depths.counts.get((queue, state), 0)

        return [
            QueueStatus(
                queue=q, available=count(q, "available"), scheduled=count(q, "scheduled"),
                running=count(q, "running"), dead=count(q, "dead"),
                oldest_wait_seconds=depths.head_wait.get(q), waiting=count(q, "waiting"),
                at_cap=tuple(s for s in STATUS_STATES if count(q, s) >= cap),
            )
            for q in names
        ]  # fmt: skip

    # -- durable jobs (trioq._durable) ----------------------------------------------------------

    async def signal(
        self,
        conn: Conn,
        job_id: int | None,
        name: str,
        payload: JSONValue = None,
        *,
        task: str | None = None,
        key: str | None = None,
    ) -> str:
        """Send signal ``name`` (with a JSON ``payload``) to a job, in the caller's
        transaction if one is open: ``"woke"`` (the job waited for it, and runs now),
        ``"stored"`` (kept for the job's ``wait_for(name)`` to come) or ``"duplicate"``
        (a signal of that name was sent to it before; the first one counts). The job is
        ``job_id``, or (``job_id=None``) the live job of ``task`` enqueued with
        ``dedup_key=key``. `trioq.JobNotFoundError` for no such live job, or one that has
        ended (``docs/durable.md``)."""
        if job_id is None:
            if task is None or key is None:
                raise TypeError("give a job_id, or task= and key= (the job's dedup_key)")
            scoped = unique_key(task=task, queue="default", args=None, dedup_key=key,
                                unique=False)  # fmt: skip
            assert scoped is not None  # a dedup_key always makes one
            found: str | None = scoped.key
        else:
            check_job_id(job_id)
            if task is not None or key is not None:
                raise TypeError("give a job_id or task= and key=, not both")
            found = None
        with migrated(conn, self.schema):
            await self._check_version(conn)
            who = f"job {job_id}" if job_id is not None else f"task {task!r} key {key!r}"
            return await send_signal(conn, self.sql, job_id=job_id, key=found, name=name,
                                     payload=payload, max_bytes=self.max_payload_bytes,
                                     who=who)  # fmt: skip

    async def steps(self, conn: Conn, job_id: int) -> list[StepRecord]:
        """What a durable job recorded (steps, sleeps, waits, patches), in order; empty for a
        job without records (or none at all)."""
        check_job_id(job_id)
        with migrated(conn, self.schema):
            return await job_steps(conn, self.sql, job_id)

    # -- results (trioq._result) ----------------------------------------------------------------

    async def dependencies(self, conn: Conn, job_id: int) -> list[Dependency]:
        """The jobs job ``job_id`` waits (or waited) for, and what became of each
        (docs/workflows.md)."""
        return await read_dependencies(conn, self.sql, job_id)

    async def job_status(self, conn: Conn, job_id: int) -> JobStatus:
        """Where the job is in its life: every state, ``unknown`` when there is no such job."""
        return await read_job_status(conn, self.sql, job_id)

    async def result(
        self,
        conn: Conn,
        job_id: int,
        *,
        timeout: float | dt.timedelta | None = None,  # noqa: ASYNC109 - see docs/results.md
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> JSONValue:
        """The job's kept result, waiting for the job to finish if it has not.

        Raises `JobDeadError` or `JobCancelledError` (with the job's last error),
        or `JobNotFoundError` (no such job, or one that kept no result). A pending
        job is waited for with LISTEN on ``conn`` (autocommit, outside a
        transaction), re-read every ``poll_interval`` seconds should a
        notification be lost. ``timeout``: `trio.TooSlowError` after that many
        seconds, as ``with trio.fail_after(timeout)`` around the call would.
        """
        return await wait_result(
            conn, self.sql, job_id, timeout=timeout, poll_interval=poll_interval
        )

    # -- flow control (trioq._flow, docs/flow-control.md) --------------------------------------

    async def queue_settings(
        self, conn: Conn, names: Sequence[str] | None = None
    ) -> list[QueueSettings]:
        """The stored settings of ``names`` (default: every queue that has any), by name."""
        with migrated(conn, self.schema):
            return await read_settings(conn, self.sql, names)

    async def pause(
        self, conn: Conn, queue: str, *, until: dt.datetime | dt.timedelta | None = None
    ) -> QueueSettings:
        """Stop every worker from claiming from ``queue`` (running jobs finish; enqueueing
        goes on). Stored, so it outlives restarts; workers hear of it by notification.

        ``until``: the pause ends by itself then, on the database's clock: an aware
        datetime, or a timedelta from the database's clock now (at most 100 years). Without
        it the queue stays paused until resumed, even if it was paused until a time.
        """
        return await self._change(conn, queue, {"paused": True, "until": until})

    async def resume(self, conn: Conn, queue: str) -> QueueSettings:
        """Let workers claim from ``queue`` again (a timed pause ends now)."""
        return await self._change(conn, queue, {"paused": False})

    async def set_limits(
        self,
        conn: Conn,
        queue: str,
        *,
        global_concurrency: int | Unset | None = UNSET,
        rate_limit: RateLimit | str | Unset | None = UNSET,
        key_concurrency: int | Unset | None = UNSET,
        key_rate_limit: RateLimit | str | Unset | None = UNSET,
        aging: dt.timedelta | float | Unset | None = UNSET,
        fair: bool | Unset = UNSET,
    ) -> QueueSettings:
        """Change the limits of ``queue`` that are given (None removes one); the others stay.

        Takes effect for every claim that starts after the caller commits, in every process.
        ``aging`` is the wait that earns a waiting job one priority level (a timedelta or
        seconds; None turns aging off; `trioq.DEFAULT_AGING` when never set). ``fair``:
        claims go round-robin across the jobs' keys (their ``concurrency_key``), so that one
        key's backlog does not delay another's (docs/flow-control.md, "Fair share").
        """
        given = {
            "global_concurrency": global_concurrency,
            "rate_limit": rate_limit,
            "key_concurrency": key_concurrency,
            "key_rate_limit": key_rate_limit,
            "aging": aging,
            "fair": fair,
        }
        return await self._change(conn, queue, {k: v for k, v in given.items() if v is not UNSET})

    async def age(self, conn: Conn, queue: str) -> int:
        """One round of aging for ``queue``, what every worker serving it does every few
        seconds (docs/flow-control.md, "Aging"): the waiting jobs whose wait has earned a
        better priority get it. How many climbed. For tests on a frozen clock."""
        with migrated(conn, self.schema):
            return await age_queue(conn, self.sql, queue)

    async def _change(self, conn: Conn, queue: str, changes: dict[str, Any]) -> QueueSettings:
        with migrated(conn, self.schema):
            return await change_settings(conn, self.sql, queue, changes)

    # -- cron entries of the database (trioq._cron_store, docs/cron.md) ------------------------

    async def add_cron(
        self, conn: Conn, entry: CronEntry, *, replace: bool = False, enabled: bool = True
    ) -> StoredCronEntry:
        """Store ``entry`` for every worker's scheduler to run (beside ``Config.cron``). A
        name already stored is refused unless ``replace``; ``enabled=False`` stores it
        without running it. Every worker hears of it by notification once the caller
        commits."""
        with migrated(conn, self.schema):
            return await add_entry(conn, self.sql, entry, replace=replace, enabled=enabled,
                                   max_payload_bytes=self.max_payload_bytes)  # fmt: skip

    async def remove_cron(self, conn: Conn, name: str) -> bool:
        """Delete the stored entry ``name`` (False: there was none). Once the caller commits
        no worker fires another of its ticks."""
        with migrated(conn, self.schema):
            return await remove_entry(conn, self.sql, name)

    async def cron_entries(self, conn: Conn) -> list[StoredCronEntry]:
        """Every stored entry, by name; a row trioq cannot serve has ``entry`` None and
        ``error`` saying why."""
        with migrated(conn, self.schema):
            return await read_entries(conn, self.sql, max_payload_bytes=self.max_payload_bytes)

    # -- dead letters --------------------------------------------------------------------------

    async def dead_list(
        self, conn: Conn, where: DeadFilter | None = None, *, limit: int = 100
    ) -> list[DeadJob]:
        return await list_dead(conn, self.sql, where or DeadFilter(), limit=limit)

    async def dead_retry(
        self, conn: Conn, where: DeadFilter | None = None, *, dry_run: bool = False
    ) -> list[int]:
        """Move matching dead jobs back to available with fresh attempts; their ids. With
        ``dry_run``, the ids it would move, and nothing moves."""
        return await retry_dead(conn, self.sql, where or DeadFilter(), dry_run=dry_run)

    async def dead_purge(
        self,
        conn: Conn,
        where: DeadFilter | None = None,
        *,
        before: dt.datetime | None = None,
        older_than: dt.timedelta | None = None,
        dry_run: bool = False,
    ) -> list[int]:
        """Delete matching dead jobs; with ``before``, only those that died before it; with
        ``older_than``, only those that died longer ago than that by the database's clock.
        Their ids; with ``dry_run``, the ids it would delete, and nothing is deleted."""
        return await purge_dead(
            conn, self.sql, where or DeadFilter(), before=before, older_than=older_than,
            dry_run=dry_run,
        )  # fmt: skip


def _on_tuple_rows(method: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """``method`` (of `Queue`, with the connection first) on the connection as trioq reads
    it: rows by position, whatever the caller's ``row_factory`` (`tuple_rows`)."""

    async def call(self: Queue, conn: Conn, /, *args: Any, **kwargs: Any) -> R:
        return await method(self, tuple_rows(conn), *args, **kwargs)

    functools.update_wrapper(call, method)
    return call


def _takes_conn(method: object) -> bool:
    if not inspect.iscoroutinefunction(method):
        return False
    parameters = list(inspect.signature(method).parameters)
    return len(parameters) > 1 and parameters[1] == "conn"


for _name, _method in list(vars(Queue).items()):
    if not _name.startswith("_") and _takes_conn(_method):
        setattr(Queue, _name, _on_tuple_rows(_method))


#: The counted states of `QueueStatus`, in its order (the names `QueueStatus.at_cap` uses).
STATUS_STATES = ("available", "scheduled", "running", "dead", "waiting")
#: The largest cap `Queue.status` takes (above it a capped count costs what an exact one does).
MAX_STATUS_CAP = 1_000_000


def _check_cap(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"cap must be an int or None, got {value!r}")
    if not 1 <= value <= MAX_STATUS_CAP:
        raise ValueError(f"cap must be between 1 and {MAX_STATUS_CAP:,}, got {value}")
    return value
