"""Hooks: middleware around each execution, and callbacks for what happens outside a handler.

Both are registered on the `trioq.Registry`, beside the tasks they concern (so they also
run in ``trioq.testing.drain``)::

    @tasks.middleware
    async def timed(job: trioq.JobContext, call_next: trioq.CallNext) -> Any:
        started = time.monotonic()
        try:
            return await call_next()
        finally:
            log.info("job %d took %.3f s", job.id, time.monotonic() - started)

    @tasks.on("dead")
    async def page_someone(event: trioq.JobEvent) -> None: ...

**Middleware** is an ``async def (job, call_next)`` that returns what ``await call_next()``
returned (or something else). The first registered is the outermost; the handler is the
innermost. It runs in the job's cancel scope and inside the task's timeout, so a lost
lease, a cancel request, a shutdown or the timeout reach it as they reach the handler. What
it returns is the handler's result; what it raises is the handler's error (the usual rules:
``FatalError`` kills the job, ``job.snooze()`` snoozes it, any other exception retries). So
a middleware may catch a handler's exception and return instead (the job completes), or
raise one of its own. It must not swallow ``trio.Cancelled``: if the chain returns while the
job's scope is cancelled, trioq logs an error and raises the cancellation again, so the job
ends as its abort says (`run_chain`). ``call_next`` may be called at most once (a second
call raises ``RuntimeError``); a middleware that does not call it skips the handler.

**Event callbacks** (`JobEvent`, kinds in `EVENT_KINDS`) fire after the worker has written
what they report, in a nursery the runtime owns (`EventDispatcher`): at most
``Config.hook_concurrency`` callbacks run at once, each bounded by ``Config.hook_timeout``.
One that raises is logged with its traceback; one that runs over is cancelled and logged.
Neither stops the worker nor changes the job. Events wait in a bounded buffer
(``Config.hook_buffer``): when callbacks fall behind and it is full, new events are dropped,
counted (`EventDispatcher.dropped`, the ``trioq_hook_events_dropped_total`` metric) and
logged (one warning per 10 s at most), and the completer is never slowed down.
"""

from __future__ import annotations

import datetime as dt
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ._job import JSONValue

if TYPE_CHECKING:
    from ._context import JobContext

__all__ = [
    "EVENT_KINDS",
    "CallNext",
    "EventCallback",
    "EventDispatcher",
    "Hooks",
    "JobEvent",
    "Middleware",
    "run_chain",
]

logger = logging.getLogger("trioq.hooks")

#: What a callback can be registered for.
EVENT_KINDS = ("retried", "dead", "cancelled", "lease_lost", "unknown_task")

#: A dropped-events warning is logged at most this often (seconds).
DROP_WARNING_INTERVAL = 10.0

CallNext = Callable[[], Awaitable[Any]]
Middleware = Callable[["JobContext", CallNext], Awaitable[Any]]


@attrs.frozen(kw_only=True)
class JobEvent:
    """Something that happened to a job outside its handler, after the worker wrote it.

    ``kind`` is one of `EVENT_KINDS`:

    - ``retried``: a failed attempt will run again after ``delay``; ``error`` says why;
    - ``dead``: the job moved to dead_jobs; ``reason`` (``attempts exhausted``,
      ``fatal error``, ``unknown task``, ``lease expired on the last attempt``, ...) and
      ``error``;
    - ``cancelled``: a cancel request stopped it (or reached it before it ran);
    - ``lease_lost``: the job is no longer this worker's (``reason`` says how it noticed);
      its handler was cancelled, or its outcome discarded;
    - ``unknown_task``: no handler here knows the task: given back, attempt refunded.

    ``args`` are the job's args (None where the worker did not claim the job itself: a
    sweep of another worker's expired lease reads them from dead_jobs, so they are there
    too). ``attempt`` is the attempt that ran.
    """

    kind: str
    job_id: int
    queue: str
    task: str
    attempt: int
    args: JSONValue = None
    delay: dt.timedelta | None = None
    error: str | None = None
    reason: str | None = None


