"""The worker processes of `trioq stress`: real ``trioq serve`` subprocesses.

Each worker runs ``python -m trioq._cli serve --app trioq._stress.app:config``, with the
DSN in ``TRIOQ_DSN`` (never on a command line, where ``ps`` shows passwords) and an
``application_name`` naming the worker, so the driver can find its connections in
``pg_stat_activity`` (readiness: its LISTEN is active; chaos: terminate them).

Workers are spawned on the trio thread (a fork+exec of a few ms) with ``PR_SET_PDEATHSIG``
so they receive SIGTERM when the driver dies, even by SIGKILL. Their output goes through a
pipe into a bounded `LogTail`; their CPU time comes from ``os.wait4`` when they exit
(killed ones included) and from ``/proc`` while they run.

Hosts (``--launcher``): each `Host` is a command prefix the worker command is run under
(``ip netns exec trioq-h1``, ``nsenter --net=/run/netns/h1``), with an optional DSN of its
own (how that host reaches the database). The prefix must exec the worker in this PID
namespace, so the process the driver spawned is the worker: its SIGKILL is the worker's,
and its pid is the one in the jobs' ``lease_owner``. Slots are spread round-robin over the
hosts (slot ``i`` on host ``i % hosts``). `WorkerGroup.kill_host` SIGKILLs every process
of one host and starts none again: a host lost for good, whose jobs the others recover.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import shlex
import signal
import subprocess
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import attrs
import trio
from psycopg.conninfo import make_conninfo

from .._worker.pooling import SESSION_DSN_VAR
from .cpu import process_cpu

__all__ = ["LOCAL", "Host", "LogTail", "StressError", "Worker", "WorkerGroup", "open_workers"]

APP = "trioq._stress.app:config"
#: Workers that exit on their own (not killed by the chaos) before the run gives up.
MAX_UNEXPECTED_EXITS = 10
RESTART_DELAY = 0.5
STOP_TIMEOUT = 10.0
_TAIL_LINES = 20
_PR_SET_PDEATHSIG = 1
_REAP_POLL = 0.05


class StressError(RuntimeError):
    """The stress run could not go on (workers keep dying, a worker never got ready)."""


@attrs.frozen(kw_only=True)
class Host:
    """Where a worker runs: under the command ``prefix``, connecting with ``dsn`` if given
    (else the run's DSN)."""

    name: str
    prefix: tuple[str, ...] = ()
    dsn: str | None = None

    @classmethod
    def parse(cls, index: int, launcher: str, dsn: str | None = None) -> Host:
        """Host ``h<index+1>`` from a ``--launcher`` string (split as a shell would)."""
        if "\x00" in launcher:
            raise ValueError("--launcher must not hold a NUL character")
        try:
            launcher.encode()
        except UnicodeEncodeError:
            raise ValueError(f"--launcher {launcher!r} is not valid UTF-8 text") from None
        try:
            prefix = tuple(shlex.split(launcher))
        except ValueError as ex:
            raise ValueError(f"--launcher {launcher!r}: {ex}") from None
        if not prefix:
            raise ValueError("--launcher must not be empty")
        return cls(name=f"h{index + 1}", prefix=prefix, dsn=dsn)


#: The default single host: workers run as plain children of the driver.
LOCAL = Host(name="local")


@attrs.define
class LogTail:
    """Counts of the workers' warnings and errors, and their last few output lines."""

    warnings: int = 0
    errors: int = 0
    lease_lost: int = 0  # "job N lost its lease" warnings, a subset of ``warnings``
    lines: deque[str] = attrs.field(factory=lambda: deque(maxlen=_TAIL_LINES))

    def feed(self, worker: int, line: str) -> None:
        if " WARNING " in line:
            self.warnings += 1
            self.lease_lost += "lost its lease" in line
        elif " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback"):
            self.errors += 1
        self.lines.append(f"[w{worker}] {line}")


@attrs.define(eq=False)
class Worker:
    slot: int
    app_name: str
    popen: subprocess.Popen[bytes]
    host: Host = LOCAL
    killed: bool = False  # SIGKILLed by the chaos
    stopping: bool = False  # asked to stop by the driver
    returncode: int | None = None
    cpu: float | None = None  # user + system seconds, once reaped
    exited: trio.Event = attrs.field(factory=trio.Event)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def cpu_now(self) -> float:
        if self.cpu is not None:
            return self.cpu
        sample = process_cpu(self.pid)
        return sample.own if sample else 0.0


