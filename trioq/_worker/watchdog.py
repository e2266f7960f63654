"""The watchdog: notices when the trio loop has not run for a while, and says what blocks it.

An async handler that blocks (``time.sleep(35)``, a blocking driver, a long computation)
stops every task of the process: no heartbeats (leases expire and jobs run again
elsewhere), no claims, no outcomes. trio cannot interrupt it, but a thread can see it.
The loop task ticks every quarter of `threshold`; a daemon thread checks the tick, and
when it is older than `threshold` logs once per stall the stack of the loop's thread and,
if a handler is running there, its job. The rule, in ``docs/concepts.md``: async handlers
must not block; blocking work goes in a sync handler (a worker thread) or
``trio.to_thread``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from types import FrameType

import attrs
import trio

from .._context import JobContext

__all__ = ["Stall", "Watchdog"]

logger = logging.getLogger("trioq.runtime")

#: How many frames of the blocked stack the warning shows (the innermost ones).
STACK_LIMIT = 12


@attrs.frozen(kw_only=True)
class Stall:
    """A blocked loop, as one check saw it."""

    seconds: float  # since the loop last ran
    job: tuple[int, str] | None  # (id, task) of the handler running on the loop, if any
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
        stall = Stall(seconds=lag, job=_job_of(frame), stack=_stack(frame))
        where = (
            "no handler is running on it"
            if stall.job is None
            else f"the async handler of job {stall.job[0]} (task {stall.job[1]!r}) blocks it"
        )
        logger.warning("the trio loop has not run for %.1f s: %s (async handlers must not "
                       "block: use a sync handler, or trio.to_thread, for blocking work); the "
                       "loop's thread is in:\n%s", lag, where, stall.stack,
                       extra={} if stall.job is None else {"job_id": stall.job[0],
                                                           "task": stall.job[1]})  # fmt: skip
        return stall


def _job_of(frame: FrameType | None) -> tuple[int, str] | None:
    """The job whose handler the loop's thread is in: the ``ctx`` of the executor's frame."""
    while frame is not None:
        if frame.f_code.co_name == "_invoke" and isinstance(
            ctx := frame.f_locals.get("ctx"), JobContext
        ):
            return ctx.id, ctx.task
        frame = frame.f_back
    return None


def _stack(frame: FrameType | None) -> str:
    if frame is None:
        return "  (the loop's thread is gone)"
    return "".join(traceback.format_stack(frame)[-STACK_LIMIT:]).rstrip()