EventCallback = Callable[[JobEvent], Awaitable[None]]


def check_kind(kind: object) -> str:
    if not isinstance(kind, str) or kind not in EVENT_KINDS:
        raise ValueError(f"event kind must be one of {', '.join(EVENT_KINDS)}; got {kind!r}")
    return kind


def _check_async(fn: object, what: str) -> None:
    if not callable(fn):
        raise TypeError(f"{what} must be an async function, got {fn!r}")
    if not (
        inspect.iscoroutinefunction(fn)
        or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004
    ):
        raise TypeError(
            f"{what} must be an async function (async def), got {fn!r}: trioq bounds it "
            "with a timeout and a cancel scope, which a plain function would not honour"
        )


class Hooks:
    """A registry's middleware (outermost first) and event callbacks (per kind)."""

    def __init__(self) -> None:
        self.middleware: list[Middleware] = []
        self.callbacks: dict[str, list[EventCallback]] = {kind: [] for kind in EVENT_KINDS}

    def add_middleware(self, fn: Middleware) -> None:
        _check_async(fn, "middleware")
        self.middleware.append(fn)

    def add_callback(self, kind: str, fn: EventCallback) -> None:
        check_kind(kind)
        _check_async(fn, f"callback for {kind!r}")
        self.callbacks[kind].append(fn)

    def wants(self, kind: str) -> bool:
        return bool(self.callbacks[kind])


# -- middleware --------------------------------------------------------------------------------


async def run_chain(chain: Sequence[Middleware], ctx: JobContext, handler: CallNext) -> Any:
    """``handler()`` wrapped by ``chain`` (``chain[0]`` outermost).

    If the chain returns (or raises something else) while a scope around it is cancelled,
    a middleware swallowed ``trio.Cancelled``: that is logged, and a checkpoint raises the
    scope's cancellation again, so the job ends as the runtime decided.
    """
    try:
        result = await call_middleware(chain, 0, ctx, handler)
    except trio.Cancelled:
        raise
    except BaseException:
        await _reraise_if_cancelled(ctx)
        raise
    await _reraise_if_cancelled(ctx)
    return result


async def _reraise_if_cancelled(ctx: JobContext) -> None:
    if trio.current_effective_deadline() == -math.inf:
        logger.error("job %d (%s): a middleware swallowed trio.Cancelled; raising it again (a "
                     "middleware must let Cancelled through)", ctx.id, ctx.task,
                     extra=fields(ctx.id, ctx.task, ctx.queue, ctx.attempt))  # fmt: skip
        await trio.lowlevel.checkpoint()  # in a cancelled scope: raises its Cancelled


async def call_middleware(
    chain: Sequence[Middleware], i: int, ctx: JobContext, handler: CallNext
) -> Any:
    """``chain[i]`` around the rest of the chain (the handler at its end). The watchdog knows
    this frame (``trioq/_worker/watchdog.py``): while it calls ``chain[i]``, its locals
    ``chain``, ``i`` and ``ctx`` name the middleware that runs."""
    if i == len(chain):
        return await handler()
    called = False

    async def call_next() -> Any:
        nonlocal called
        if called:
            raise RuntimeError(f"middleware {chain[i]!r} called call_next() twice")
        called = True
        return await call_middleware(chain, i + 1, ctx, handler)

    return await chain[i](ctx, call_next)


# -- event callbacks ----------------------------------------------------------------------------


def fields(job_id: int, task: str, queue: str, attempt: int | None = None) -> dict[str, Any]:
    """The structured fields of a log record about one job (``extra=``)."""
    out: dict[str, Any] = {"job_id": job_id, "task": task, "queue": queue}
    if attempt is not None:
        out["attempt"] = attempt
    return out


@attrs.frozen(kw_only=True)
class DispatchStatistics:
    delivered: int  # callbacks that returned
    failed: int  # callbacks that raised
    timed_out: int  # callbacks cancelled at the timeout
    dropped: int  # events dropped: the buffer was full
    pending: int  # events waiting


