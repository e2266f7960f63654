"""CPU accounting for `trioq stress`, from ``/proc`` (Linux; psutil is not a dependency).

- A process: ``utime + stime`` of ``/proc/<pid>/stat``; a reaped worker's total comes
  from ``os.wait4`` instead (see `trioq._stress.workers`).
- The Postgres server: the postmaster's own time and ``cutime + cstime`` (every backend
  or background process it has reaped), plus the time of its live children. The sum is
  monotonic across backends that come and go, so a window is the difference of two samples.
  It covers the whole cluster, other databases' sessions included.
- The machine: busy jiffies of ``/proc/stat`` (user, nice, system, irq, softirq), so a reader
  can tell how much CPU others used during the run.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

__all__ = [
    "CpuSample",
    "ServerMeter",
    "machine_busy",
    "postmaster_of",
    "process_cpu",
    "server_cpu",
]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC = Path("/proc")


@attrs.frozen
class CpuSample:
    """CPU seconds: own (user + system) and that of reaped children."""

    own: float
    children: float


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name, or None if it is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def process_cpu(pid: int) -> CpuSample | None:
    """A process's CPU seconds so far (a zombie still reports its own)."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    # After the name: state ppid ... utime(14) stime(15) cutime(16) cstime(17), 1-based from pid.
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return CpuSample(own=(utime + stime) / _TICKS, children=(cutime + cstime) / _TICKS)


def _parent(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def _is_postgres(pid: int) -> bool:
    try:
        argv0 = (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return False
    return b"postgres" in argv0 or b"postmaster" in argv0


def postmaster_of(backend_pid: int) -> int | None:
    """The postmaster of a backend running on this host, or None (remote server, no /proc)."""
    parent = _parent(backend_pid)
    if parent is None or not _is_postgres(backend_pid) or not _is_postgres(parent):
        return None
    return parent


def _children(pid: int) -> list[int]:
    """Children of ``pid``, from every thread's ``children`` list (Linux 3.5+)."""
    found: list[int] = []
    for task in (_PROC / str(pid) / "task").glob("*/children"):
        try:
            found.extend(int(c) for c in task.read_text().split())
        except OSError:
            continue
    return found


def server_cpu(postmaster: int) -> float | None:
    """CPU seconds of a Postgres server so far: see the module docs. None if it is gone."""
    root = process_cpu(postmaster)
    if root is None:
        return None
    total = root.own + root.children
    for child in _children(postmaster):
        sample = process_cpu(child)
        if sample is not None:
            total += sample.own + sample.children
    return total


def machine_busy() -> float | None:
    """Busy CPU seconds of the whole machine since boot (all cores), or None without /proc."""
    try:
        first = (_PROC / "stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    jiffies = [int(x) for x in first[1:8]]
    user, nice, system, _idle, _iowait, irq, softirq = jiffies  # guest time is within user
    return (user + nice + system + irq + softirq) / _TICKS


class ServerMeter:
    """Cumulative CPU seconds of a Postgres server, carried across a restart.

    `reading` is monotonic; a window is the difference of two readings. Around a restart,
    `before_restart` banks the old server's time and `after_restart` follows the new one
    (what the stopping server spends on its shutdown checkpoint is not seen).
    """

    def __init__(self, postmaster: int | None) -> None:
        self.postmaster = postmaster
        self._banked = 0.0
        self._last = 0.0
        self._base = self._sample()

    def _sample(self) -> float:
        """The server's total now (its last known total once it is gone)."""
        if self.postmaster is not None:
            self._last = server_cpu(self.postmaster) or self._last
        return self._last

    def reading(self) -> float:
        return self._banked + self._sample() - self._base

    def before_restart(self) -> None:
        self._banked = self.reading()
        self.postmaster = None
        self._base = self._last

    def after_restart(self, postmaster: int | None) -> None:
        self.postmaster = postmaster
        self._last = 0.0
        self._base = self._sample()
