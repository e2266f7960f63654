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
     |- jobs nursery          one task per running job, each in its own cancel scope
         |- fetchers          per queue: claim up to the free slots, start job tasks

Shutdown: stop the fetchers -> wait up to ``shutdown_grace`` for running jobs
-> cancel the rest, whose rows are released (attempt refunded) -> flush the
completer -> close.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
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
from ._exceptions import FatalError, LeaseLostError, Snooze
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


@attrs.frozen(kw_only=True)
class RuntimeStatistics:
    worker_id: str
    running: int
    held_leases: int
    claimed: int
    completed_batches: int
    outcomes_written: int
    stopping: bool


@attrs.define
class _Running:
    """A job task's handle: its cancel scope and why we cancelled it, if we did."""

    job: Job
    lease: Lease
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    reason: str | None = None  # "lost", "cancel" or "shutdown"
    finished: bool = False  # the handler returned; only its outcome is left to write

    def abort(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.scope.cancel()


@attrs.define
class _QueueState:
    name: str
    config: QueueConfig
    active: int = 0
    wakeup: Wakeup = attrs.field(factory=Wakeup)  # a notification, or work to fetch
    slot_freed: Wakeup = attrs.field(factory=Wakeup)

    @property
    def free(self) -> int:
        return self.config.concurrency - self.active


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
                    fetchers.start_soon(self._fetch_loop, state, jobs)
                task_status.started(self)
                await self._stop_requested.wait()
                fetchers.cancel_scope.cancel()
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

    async def _fetch_loop(self, state: _QueueState, jobs: trio.Nursery) -> None:
        backoff = RECONNECT_MIN
        while True:
            if state.free <= 0:
                await state.slot_freed.wait()
                continue
            wanted = state.free
            try:
                claimed = await self._claim(state, wanted)
            except Exception as ex:  # the database, mostly; Cancelled is not an Exception
                logger.warning("claiming from queue %r failed: %s", state.name, ex)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX)
                continue
            backoff = RECONNECT_MIN
            for job in claimed:
                state.active += 1
                running = _Running(job, Lease(job.id, job.attempt))
                self._held[running.lease] = running
                jobs.start_soon(self._run_job, state, running)
            if len(claimed) < wanted:  # the queue is drained: wait for news, or poll
                with trio.move_on_after(self.config.poll_interval):
                    await state.wakeup.wait()

    async def _claim(self, state: _QueueState, limit: int) -> list[Job]:
        async with self.pool.connection() as conn:
            claimed = await self.queue.claim(
                conn, state.name, owner=self.config.worker_id, limit=limit,
                lease=dt.timedelta(seconds=self.config.lease),
            )  # fmt: skip
        self._claimed += len(claimed)
        return claimed

    async def _run_job(self, state: _QueueState, running: _Running) -> None:
        try:
            outcome = await self._execute(running)
            await self._completer.submit(outcome)
        finally:
            state.active -= 1
            state.slot_freed.set()
            self._job_finished.set()

    async def _execute(self, running: _Running) -> Outcome:
        job, lease = running.job, running.lease
        task = self.config.registry.get(job.task)
        if task is None:
            return _unknown_task(job, self.config.registry, lease)
        ctx = JobContext(job, self)
        outcome: Outcome | None = None
        with running.scope:
            outcome = await self._call(task, ctx, lease)
        running.finished = True
        if running.reason == "lost" or ctx.completed_in_transaction:
            return Outcome(kind=Kind.NOTHING, lease=lease)
        if outcome is not None:
            return outcome
        if running.reason == "cancel":
            return Outcome(kind=Kind.CANCELLED, lease=lease)
        return Outcome(kind=Kind.RELEASE, lease=lease)  # shutdown

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
        if task.keep_result:
            try:
                encode_args(result)
            except ValueError as ex:
                error = f"result of task {task.name!r} is not JSON: {ex}"
                return _failure(task, lease, error, None, fatal=True)
            return Outcome(kind=Kind.KEEP, lease=lease, result=result)
        return Outcome(kind=Kind.COMPLETE, lease=lease)

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


def _describe(ex: BaseException) -> str:
    text = str(ex)
    return f"{type(ex).__name__}: {text}" if text else type(ex).__name__


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
