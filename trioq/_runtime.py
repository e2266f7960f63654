"""The worker runtime: ``trio.run(trioq.serve, config)``.

One nursery tree owns everything::

    serve
     |- pool                 bounded connections for claims, outcomes, maintenance
     |- services nursery
     |   |- listener          LISTEN; reconnects with backoff; wakes fetchers on (re)connect
     |   |- completer         batches outcomes into one fenced statement per kind
     |   |- heartbeat         one statement per interval extends every lease we hold
     |   |- sweeper           expired leases of crashed workers: back to available, or dead
     |   |- scheduler         promotes due scheduled jobs; fires cron ticks
     |   |- signals           SIGINT/SIGTERM: graceful stop, a second one skips the grace
     |- jobs nursery          per queue: ``concurrency`` slots, each running one job at a time
         |- fetchers          per queue: claim for idle slots, and ahead of them for short jobs

Shutdown: stop the fetchers (buffered jobs are released unstarted) -> wait up to
``shutdown_grace`` for running jobs -> cancel the rest, whose rows are released
(attempt refunded) -> flush the completer -> close.
"""

from __future__ import annotations

import collections
import datetime as dt
import functools
import logging
import math
import signal
import traceback
from collections.abc import Sequence
from typing import Any

import attrs
import psycopg
import trio
from psycopg import sql

from ._completer import Completer
from ._config import Config, QueueConfig
from ._context import JobContext
from ._cron import fire_due, next_fire_time
from ._exceptions import FatalError, LeaseLostError, Snooze, leaves
from ._job import Job, encode_args
from ._migrate import latest_version
from ._outcome import Kind, Outcome
from ._pg import connect
from ._pool import Pool
from ._queue import Failure, Lease, Queue
from ._registry import Task
from ._retry import Sidekiq
from ._schema import check_schema
from ._sql import NOW, SCHEDULED_PAYLOAD
from ._wakeup import Wakeup

__all__ = ["Runtime", "RuntimeStatistics"]

logger = logging.getLogger("trioq.runtime")

RECONNECT_MIN, RECONNECT_MAX = 0.05, 5.0
#: Bound on the shielded cleanup at shutdown (flushing outcomes).
FLUSH_TIMEOUT = 10.0
#: Longest a retry may be put off, whatever the policy says (Postgres timestamps are finite).
MAX_RETRY_DELAY = dt.timedelta(days=365)
#: Longest the scheduler sleeps without a reason to wake.
SCHEDULER_MAX_SLEEP = 5.0
#: A slot that finds its next job already buffered takes it without a checkpoint, but
#: yields to the other tasks at least once every this many jobs. A checkpoint (one trip
#: through trio's scheduler) costs about as much as the rest of a no-op job; handlers that
#: do any I/O checkpoint anyway.
SLOT_YIELD_EVERY = 8


@attrs.frozen(kw_only=True)
class RuntimeStatistics:
    worker_id: str
    running: int
    held_leases: int
    claimed: int
    completed_batches: int
    outcomes_written: int
    stopping: bool


