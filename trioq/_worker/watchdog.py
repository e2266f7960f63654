"""The watchdog: notices when the trio loop has not run for a while, and says what blocks it.

User code that blocks the loop (``time.sleep(35)``, a blocking driver, a long computation)
stops every task of the process: no heartbeats (leases expire and jobs run again
elsewhere), no claims, no outcomes. trio cannot interrupt it, but a thread can see it.
The loop task ticks every quarter of `threshold`; a daemon thread checks the tick, and
when it is older than `threshold` logs once per stall the stack of the loop's thread and
whose code it is in.

Whose code: trioq calls user code on the loop at four places, its call sites (`SITES`):
an async handler (`Executor._invoke`), a middleware (`call_middleware`), a retry policy's
``delay()`` (`retry_delay`) and an event callback (`EventDispatcher._call`). The frames of
the loop's stack are walked from the innermost out; the first call site found names what
it calls (from its locals), so a middleware is named while it runs and the handler once
``call_next()`` has reached it. Nothing is paid on the hot path: the sites are functions
that run anyway, recognised by their code objects, and the stack is only read when the
loop is stuck. The rule, in ``docs/concepts.md``: code on the loop must not block; blocking
work goes in a sync handler (a worker thread) or ``trio.to_thread``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from types import CodeType, FrameType

import attrs
import trio

from .._context import JobContext
from .._hooks import EventDispatcher, JobEvent, call_middleware
from .._job import Lease
from .._registry import Task
from .execute import Executor, retry_delay

__all__ = ["SITES", "Culprit", "Stall", "Watchdog"]

logger = logging.getLogger("trioq.runtime")

#: How many frames of the blocked stack the warning shows (the innermost ones).
STACK_LIMIT = 12


@attrs.frozen(kw_only=True)
class Culprit:
    """The user code the loop's thread is in, as the warning names it."""

    what: str  # "the async handler of job 42 (task 'send')", "the middleware timed of ..."
    job: tuple[int, str] | None  # (id, task) of the job it runs for, when known


@attrs.frozen(kw_only=True)
class Stall:
    """A blocked loop, as one check saw it."""

    seconds: float  # since the loop last ran
    culprit: str | None  # what blocks it (`Culprit.what`); None: no user code trioq called
    job: tuple[int, str] | None  # (id, task) of the job that code runs for, if any
    stack: str  # the innermost frames of the loop's thread


class Watchdog:
    def __init__(self, *, threshold: float) -> None:
        self.threshold = threshold
        self._tick = time.monotonic()
        self._reported: float | None = None  # the tick of the stall already logged
        self._loop_thread = threading.get_ident()

    async def run(self) -> None:
        """Tick until cancelled, with the checking thread beside it."""
        self._loop_thread = threading.get_ident()
        stop = threading.Event()
        thread = threading.Thread(
            target=self._watch, args=(stop,), name="trioq-watchdog", daemon=True
        )
        thread.start()
        try:
            while True:
                self._tick = time.monotonic()
                await trio.sleep(self.threshold / 4)
        finally:
            stop.set()  # the thread ends within a quarter of the threshold (and is a daemon)

    def _watch(self, stop: threading.Event) -> None:
        while not stop.wait(self.threshold / 4):
            self.run_once()

    def run_once(self, now: float | None = None) -> Stall | None:
        """One check (any thread): the stall, logged the first time it is seen; else None."""
        tick = self._tick
        lag = (time.monotonic() if now is None else now) - tick
        if lag < self.threshold or self._reported == tick:
            return None
        self._reported = tick
        frame = sys._current_frames().get(self._loop_thread)
        culprit = culprit_of(frame)
        stall = Stall(seconds=lag, culprit=None if culprit is None else culprit.what,
                      job=None if culprit is None else culprit.job,
                      stack=_stack(frame))  # fmt: skip
        where = (
            "no handler, middleware, retry policy or event callback is running on it"
            if stall.culprit is None
            else f"{stall.culprit} blocks it"
        )
        logger.warning("the trio loop has not run for %.1f s: %s (code on the trio loop must "
                       "not block: use a sync handler, or trio.to_thread, for blocking work); "
                       "the loop's thread is in:\n%s", lag, where, stall.stack,
                       extra={} if stall.job is None else {"job_id": stall.job[0],
                                                           "task": stall.job[1]})  # fmt: skip
        return stall


def culprit_of(frame: FrameType | None) -> Culprit | None:
    """The user code ``frame`` (the innermost of a stack) is in: what the innermost call site
    (`SITES`) on the stack calls; None if there is none."""
    while frame is not None:
        site = SITES.get(frame.f_code)
        if site is not None and (found := site(frame)) is not None:
            return found
        frame = frame.f_back
    return None


def _handler(frame: FrameType) -> Culprit | None:
    names = frame.f_locals
    ctx = names.get("ctx")
    if not isinstance(ctx, JobContext):
        return None
    if names.get("wrap") and getattr(names.get("self"), "_middleware", ()):
        return None  # the chain's entry: a middleware, or the handler, is further in
    return Culprit(what=f"the async handler of job {ctx.id} (task {ctx.task!r})",
                   job=(ctx.id, ctx.task))  # fmt: skip


def _middleware(frame: FrameType) -> Culprit | None:
    names = frame.f_locals
    chain, i, ctx = names.get("chain"), names.get("i"), names.get("ctx")
    if not (isinstance(ctx, JobContext) and isinstance(i, int) and i < len(chain or ())):
        return None  # at the chain's end: calling the handler, whose own site is inner
    assert chain is not None
    return Culprit(what=f"the middleware {_qualname(chain[i])} of task {ctx.task!r} (job "
                   f"{ctx.id})", job=(ctx.id, ctx.task))  # fmt: skip


def _policy(frame: FrameType) -> Culprit | None:
    task = frame.f_locals.get("task")
    if not isinstance(task, Task):
        return None
    job_id = _job_id_around(frame.f_back)
    what = f"the retry policy {_qualname(type(task.retry))} of task {task.name!r}"
    if job_id is None:
        return Culprit(what=what, job=None)
    return Culprit(what=f"{what} (job {job_id})", job=(job_id, task.name))


def _callback(frame: FrameType) -> Culprit | None:
    names = frame.f_locals
    event = names.get("event")
    if not isinstance(event, JobEvent):
        return None
    return Culprit(what=f"the {event.kind} callback {_qualname(names.get('fn'))} of task "
                   f"{event.task!r} (job {event.job_id})",
                   job=(event.job_id, event.task))  # fmt: skip


def _job_id_around(frame: FrameType | None) -> int | None:
    """The job a frame further out is about: its ``ctx`` or its ``lease``."""
    while frame is not None:
        names = frame.f_locals
        if isinstance(ctx := names.get("ctx"), JobContext):
            return ctx.id
        if isinstance(lease := names.get("lease"), Lease):
            return lease.job_id
        frame = frame.f_back
    return None


def _qualname(fn: object) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


#: Where trioq calls user code on the loop: the code of each call site, and how its frame's
#: locals name what it calls (None: not user code at this moment).
SITES: Mapping[CodeType, Callable[[FrameType], Culprit | None]] = {
    Executor._invoke.__code__: _handler,
    call_middleware.__code__: _middleware,
    retry_delay.__code__: _policy,
    EventDispatcher._call.__code__: _callback,
}


def _stack(frame: FrameType | None) -> str:
    if frame is None:
        return "  (the loop's thread is gone)"
    return "".join(traceback.format_stack(frame)[-STACK_LIMIT:]).rstrip()
