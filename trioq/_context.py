"""What a handler gets besides its args: the job's identity and a few powers.

A `JobContext` needs four things of the worker that runs it, handed over as a
`JobServices`: the pool for the handler's own connections, the queue (schema and
limits), the lease owner's name, and a way to say "this job's outcome is already
written". It never sees the `trioq.Runtime` itself, so a test can build one around
a real pool without running a worker.
"""

from __future__ import annotations

import datetime as dt
import json
import operator
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Concatenate, NoReturn, ParamSpec, Protocol, TypeVar

import attrs
import psycopg
import trio

from ._complete_with import SharedCompletions, check_statement, complete_with
from ._dependencies import Dependency
from ._durable import DurableRun, RunOf, StepRecord, job_steps
from ._enqueue import without_first
from ._exceptions import JobNotFoundError, Snooze
from ._job import DEFAULT_MAX_RESULT, MAX_RETRY_DELAY, Job, JSONValue, Lease, to_delay
from ._job_transaction import Committing, SharedTransactions, own_transaction
from ._pg.connection import Conn, TrioConnection
from ._pg.errors import connection_fault
from ._pg.pool import Pool
from ._progress import DEFAULT_MAX_PROGRESS, ProgressBuffer, encode_progress
from ._queue import Queue

__all__ = ["JobContext", "JobServices"]


@attrs.frozen(kw_only=True)
class JobServices:
    """What a running job may use of its worker."""

    #: Connections for handlers (``Config.app_pool_size``), apart from the worker's own.
    app_pool: Pool
    #: The worker's queue: its schema and payload limit.
    queue: Queue
    #: The lease owner (``Config.worker_id``), for the fence of ``job.transaction()``.
    owner: str
    #: Around the commit of a job's own transaction (``job.transaction()``,
    #: ``job.complete_with()``): no heartbeat meanwhile; forgotten if it committed,
    #: heartbeated again if not (`trioq._worker.leases.HeldJobs.committing`).
    committing: Committing
    #: The lanes of ``job.transaction(shared=True)``; None: every job gets its own.
    shared: SharedTransactions | None = None
    #: ``job.transaction()`` without ``shared=`` joins them (``Config.group_commit``).
    shared_by_default: bool = False
    #: The lanes of ``job.complete_with(..., shared=True)``; None: every job gets its own.
    completions: SharedCompletions | None = None
    #: The largest JSON a durable step may record (``Config.max_result_bytes``).
    max_result_bytes: int = DEFAULT_MAX_RESULT
    #: Where ``job.progress()`` puts the latest value of each job until the worker writes it
    #: (`trioq._worker.services.progress`); a context without a worker keeps it there.
    progress: ProgressBuffer = attrs.field(factory=ProgressBuffer)
    #: The largest JSON ``job.progress()`` takes (``Config.max_progress_bytes``).
    max_progress_bytes: int = DEFAULT_MAX_PROGRESS


