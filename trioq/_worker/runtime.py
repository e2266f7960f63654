"""The worker runtime: ``trio.run(trioq.serve, config)``.

`Runtime` owns the nursery tree drawn in ``docs/architecture.md`` (the one copy of
it): the pools, the services (listener, completer, heartbeat, sweeper, scheduler,
signals), and per queue a fetcher and ``concurrency`` slots. What each service does
is in its own module; handler execution is in `trioq._worker.execute`. This module has the
fetching (`_QueueState.wanted` is the prefetch policy), the slots and shutdown:

stop the fetchers (buffered jobs are released unstarted) -> wait up to
``shutdown_grace`` for running jobs -> cancel the rest, whose rows are released
(attempt refunded) -> flush the completer -> close.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import signal
import time
from collections.abc import AsyncIterator, Sequence

import attrs
import trio

from .._config import Config, QueueConfig
from .._db.sql.common import CANCEL_PAYLOAD, CRON_PAYLOAD, QUEUES_PAYLOAD, SCHEDULED_PAYLOAD
from .._flow import LimitedClaim
from .._hooks import fields
from .._job import Lease
from .._obs.metrics import QueueGauges
from .._outcome import Kind, Outcome
from .execute import aborted
from .leases import HeldJob, HeldJobs
from .task_settings import resolve_cost, resolve_max_attempts
from .wakeup import Wakeup
from .wiring import RuntimeHooks, Services

__all__ = ["Runtime", "RuntimeStatistics"]

logger = logging.getLogger("trioq.runtime")

#: Backoff of a fetcher whose claims fail (a notification cuts it short).
CLAIM_BACKOFF_MIN, CLAIM_BACKOFF_MAX = 0.05, 0.5
#: Bound on one (shielded) claim statement.
CLAIM_TIMEOUT = 10.0
#: SQLSTATE read_only_sql_transaction: the server is a standby (or read-only by setting).
READ_ONLY_SQLSTATE = "25006"
#: A slot that finds its next job already buffered takes it without a checkpoint, but
#: yields to the other tasks at least once every this many jobs. A checkpoint (one trip
#: through trio's scheduler) costs about as much as the rest of a no-op job; handlers that
#: do any I/O checkpoint anyway.
SLOT_YIELD_EVERY = 8
#: Outcomes that may leave a job scheduled for later (the scheduler should look again).
_SCHEDULES = frozenset({Kind.FAIL, Kind.UNKNOWN})


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
class _QueueState:
    """One served queue: its prefetch buffer, its slots and its fetcher's wake-ups.

    The buffer is a deque rather than a memory channel: the fetcher appends at
    most what `wanted` allows (so it is bounded), the slots pop them, and slots
    with nothing to do park in ``idle``. That is a third of the cost per job of
    a channel's send and receive.

    Weighted slots (``docs/flow-control.md``): a job occupies ``units`` of the queue's
    ``concurrency`` while it runs (its cost, at most ``concurrency``: a job that costs more
    runs alone). The buffer is first in, first out: a job whose units are not free waits at
    its head, and the jobs behind it wait too, so a big job is never passed by small ones.
    Everything here counts units; with cost-1 jobs, units are jobs, as before.
    """

    name: str
    config: QueueConfig
    active: int = 0  # handlers running
    used: int = 0  # the units of the running handlers
    buffered: int = 0  # the units of the buffered jobs
    blocked: bool = False  # a slot waits for units for the buffer's head (see `take`)
    #: Its jobs have costs: the claim counts units in SQL (`Driver.claim`). From the start
    #: when a task of the queue costs more than 1, else from the first claimed job that has
    #: a cost (until then, the rare job past the units is given back by the claim).
    weighted: bool = False
    buffer: collections.deque[HeldJob] = attrs.field(factory=collections.deque)
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
    #: When the last claim came back (trio's clock), and how long its round trip took.
    last_return: float = float("-inf")
    last_round_trip: float = 0.0
    last_got: int = 0  # how many jobs it brought

    def __attrs_post_init__(self) -> None:
        self.refill = max(1, self.config.concurrency // 2)

    def wanted(self) -> int:
        """How many units the next claim should take (jobs, when they cost 1); 0: wait
        for `room`.

        Every idle slot (no job running, none buffered for it) wants one job,
        at once. On top of that the fetcher prefetches as many jobs as finished
        during the previous claim's round trip: for short jobs that is up to
        ``concurrency``, so the next claim is in flight while the slots work
        through the buffer. For long jobs it is 0, and a worker claims only
        for idle slots, leaving the rest to other workers.
        """
        idle = self.config.concurrency - self.used - self.buffered  # units
        wanted = idle + self.prefetch
        if idle <= 0 and wanted < self.refill:
            return 0
        return wanted

    def starved(self, now: float) -> bool:
        """Before a claim: everything the last one brought is done, and less than two of
        its round trips after it came back. The jobs are shorter than a round trip, and
        the slots have been waiting for this claim: the next one should be in flight while
        they run this one's jobs (`claimed` sets the prefetch for it).

        Without this the prefetch never started for such jobs: it counts the jobs that
        finish *during* a claim, and with the buffer empty during it none did, so the
        fetcher and the slots took turns (docs/benchmarks.md, round 3). A last claim that
        brought nothing (an idle queue's poll) did not starve anything: under load its round
        trip is long, and a claim for an idle queue's first jobs soon after it counted as
        starved, prefetching long jobs that other workers could run."""
        return (self.last_got > 0 and not self.buffer and self.active == 0
                and now - self.last_return < 2 * self.last_round_trip)  # fmt: skip

    def claimed(
        self, *, sent: float, now: float, got: int, finished_before: int, starved: bool,
        bound: bool,
    ) -> None:  # fmt: skip
        """After a claim sent at ``sent`` came back at ``now`` with ``got`` jobs: the
        prefetch for the next one. As many jobs as finished during this round trip (short
        jobs), or, when the slots were `starved`, as many as this claim brought; none while
        a concurrency limit decides (``bound``: buffered jobs would hold slots of the whole
        cluster idle). Long jobs finish neither during a round trip nor within two of one,
        so their worker still claims only for idle slots, leaving the rest to others."""
        self.last_return, self.last_round_trip, self.last_got = now, now - sent, got
        finished = self.finished - finished_before
        ahead = max(finished, got if starved else 0)
        self.prefetch = 0 if bound else min(self.config.concurrency, ahead)

    def units(self, cost: int | None) -> int:
        """The units a job of ``cost`` occupies here (None: 1): at most ``concurrency``."""
        return 1 if cost is None else min(cost, self.config.concurrency)

    def put(self, jobs: list[HeldJob]) -> None:
        self.buffer.extend(jobs)
        self.buffered += sum(held.units for held in jobs)
        self.idle.unpark(count=len(jobs))

    def put_back(self, held: HeldJob) -> None:
        """A job `take` gave that its slot cannot start now: first again."""
        self.buffer.appendleft(held)
        self.buffered += held.units

    def drop_last(self) -> HeldJob:
        """The last buffered job, out of the buffer (released unstarted)."""
        held = self.buffer.pop()
        self.buffered -= held.units
        return held

    def close(self) -> None:
        self.closed = True
        self.idle.unpark_all()

    async def take(self, *, checkpoint: bool) -> HeldJob | None:
        """The next buffered job once its units are free, or None once closed and empty.
        Once closed (a stop), the head comes at once: it is released, not run.

        Checkpoints when it has to wait, or when asked to (see `SLOT_YIELD_EVERY`).
        """
        if checkpoint:
            await trio.lowlevel.checkpoint()
        buffer = self.buffer
        while True:
            if buffer:
                if self.used + buffer[0].units <= self.config.concurrency or self.closed:
                    break
                self.blocked = True  # `job_done` wakes the slots when units free
            elif self.closed:
                return None
            await self.idle.park()
        held = buffer.popleft()  # the slot counts it as active at once: `idle` is unchanged
        self.buffered -= held.units
        return held

    def start(self, held: HeldJob) -> None:
        """A slot runs ``held`` now: its units are taken."""
        self.active += 1
        self.used += held.units

    def job_done(self, units: int) -> None:
        self.active -= 1
        self.used -= units
        self.finished += 1
        if self.blocked:  # a job waits for units at the buffer's head: it may fit now
            self.blocked = False
            self.idle.unpark_all()
        if self.fetcher_waits:
            self.room.set()

    async def wait_for_room(self) -> None:
        self.fetcher_waits = True
        try:
            await self.room.wait()
        finally:
            self.fetcher_waits = False


def _refuse_unservable_costs(config: Config, queues: dict[str, _QueueState]) -> None:
    """A task that costs more slots than its queue has in this process could never run here
    beside anything, and says a config mistake: refused before anything starts."""
    for task in config.registry:
        state = queues.get(task.queue)
        if state is not None and task.cost > state.config.concurrency:
            raise ValueError(
                f"task {task.name!r} costs {task.cost} slots, more than queue {task.queue!r} "
                f"has in this process (concurrency {state.config.concurrency}): raise the "
                f"queue's QueueConfig.concurrency (--concurrency) or lower the task's cost"
            )


class Runtime:
    """A running worker process. `serve` creates it and hands it to ``task_status``."""

    def __init__(self, config: Config, dsn: str) -> None:
        self.config = config
        self.dsn = dsn
        self._queues = {
            name: _QueueState(name, cfg) for name, cfg in config.served_queues().items()
        }
        _refuse_unservable_costs(config, self._queues)
        for task in config.registry:
            if task.cost > 1 and task.queue in self._queues:
                self._queues[task.queue].weighted = True
        self._held = HeldJobs()  # running, buffered, or outcome not yet written
        self._holding: set[HeldJob] = set()  # stopped, but their sync handler's thread runs on
        self._stop_requested = trio.Event()
        self._grace_scope = trio.CancelScope()
        #: Cancelled by a stop during the start-up (`run`); `_started` once the slots run.
        self._starting = trio.CancelScope()
        self._started = False
        self._job_finished = Wakeup()
        self._claimed = 0
        #: The pools, the queue, the executor, the completer and the services
        #: (`trioq._worker.wiring`), built from the config.
        self._services = Services(config, dsn, RuntimeHooks(
            held=self._held, wake=self._wake, wake_all=self._wake_all, running=self._running,
            written=self._written, release_buffered=self._release_buffered,
            gauges=self._gauges,
        ))  # fmt: skip
        #: The pools (claims, outcomes and maintenance; handlers) and the queue it serves.
        self.pool, self.app_pool = self._services.pool, self._services.app_pool
        self.queue = self._services.queue

    @property
    def session_dsn(self) -> str:
        """LISTEN and the liveness lock: never through a transaction pooler."""
        return self._services.session_dsn

    @property
    def metrics_url(self) -> str | None:
        """Where ``/metrics`` is served, once serving (`Config.metrics`)."""
        return self._services.metrics_url

    # -- public ---------------------------------------------------------------------------------

    def stop(self, *, grace: bool = True) -> None:
        """Ask for a graceful stop; a second call (or ``grace=False``) skips the grace period.
        Before the slots run (still connecting, checking the schema, starting services), it
        ends the start-up: nothing has been claimed yet."""
        if self._stop_requested.is_set() or not grace:
            self._grace_scope.cancel()
        self._stop_requested.set()
        if not self._started:
            self._starting.cancel()

    def statistics(self) -> RuntimeStatistics:
        return RuntimeStatistics(
            worker_id=self.config.worker_id,
            running=sum(q.active for q in self._queues.values()),
            held_leases=len(self._held),
            claimed=self._claimed,
            completed_batches=self._services.completer.batches,
            outcomes_written=self._services.completer.outcomes,
            stopping=self._stop_requested.is_set(),
        )

    async def run(
        self, *, task_status: trio.TaskStatus[Runtime] = trio.TASK_STATUS_IGNORED
    ) -> None:
        if not self.config.handle_signals:
            await self._run(task_status)
            return
        # SIGINT/SIGTERM are handled from the first moment: one that arrives while the
        # worker connects stops it then (`stop` ends the start-up), rather than killing it
        # with the signal's default action (a supervisor saw its worker exit with -15).
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._signal_loop, signals)
                await self._run(task_status)
                nursery.cancel_scope.cancel()

    async def _run(self, task_status: trio.TaskStatus[Runtime]) -> None:
        with self._starting:  # cancelled by a stop before the slots run: nothing was claimed
            await self._start_and_run(task_status)
        if not self._started:
            # Stopped during the start-up: `nursery.start` still gets the runtime (stopped
            # already) rather than "child exited without calling task_status.started()".
            task_status.started(self)

    async def _start_and_run(self, task_status: trio.TaskStatus[Runtime]) -> None:
        services = self._services
        async with services.pools():
            await services.check_schema()
            async with trio.open_nursery() as nursery:
                await services.start(nursery)
                await self._run_jobs(task_status)
                await services.flush()
                nursery.cancel_scope.cancel()

    # -- startup and shutdown -------------------------------------------------------------------

    async def _run_jobs(self, task_status: trio.TaskStatus[Runtime]) -> None:
        async with trio.open_nursery() as jobs:
            async with trio.open_nursery() as fetchers:
                for state in self._queues.values():
                    for _ in range(state.config.concurrency):
                        jobs.start_soon(self._slot, state)
                    fetchers.start_soon(self._fetch_loop, state)
                self._services.log_banner()
                self._started = True  # from here a stop is graceful
                task_status.started(self)
                await self._stop_requested.wait()
                fetchers.cancel_scope.cancel()
            # The fetchers closed their buffers: the slots release what is left in them.
            logger.info("stopping: waiting up to %s s for %d jobs", self.config.shutdown_grace,
                        len(self._held))  # fmt: skip
            with self._grace_scope, trio.move_on_after(self.config.shutdown_grace):
                while any(state.active for state in self._queues.values()):
                    await self._job_finished.wait()
            for held in [*self._held, *self._holding]:
                held.abort("shutdown")

    def _gauges(self) -> tuple[QueueGauges, ...]:
        """Each served queue's slots, busy and buffered (``/metrics``)."""
        return tuple(QueueGauges(queue=name, concurrency=q.config.concurrency, busy=q.used,
                                 buffered=len(q.buffer))
                     for name, q in self._queues.items())  # fmt: skip

    def _running(self) -> int:
        return sum(q.active for q in self._queues.values())

    async def _signal_loop(self, signals: AsyncIterator[int]) -> None:
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
        backoff = CLAIM_BACKOFF_MIN
        try:
            while True:
                wanted = state.wanted()
                if wanted <= 0:
                    await state.wait_for_room()
                    continue
                finished_before, sent = state.finished, trio.current_time()
                starved = state.starved(sent)
                try:
                    got, written, counted = await self._claim(state, wanted)
                except Exception as ex:  # the database, mostly; Cancelled is not an Exception
                    self._services.claim_errors[state.name] += 1
                    if getattr(ex, "sqlstate", None) == READ_ONLY_SQLSTATE:
                        logger.warning("claiming from queue %r: the database is read-only (a "
                                       "standby, or default_transaction_read_only): waiting "
                                       "until it takes writes (%s)", state.name, ex)  # fmt: skip
                    else:
                        logger.warning("claiming from queue %r failed: %s", state.name, ex)
                    # Back off, but a notification (or the listener's reconnect) means
                    # the database is answering again: try at once rather than up to
                    # CLAIM_BACKOFF_MAX later.
                    with trio.move_on_after(backoff):
                        await state.wakeup.wait()
                    backoff = min(backoff * 2, CLAIM_BACKOFF_MAX)
                    continue
                backoff = CLAIM_BACKOFF_MIN
                claimed = got.jobs
                state.claimed(sent=sent, now=trio.current_time(), got=len(claimed),
                              finished_before=finished_before, starved=starved,
                              bound=got.concurrency_bound)  # fmt: skip
                units = state.units
                batch = [HeldJob(job, Lease(job.id, job.attempt), units(job.cost))
                         for job in claimed]  # fmt: skip
                self._held.add(batch)
                # At most `wanted` units, and one job past them (its units are not free yet:
                # it waits at the buffer's head, see `_QueueState`): the buffer stays bounded.
                state.put(batch)
                if 0 <= counted < wanted:  # drained or limited: wait for news, or poll
                    await self._services.governor.wait(state.name, got, written, state.wakeup)
        finally:
            state.close()  # the slots release what is left in the buffer, then end

    async def _claim(self, state: _QueueState, limit: int) -> tuple[LimitedClaim, int, int]:
        """Claim up to ``limit`` units of ``state``'s queue: the claim (its jobs' costs and
        ``max_attempts`` resolved), the outcome batches written before it began (for
        `Governor.wait`), and the units the claim counted (-1: it gave jobs back, whose
        costs it now knows: claim again at once)."""
        services = self._services
        async with services.pool.connection() as conn:
            # Shielded: a claim cut short by the stop may have committed, and its jobs would
            # be held by nobody here. (Should it time out, the worker's row stays at the stop:
            # see `Liveness`.)
            # The worker holds what the claim may take from its sending (`Liveness.claiming`).
            with trio.move_on_after(CLAIM_TIMEOUT, shield=True), services.liveness.claiming():
                claim, written = await services.governor.claim(
                    conn, state.name, owner=self.config.worker_id, limit=limit,
                    lease=dt.timedelta(seconds=self.config.lease), weighted=state.weighted,
                )  # fmt: skip
                counted = 0
                for job in claim.jobs:
                    if job.cost is None:
                        counted += 1
                    else:
                        counted += job.cost
                        state.weighted = True
                resolved = await resolve_cost(
                    conn, services.queue.driver, self.config.registry,
                    owner=self.config.worker_id, claim=claim,
                    global_limit=services.governor.settings(state.name).global_concurrency
                    is not None,
                )  # fmt: skip
                for lease in resolved.release:  # a queue with a global limit: not run here
                    await services.completer.submit(aborted(None, lease))
                if resolved.given_back or resolved.release:
                    counted = -1
                claim = await resolve_max_attempts(conn, services.queue.driver,
                                                   self.config.registry,
                                                   owner=self.config.worker_id,
                                                   claim=resolved.claim)  # fmt: skip
                self._claimed += len(claim.jobs)
                if services.meter is not None:
                    services.meter.claimed(state.name, claim.jobs)
                return claim, written, counted
        raise TimeoutError(f"the claim took longer than {CLAIM_TIMEOUT} s")

    async def _release_buffered(self, name: str) -> None:
        """The queue was paused: give back the jobs claimed for it but not started."""
        state = self._queues[name]
        while state.buffer:
            held = state.drop_last()
            held.abort("paused")  # keeps an earlier reason: a lost lease, a cancel request
            await self._services.completer.submit(aborted(held.reason, held.lease))

    async def _slot(self, state: _QueueState) -> None:
        """One of the queue's ``concurrency`` slots: run buffered jobs one after another.

        Each job's handler runs in a cancel scope that `HeldJob.abort` cancels
        (lost lease, cancel request, shutdown). Entering and leaving a scope is
        a good part of trio's cost per job, so a slot keeps one scope for as
        many jobs as it can: until one of them is aborted while it runs. Then
        that job's outcome is decided here, and the slot opens a new scope.
        """
        while True:
            current: list[HeldJob] = []  # the job whose handler runs in `scope`, if any
            with trio.CancelScope() as scope:
                await self._slot_jobs(state, scope, current)
                return  # the buffer is closed and empty
            # `scope` was cancelled: abort() of the job it was running (or of one that
            # returned just as it was aborted; then `current` is empty).
            if current:
                running = current.pop()
                outcome = self._aborted(running)
                if (thread := self._services.executor.thread_of(running.job.id)) is not None:
                    outcome = await self._hold_for_thread(running, thread, outcome)
                self._finish(state, running)
                await self._services.completer.submit(outcome)

    async def _slot_jobs(
        self, state: _QueueState, scope: trio.CancelScope, current: list[HeldJob]
    ) -> None:
        """Run buffered jobs in ``scope`` until the buffer is closed and empty."""
        streak = 0
        while (running := await state.take(checkpoint=streak >= SLOT_YIELD_EVERY)) is not None:
            streak = streak + 1 if streak < SLOT_YIELD_EVERY else 1
            if running.reason is not None or self._stop_requested.is_set():
                await self._services.completer.submit(self._aborted(running))
                continue
            if scope.cancel_called:  # a job aborted as it returned: a fresh scope, please
                state.put_back(running)
                await trio.lowlevel.checkpoint()  # raises Cancelled: we are in `scope`
            state.start(running)
            running.scope = scope
            current.append(running)
            outcome = await self._execute(running)  # Cancelled: abort(); the caller deals
            current.pop()
            self._finish(state, running)
            await self._services.completer.submit(outcome)

    async def _hold_for_thread(
        self, running: HeldJob, thread: trio.Event, outcome: Outcome
    ) -> Outcome:
        """The job was stopped, but its sync handler's thread runs on: keep the slot until
        it returns, so this process never runs the job twice at once. A cancelled job is
        marked cancelled at once (the thread's result will be discarded); at shutdown the
        job is not given back at all (its lease expires once this process is gone)."""
        job, why = running.job, running.reason
        if why == "shutdown" or self._stop_requested.is_set():
            logger.warning("job %d (%s): its sync handler's thread is still running at "
                           "shutdown: the job is not given back; the sweeper returns it once "
                           "its lease expires", job.id, job.task,
                           extra=fields(job.id, job.task, job.queue, job.attempt))  # fmt: skip
            return Outcome(kind=Kind.NOTHING, lease=running.lease)
        if why == "cancel":
            await self._services.completer.submit(outcome)  # marked cancelled now
            outcome = Outcome(kind=Kind.NOTHING, lease=running.lease)
        with trio.CancelScope() as scope:
            running.scope = scope  # a shutdown's abort() ends the wait
            self._holding.add(running)
            try:
                await self._services.executor.outlived(
                    job, "it was cancelled" if why == "cancel" else "its lease was lost"
                )
            finally:
                self._holding.discard(running)
        if scope.cancelled_caught:
            return Outcome(kind=Kind.NOTHING, lease=running.lease)
        return outcome

    def _finish(self, state: _QueueState, running: HeldJob) -> None:
        """The handler is done: the slot is free (its outcome is handed over after this)."""
        running.scope = None
        running.finished = True
        state.job_done(running.units)
        if self._stop_requested.is_set():
            self._job_finished.set()  # the shutdown grace waits for running jobs

    async def _execute(self, running: HeldJob) -> Outcome:
        """Run the job's handler; raises Cancelled if the job is aborted while it runs."""
        started = time.monotonic()
        outcome = await self._services.executor.run(running.job, running.lease)
        if running.reason == "lost":  # its handler ran on, but the outcome is not ours
            logger.warning("job %d (%s) attempt %d: its handler finished after its lease was "
                           "lost (the job was returned or taken by another worker): its "
                           "outcome (%s) is discarded", running.job.id, running.job.task,
                           running.lease.attempt, outcome.kind.value,
                           extra=fields(running.job.id, running.job.task, running.job.queue,
                                        running.lease.attempt))  # fmt: skip
            return Outcome(kind=Kind.NOTHING, lease=running.lease)
        outcome.ended = time.monotonic()  # for the history, with `started` and the job
        outcome.started = started
        outcome.job = running.job
        return outcome

    @staticmethod
    def _aborted(running: HeldJob) -> Outcome:
        """The outcome of a job stopped by the runtime (`aborted`), with its job attached."""
        outcome = aborted(running.reason, running.lease)
        outcome.job = running.job
        return outcome

    def _written(self, batch: Sequence[Outcome]) -> None:
        services = self._services
        services.history.record(batch)
        services.lifecycle.written(batch)  # logs, events and counts of retries, deaths, ...
        queues = self._queues_of(batch) if services.governor.waiting else None
        forget = self._held.forget
        progress = services.progress
        for outcome in batch:
            forget(outcome.lease)
            progress.forget(outcome.lease)  # what it reported is written, or not ours
        services.governor.outcomes_written(queues)
        if any(o.kind in _SCHEDULES or (o.kind is Kind.RELEASE and o.delay) for o in batch):
            services.scheduler.wake()  # a retry or snooze may now be the next job due

    def _queues_of(self, batch: Sequence[Outcome]) -> set[str | None]:
        """The queues of the jobs whose outcomes these are (None: no longer held)."""
        get = self._held.get
        return {None if (held := get(o.lease)) is None else held.job.queue for o in batch}

    # -- wake-ups -------------------------------------------------------------------------------

    def _wake(self, payload: str) -> None:
        """A notification: a queue got due work, (``@scheduled``) a job for later,
        (``@queues``) queue settings changed, (``@cron``) the database's cron entries
        changed, or (``@cancel:<id>``) a cancel of a running job, maybe one of ours."""
        if payload == SCHEDULED_PAYLOAD:
            self._services.scheduler.wake()
        elif payload == QUEUES_PAYLOAD:
            self._services.governor.wake()
        elif payload == CRON_PAYLOAD:
            self._services.scheduler.cron_changed()
        elif payload.startswith(CANCEL_PAYLOAD):
            self._cancel(payload[len(CANCEL_PAYLOAD) :])
        elif (state := self._queues.get(payload)) is not None:
            state.wakeup.set()

    def _cancel(self, job_id: str) -> None:
        """Stop the handler of a job whose cancel was requested, if it runs (or waits) here.
        The heartbeat would see the flag too, up to an interval later: this is the fast path."""
        if not job_id.isdigit():
            return
        for held in self._held.of_job(int(job_id)):
            logger.info("job %d (%s): cancel requested: stopping its handler", held.job.id,
                        held.job.task)  # fmt: skip
            held.abort("cancel")

    def _wake_all(self) -> None:
        for state in self._queues.values():
            state.wakeup.set()
        self._services.scheduler.wake()
        self._services.governor.wake()
