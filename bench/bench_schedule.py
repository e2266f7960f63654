"""Scheduling latency of the real worker runtime against real Postgres (prints numbers; no test).

Three measurements in the database ``trioq_bench_sched``, which the script creates (dropping a
leftover one first), migrates and drops at the end; the first two each with a freshly started
runtime (``trioq.serve``):

1. **Scheduled jobs** (lateness). A producer enqueues ``--jobs`` jobs at ``--rate`` jobs/s, each
   with ``run_at = now + U(--min-delay, --max-delay)`` (``trioq.enqueue(..., run_at=...)``, one
   autocommit statement each, the intended due time also in the args). A fraction
   ``--burst-share`` of the enqueues are bursts of 2..``--burst-max`` jobs sharing one run_at, so
   several jobs are due at the same moment. The handler records ``start - run_at``: ``start`` is
   ``time.time()`` on its first line, ``run_at`` is the row's own value as the worker received it.
   Both are the same host's CLOCK_REALTIME (Postgres' ``clock_timestamp()`` is gettimeofday); the
   script measures the DB-vs-Python clock offset and prints it, so the comparison is checked,
   not assumed. Target: p99 <= 50 ms.
2. **Idle pickup**. With an idle worker, enqueue one job due now in an explicit transaction,
   wait until its handler has started, pause ``--idle-gap`` (randomized +-50 %) so the worker
   is idle again (its outcome written), repeat ``--jobs`` times. The commit happens between
   sending COMMIT and its reply, so ``COMMIT sent -> handler start`` (the headline) is an upper
   bound of commit -> start and ``COMMIT done -> start`` a lower bound (negative when the
   worker started the job before the producer task ran again). ``--pickup-autocommit`` times a
   single autocommit ``enqueue()`` call instead (its INSERT included). Targets: p50 <= 2.5 ms,
   p99 <= 5 ms.
3. **Floor**. The same hops without trioq's runtime, to tell the machine's share from trioq's:
   ``SELECT 1`` after the same idle gap and back to back, ``NOTIFY`` sent -> the listening
   connection has it, and ``NOTIFY`` -> received -> one ``SELECT 1`` on a third connection.

Recording is bounded: one float per job, preallocated. The runtime runs in this process under
the same ``trio.run`` as the producer (``await nursery.start(trioq.serve, config)``, stopped with
``runtime.stop()``), with the default `trioq.Config` except ``--concurrency`` for the one queue.
``--separate-process`` starts ``trioq serve --app bench_schedule:tasks`` as a child process
instead (this file is the app module); its handlers report over a UDP socket on 127.0.0.1, and
``perf_counter`` (CLOCK_MONOTONIC) is system-wide on Linux, so pickup latency is still one clock.

``--prototype lean-claim`` (in-process only) runs the worker with a change to the runtime,
monkeypatched for the measurement: claims on a connection of each fetcher's own, and statements
rendered to text once (see docs/scheduling-latency.md for the A/B result).

``--trace`` (in-process only) wraps `Driver.claim`, `Driver.promote_due`, `Driver.next_due` and
`Runtime._wake` (monkeypatching, nothing under ``trioq/`` is edited) and splits each job's latency
into its stages: scheduler wake-up (due -> promote called), the promote statement, promote ->
claim called, the claim statement, claim -> handler start (scheduled); COMMIT sent ->
notification handled -> claim called, the claim statement, claim -> handler start (pickup).

Before each measurement the script waits (up to ``--quiet-wait`` s) for the rest of the machine to
be below ``--quiet-cores`` busy cores, and it reports the CPU used during the measurement by this
process, the worker child, the bench database's backends and everything else (``others``): on a
2-core box a neighbour's work moves the tail. Only the numbers of runs with low ``others`` say
anything about trioq.

Usage::

    python bench/bench_schedule.py                      # TRIOQ_DSN or the local test server
    python bench/bench_schedule.py --repeat 3 --trace
    python bench/bench_schedule.py --separate-process --json sched.json
    python bench/bench_schedule.py --phases pickup --pickup-autocommit
    python bench/bench_schedule.py --phases pickup,floor --trace --prototype lean-claim
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import math
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import trio
from _common import (
    add_common_options,
    client_versions,
    cpu_model,
    create_bench_db,
    drop_bench_db,
    machine_busy,
    median_or_none,
    patched,
    scalar,
    show_settings,
    wait_quiet,
    write_json,
)
from psycopg import sql

import trioq
from trioq import Runtime
from trioq._db.driver import Driver
from trioq._db.statements import Statements, names, statements

BENCH_DB = "trioq_bench_sched"
QUEUE = "bench_sched"
PORT_ENV = "TRIOQ_BENCH_SCHED_PORT"
TICK = os.sysconf("SC_CLK_TCK")
TARGET_SCHED_P99 = 50.0  # ms
TARGET_PICKUP_P50, TARGET_PICKUP_P99 = 2.5, 5.0  # ms
TRACE_CAP = 200_000  # events kept per trace list (bounded memory)
PROMOTE_SKEW = 0.0005  # s: a promote called this much before a job is due may promote it

Conn = Any  # trioq.TrioConnection


# -- the app: two handlers, reporting to a sink ----------------------------------------------------
#
# In-process runs set _Sink.fn to the recorder; in a ``trioq serve`` child the handlers send one UDP
# datagram per job to the port in $TRIOQ_BENCH_SCHED_PORT.

tasks = trioq.Registry()
HERE = Path(__file__).resolve().parent


class _Sink:
    """Where handlers report: a function (in-process), else UDP to $TRIOQ_BENCH_SCHED_PORT."""

    fn: Callable[[str, int, float, float], None] | None = None
    udp: socket.socket | None = None


def _report(kind: str, seq: int, a: float, b: float = 0.0) -> None:
    if _Sink.fn is not None:
        _Sink.fn(kind, seq, a, b)
        return
    if _Sink.udp is None:
        _Sink.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    address = ("127.0.0.1", int(os.environ[PORT_ENV]))
    _Sink.udp.sendto(f"{kind} {seq} {a!r} {b!r}".encode(), address)


@tasks.task(name="bench_sched.scheduled", queue=QUEUE, max_attempts=1)
async def scheduled(job: trioq.JobContext, seq: int, due: float) -> None:
    start = time.time()
    _report("s", seq, start, job.job.run_at.timestamp())


@tasks.task(name="bench_sched.pickup", queue=QUEUE, max_attempts=1)
async def pickup(job: trioq.JobContext, seq: int) -> None:
    _report("p", seq, time.perf_counter(), time.process_time())


# -- recording -------------------------------------------------------------------------------------


class Recorder:
    """One preallocated slot per job; a waiter per phase."""

    def __init__(self) -> None:
        self.kind = ""
        self.values: list[float] = []
        self.extra: list[float] = []
        self.seen = 0
        self.duplicates = 0
        self.waiting: int | None = None
        self._event = trio.Event()

    def reset(self, kind: str, n: int) -> None:
        self.kind, self.seen, self.duplicates = kind, 0, 0
        self.values = [math.nan] * n
        self.extra = [math.nan] * n
        self._event = trio.Event()

    def record(self, kind: str, seq: int, a: float, b: float) -> None:
        if kind == "w":  # warm-up
            self._event.set()
            return
        if kind != self.kind or not 0 <= seq < len(self.values):
            return
        if not math.isnan(self.values[seq]):
            self.duplicates += 1
            return
        self.values[seq], self.extra[seq] = a, b
        self.seen += 1
        if self.waiting is None or self.waiting == seq or self.seen == len(self.values):
            self._event.set()

    async def wait(self, seconds: float) -> bool:
        with trio.move_on_after(seconds):
            await self._event.wait()
            self._event = trio.Event()
            return True
        return False


@tasks.task(name="bench_sched.warmup", queue=QUEUE, max_attempts=1)
async def warmup(job: trioq.JobContext) -> None:
    _report("w", 0, 0.0)


# -- statistics and machine noise -----------------------------------------------------------------


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return math.nan
    k = (len(sorted_values) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def summary(values_s: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/max/min/mean in milliseconds of the finite values (seconds)."""
    ms = sorted(v * 1000 for v in values_s if not math.isnan(v))
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "min": ms[0],
        "p50": percentile(ms, 50),
        "p95": percentile(ms, 95),
        "p99": percentile(ms, 99),
        "max": ms[-1],
        "mean": statistics.fmean(ms),
    }