class WorkerGroup:
    """``count`` worker slots, each running one process at a time."""

    def __init__(
        self, nursery: trio.Nursery, *, dsn: str, env: Mapping[str, str], count: int,
        pooler_dsn: str | None = None, hosts: tuple[Host, ...] = (LOCAL,),
    ) -> None:  # fmt: skip
        self._nursery = nursery
        self.hosts = hosts
        self.lost_hosts: set[str] = set()  # killed by kill_host: nothing starts there again
        self.pids: dict[str, list[int]] = {h.name: [] for h in hosts}  # every pid started
        self._dsn = dsn
        self._pooler_dsn = pooler_dsn  # the pools go through it; LISTEN and liveness: dsn
        self._env = dict(env)
        self.count = count
        self.prefix = f"trioq-stress-{os.getpid()}-w"  # application_name of every worker
        self.slots: dict[int, Worker] = {}
        self.log = LogTail()
        self.started = 0
        self.unexpected_exits = 0
        self.failure: str | None = None
        self.failed = trio.Event()
        self._exited_cpu = 0.0

    # -- starting and stopping ----------------------------------------------------------------

    def start_all(self) -> None:
        """Start every slot, but those of a host `kill_host` took down."""
        for slot in range(self.count):
            if self.host_of(slot).name not in self.lost_hosts:
                self.start(slot)

    def start(self, slot: int) -> Worker:
        """Spawn a worker into ``slot`` (replacing whatever ran there)."""
        app_name = f"{self.prefix}{slot}"
        host = self.host_of(slot)
        read_fd, write_fd = os.pipe()
        try:
            popen = _spawn(self._command(host), self._worker_env(app_name, host), write_fd)
        finally:
            os.close(write_fd)
        worker = Worker(slot=slot, app_name=app_name, popen=popen, host=host)
        self.slots[slot] = worker
        self.pids[host.name].append(popen.pid)
        self.started += 1
        self._nursery.start_soon(self._watch, worker, read_fd)
        return worker

    def host_of(self, slot: int) -> Host:
        return self.hosts[slot % len(self.hosts)]

    def _command(self, host: Host) -> list[str]:
        return [*host.prefix, sys.executable, "-m", "trioq._cli", "serve", "--app", APP]

    def _worker_env(self, app_name: str, host: Host) -> dict[str, str]:
        ours = ("TRIOQ_DSN", "DATABASE_URL", SESSION_DSN_VAR)
        env = {k: v for k, v in os.environ.items() if k not in ours}
        env.update(self._env)
        direct = make_conninfo(host.dsn or self._dsn, application_name=app_name)
        if self._pooler_dsn is None:
            env["TRIOQ_DSN"] = direct
        else:
            env["TRIOQ_DSN"] = make_conninfo(self._pooler_dsn, application_name=app_name)
            env[SESSION_DSN_VAR] = direct
        return env

    async def stop(self, grace: float) -> None:
        """SIGTERM every worker, wait up to ``grace`` (+ its shutdown), then SIGKILL."""
        for sig, wait in ((signal.SIGTERM, grace + STOP_TIMEOUT), (signal.SIGKILL, STOP_TIMEOUT)):
            live = self.live()
            for worker in live:
                worker.stopping = True
                _signal(worker.popen, sig)
            with trio.move_on_after(wait):
                for worker in live:
                    await worker.exited.wait()

    # -- chaos ------------------------------------------------------------------------------

    def kill(self, victim: Worker) -> Worker:
        """SIGKILL ``victim`` and start its replacement at once."""
        victim.killed = True
        _signal(victim.popen, signal.SIGKILL)
        self.start(victim.slot)
        return victim

    def kill_host(self, host: Host) -> list[Worker]:
        """SIGKILL every live worker on ``host``, and start none there again."""
        self.lost_hosts.add(host.name)
        victims = [w for w in self.live() if w.host == host]
        for victim in victims:
            victim.killed = True
            _signal(victim.popen, signal.SIGKILL)
        return victims

    def signal(self, worker: Worker, sig: int) -> None:
        """Send ``sig`` to ``worker`` if it is still running."""
        _signal(worker.popen, sig)

    # -- observing -------------------------------------------------------------------------

    def live(self) -> list[Worker]:
        return [w for w in self.slots.values() if not w.exited.is_set()]

    def cpu_total(self) -> float:
        """CPU seconds of every worker process this group started, so far."""
        return self._exited_cpu + sum(w.cpu_now() for w in self.live())

    def app_names(self) -> list[str]:
        return [w.app_name for w in self.live()]

    # -- one worker's output and exit ------------------------------------------------------

    async def _watch(self, worker: Worker, read_fd: int) -> None:
        await self._pump(worker, read_fd)
        returncode, cpu = await _reap(worker.popen)
        worker.returncode, worker.cpu = returncode, cpu
        self._exited_cpu += cpu
        worker.exited.set()
        if not (worker.killed or worker.stopping):
            await self._unexpected_exit(worker)

    async def _pump(self, worker: Worker, read_fd: int) -> None:
        pending = b""
        async with trio.lowlevel.FdStream(read_fd) as stream:
            async for chunk in stream:
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    self.log.feed(worker.slot, line.decode(errors="replace"))
        if pending:
            self.log.feed(worker.slot, pending.decode(errors="replace"))

    async def _unexpected_exit(self, worker: Worker) -> None:
        self.unexpected_exits += 1
        self.log.feed(worker.slot, f"(worker pid {worker.pid} exited with {worker.returncode})")
        if self.unexpected_exits > MAX_UNEXPECTED_EXITS:
            self._fail(f"{self.unexpected_exits} workers exited on their own")
            return
        await trio.sleep(RESTART_DELAY)
        lost = worker.host.name in self.lost_hosts
        if self.slots.get(worker.slot) is worker and not (self.failed.is_set() or lost):
            self.start(worker.slot)

    def _fail(self, why: str) -> None:
        if self.failure is None:
            tail = "\n".join(self.log.lines)
            self.failure = f"{why}; last lines of their output:\n{tail}"
            self.failed.set()


