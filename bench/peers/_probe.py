"""What every peer worker takes from and tells `bench/bench_peers.py` (no dependencies).

Each worker script imports this from its own directory, under its own venv's
Python. `worker_parser` is the command line they share (``install``, ``prefill``,
``drain``, ``versions``; ``--dsn``, ``--jobs``); ``versions`` prints one line
``VERSIONS {json}`` (`say_versions`). The handler of the no-op task calls `Probe.hit`
with the job id:

* the first call prints ``FIRST <monotonic> <process_time>``: the start of the
  timed drain (first pickup), and the worker's CPU seconds at that moment;
* the call that reaches ``jobs`` prints ``ALL <monotonic>``: every handler has
  run; the parent then polls the database until no unfinished job is left (the
  last completion), the same way for every library;
* `Probe.done` prints ``DONE <calls> <distinct ids>`` when the worker exits.

With ``--share`` (one of several worker processes over the same jobs), the calls never reach
``jobs`` in one process: it stops once no job is left and then prints ``ALL`` with the time
of its own last handler call (`Probe.all_done`).

``time.monotonic`` is CLOCK_MONOTONIC, the same clock in every process of the
machine, so the parent can compare it with its own.

`server_cpu` reads the CPU of a local Postgres server's processes (`bench_durable.py`'s
peers report the server's CPU per step with it).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
import time


class Probe:
    def __init__(self, jobs: int = 0) -> None:
        self.reset(jobs)

    def reset(self, jobs: int) -> None:
        self.jobs = jobs
        self.calls = 0
        self.ids: set[object] = set()
        self.all_seen = False
        self.last = 0.0

    def hit(self, job_id: object) -> None:
        self.calls += 1
        self.ids.add(job_id)
        self.last = time.monotonic()
        if self.calls == 1:
            say(f"FIRST {time.monotonic():.6f} {time.process_time():.6f}")
        if self.calls == self.jobs:
            self.all_seen = True
            say(f"ALL {time.monotonic():.6f}")

    def all_done(self) -> None:
        """``ALL`` at the last handler call (``--share``: this process saw no job left)."""
        say(f"ALL {self.last:.6f}")

    def done(self) -> None:
        say(f"DONE {self.calls} {len(self.ids)}")


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def server_cpu(postmaster: int) -> float:
    """CPU seconds (user + system) of the live children of process ``postmaster`` (the
    server's backends and helpers, from ``/proc``); 0.0 for ``postmaster`` 0. A backend that
    exits takes its seconds with it: read this while the connections measured are open."""
    if not postmaster:
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == postmaster:  # ppid; utime and stime are fields 14 and 15
            total += int(fields[11]) + int(fields[12])
    return total / tick


def worker_parser() -> argparse.ArgumentParser:
    """The command and options every worker takes; each adds its own after these."""
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["install", "prefill", "drain", "versions"])
    p.add_argument("--dsn")
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--share", action="store_true",
                   help="drain: one of several worker processes; stop once no job is left, "
                   "then say ALL (the time of this process's last handler call)")
    return p


def say_versions(distributions: list[str]) -> None:
    """``VERSIONS {json}``: the installed version of each distribution (None: absent), and
    Python's."""
    found: dict[str, str | None] = {}
    for name in distributions:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    found["python"] = platform.python_version()
    say("VERSIONS " + json.dumps(found))