class _Running:
    """A claimed job's handle: why we aborted it, if we did, and how to stop its handler.

    It exists from the claim on: a prefetched job waiting for a slot has one too,
    so heartbeats, lost leases and cancel requests reach it before it starts.
    While its handler runs, ``scope`` is the cancel scope of the slot running it.
    """

    __slots__ = ("finished", "job", "lease", "reason", "scope")

    def __init__(self, job: Job, lease: Lease) -> None:
        self.job = job
        self.lease = lease
        self.scope: trio.CancelScope | None = None  # set while its handler runs
        self.reason: str | None = None  # "lost", "cancel" or "shutdown"
        self.finished = False  # the handler returned; only its outcome is left to write

    def abort(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        if self.scope is not None:
            self.scope.cancel()


@attrs.define
class _QueueState:
    """One served queue: its prefetch buffer, its slots and its fetcher's wake-ups.

    The buffer is a deque rather than a memory channel: the fetcher appends at
    most what `wanted` allows (so it is bounded), the slots pop them, and slots
    with nothing to do park in ``idle``. That is a third of the cost per job of
    a channel's send and receive.
    """

    name: str
    config: QueueConfig
    active: int = 0  # handlers running
    buffer: collections.deque[_Running] = attrs.field(factory=collections.deque)
    closed: bool = False  # the fetcher stopped: the slots end once the buffer is empty
    idle: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    wakeup: Wakeup = attrs.field(factory=Wakeup)  # a notification, or work to fetch
    room: Wakeup = attrs.field(factory=Wakeup)  # a job finished: claim again?
    fetcher_waits: bool = False  # for `room`: only then do the slots set it
    finished: int = 0  # handlers that returned (or were aborted), ever
    #: Jobs to claim beyond the idle slots: how many finished while the last claim was in
    #: flight (at most ``concurrency``). See `wanted`.
    prefetch: int = 0
    #: Below this, the fetcher does not claim while every slot has work (no tiny claims).
    refill: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.refill = max(1, self.config.concurrency // 2)

    def wanted(self) -> int:
        """How many jobs the next claim should take; 0: wait for `room`.

        Every idle slot (no job running, none buffered for it) wants one job,
        at once. On top of that the fetcher prefetches as many jobs as finished
        during the previous claim's round trip: for short jobs that is up to
        ``concurrency``, so the next claim is in flight while the slots work
        through the buffer. For long jobs it is 0, and a worker claims only
        for idle slots, leaving the rest to other workers.
        """
        idle = self.config.concurrency - self.active - len(self.buffer)
        wanted = idle + self.prefetch
        if idle <= 0 and wanted < self.refill:
            return 0
        return wanted

    def put(self, jobs: list[_Running]) -> None:
        self.buffer.extend(jobs)
        self.idle.unpark(count=len(jobs))

    def close(self) -> None:
        self.closed = True
        self.idle.unpark_all()

    async def take(self, *, checkpoint: bool) -> _Running | None:
        """The next buffered job, or None once closed and empty.

        Checkpoints when it has to wait, or when asked to (see `SLOT_YIELD_EVERY`).
        """
        if checkpoint:
            await trio.lowlevel.checkpoint()
        while not self.buffer:
            if self.closed:
                return None
            await self.idle.park()
        return self.buffer.popleft()  # the slot counts it as active at once: `idle` is unchanged

    def job_done(self) -> None:
        self.active -= 1
        self.finished += 1
        if self.fetcher_waits:
            self.room.set()

    async def wait_for_room(self) -> None:
        self.fetcher_waits = True
        try:
            await self.room.wait()
        finally:
            self.fetcher_waits = False


class Runtime:
    """A running worker process. `serve` creates it and hands it to ``task_status``."""

    def __init__(self, config: Config, dsn: str) -> None:
        self.config = config
        self.dsn = dsn
        self.queue = Queue(schema=config.schema, max_payload_bytes=config.max_payload_bytes)
        #: Claims, outcomes, heartbeats and maintenance: never starved by handlers.
        self.pool = Pool(dsn, max_size=config.pool_size, connect_kwargs={"autocommit": True})
        #: For handlers (``job.connection()``, ``job.transaction()``, ``job.enqueue()``).
        self.app_pool = Pool(
            dsn, max_size=config.app_pool_size, connect_kwargs={"autocommit": True}
        )
        self._queues = {
            name: _QueueState(name, cfg) for name, cfg in config.served_queues().items()
        }
        self._held: dict[Lease, _Running] = {}  # running, or outcome not yet written
        self._sync_limiter = trio.CapacityLimiter(config.sync_threads)
        self._stop_requested = trio.Event()
        self._grace_scope = trio.CancelScope()
        self._scheduler_wakeup = Wakeup()
        self._job_finished = Wakeup()
        self._claimed = 0
        self._completer = Completer(
            self.pool,
            self.queue,
            config.worker_id,
            capacity=sum(q.config.concurrency for q in self._queues.values()),
            written=self._written,
        )

    # -- public ---------------------------------------------------------------------------------

    def stop(self, *, grace: bool = True) -> None:
        """Ask for a graceful stop; a second call (or ``grace=False``) skips the grace period."""
        if self._stop_requested.is_set() or not grace:
            self._grace_scope.cancel()
        self._stop_requested.set()

    def statistics(self) -> RuntimeStatistics:
        return RuntimeStatistics(
            worker_id=self.config.worker_id,
            running=sum(q.active for q in self._queues.values()),
            held_leases=len(self._held),
            claimed=self._claimed,
            completed_batches=self._completer.batches,
            outcomes_written=self._completer.outcomes,
            stopping=self._stop_requested.is_set(),
        )

    async def run(
        self, *, task_status: trio.TaskStatus[Runtime] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with self.pool, self.app_pool:
            await self._check_schema()
            async with trio.open_nursery() as services:
                await services.start(self._listen)
                services.start_soon(self._completer.run)
                services.start_soon(self._heartbeat_loop)
                services.start_soon(self._sweep_loop)
                services.start_soon(self._scheduler_loop)
                if self.config.handle_signals:
                    services.start_soon(self._signal_loop)
                await self._run_jobs(task_status)
                await self._flush()
                services.cancel_scope.cancel()

    # -- startup and shutdown -------------------------------------------------------------------

    async def _check_schema(self) -> None:
        async with self.pool.connection() as conn:
            await check_schema(conn, self.config.schema, latest_version())

    async def _run_jobs(self, task_status: trio.TaskStatus[Runtime]) -> None:
        async with trio.open_nursery() as jobs:
            async with trio.open_nursery() as fetchers:
                for state in self._queues.values():
                    for _ in range(state.config.concurrency):
                        jobs.start_soon(self._slot, state)
                    fetchers.start_soon(self._fetch_loop, state)
                task_status.started(self)
                await self._stop_requested.wait()
                fetchers.cancel_scope.cancel()
            # The fetchers closed their buffers: the slots release what is left in them.
            logger.info("stopping: waiting up to %s s for %d jobs", self.config.shutdown_grace,
                        len(self._held))  # fmt: skip
            with self._grace_scope, trio.move_on_after(self.config.shutdown_grace):
                while any(state.active for state in self._queues.values()):
                    await self._job_finished.wait()
            for running in list(self._held.values()):
                running.abort("shutdown")

    async def _flush(self) -> None:
        """Write every outcome submitted so far (shielded, bounded), then stop the completer."""
        with trio.move_on_after(FLUSH_TIMEOUT, shield=True) as scope:
            await self._completer.close()
            await self._completer.finished.wait()
        if scope.cancelled_caught:
            logger.warning("%d job outcomes not written at shutdown: their leases will expire",
                           len(self._held))  # fmt: skip

    async def _signal_loop(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                logger.info("received %s", signal.Signals(signum).name)
                self.stop()

    # -- fetching and running jobs --------------------------------------------------------------

    async def _fetch_loop(self, state: _QueueState) -> None:
        """Claim jobs for the queue's slots, and ahead of them while jobs are short.

        See `_QueueState.wanted`. Leases held by this queue stay bounded: at
        most 2 x ``concurrency`` running or buffered, plus the outcomes waiting
        for the completer.
        """
        backoff = RECONNECT_MIN
        try:
            while True:
                wanted = state.wanted()
                if wanted <= 0:
                    await state.wait_for_room()
                    continue
                finished_before = state.finished
                try:
                    claimed = await self._claim(state, wanted)
                except Exception as ex:  # the database, mostly; Cancelled is not an Exception
                    logger.warning("claiming from queue %r failed: %s", state.name, ex)
                    # Back off, but a notification (or the listener's reconnect) means
                    # the database is answering again: try at once rather than up to
                    # RECONNECT_MAX later.
                    with trio.move_on_after(backoff):
                        await state.wakeup.wait()
                    backoff = min(backoff * 2, RECONNECT_MAX)
                    continue
                backoff = RECONNECT_MIN
                concurrency = state.config.concurrency
                state.prefetch = min(concurrency, state.finished - finished_before)
                held = self._held
                batch = [_Running(job, Lease(job.id, job.attempt)) for job in claimed]
                for running in batch:
                    held[running.lease] = running
                state.put(batch)  # at most `wanted`: the buffer stays within `concurrency`
                if len(claimed) < wanted:  # the queue is drained: wait for news, or poll
                    with trio.move_on_after(self.config.poll_interval):
                        await state.wakeup.wait()
        finally:
            state.close()  # the slots release what is left in the buffer, then end

    async def _claim(self, state: _QueueState, limit: int) -> list[Job]:
        async with self.pool.connection() as conn:
            claimed = await self.queue.claim(
                conn, state.name, owner=self.config.worker_id, limit=limit,
                lease=dt.timedelta(seconds=self.config.lease),
            )  # fmt: skip
        self._claimed += len(claimed)
        return claimed

    async def _slot(self, state: _QueueState) -> None:
        """One of the queue's ``concurrency`` slots: run buffered jobs one after another.

        Each job's handler runs in a cancel scope that `_Running.abort` cancels
        (lost lease, cancel request, shutdown). Entering and leaving a scope is
        a good part of trio's cost per job, so a slot keeps one scope for as
        many jobs as it can: until one of them is aborted while it runs. Then
        that job's outcome is decided here, and the slot opens a new scope.
        """
        while True:
            current: list[_Running] = []  # the job whose handler runs in `scope`, if any
            with trio.CancelScope() as scope:
                await self._slot_jobs(state, scope, current)
                return  # the buffer is closed and empty
            # `scope` was cancelled: abort() of the job it was running (or of one that
            # returned just as it was aborted; then `current` is empty).
            if current:
                running = current.pop()
                self._finish(state, running)
                await self._completer.submit(_aborted(running))

    async def _slot_jobs(
        self, state: _QueueState, scope: trio.CancelScope, current: list[_Running]
    ) -> None:
        """Run buffered jobs in ``scope`` until the buffer is closed and empty."""
        streak = 0
        while (running := await state.take(checkpoint=streak >= SLOT_YIELD_EVERY)) is not None:
            streak = streak + 1 if streak < SLOT_YIELD_EVERY else 1
            if running.reason is not None or self._stop_requested.is_set():
                await self._completer.submit(_unstarted(running))
                continue
            if scope.cancel_called:  # a job aborted as it returned: a fresh scope, please
                state.buffer.appendleft(running)
                await trio.lowlevel.checkpoint()  # raises Cancelled: we are in `scope`
            state.active += 1
            running.scope = scope
            current.append(running)
            outcome = await self._execute(running)  # Cancelled: abort(); the caller deals
            current.pop()
            self._finish(state, running)
            await self._completer.submit(outcome)

    def _finish(self, state: _QueueState, running: _Running) -> None:
        """The handler is done: the slot is free (its outcome is handed over after this)."""
        running.scope = None
        running.finished = True
        state.job_done()
        if self._stop_requested.is_set():
            self._job_finished.set()  # the shutdown grace waits for running jobs

    async def _execute(self, running: _Running) -> Outcome:
        """Run the job's handler; raises Cancelled if the job is aborted while it runs."""
        job, lease = running.job, running.lease
        task = self.config.registry.get(job.task)
        if task is None:
            return _unknown_task(job, self.config.registry, lease)
        ctx = JobContext(job, self)
        outcome = await self._call(task, ctx, lease)
        if running.reason == "lost" or ctx.completed_in_transaction:
            return Outcome(kind=Kind.NOTHING, lease=lease)
        return outcome

    async def _call(self, task: Task, ctx: JobContext, lease: Lease) -> Outcome:
        try:
            if task.timeout is None:
                result = await self._invoke(task, ctx)
            else:
                with trio.move_on_after(task.timeout) as deadline:
                    result = await self._invoke(task, ctx)
                if deadline.cancelled_caught:
                    error = f"timeout: handler ran over {task.timeout} s"
                    return _failure(task, lease, error, None)
        except Exception as ex:
            return _outcome_of_error(task, ctx.job, lease, ex)
        except BaseException as ex:  # KeyboardInterrupt, SystemExit, a stray Cancelled, ...
            _reraise_cancellation(ex, ctx.job)
            return _outcome_of_base_error(task, ctx.job, lease, ex)
        if task.keep_result:
            try:
                encode_args(result)
            except ValueError as ex:
                error = f"result of task {task.name!r} is not JSON: {ex}"
                return _failure(task, lease, error, None, fatal=True)
            return Outcome(kind=Kind.KEEP, lease=lease, result=result)
        return Outcome(kind=Kind.COMPLETE, lease=lease)

    # KI-protected: a real Ctrl-C (without ``handle_signals``) that arrives while handler code
    # runs goes to trio's main task, as it does everywhere else in the runtime, instead of
    # being raised inside the handler, where it would look like the handler's own error.
    @trio.lowlevel.enable_ki_protection
    async def _invoke(self, task: Task, ctx: JobContext) -> Any:
        args = ctx.job.args
        if task.is_async:
            if isinstance(args, dict):
                return await task.fn(ctx, **args)
            return await task.fn(ctx, args)
        call = (
            functools.partial(task.fn, ctx, **args)
            if isinstance(args, dict)
            else functools.partial(task.fn, ctx, args)
        )
        return await trio.to_thread.run_sync(
            call, limiter=self._sync_limiter, abandon_on_cancel=True
        )

    def forget(self, lease: Lease) -> None:
        """The job's outcome is already written (``job.transaction()``): stop heartbeating it."""
        self._held.pop(lease, None)

    def _written(self, batch: Sequence[Outcome]) -> None:
        for outcome in batch:
            self._held.pop(outcome.lease, None)
        if any(o.kind is Kind.FAIL or (o.kind is Kind.RELEASE and o.delay) for o in batch):
            self._scheduler_wakeup.set()  # a retry or snooze may now be the next job due

    # -- maintenance ----------------------------------------------------------------------------

    async def _listen(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        listen = sql.SQL("LISTEN {}").format(sql.Identifier(self.queue.sql.channel))
        backoff = RECONNECT_MIN
        started = False
        while True:
            try:
                async with await connect(self.dsn, autocommit=True) as conn:
                    await conn.execute(listen)
                    if not started:
                        task_status.started()
                        started = True
                    backoff = RECONNECT_MIN
                    self._wake_all()  # whatever arrived while we were not listening
                    async for note in conn.notifies():
                        self._wake(note.payload)
            except psycopg.OperationalError as ex:
                if not started:
                    raise
                logger.warning("listener lost its connection, reconnecting: %s", ex)
            await trio.sleep(backoff)
            backoff = min(backoff * 2, RECONNECT_MAX)

    def _wake(self, payload: str) -> None:
        """A notification: a queue got due work, or (``@scheduled``) a job for later."""
        if payload == SCHEDULED_PAYLOAD:
            self._scheduler_wakeup.set()
        elif (state := self._queues.get(payload)) is not None:
            state.wakeup.set()

    def _wake_all(self) -> None:
        for state in self._queues.values():
            state.wakeup.set()
        self._scheduler_wakeup.set()

    async def _heartbeat_loop(self) -> None:
        lease = dt.timedelta(seconds=self.config.lease)
        while True:
            await trio.sleep(self.config.heartbeat_interval)
            leases = list(self._held)
            if not leases:
                continue
            try:
                async with self.pool.connection() as conn:
                    beat = await self.queue.heartbeat(
                        conn, owner=self.config.worker_id, leases=leases, lease=lease
                    )
            except Exception as ex:  # Cancelled is not an Exception
                logger.warning("heartbeat failed: %s", ex)
                continue
            for lost in beat.lost:
                running = self._held.get(lost)
                if running is None or running.finished:
                    continue  # its outcome was written while the heartbeat ran
                del self._held[lost]
                logger.warning("job %d lost its lease: cancelling its handler", lost.job_id)
                running.abort("lost")
            for wanted in beat.cancel_requested:
                if (running := self._held.get(wanted)) is not None:
                    running.abort("cancel")

    async def _sweep_loop(self) -> None:
        while True:
            try:
                async with self.pool.connection() as conn:
                    swept = await self.queue.sweep(conn)
                if swept.returned:
                    self._wake_all()
            except Exception as ex:  # Cancelled is not an Exception
                logger.warning("sweep failed: %s", ex)
            await trio.sleep(self.config.sweep_interval)

    async def _scheduler_loop(self) -> None:
        while True:
            try:
                sleep = await self._schedule_once()
            except psycopg.OperationalError as ex:
                logger.warning("scheduler failed: %s", ex)
                sleep = self.config.poll_interval
            except Exception:  # e.g. a bad cron entry: must not stop the workers
                logger.exception("scheduler failed")
                sleep = self.config.poll_interval
            with trio.move_on_after(sleep):
                await self._scheduler_wakeup.wait()

    async def _schedule_once(self) -> float:
        """Promote due jobs, fire due cron ticks; return how long to sleep."""
        async with self.pool.connection() as conn:
            for queue in await self.queue.promote_due(conn):
                self._wake(queue)
            due_in = await self.queue.next_due(conn)
            sleep = SCHEDULER_MAX_SLEEP
            if due_in is not None:
                sleep = min(sleep, max(due_in.total_seconds(), 0.0))
            if self.config.cron:
                now = await _db_now(conn)
                await fire_due(conn, self.queue, self.config.cron, now=now)
                upcoming = next_fire_time(self.config.cron, now)
                if upcoming is not None:
                    sleep = min(sleep, max((upcoming - now).total_seconds(), 0.0))
        return sleep


def _aborted(running: _Running) -> Outcome:
    """The outcome of a job whose handler we cancelled: lost lease, cancel or shutdown."""
    if running.reason == "lost":
        return Outcome(kind=Kind.NOTHING, lease=running.lease)
    if running.reason == "cancel":
        return Outcome(kind=Kind.CANCELLED, lease=running.lease)
    return Outcome(kind=Kind.RELEASE, lease=running.lease)  # shutdown: attempt refunded


#: A claimed job that no handler ran ends the same way (shutdown: released, attempt refunded).
_unstarted = _aborted


async def _db_now(conn: Any) -> dt.datetime:
    cur = await conn.execute(sql.SQL("SELECT " + NOW))  # NOW is a constant expression
    row = await cur.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def _outcome_of_error(task: Task, job: Job, lease: Lease, ex: Exception) -> Outcome:
    """What a handler's exception means for its job (called inside the except block)."""
    if isinstance(ex, Snooze):
        return Outcome(kind=Kind.RELEASE, lease=lease, delay=ex.delay)
    if isinstance(ex, LeaseLostError):
        return Outcome(kind=Kind.NOTHING, lease=lease)
    fatal = isinstance(ex, FatalError)
    if not fatal:
        logger.info("job %d (%s) attempt %d failed: %s", job.id, job.task, job.attempt, ex)
    return _failure(task, lease, _describe(ex), traceback.format_exc(), fatal=fatal)


def _reraise_cancellation(ex: BaseException, job: Job) -> None:
    """Re-raise ``ex`` if it is (or holds) a `trio.Cancelled` of a cancelled enclosing scope.

    Called in the ``except BaseException`` block of a handler call. A Cancelled
    while an enclosing scope is cancelled (lost lease, job cancel, shutdown, or
    whatever cancels `serve` itself) is the runtime's own: it propagates, and
    the scope that was cancelled decides the outcome. Anything else the handler
    raised returns to the caller, which fails the job: KeyboardInterrupt,
    SystemExit, GeneratorExit, and a "stray" Cancelled raised while no
    enclosing scope is cancelled. Of a group holding both, only the Cancelled
    part propagates; the rest is logged.
    """
    if trio.current_effective_deadline() != -math.inf:
        return  # nothing around us is cancelled: whatever this is, it is the handler's
    if isinstance(ex, trio.Cancelled):
        raise ex
    if isinstance(ex, BaseExceptionGroup):
        cancelled, rest = ex.split(trio.Cancelled)
        if cancelled is not None:
            if rest is not None:
                logger.warning("job %d (%s) raised while being cancelled: %s",
                               job.id, job.task, _describe(rest))  # fmt: skip
            raise cancelled


def _outcome_of_base_error(task: Task, job: Job, lease: Lease, ex: BaseException) -> Outcome:
    """A handler raised a BaseException that is not the runtime's cancellation: a failure."""
    error = _describe(ex)
    if isinstance(ex, trio.Cancelled):
        error = "stray trio.Cancelled: raised while no enclosing cancel scope was cancelled"
    logger.warning("job %d (%s) attempt %d failed: %s", job.id, job.task, job.attempt, error)
    return _failure(task, lease, error, traceback.format_exc())


def _describe(ex: BaseException) -> str:
    if isinstance(ex, trio.Cancelled):  # its text names no cause ("cancelled due to unknown")
        return "stray trio.Cancelled"
    text = str(ex)
    described = f"{type(ex).__name__}: {text}" if text else type(ex).__name__
    if isinstance(ex, BaseExceptionGroup):
        members = ", ".join(_describe(leaf) for leaf in leaves(ex))
        described = f"{described}: {members}"
    return described


def _failure(
    task: Task, lease: Lease, error: str, tb: str | None, *, fatal: bool = False
) -> Outcome:
    delay = _retry_delay(task, lease.attempt)
    failure = Failure(lease=lease, error=error, traceback=tb, fatal=fatal, delay=delay)
    return Outcome(kind=Kind.FAIL, lease=lease, failure=failure)


def _retry_delay(task: Task, attempt: int) -> dt.timedelta:
    """The task's retry delay, kept within [0, MAX_RETRY_DELAY]; a broken policy falls back."""
    try:
        delay = task.retry.delay(attempt)
        seconds = delay.total_seconds()
    except Exception:
        logger.exception("retry policy of task %r failed: using the default", task.name)
        return Sidekiq().delay(attempt)
    if not seconds >= 0:  # also catches NaN
        return dt.timedelta(0)
    return min(delay, MAX_RETRY_DELAY)


def _unknown_task(job: Job, registry: Any, lease: Lease) -> Outcome:
    """A task no handler here knows is failed (retried with backoff, then dead): not lost.

    Another deploy may know it; once attempts are spent it waits in dead_jobs,
    from where ``trioq dead retry`` brings it back.
    """
    known = ", ".join(sorted(t.name for t in registry)) or "none"
    error = f"unknown task {job.task!r}: no handler registered in this worker (known: {known})"
    logger.error("job %d: %s", job.id, error)
    failure = Failure(lease=lease, error=error, delay=Sidekiq().delay(lease.attempt))
    return Outcome(kind=Kind.FAIL, lease=lease, failure=failure)