@contextlib.asynccontextmanager
async def open_workers(
    *, dsn: str, env: Mapping[str, str], count: int, grace: float,
    pooler_dsn: str | None = None, hosts: tuple[Host, ...] = (LOCAL,),
) -> AsyncIterator[WorkerGroup]:  # fmt: skip
    """A `WorkerGroup` whose processes are all stopped (bounded, shielded) when the block ends."""
    async with trio.open_nursery() as nursery:
        group = WorkerGroup(
            nursery, dsn=dsn, env=env, count=count, pooler_dsn=pooler_dsn, hosts=hosts
        )
        try:
            yield group
        finally:
            with trio.move_on_after(grace + 3 * STOP_TIMEOUT, shield=True):
                await group.stop(grace)
            nursery.cancel_scope.cancel()


def _spawn(command: list[str], env: dict[str, str], output_fd: int) -> subprocess.Popen[bytes]:
    # Own session: a Ctrl-C meant for the driver must not stop the workers under it.
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=output_fd,
        stderr=output_fd,
        env=env,
        start_new_session=True,
        preexec_fn=_death_signal(),  # noqa: PLW1509 - only prctl and getppid run in the child
    )


def _death_signal() -> Callable[[], None] | None:
    """SIGTERM the worker when the driver's (main) thread dies: no orphaned workers."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            raise RuntimeError("the driver exited during spawn")

    return preexec


def _signal(popen: subprocess.Popen[Any], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        if popen.returncode is None:
            os.kill(popen.pid, sig)


async def _reap(popen: subprocess.Popen[Any]) -> tuple[int, float]:
    """Wait for the process to exit and reap it: its exit code and CPU seconds."""
    pid = popen.pid
    await _wait_exited(pid)
    _, status, usage = os.wait4(pid, 0)  # noqa: ASYNC222 - it has exited: this cannot block
    popen.returncode = os.waitstatus_to_exitcode(status)  # so Popen never reaps it again
    return popen.returncode, usage.ru_utime + usage.ru_stime


async def _wait_exited(pid: int) -> None:
    pidfd_open = getattr(os, "pidfd_open", None)
    try:
        fd = pidfd_open(pid) if pidfd_open else -1
    except OSError:
        fd = -1
    if fd < 0:
        # No pidfd (before Linux 5.3): poll, without reaping and without blocking.
        exited = functools.partial(os.waitid, os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        while exited() is None:  # noqa: ASYNC110 - a pid has no event to wait on
            await trio.sleep(_REAP_POLL)
        return
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)