class EventDispatcher:
    """Runs the event callbacks: a bounded buffer, ``concurrency`` runner tasks, a timeout.

    `emit` never blocks (the completer calls it): when the buffer is full the event is
    dropped and counted. `run` runs until cancelled; `close` lets the runners finish what is
    buffered (bounded by the caller) before they end.
    """

    def __init__(
        self, callbacks: Mapping[str, Sequence[EventCallback]], *, timeout: float,
        concurrency: int, buffer: int,
    ) -> None:  # fmt: skip
        self._callbacks = {kind: tuple(fns) for kind, fns in callbacks.items() if fns}
        self.timeout = timeout
        self.concurrency = concurrency
        self._send, self._receive = trio.open_memory_channel[JobEvent](buffer)
        self.delivered = self.failed = self.timed_out = self.dropped = 0
        self._dropped_logged = 0
        self._last_drop_warning = -math.inf
        self._closed = False
        #: Set when `run` returns: delivered everything (`drained`), or cancelled.
        self.finished = trio.Event()
        self.drained = False

    def wants(self, kind: str) -> bool:
        return kind in self._callbacks

    def emit(self, event: JobEvent) -> None:
        """Queue ``event`` for its callbacks (none registered: nothing); never blocks."""
        if event.kind not in self._callbacks or self._closed:
            return
        try:
            self._send.send_nowait(event)
        except trio.WouldBlock:
            self.dropped += 1
            self._warn_dropped()

    def _warn_dropped(self) -> None:
        now = time.monotonic()
        if now - self._last_drop_warning < DROP_WARNING_INTERVAL:
            return
        self._last_drop_warning = now
        logger.warning("%d job events dropped so far: the hook callbacks fall behind (buffer "
                       "of %d full); raise hook_concurrency or make the callbacks faster",
                       self.dropped, self._send.statistics().max_buffer_size)  # fmt: skip

    def statistics(self) -> DispatchStatistics:
        return DispatchStatistics(
            delivered=self.delivered, failed=self.failed, timed_out=self.timed_out,
            dropped=self.dropped, pending=self._send.statistics().current_buffer_used,
        )  # fmt: skip

    async def run(self) -> None:
        """Run callbacks until cancelled, or until closed and drained (`drained`); either
        way `finished` is set, so a shutdown that waits for it never waits for a run that a
        cancel has ended."""
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(self.concurrency):
                    nursery.start_soon(self._runner, self._receive.clone())
                await self._receive.aclose()  # the clones keep the channel open
            self.drained = True
        finally:
            self.finished.set()

    async def close(self) -> None:
        """No more events: `run` returns once the buffered ones are delivered."""
        self._closed = True
        await self._send.aclose()

    async def _runner(self, receive: trio.MemoryReceiveChannel[JobEvent]) -> None:
        async with receive:
            async for event in receive:
                await self.run_once(event)

    async def run_once(self, event: JobEvent) -> None:
        """Every callback of ``event``'s kind, one after another, each bounded."""
        for fn in self._callbacks.get(event.kind, ()):
            await self._call(fn, event)

    async def _call(self, fn: EventCallback, event: JobEvent) -> None:
        # The watchdog knows this frame: its locals ``fn`` and ``event`` name the callback.
        extra = fields(event.job_id, event.task, event.queue, event.attempt)
        with trio.move_on_after(self.timeout) as scope:
            try:
                await fn(event)
            except Exception:  # Cancelled is not an Exception: it propagates
                self.failed += 1
                logger.exception("hook %s for %s of job %d (%s) raised", _name(fn), event.kind,
                                 event.job_id, event.task, extra=extra)  # fmt: skip
                return
        if scope.cancelled_caught:
            self.timed_out += 1
            logger.warning("hook %s for %s of job %d (%s) ran over its timeout of %s s: "
                           "cancelled", _name(fn), event.kind, event.job_id, event.task,
                           self.timeout, extra=extra)  # fmt: skip
        else:
            self.delivered += 1


def _name(fn: object) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)