def process_times(pid: int) -> tuple[float, float]:
    """CPU seconds (user, system) of process ``pid`` (0 if it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0, 0.0
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` (0 if it is gone or unreadable)."""
    return sum(process_times(pid))


def client_times(worker_pid: int | None) -> tuple[float, float]:
    """(user, system) CPU seconds of this process plus the worker child, if any."""
    own = os.times()
    user, system = process_times(worker_pid) if worker_pid else (0.0, 0.0)
    return own.user + user, own.system + system


async def bench_backends(conn: Conn) -> list[int]:
    cur = await conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s",
        (BENCH_DB,),
    )
    return [row[0] for row in await cur.fetchall()]


class Meter:
    """Wall time and CPU around one measurement: ours (this process, a worker child, the
    Postgres backends of the bench database) and the rest of the machine's (``others``)."""

    def __init__(self, worker_pid: int | None) -> None:
        self.worker_pid = worker_pid
        self.cpu: dict[int, float] = {}

    async def start(self, conn: Conn) -> None:
        pids = await bench_backends(conn)
        pids += [self.worker_pid] if self.worker_pid else []
        self.cpu = {pid: process_cpu(pid) for pid in pids}
        self.t0, self.own0, self.machine0 = time.monotonic(), time.process_time(), machine_busy()
        self.client0 = client_times(self.worker_pid)

    async def stop(self, conn: Conn) -> dict[str, float]:
        wall = time.monotonic() - self.t0
        machine = machine_busy() - self.machine0
        own = time.process_time() - self.own0
        pids = set(await bench_backends(conn)) | set(self.cpu)
        bench = sum(process_cpu(pid) - self.cpu.get(pid, 0.0) for pid in pids)
        worker = 0.0
        if self.worker_pid:
            worker = process_cpu(self.worker_pid) - self.cpu.get(self.worker_pid, 0.0)
        (user0, system0), (user1, system1) = self.client0, client_times(self.worker_pid)
        user, system = user1 - user0, system1 - system0
        return {
            "wall_s": wall,
            "client_user_s": user,  # this process + the worker child
            "client_system_s": system,
            "this_process_cores": own / wall,
            "worker_process_cores": worker / wall,
            "backends_cores": (bench - worker) / wall,
            "machine_cores": machine / wall,
            "others_cores": max(0.0, (machine - own - bench) / wall),
        }


# -- tracing (in-process only) ---------------------------------------------------------------------


