"""``trioq serve --processes N``: one parent supervising N worker processes.

trio is single-threaded, so a host's cores are used by running one worker
process per core. If the parent itself dies (SIGKILL, the OOM killer), its
children notice and stop gracefully, as on SIGTERM: each holds the read end of
a pipe whose only write end is the parent's (`PARENT_FD_VAR`), and the kernel
closes it when the parent dies, however it died. So a restarted supervisor
never runs beside orphans of the last one.

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
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import attrs
import trio

__all__ = ["parent_fd_from_env", "stop_when_orphaned", "supervise"]

logger = logging.getLogger("trioq.supervisor")

RESTART_BACKOFF_MIN, RESTART_BACKOFF_MAX = 0.5, 30.0
#: A child that exits this soon after starting counts as failing to start.
QUICK_EXIT = 10.0
#: Failures to start in a row after which the supervisor gives up.
MAX_QUICK_EXITS = 5
#: The environment variable that gives a worker the file descriptor of its supervisor's
#: pipe (read end): end of file on it means the supervisor is gone.
PARENT_FD_VAR = "TRIOQ_SUPERVISOR_FD"


class GaveUp(Exception):
    """A worker kept exiting right after it started."""


@attrs.define
class _Workers:
    """What the supervisor's tasks share."""

    argv: Sequence[str]
    parent_fd: int  # the pipe's read end, for the children (the write end stays here)
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
    read_end, write_end = os.pipe()  # both close-on-exec: children get read_end only
    try:
        return await _supervise(_Workers(argv, read_end), processes)
    finally:
        os.close(read_end)
        os.close(write_end)


async def _supervise(workers: _Workers, processes: int) -> int:
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
            [sys.executable, "-m", "trioq._cli", *workers.argv], start_new_session=True,
            pass_fds=(workers.parent_fd,),
            env={**os.environ, PARENT_FD_VAR: str(workers.parent_fd)},
        )  # fmt: skip
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


def parent_fd_from_env() -> int | None:
    """The supervisor's pipe in a worker it started (and out of the environment, so the
    worker's own children do not take it for theirs); None when run on its own."""
    value = os.environ.pop(PARENT_FD_VAR, None)
    return None if value is None else int(value)


async def stop_when_orphaned(runtime: Any, parent_fd: int) -> None:
    """Stop ``runtime`` gracefully (as SIGTERM does) once the supervisor is gone: end of
    file on ``parent_fd``, which the kernel delivers when the parent's write end closes."""
    while True:
        await trio.lowlevel.wait_readable(parent_fd)
        if os.read(parent_fd, 1) == b"":
            break
    logger.warning("the supervisor (pid %d) is gone: stopping gracefully", os.getppid())
    runtime.stop()
