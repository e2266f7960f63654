"""``trioq serve --processes N``: one parent supervising N worker processes.

trio is single-threaded, so a host's cores are used by running one worker
process per core. If the parent itself is SIGKILLed, the children keep running
until they are stopped (each is a complete worker on its own).

The parent starts the children, forwards SIGINT/SIGTERM to them (the first
signal asks for a graceful stop, a second one skips the grace), restarts a
child that dies unexpectedly (after a short backoff), and exits with the worst
child exit code once all have stopped. Children run in their own sessions, so
a terminal's Ctrl-C reaches them once, through the parent; under systemd use
``KillMode=mixed`` so SIGTERM goes to the parent only (the default
``control-group`` would deliver it twice, skipping the grace).
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence

import trio

__all__ = ["supervise"]

logger = logging.getLogger("trioq.supervisor")

RESTART_BACKOFF = 1.0


async def supervise(argv: Sequence[str], processes: int) -> int:
    """Run ``python -m trioq._cli *argv`` ``processes`` times until stopped."""
    stopping = trio.Event()
    codes: list[int] = []
    children: list[trio.Process] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_forward_signals, children, stopping)
        async with trio.open_nursery() as workers:
            for index in range(processes):
                workers.start_soon(_keep_running, argv, index, children, stopping, codes)
        nursery.cancel_scope.cancel()
    return max(codes, default=0)


async def _keep_running(
    argv: Sequence[str],
    index: int,
    children: list[trio.Process],
    stopping: trio.Event,
    codes: list[int],
) -> None:
    while True:
        # Own session: a terminal's Ctrl-C reaches only the parent, which forwards it
        # once (a child seeing it twice would skip the grace).
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "trioq._cli", *argv], start_new_session=True
        )
        children.append(proc)
        logger.info("worker %d started (pid %d)", index, proc.pid)
        try:
            code = await proc.wait()
        finally:
            children.remove(proc)
        if stopping.is_set():
            codes.append(code)
            return
        logger.warning("worker %d (pid %d) exited with %d: restarting", index, proc.pid, code)
        await trio.sleep(RESTART_BACKOFF)


async def _forward_signals(children: list[trio.Process], stopping: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            stopping.set()
            for proc in list(children):
                if proc.returncode is None:
                    proc.send_signal(signum)