class Tracer:
    """Timestamps (perf_counter) of the runtime's scheduling steps, bounded."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.claims: list[tuple[float, float, int]] = []  # call, return, jobs
        self.claimed: dict[int, tuple[float, float]] = {}  # job id -> claim call, return
        self.claim_cpu: dict[int, tuple[float, float]] = {}  # job id -> process_time, same
        self.promotes: list[tuple[float, float, int]] = []  # call, return, queues promoted
        self.next_dues: list[tuple[float, float]] = []  # return, due_in seconds (nan: none)
        self.wakes: list[float] = []  # Runtime._wake calls (notifications and promotions)
        self.wake_cpu: dict[float, float] = {}  # wake time -> process_time then
        self.gc: dict[int, list[float]] = {0: [], 1: [], 2: []}  # pause seconds per generation
        self._gc_start = 0.0

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif len(self.gc[info["generation"]]) < TRACE_CAP:
            self.gc[info["generation"]].append(time.perf_counter() - self._gc_start)

    def gc_summary(self) -> dict[str, Any]:
        return {
            f"gen{g}": {"count": len(v), "max_ms": max(v, default=0) * 1000,
                        "total_ms": sum(v) * 1000}
            for g, v in self.gc.items()
        }  # fmt: skip

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        tracer = self
        claim, promote_due, next_due = Driver.claim, Driver.promote_due, Driver.next_due
        wake = Runtime._wake

        async def traced_claim(self: Driver, conn: Conn, queue: str, **kw: Any) -> Any:
            c0, t0 = time.process_time(), time.perf_counter()
            jobs = await claim(self, conn, queue, **kw)
            c1, t1 = time.process_time(), time.perf_counter()
            if len(tracer.claims) < TRACE_CAP:
                tracer.claims.append((t0, t1, len(jobs)))
                for job in jobs:
                    tracer.claimed[job.id] = (t0, t1)
                    tracer.claim_cpu[job.id] = (c0, c1)
            return jobs

        async def traced_promote(self: Driver, conn: Conn, **kw: Any) -> Any:
            t0 = time.perf_counter()
            queues = await promote_due(self, conn, **kw)
            if len(tracer.promotes) < TRACE_CAP:
                tracer.promotes.append((t0, time.perf_counter(), len(queues)))
            return queues

        async def traced_next_due(self: Driver, conn: Conn) -> Any:
            due_in = await next_due(self, conn)
            if len(tracer.next_dues) < TRACE_CAP:
                seconds = math.nan if due_in is None else due_in.total_seconds()
                tracer.next_dues.append((time.perf_counter(), seconds))
            return due_in

        def traced_wake(self: Runtime, queue: str) -> None:
            if len(tracer.wakes) < TRACE_CAP:
                t = time.perf_counter()
                tracer.wakes.append(t)
                tracer.wake_cpu[t] = time.process_time()
            wake(self, queue)

        gc.callbacks.append(self._on_gc)
        try:
            with (
                patched(Driver, "claim", traced_claim),
                patched(Driver, "promote_due", traced_promote),
                patched(Driver, "next_due", traced_next_due),
                patched(Runtime, "_wake", traced_wake),
            ):
                yield
        finally:
            gc.callbacks.remove(self._on_gc)


def _first_at_or_after(times: Sequence[float], t: float) -> int:
    """Index of the first element >= t in an ascending list (len if none)."""
    lo, hi = 0, len(times)
    while lo < hi:
        mid = (lo + hi) // 2
        if times[mid] < t:
            lo = mid + 1
        else:
            hi = mid
    return lo


def scheduled_breakdown(
    tracer: Tracer, ids: Sequence[int], due_pc: Sequence[float], start_pc: Sequence[float]
) -> dict[str, Any]:
    """Per job: wake lag, promote statement, promote -> claim call, claim, claim -> handler start.

    All in perf_counter seconds. Which promote made a job available is inferred: of the non-empty
    promotes that returned after the job was due and no later than the claim that got it, the
    first one called at most `PROMOTE_SKEW` before the due time (the statement's ``now()`` is a
    little later than the call), else the last of them. Jobs without such a promote (or claim)
    are counted as unattributed.
    """
    productive = [p for p in tracer.promotes if p[2]]
    returns = [p[1] for p in productive]
    stages: dict[str, list[float]] = {
        "wake": [], "promote": [], "to_claim_call": [], "claim": [], "to_start": []
    }  # fmt: skip
    worst: list[tuple[float, dict[str, float]]] = []
    unattributed = 0
    for job_id, due, start in zip(ids, due_pc, start_pc, strict=True):
        claim = tracer.claimed.get(job_id)
        if claim is None or math.isnan(start):
            unattributed += 1
            continue
        first = _first_at_or_after(returns, due)
        last = _first_at_or_after(returns, claim[1] + 1e-9)
        candidates = productive[first:last]
        if not candidates:
            unattributed += 1
            continue
        chosen = next((p for p in candidates if p[0] >= due - PROMOTE_SKEW), candidates[-1])
        p_call, p_ret, _ = chosen
        parts = {
            "wake": p_call - due,
            "promote": p_ret - p_call,
            "to_claim_call": claim[0] - p_ret,
            "claim": claim[1] - claim[0],
            "to_start": start - claim[1],
        }
        for key, value in parts.items():
            stages[key].append(value)
        worst.append((start - due, parts))
    worst.sort(key=lambda w: w[0], reverse=True)
    return {
        "stages_ms": {key: summary(values) for key, values in stages.items()},
        "worst_ms": [
            {"lateness": lat * 1000, **{k: v * 1000 for k, v in parts.items()}}
            for lat, parts in worst[:8]
        ],
        "unattributed": unattributed,
        "gc": tracer.gc_summary(),
        "scheduler_passes": len(tracer.promotes),
        "productive_promotes": len(productive),
        "claims": len(tracer.claims),
        "empty_claims": sum(1 for c in tracer.claims if c[2] == 0),
        "wakes": len(tracer.wakes),
    }


def pickup_breakdown(
    tracer: Tracer,
    ids: Sequence[int],
    sent: Sequence[float],
    start_pc: Sequence[float],
    start_cpu: Sequence[float],
) -> dict[str, Any]:
    """Per job: COMMIT sent -> notification handled -> claim call -> claim return -> start.

    The ``cpu_*`` stages are this process' CPU time (``process_time``) over the same intervals:
    next to the wall time they show whether a stage waits or computes.
    """
    wakes = sorted(tracer.wakes)
    stages: dict[str, list[float]] = {
        "to_wake": [], "wake_to_claim": [], "claim": [], "to_start": [],
        "cpu_wake_to_claim": [], "cpu_claim": [], "cpu_to_start": [],
    }  # fmt: skip
    for job_id, t0, start, cpu_start in zip(ids, sent, start_pc, start_cpu, strict=True):
        claim = tracer.claimed.get(job_id)
        claim_cpu = tracer.claim_cpu.get(job_id)
        if claim is None or claim_cpu is None or math.isnan(start):
            continue
        i = _first_at_or_after(wakes, t0)
        if i < len(wakes) and wakes[i] <= claim[0]:
            stages["to_wake"].append(wakes[i] - t0)
            stages["wake_to_claim"].append(claim[0] - wakes[i])
            stages["cpu_wake_to_claim"].append(claim_cpu[0] - tracer.wake_cpu[wakes[i]])
        stages["claim"].append(claim[1] - claim[0])
        stages["to_start"].append(start - claim[1])
        stages["cpu_claim"].append(claim_cpu[1] - claim_cpu[0])
        stages["cpu_to_start"].append(cpu_start - claim_cpu[1])
    return {
        "stages_ms": {key: summary(values) for key, values in stages.items()},
        "gc": tracer.gc_summary(),
        "scheduler_passes": len(tracer.promotes),
        "claims": len(tracer.claims),
        "empty_claims": sum(1 for c in tracer.claims if c[2] == 0),
        "wakes": len(tracer.wakes),
    }


# -- a prototype of a runtime change (monkeypatched, in-process only) ------------------------------

PROTOTYPES = ("lean-claim",)


@contextlib.contextmanager
def lean_claim() -> Iterator[None]:
    """Prototype of two changes to the pickup path (see docs/scheduling-latency.md).

    * Each fetcher claims on a connection of its own, opened once, instead of checking one
      out of the pool for every claim (``Semaphore.acquire``, the health check, ``putconn``).
    * Statements are rendered to text once (``Composed.as_string``), not on every execute.
    """
    rendered = statements_rendered()

    async def claim(self: Runtime, state: Any, limit: int) -> Any:
        conns: dict[str, Any] = self.__dict__.setdefault("_bench_claim_conns", {})
        conn = conns.get(state.name)
        if conn is None or conn.closed:
            conn = conns[state.name] = await trioq.connect(self.dsn, autocommit=True)
        try:
            claimed = await self.queue.driver.claim(
                conn, state.name, owner=self.config.worker_id, limit=limit,
                lease=dt.timedelta(seconds=self.config.lease),
            )  # fmt: skip
        except psycopg.OperationalError:
            conns.pop(state.name, None)
            await conn.close()
            raise
        self._claimed += len(claimed)
        return claimed

    with patched(Runtime, "_claim", claim), patched(Driver, "sql", property(lambda q: rendered)):
        yield


def statements_rendered() -> Statements:
    """trioq's statements for the schema ``trioq``, each rendered to text once."""
    composed = statements("trioq")
    fields = {
        name: getattr(composed, name).as_string(None)
        for name in names()
        if isinstance(getattr(composed, name), sql.Composable)
    }
    return composed.replaced(**fields)


