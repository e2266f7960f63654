"""``trioq serve --processes N``: one parent supervising N worker processes.

trio is single-threaded, so a host's cores are used by running one worker
process per core. If the parent itself is SIGKILLed, the children keep running
until they are stopped (each is a complete worker on its own).

The parent starts the children, forwards SIGINT/SIGTERM to them (the first
signal asks for a graceful stop, a second one skips the grace), restarts a
child that dies unexpectedly (with a backoff that doubles from 1 s up to 30 s
while it keeps dying soon after starting), and exits with the worst child exit
code once all have stopped. A child that exits within `QUICK_EXIT` of starting
`MAX_QUICK_EXITS` times in a row (a refused DSN, a missing schema, a bad app) is
not restarted again: the parent stops the others and exits 1, saying so.

Children run in their own sessions, so a terminal's Ctrl-C reaches them once,
through the parent; under systemd use ``KillMode=mixed`` so SIGTERM goes to the
parent only (the default ``control-group`` would deliver it twice, skipping the
grace). ``--processes 1`` (the default) runs the worker in the ``trioq serve``
process itself, unsupervised: use a process manager to restart it.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence

import attrs
import trio

__all__ = ["supervise"]

logger = logging.getLogger("trioq.supervisor")

RESTART_BACKOFF_MIN, RESTART_BACKOFF_MAX = 0.5, 30.0
#: A child that exits this soon after starting counts as failing to start.
QUICK_EXIT = 10.0
#: Failures to start in a row after which the supervisor gives up.
MAX_QUICK_EXITS = 5


class GaveUp(Exception):
    """A worker kept exiting right after it started."""


@attrs.define
class _Workers:
    """What the supervisor's tasks share."""

    argv: Sequence[str]
    children: list[trio.Process] = attrs.field(factory=list)
    stopping: trio.Event = attrs.field(factory=trio.Event)
    codes: list[int] = attrs.field(factory=list)
    gave_up: list[str] = attrs.field(factory=list)

    def stop_all(self) -> None:
        self.stopping.set()
        for proc in list(self.children):
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)


async def supervise(argv: Sequence[str], processes: int) -> int:
    """Run ``python -m trioq._cli *argv`` ``processes`` times until stopped."""
    workers = _Workers(argv)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_forward_signals, workers.children, workers.stopping)
        async with trio.open_nursery() as each:
            for index in range(processes):
                each.start_soon(_keep_running, workers, index)
        nursery.cancel_scope.cancel()
    if workers.gave_up:
        print(f"trioq: error: {workers.gave_up[0]}", file=sys.stderr)
        return 1
    return max(workers.codes, default=0)


async def _keep_running(workers: _Workers, index: int) -> None:
    backoff = RESTART_BACKOFF_MIN
    quick_exits = 0
    while True:
        # Own session: a terminal's Ctrl-C reaches only the parent, which forwards it
        # once (a child seeing it twice would skip the grace).
        started = trio.current_time()
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "trioq._cli", *workers.argv], start_new_session=True
        )
        workers.children.append(proc)
        logger.info("worker %d started (pid %d)", index, proc.pid)
        try:
            code = await proc.wait()
        finally:
            workers.children.remove(proc)
        if workers.stopping.is_set():
            workers.codes.append(code)
            return
        quick = trio.current_time() - started < QUICK_EXIT
        quick_exits = quick_exits + 1 if quick else 0
        backoff = min(backoff * 2, RESTART_BACKOFF_MAX) if quick else RESTART_BACKOFF_MIN
        if quick_exits >= MAX_QUICK_EXITS:
            workers.gave_up.append(
                f"worker {index} exited with {code} within {QUICK_EXIT:g} s of starting "
                f"{quick_exits} times in a row: giving up (its error is above)"
            )
            workers.stop_all()
            workers.codes.append(code)
            return
        logger.warning("worker %d (pid %d) exited with %d: restarting in %g s", index,
                       proc.pid, code, backoff)  # fmt: skip
        with trio.move_on_after(backoff):
            await workers.stopping.wait()
        if workers.stopping.is_set():
            workers.codes.append(code)
            return


async def _forward_signals(children: list[trio.Process], stopping: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            stopping.set()
            for proc in list(children):
                if proc.returncode is None:
                    proc.send_signal(signum)