class TaskLike(Protocol):
    """What `JobContext.spawn` reads of a `trioq.Task` (which imports this module)."""

    @property
    def name(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def max_attempts(self) -> int: ...


P = ParamSpec("P")
R = TypeVar("R")


def _on_app_connection(
    method: Callable[Concatenate[Queue, Conn, P], Awaitable[R]],
) -> Callable[Concatenate[JobContext, P], Awaitable[R]]:
    """``method`` of the worker's queue, on a connection of the app pool."""

    async def call(self: JobContext, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._noting_faults():
            async with self.services.app_pool.connection() as conn:
                return await method(self.services.queue, conn, *args, **kwargs)

    without_first(call, method, name=method.__name__, first="self")
    call.__doc__ = (
        "Enqueue another job, committed at once (independently of this job), on a connection "
        f"of the app pool; the arguments are those of `Queue.{method.__name__}` after ``conn``."
    )
    return call


def _of_job(name: str) -> Any:
    """A read-only property: the running job's ``name``."""
    return property(operator.attrgetter(f"job.{name}"), doc=f"The job's ``{name}``.")


#: The shortest snooze: a snoozed attempt is refunded, so ``snooze(0)`` would run the job
#: again at once and forever, a busy loop through the database that nothing reports.
MIN_SNOOZE = dt.timedelta(milliseconds=10)


class JobContext:
    """The running job: ``job.id``, ``job.attempt``, ``job.queue``, ... and helpers."""

    def __init__(self, job: Job, services: JobServices) -> None:
        self.job = job
        self.services = services
        self.completed_in_transaction = False
        self._in_transaction = False  # inside a job.transaction() block
        #: The connection fault (`trioq._pg.errors.connection_fault`) that broke one of this
        #: job's own connections (``job.transaction()``, ``job.complete_with()``,
        #: ``job.connection()``, ``job.enqueue()``): if the handler's error came from it, the
        #: database failed, not the handler (the job is given back at once, `trioq._worker.
        #: execute`).
        self.fault: psycopg.Error | None = None
        self._durable: DurableRun | None = None  # made by the first durable call

    @contextmanager
    def _noting_faults(self) -> Iterator[None]:
        try:
            yield
        except Exception as ex:
            if (fault := connection_fault(ex)) is not None:
                self.fault = fault
            raise

    # The running job's fields, read-only (as on `trioq.Job`).
    id: int = _of_job("id")
    attempt: int = _of_job("attempt")
    max_attempts: int = _of_job("max_attempts")
    queue: str = _of_job("queue")
    task: str = _of_job("task")
    enqueued_at: dt.datetime = _of_job("enqueued_at")

    @property
    def cost(self) -> int:
        """The slots it occupies (``docs/flow-control.md``, "Weighted slots"): its row's
        cost, or its task's when the enqueue left it to the task."""
        cost = self.job.cost
        return 1 if cost is None else cost

    @property
    def lease(self) -> Lease:
        return Lease(self.job.id, self.job.attempt)

    def snooze(self, delay: dt.timedelta | float) -> NoReturn:
        """Stop now and run again after ``delay`` (at least `MIN_SNOOZE`, at most 365 days);
        this attempt does not count."""
        if delay is None:
            raise TypeError("snooze delay must be a timedelta or seconds, got None: give the "
                            "time to wait, e.g. job.snooze(30)")  # fmt: skip
        wait = to_delay(delay, "snooze delay", MAX_RETRY_DELAY)
        if wait < MIN_SNOOZE:
            raise ValueError(
                f"snooze delay must be at least {MIN_SNOOZE.total_seconds():g} s, got "
                f"{wait.total_seconds():g} s: a snoozed attempt is refunded, so a job that "
                "snoozes for nothing runs again at once, forever; give the time to wait"
            )
        raise Snooze(wait)

    # -- progress (docs/progress.md) ------------------------------------------------------------

    async def progress(self, value: JSONValue) -> None:
        """Report this job's progress: any JSON value (``{"done": 40, "of": 100}``), readable by
        `trioq.job_status`, ``trioq jobs show`` and the dashboard's job page.

        Call it as often as you like: it only keeps the value in memory, and the worker
        writes the latest one at most once per ``Config.progress_interval`` (fenced by the
        lease), so it never waits for the database and never fails because of it. Raises
        `ValueError` for a value that is not JSON or is over ``Config.max_progress_bytes``."""
        self.progress_nowait(value)
        await trio.lowlevel.checkpoint()

    def progress_nowait(self, value: JSONValue) -> None:
        """`progress` without the checkpoint: for a sync handler (it may be called from its
        thread) and for code that must not yield."""
        text = encode_progress(value, self.services.max_progress_bytes)
        self.services.progress.record(self.lease, text)

    @property
    def last_progress(self) -> JSONValue:
        """The value this attempt reported last (written yet or not), None if none: for
        tests of a handler (`trioq.testing.job_context`)."""
        text = self.services.progress.last(self.lease)
        return None if text is None else json.loads(text)

    # -- durable jobs (docs/durable.md) -----------------------------------------------------------

    @property
    def _run(self) -> DurableRun:
        if self._durable is None:
            services = self.services
            self._durable = DurableRun(RunOf(
                lease=self.lease, pool=services.app_pool, sql=services.queue.sql,
                owner=services.owner, max_result_bytes=services.max_result_bytes,
                noting_faults=self._noting_faults, enqueue=services.queue.enqueue,
            ))  # fmt: skip
        return self._durable

    async def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` (awaited if it returns an awaitable) once and record its
        JSON result; in any later run of this job (a retry, a wake-up after `sleep`, a run
        after a crash) return the recorded result without running it.

        The record is written after ``fn`` returns, fenced by the lease: should the worker
        die in between, ``fn`` runs again in the next run, so give an external effect an
        idempotency key (`step_key`). Steps must be called in the same order, each name
        once per run; a replay that does not match raises `trioq.DurableError` (the job is
        dead-lettered, naming the step)."""
        return await self._run.step(name, fn, *args, **kwargs)

    async def step_transaction(
        self, name: str, fn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any
    ) -> Any:
        """`step` whose effect is database writes: ``await fn(conn, *args, **kwargs)`` runs in
        a transaction on a connection of the app pool, and its writes commit together with
        the step's record, fenced by the lease: exactly once. A replay returns the recorded
        result without calling ``fn``."""
        return await self._run.step_transaction(name, fn, *args, **kwargs)

    def step_key(self, name: str) -> str:
        """A key for step ``name`` of this job, the same in every run and attempt (an
        idempotency key for the external effect of a step: a payment, an e-mail)."""
        return self._run.key(name)

    async def sleep(self, delay: dt.timedelta | float, *, name: str | None = None) -> None:
        """End this run and run the job again after ``delay`` (seconds or a timedelta, up to
        100 years), by the database's clock; the slot and the lease are freed meanwhile and
        the attempt is refunded. Recorded as a step (``name``, default ``"sleep N"`` for the
        N-th sleep of the run): when the job runs again, the steps before it replay and
        this call returns. Raises `trioq.Sleep` to end the run: do not catch it."""
        await self._run.sleep(delay, name)

    async def sleep_until(self, when: dt.datetime, *, name: str | None = None) -> None:
        """`sleep` until an aware datetime (returns at once, recorded, if it has passed)."""
        await self._run.sleep_until(when, name)

    async def wait_for(
        self,
        name: str,
        *,
        timeout: dt.timedelta | float | None = None,  # noqa: ASYNC109 - a durable deadline
    ) -> JSONValue:
        """The payload of signal ``name`` (`trioq.signal`), once it has been sent to this job.

        A signal sent before this call is not lost: it is returned at once. Otherwise the
        run ends (`trioq.Waiting`): the job is given back, its slot and lease freed and the
        attempt refunded, and runs again when the signal comes (its queue is notified:
        milliseconds) or when ``timeout`` (seconds or a timedelta; None: 100 years) has
        passed, when this call raises `trioq.WaitTimeout` (catch it to go on without). The
        wait is recorded as a step named ``name``: each name once per run."""
        return await self._run.wait_for(name, timeout)

    async def spawn(
        self,
        task: TaskLike | str,
        args: JSONValue = None,
        /,
        *,
        name: str | None = None,
        **options: Any,
    ) -> int:
        """Enqueue a child job, once: its id. The enqueue and the spawn's record commit in one
        transaction, so a replay returns the same child and never enqueues a second one.
        ``task`` is a `trioq.Task` (its queue and max_attempts apply) or a task name;
        ``options`` are `Queue.enqueue`'s (``queue=``, ``priority=``, ``delay=``, ...).
        Recorded as a step (``name``, default ``"spawn N"`` for the N-th spawn of the run).
        The child tells this job when it ends: `wait_for_job`."""
        if not isinstance(task, str):
            options = {"queue": task.queue, "max_attempts": task.max_attempts, **options}
            task = task.name
        return await self._run.spawn(task, args, options, name)

    async def wait_for_job(
        self,
        child: int,
        *,
        timeout: dt.timedelta | float | None = None,  # noqa: ASYNC109 - a durable deadline
    ) -> JSONValue:
        """The result of a child (`spawn`) once it has ended, without holding a slot
        meanwhile (as `wait_for`: the run ends, and the child's end wakes it). Its kept
        result (None when its task does not keep results); `trioq.JobDeadError` or
        `trioq.JobCancelledError` if it died or was cancelled; `trioq.WaitTimeout` after
        ``timeout``."""
        return await self._run.wait_for_job(child, timeout)

    async def patched(self, name: str) -> bool:
        """Whether this run takes the new branch of a changed handler: True for a run that
        reaches this point for the first time since the patch (recorded, so its replays say
        True too), False for a run that had gone past this point before the patch existed
        (its records replay the old branch). ``if await job.patched("tax-v2"): ... else: ...``
        (``docs/durable.md``, "Changing a durable handler")."""
        return await self._run.patched(name)

    async def steps(self) -> list[StepRecord]:
        """What this job has recorded, in order (steps and sleeps)."""
        with self._noting_faults():
            async with self.services.app_pool.connection() as conn:
                return await job_steps(conn, self.services.queue.sql, self.id)

    enqueue = _on_app_connection(Queue.enqueue)
    enqueue_many = _on_app_connection(Queue.enqueue_many)
    enqueue_bulk = _on_app_connection(Queue.enqueue_bulk)

    async def dependencies(self) -> list[Dependency]:
        """The jobs this job waited for (``after``, or a workflow's), by id, and what became
        of each; empty for a job without dependencies (``docs/workflows.md``)."""
        with self._noting_faults():
            async with self.services.app_pool.connection() as conn:
                return await self.services.queue.dependencies(conn, self.id)

    async def dependency_results(self) -> dict[int, JSONValue]:
        """The kept results of the dependencies that completed, by job id.

        Dependencies that did not complete (dead, cancelled or deleted, for a job that runs
        anyway) are left out: `dependencies` says what became of them. A dependency that
        completed without keeping its result raises `trioq.JobNotFoundError`: register its
        task with ``keep_result=True``.
        """
        results: dict[int, JSONValue] = {}
        for dep in await self.dependencies():
            if dep.outcome != "done":
                continue
            if not dep.result_kept:
                raise JobNotFoundError(
                    f"dependency {dep.job_id} (task {dep.task!r}) of job {self.id} completed, "
                    "but its result was not kept (or was pruned): register its task with "
                    "keep_result=True",
                    job_id=dep.job_id,
                )
            results[dep.job_id] = dep.result
        return results

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[TrioConnection[Any]]:
        """A pooled connection (autocommit) for work that is not the job's outcome."""
        with self._noting_faults():
            async with self.services.app_pool.connection() as conn:
                yield conn

    @asynccontextmanager
    async def transaction(
        self, *, shared: bool | None = None
    ) -> AsyncIterator[TrioConnection[Any]]:
        """A transaction that also completes this job: exactly-once effects.

        Do the job's database writes on the yielded connection; when the block
        ends without error, the job is completed (fenced by its lease) in the
        same transaction. If the lease was lost meanwhile, the transaction rolls
        back and `LeaseLostError` is raised, so the writes happen once even when
        the job runs twice. ``BEGIN`` travels with the block's first statement, and
        the completion with ``COMMIT``: no round trip of its own.

        ``shared=True`` (under ``serve``, the default: ``Config.group_commit``): the block
        runs in a transaction shared with other jobs' blocks (each under its savepoint,
        its lease checked and its row held by its first statement), committed with all
        their completions when the worker has no more blocks waiting
        (``Config.shared_transactions``, ``docs/transactions.md``): for short blocks,
        about twice the jobs per second. A failing block or a lost lease fails only its
        own job. The block returns once that transaction has committed; if the commit
        failed, `SharedTransactionError` is raised and the job is retried.
        ``shared=False``: a transaction of its own (for ``SET TRANSACTION``, ``SET LOCAL``,
        transaction-level advisory locks, or a block that waits on something slow).
        """
        services = self.services
        if shared is None:
            shared = services.shared_by_default
        if shared and services.shared is not None:
            block = services.shared.member(self.lease, services.committing)
        else:
            block = own_transaction(
                services.app_pool, services.queue, services.owner, self.lease, services.committing
            )
        self._in_transaction = True
        try:
            with self._noting_faults():
                async with block as conn:
                    yield conn
        finally:
            self._in_transaction = False
        self.completed_in_transaction = True

    async def complete_with(
        self, query: Any, params: Any = None, *, shared: bool = False
    ) -> psycopg.AsyncCursor[Any]:
        """Run one statement and complete this job in the same transaction, in one round trip.

        The exactly-once path of a job whose effect is one statement: like
        ``job.transaction()`` around one ``execute``, but ``BEGIN``, the fence (the lease
        checked, the job's row locked), the statement, the completion and ``COMMIT`` go
        together, so the job costs one round trip instead of two. Returns the statement's
        cursor (``RETURNING`` rows are on it). If the statement fails, its error is raised
        here and nothing is committed; if the lease was lost, `LeaseLostError` is raised and
        nothing is committed. Once it returns, the job is completed, whatever the handler
        does next. Statements that would end or change the transaction or the session, and
        COPY, are refused before anything is sent (`psycopg.ProgrammingError`).

        ``shared=True``: group commit. The statement goes in one transaction with the
        statements of the other jobs that call it meanwhile, and all their completions
        (``Config.shared_transactions`` lanes, at most ``Config.shared_transaction_jobs``
        jobs each); it returns once that transaction has committed. Should the batch not
        commit, its jobs are sent again one by one, so each gets only its own error: the
        statement may run twice on the server (the first run rolled back) and must not
        depend on the other jobs' statements (``docs/transactions.md``).
        """
        if self.completed_in_transaction:
            raise RuntimeError(
                f"job {self.id}: already completed in a transaction "
                "(by job.transaction() or job.complete_with())"
            )
        check_statement(query)
        if self._in_transaction:
            raise RuntimeError(
                f"job {self.id}: complete_with() inside job.transaction(): run the statement "
                "on the block's connection, which completes the job when the block ends"
            )
        services = self.services
        with self._noting_faults():
            if shared and services.completions is not None:
                cursor = await services.completions.complete(
                    self.lease, services.committing, query, params
                )
            else:
                cursor = await complete_with(
                    services.app_pool, services.queue, services.owner, self.lease,
                    services.committing, query=query, params=params,
                )  # fmt: skip
        self.completed_in_transaction = True
        return cursor