async def close_prototype_connections(runtime: Runtime) -> None:
    for conn in runtime.__dict__.get("_bench_claim_conns", {}).values():
        await conn.close()


def prototype(name: str | None) -> contextlib.AbstractContextManager[None]:
    return lean_claim() if name == "lean-claim" else contextlib.nullcontext()


# -- database --------------------------------------------------------------------------------------


async def clock_offset(conn: Conn, samples: int = 50) -> dict[str, float]:
    """DB ``clock_timestamp()`` minus Python ``time.time()``, from the tightest round trip."""
    best = (math.inf, 0.0)
    for _ in range(samples):
        t0 = time.time()
        db = await scalar(conn, "SELECT extract(epoch FROM clock_timestamp())::float8")
        t1 = time.time()
        best = min(best, (t1 - t0, db - (t0 + t1) / 2))
    return {"offset_ms": best[1] * 1000, "uncertainty_ms": best[0] / 2 * 1000}


async def environment(conn: Conn) -> dict[str, Any]:
    settings = await show_settings(
        conn, ("server_version", "fsync", "synchronous_commit", "shared_buffers")
    )
    return {
        "postgres": settings,
        **client_versions(),
        "trioq": trioq.__version__,
        "trioq_revision": _revision(),
        "kernel": platform.release(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
        "clock": await clock_offset(conn),
    }


def _revision() -> str:
    """The checkout's commit, and whether trioq/ has uncommitted changes (read-only git)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    try:
        head, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "../trioq")
    except OSError:
        return "?"
    return f"{head or '?'}{' + uncommitted changes in trioq/' if dirty else ''}"


# -- the worker: in this process or a child --------------------------------------------------------


@dataclass
class Options:
    admin_dsn: str
    jobs: int
    rate: float
    min_delay: float
    max_delay: float
    burst_share: float
    burst_max: int
    idle_gap: float
    pickup_autocommit: bool
    floor_samples: int
    concurrency: int
    repeat: int
    phases: tuple[str, ...]
    separate_process: bool
    trace: bool
    prototype: str | None
    seed: int
    quiet_cores: float
    quiet_wait: float
    json_path: Path | None
    keep_db: bool


@contextlib.asynccontextmanager
async def worker_in_process(dsn: str, opts: Options, rec: Recorder) -> Any:
    config = trioq.Config(
        dsn=dsn, registry=tasks, queues={QUEUE: trioq.QueueConfig(concurrency=opts.concurrency)}
    )
    _Sink.fn = rec.record
    try:
        async with trio.open_nursery() as nursery:
            runtime = await nursery.start(trioq.serve, config)
            try:
                yield runtime
            finally:
                runtime.stop()
                await close_prototype_connections(runtime)
    finally:
        _Sink.fn = None


@contextlib.asynccontextmanager
async def worker_process(dsn: str, opts: Options, rec: Recorder) -> Any:
    """``trioq serve --app bench_schedule:tasks`` as a child; its handlers report over UDP."""
    udp = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await udp.bind(("127.0.0.1", 0))
    port = udp.getsockname()[1]
    here = HERE
    env = {**os.environ, PORT_ENV: str(port), "PYTHONPATH": str(here)}
    trioq_cli = Path(sys.executable).with_name("trioq")
    argv = [str(trioq_cli), "serve", "--app", "bench_schedule:tasks", "--dsn", dsn,
            "--queues", QUEUE, "--concurrency", str(opts.concurrency)]  # fmt: skip
    log = tempfile.NamedTemporaryFile("w+", prefix="bench_schedule_serve_", suffix=".log")  # noqa: SIM115

    async def receive() -> None:
        while True:
            data = await udp.recv(256)
            kind, seq, a, b = data.decode().split()
            rec.record(kind, int(seq), float(a), float(b))

    with udp, log:
        proc = await trio.lowlevel.open_process(
            argv, cwd=str(here), env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(receive)
                yield proc
                nursery.cancel_scope.cancel()
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGINT)  # graceful stop
                with trio.move_on_after(15):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            if proc.returncode not in (0, -2):
                log.seek(0)
                print(f"trioq serve exited with {proc.returncode}:\n{log.read()[-3000:]}")


async def warm_up(conn: Conn, rec: Recorder, proc: Any = None) -> None:
    """Wait until the worker runs jobs, then run a few more (prepared statements, pool)."""
    deadline = trio.current_time() + 60
    ok = 0
    while ok < 30:
        if proc is not None and proc.returncode is not None:
            raise RuntimeError(f"trioq serve exited with {proc.returncode}")
        if trio.current_time() > deadline:
            raise RuntimeError("the worker did not run warm-up jobs within 60 s")
        await trioq.enqueue(conn, "bench_sched.warmup", queue=QUEUE)
        if await rec.wait(2.0):
            ok += 1
    await trio.sleep(0.2)


# -- the two measurements --------------------------------------------------------------------------


def plan_schedule(opts: Options, rng: random.Random) -> list[tuple[float, float]]:
    """(enqueue offset, delay) per job; bursts share one delay and one enqueue moment."""
    plan: list[tuple[float, float]] = []
    while len(plan) < opts.jobs:
        size = rng.randint(2, opts.burst_max) if rng.random() < opts.burst_share else 1
        size = min(size, opts.jobs - len(plan))
        at = len(plan) / opts.rate
        delay = rng.uniform(opts.min_delay, opts.max_delay)
        plan.extend((at, delay) for _ in range(size))
    return plan


async def measure_scheduled(
    conn: Conn, rec: Recorder, opts: Options, rng: random.Random, tracer: Tracer | None
) -> dict[str, Any]:
    plan = plan_schedule(opts, rng)
    n = len(plan)
    rec.reset("s", n)
    rec.waiting = None
    due = [0.0] * n
    ids = [0] * n
    pc_minus_unix = time.perf_counter() - time.time()
    enqueue_lag: list[float] = [0.0] * n
    t0 = trio.current_time()
    run_at: dt.datetime | None = None
    for seq, (at, delay) in enumerate(plan):
        await trio.sleep_until(t0 + at)
        if seq == 0 or plan[seq - 1] != (at, delay):  # a new group: a new run_at
            run_at = dt.datetime.fromtimestamp(round(time.time() + delay, 6), dt.UTC)
        assert run_at is not None
        due[seq] = run_at.timestamp()
        c0 = time.perf_counter()
        result = await trioq.enqueue(
            conn, "bench_sched.scheduled", {"seq": seq, "due": due[seq]}, queue=QUEUE,
            run_at=run_at,
        )  # fmt: skip
        enqueue_lag[seq] = time.perf_counter() - c0
        ids[seq] = result.job_id
    timeout = opts.max_delay + 30
    while rec.seen < n and await rec.wait(timeout):
        pass
    lateness = [start - run for start, run in zip(rec.values, rec.extra, strict=True)]
    mismatched = sum(
        1 for d, run in zip(due, rec.extra, strict=True) if abs(d - run) > 2e-6
    )  # NaN (not received) compares False
    report: dict[str, Any] = {
        "jobs": n,
        "received": rec.seen,
        "duplicates": rec.duplicates,
        "run_at_mismatches": mismatched,
        "distinct_due_times": len(set(due)),
        "jobs_sharing_a_due_time": sum(c for c in Counter(due).values() if c > 1),
        "lateness_ms": summary(lateness),
        "enqueue_call_ms": summary(enqueue_lag),
    }
    if tracer is not None:
        due_pc = [d + pc_minus_unix for d in due]
        start_pc = [s + pc_minus_unix for s in rec.values]
        report["trace"] = scheduled_breakdown(tracer, ids, due_pc, start_pc)
    return report


async def measure_pickup(
    conn: Conn, rec: Recorder, opts: Options, rng: random.Random, tracer: Tracer | None
) -> dict[str, Any]:
    """Idle worker; one job at a time, committed by an explicit COMMIT (or autocommit)."""
    n = opts.jobs
    rec.reset("p", n)
    sent = [math.nan] * n  # COMMIT sent (or, with --pickup-autocommit, enqueue() called)
    acked = [math.nan] * n  # COMMIT (or enqueue()) returned
    insert = [math.nan] * n  # the INSERT statement, inside the transaction
    ids = [0] * n
    lost = 0
    for seq in range(n):
        await trio.sleep(opts.idle_gap * rng.uniform(0.5, 1.5))
        rec.waiting = seq
        if opts.pickup_autocommit:
            t0 = time.perf_counter()
            result = await trioq.enqueue(conn, "bench_sched.pickup", {"seq": seq}, queue=QUEUE)
        else:
            async with conn.transaction():
                i0 = time.perf_counter()
                result = await trioq.enqueue(conn, "bench_sched.pickup", {"seq": seq}, queue=QUEUE)
                insert[seq] = time.perf_counter() - i0
                t0 = time.perf_counter()  # leaving the block sends COMMIT
        t1 = time.perf_counter()
        sent[seq], acked[seq], ids[seq] = t0, t1, result.job_id
        while math.isnan(rec.values[seq]):
            if not await rec.wait(10.0):
                lost += 1
                break
    rec.waiting = None
    report: dict[str, Any] = {
        "jobs": n,
        "received": rec.seen,
        "lost": lost,
        "mode": "autocommit" if opts.pickup_autocommit else "transaction",
        "sent_to_start_ms": summary([s - t0 for s, t0 in zip(rec.values, sent, strict=True)]),
        "ack_to_start_ms": summary([s - t1 for s, t1 in zip(rec.values, acked, strict=True)]),
        "commit_call_ms": summary([t1 - t0 for t0, t1 in zip(sent, acked, strict=True)]),
        "insert_ms": summary(insert),
    }
    if tracer is not None:
        report["trace"] = pickup_breakdown(tracer, ids, sent, rec.values, rec.extra)
    return report


async def measure_floor(
    dsn: str, opts: Options, rng: random.Random, meter: Meter
) -> dict[str, Any]:
    """What this machine charges for the hops of any LISTEN/NOTIFY pickup, without trioq's runtime.

    Three trioq.pg connections in this process, the same ``--idle-gap`` before each sample:
    ``SELECT 1`` round trips after idleness and back to back; ``NOTIFY`` sent -> the listening
    connection has it; and the chain ``NOTIFY`` sent -> received -> one ``SELECT 1`` on a third
    connection returned: the least a worker that claims with one statement can do.
    """
    n = opts.floor_samples
    channel = "trioq_bench_sched_floor"
    received = [math.nan] * n
    chained = [math.nan] * n
    done = trio.Event()
    async with (
        await trioq.connect(dsn, autocommit=True) as a,
        await trioq.connect(dsn, autocommit=True) as b,
        await trioq.connect(dsn, autocommit=True) as c,
    ):
        for _ in range(20):  # prepared statements, warm caches
            await a.execute("SELECT 1")
            await c.execute("SELECT 1")
        await b.execute(f"LISTEN {channel}")
        chain = False
        await meter.start(a)

        async def listener() -> None:
            nonlocal done
            async for note in b.notifies():
                t = time.perf_counter()
                seq = int(note.payload)
                received[seq] = t
                if chain:
                    await c.execute("SELECT 1")
                    chained[seq] = time.perf_counter()
                done.set()

        idle_rt = [math.nan] * n
        idle_cpu = [math.nan] * n  # this process' CPU time during that round trip
        hot_rt = [math.nan] * n
        notify = [math.nan] * n
        chain_total = [math.nan] * n
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listener)
            for i in range(n):
                await trio.sleep(opts.idle_gap * rng.uniform(0.5, 1.5))
                c0, t0 = time.process_time(), time.perf_counter()
                await a.execute("SELECT 1")
                idle_rt[i], idle_cpu[i] = time.perf_counter() - t0, time.process_time() - c0
            c0, t0 = time.process_time(), time.perf_counter()
            for i in range(n):
                await a.execute("SELECT 1")
                t1 = time.perf_counter()
                hot_rt[i], t0 = t1 - t0, t1
            hot_cpu = (time.process_time() - c0) / n
            for phase in ("notify", "chain"):
                chain = phase == "chain"
                for i in range(n):
                    await trio.sleep(opts.idle_gap * rng.uniform(0.5, 1.5))
                    done = trio.Event()
                    t0 = time.perf_counter()
                    await a.execute(f"NOTIFY {channel}, '{i}'")
                    with trio.move_on_after(5):
                        await done.wait()
                    if chain:
                        chain_total[i] = chained[i] - t0
                    else:
                        notify[i] = received[i] - t0
            nursery.cancel_scope.cancel()
        usage = await meter.stop(a)
    return {
        **usage,
        "samples": n,
        "idle_select1_ms": summary(idle_rt),
        "idle_select1_client_cpu_ms": summary(idle_cpu),
        "hot_select1_ms": summary(hot_rt),
        "hot_select1_client_cpu_ms": hot_cpu * 1000,
        "notify_ms": summary(notify),
        "notify_then_select1_ms": summary(chain_total),
    }


async def run_phase(
    phase: str, dsn: str, opts: Options, rec: Recorder, rng: random.Random
) -> dict[str, Any]:
    if phase == "floor":
        others_before = await wait_quiet(opts.quiet_cores, opts.quiet_wait)
        report = await measure_floor(dsn, opts, rng, Meter(None))
        report["others_cores_before"] = others_before
        return report
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await conn.execute("TRUNCATE trioq.jobs, trioq.dead_jobs")
        await conn.execute("VACUUM ANALYZE trioq.jobs")
        others_before = await wait_quiet(opts.quiet_cores, opts.quiet_wait)
        tracer = Tracer() if opts.trace and not opts.separate_process else None
        measure: Callable[..., Awaitable[dict[str, Any]]] = (
            measure_scheduled if phase == "scheduled" else measure_pickup
        )
        traced = tracer.installed() if tracer is not None else contextlib.nullcontext()
        with prototype(opts.prototype), traced:
            worker = worker_process if opts.separate_process else worker_in_process
            async with worker(dsn, opts, rec) as handle:
                await warm_up(conn, rec, handle if opts.separate_process else None)
                if tracer is not None:
                    tracer.clear()  # forget the warm-up
                meter = Meter(handle.pid if opts.separate_process else None)
                await meter.start(conn)
                report = await measure(conn, rec, opts, rng, tracer)
                report.update(await meter.stop(conn))
                cpu = report["client_user_s"] + report["client_system_s"]
                report["client_cpu_ms_per_job"] = cpu / max(1, report["received"]) * 1000
        report["others_cores_before"] = others_before
        return report


async def bench(opts: Options) -> dict[str, Any]:
    dsn = await create_bench_db(opts.admin_dsn, BENCH_DB)
    rng = random.Random(opts.seed)
    rec = Recorder()
    try:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            env = await environment(conn)
        print_environment(env, opts)
        runs: dict[str, list[dict[str, Any]]] = {phase: [] for phase in opts.phases}
        for i in range(opts.repeat):
            for phase in opts.phases:
                report = await run_phase(phase, dsn, opts, rec, rng)
                runs[phase].append(report)
                print_run(phase, i + 1, report)
        return {"environment": env, "options": vars(opts), "runs": runs}
    finally:
        if not opts.keep_db:
            await drop_bench_db(opts.admin_dsn, BENCH_DB)


# -- output ----------------------------------------------------------------------------------------


def fmt_summary(s: dict[str, float]) -> str:
    if not s.get("n"):
        return "no data"
    return "  ".join(f"{k} {s[k]:7.2f}" for k in ("p50", "p95", "p99", "max")) + (
        f"  (min {s['min']:.2f}, mean {s['mean']:.2f}, n {s['n']})"
    )


def print_environment(env: dict[str, Any], opts: Options) -> None:
    pg = env["postgres"]
    clock = env["clock"]
    print(
        f"PostgreSQL {pg['server_version']} (fsync={pg['fsync']}, synchronous_commit="
        f"{pg['synchronous_commit']}, shared_buffers={pg['shared_buffers']})"
    )
    print(
        f"Python {env['python']}, trio {env['trio']}, psycopg {env['psycopg']} "
        f"({env['psycopg_impl']}, libpq {env['libpq']}), trioq {env['trioq']} at "
        f"{env['trioq_revision']}; "
        f"kernel {env['kernel']}, {env['cores']} x {env['cpu']}"
    )
    print(
        f"DB clock - Python clock: {clock['offset_ms']:+.3f} ms (+-{clock['uncertainty_ms']:.3f}); "
        f"load average at start {env['loadavg_at_start'][0]:.2f}"
    )
    where = "child process (trioq serve)" if opts.separate_process else "this process"
    if opts.prototype:
        where += f", PROTOTYPE {opts.prototype}"
    print(
        f"worker in {where}; {opts.jobs} jobs per phase, concurrency {opts.concurrency}, "
        f"default Config otherwise (poll_interval 2 s)"
    )


def print_run(phase: str, i: int, r: dict[str, Any]) -> None:
    worker = f" + worker {r['worker_process_cores']:.2f}" if r["worker_process_cores"] else ""
    noise = (
        f"cores busy: this process {r['this_process_cores']:.2f}{worker}, its backends "
        f"{r['backends_cores']:.2f}, others {r['others_cores']:.2f} (before: "
        f"{r['others_cores_before']:.2f})"
    )
    if "client_cpu_ms_per_job" in r:
        total = r["client_user_s"] + r["client_system_s"]
        noise += (
            f"\n  client CPU (producer + worker) {r['client_cpu_ms_per_job']:.2f} ms per job, "
            f"{100 * r['client_system_s'] / max(total, 1e-9):.0f} % of it in the kernel"
        )
    if phase == "scheduled":
        print(f"\n[scheduled #{i}] {r['received']}/{r['jobs']} jobs, {r['wall_s']:.1f} s; {noise}")
        print(f"  lateness ms      {fmt_summary(r['lateness_ms'])}")
        print(f"  enqueue call ms  {fmt_summary(r['enqueue_call_ms'])}")
        if r["run_at_mismatches"] or r["duplicates"]:
            print(f"  !! run_at mismatches {r['run_at_mismatches']}, duplicates {r['duplicates']}")
        target = r["lateness_ms"].get("p99", math.inf) <= TARGET_SCHED_P99
        print(f"  target p99 <= {TARGET_SCHED_P99:.0f} ms: {'met' if target else 'MISSED'}")
    elif phase == "pickup":
        print(f"\n[pickup #{i}] {r['received']}/{r['jobs']} jobs, {r['wall_s']:.1f} s; {noise}")
        if r["mode"] == "transaction":
            print(f"  COMMIT sent->start ms  {fmt_summary(r['sent_to_start_ms'])}")
            print(f"  COMMIT done->start ms  {fmt_summary(r['ack_to_start_ms'])}")
            print(f"  COMMIT call ms         {fmt_summary(r['commit_call_ms'])}")
            print(f"  INSERT (in tx) ms      {fmt_summary(r['insert_ms'])}")
        else:
            print(f"  enqueue() call->start ms  {fmt_summary(r['sent_to_start_ms'])}")
            print(f"  enqueue() done->start ms  {fmt_summary(r['ack_to_start_ms'])}")
            print(f"  enqueue() call ms         {fmt_summary(r['commit_call_ms'])}")
        s = r["sent_to_start_ms"]
        met = s.get("p50", math.inf) <= TARGET_PICKUP_P50 and s.get("p99", math.inf) <= (
            TARGET_PICKUP_P99
        )
        print(
            f"  target p50 <= {TARGET_PICKUP_P50} ms, p99 <= {TARGET_PICKUP_P99:.0f} ms: "
            f"{'met' if met else 'MISSED'}"
        )
    else:
        print(f"\n[floor #{i}] {r['samples']} samples each, {r['wall_s']:.1f} s; {noise}")
        print(f"  SELECT 1 after idle ms   {fmt_summary(r['idle_select1_ms'])}")
        print(f"  its client CPU ms        {fmt_summary(r['idle_select1_client_cpu_ms'])}")
        print(f"  SELECT 1 back to back ms {fmt_summary(r['hot_select1_ms'])}")
        print(f"  its client CPU ms        {r['hot_select1_client_cpu_ms']:.3f} (mean)")
        print(f"  NOTIFY -> received ms    {fmt_summary(r['notify_ms'])}")
        print(f"  NOTIFY -> SELECT 1 ms    {fmt_summary(r['notify_then_select1_ms'])}")
    trace = r.get("trace")
    if trace:
        print(
            f"  trace: {trace['scheduler_passes']} scheduler passes, {trace['claims']} claims "
            f"({trace['empty_claims']} empty), {trace['wakes']} wake-ups"
            + (f", {trace['unattributed']} jobs unattributed" if trace.get("unattributed") else "")
        )
        for stage, s in trace["stages_ms"].items():
            print(f"    {stage:<17} {fmt_summary(s)}")
        print(
            "    gc pauses: "
            + ", ".join(
                f"{g} {v['count']} (max {v['max_ms']:.2f} ms, total {v['total_ms']:.1f} ms)"
                for g, v in trace["gc"].items()
            )
        )
        for w in trace.get("worst_ms", []):
            print("    worst: " + ", ".join(f"{k} {v:.2f}" for k, v in w.items()))


def print_medians(report: dict[str, Any]) -> None:
    runs = report["runs"]
    if report["options"]["repeat"] < 2:
        return
    print("\nmedian over runs (ms):")
    keys = {
        "scheduled": ["lateness_ms"],
        "pickup": ["sent_to_start_ms", "ack_to_start_ms"],
        "floor": ["idle_select1_ms", "notify_ms", "notify_then_select1_ms"],
    }
    for phase, items in runs.items():
        for key in keys[phase]:
            cells = []
            for p in ("p50", "p95", "p99", "max"):
                median = median_or_none(r[key][p] for r in items if r[key].get("n"))
                cells.append(f"{p} -" if median is None else f"{p} {median:7.2f}")
            print(f"  {phase:<9} {key:<22} " + "  ".join(cells))


# -- command line ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> Options:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_options(
        p, creates=f"the database {BENCH_DB}", repeat=1, quiet_cores=0.5, quiet_wait=20.0,
        pgbench=False,
    )  # fmt: skip
    p.add_argument("--jobs", type=int, default=1000, help="jobs per phase (default 1000)")
    p.add_argument("--rate", type=float, default=100.0, help="scheduled enqueues/s (default 100)")
    p.add_argument("--min-delay", type=float, default=0.2, help="seconds (default 0.2)")
    p.add_argument("--max-delay", type=float, default=2.0, help="seconds (default 2.0)")
    p.add_argument(
        "--burst-share",
        type=float,
        default=0.15,
        help="share of enqueues that are bursts sharing a run_at (default 0.15)",
    )
    p.add_argument("--burst-max", type=int, default=8, help="largest burst (default 8)")
    p.add_argument(
        "--idle-gap",
        type=float,
        default=0.02,
        help="pickup: seconds of idleness before each job (default 0.02, +-50%%)",
    )
    p.add_argument(
        "--pickup-autocommit",
        action="store_true",
        help="pickup: enqueue in autocommit and time from the enqueue() call (default: an "
        "explicit transaction, timed from sending its COMMIT)",
    )
    p.add_argument(
        "--floor-samples", type=int, default=300, help="samples per floor measurement (300)"
    )
    p.add_argument("--concurrency", type=int, default=10, help="slots (default 10)")
    p.add_argument(
        "--phases",
        default="scheduled,pickup,floor",
        help="comma-separated: scheduled, pickup, floor (default all three)",
    )
    p.add_argument(
        "--separate-process",
        action="store_true",
        help="run the worker as `trioq serve` in a child process",
    )
    p.add_argument("--trace", action="store_true", help="per-stage breakdown (in-process only)")
    p.add_argument(
        "--prototype",
        choices=PROTOTYPES,
        help="run the in-process worker with this runtime change (monkeypatched; see the doc)",
    )
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument("--keep-db", action="store_true", help=f"do not drop {BENCH_DB} at the end")
    a = p.parse_args(argv)
    phases = tuple(x.strip() for x in a.phases.split(",") if x.strip())
    if not phases or any(x not in ("scheduled", "pickup", "floor") for x in phases):
        p.error("--phases takes scheduled, pickup and/or floor")
    if not 0 < a.min_delay <= a.max_delay:
        p.error("need 0 < --min-delay <= --max-delay")
    if a.trace and a.separate_process:
        p.error("--trace patches the runtime in this process: not with --separate-process")
    if a.prototype and a.separate_process:
        p.error("--prototype patches the runtime in this process: not with --separate-process")
    return Options(
        admin_dsn=a.dsn, jobs=a.jobs, rate=a.rate, min_delay=a.min_delay, max_delay=a.max_delay,
        burst_share=a.burst_share, burst_max=max(2, a.burst_max), idle_gap=a.idle_gap,
        pickup_autocommit=a.pickup_autocommit, floor_samples=a.floor_samples,
        concurrency=a.concurrency, repeat=a.repeat, phases=phases,
        separate_process=a.separate_process, trace=a.trace, prototype=a.prototype, seed=a.seed,
        quiet_cores=a.quiet_cores, quiet_wait=a.quiet_wait, json_path=a.json,
        keep_db=a.keep_db,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    report = trio.run(bench, opts)
    print_medians(report)
    if opts.json_path:
        write_json(opts.json_path, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
