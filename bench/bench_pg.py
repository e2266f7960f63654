"""Round-trip benchmark of trioq.pg against psycopg's own drivers (not a test).

Measures, against the same server in the same run, round trips per second and
client CPU microseconds per round trip for::

    SELECT 1
    UPDATE trioq_bench_pg SET n = n + 1 WHERE id = $1 RETURNING n

with three drivers, each doing sequential round trips on one connection:

* ``trioq``   -- ``trioq.connect()`` (a `trioq.pg.TrioConnection`) under ``trio.run``
* ``asyncio`` -- ``psycopg.AsyncConnection`` under ``asyncio.run``
* ``sync``    -- ``psycopg.Connection``

All drivers use the same settings: ``autocommit=True``, psycopg's default
``prepare_threshold`` (statements are prepared after 5 executions), one cursor
reused for the whole loop, ``fetchone()`` after every ``execute()``.

Every measurement (driver x query x transport x repetition) runs in a fresh
subprocess (``bench_pg.py --worker DRIVER ...``), so imports and CPU accounting
never mix and the trio worker never has an asyncio loop. A worker connects,
warms up, then times N round trips: wall time with ``time.perf_counter`` and
client CPU (user + system of the worker process) with ``time.process_time``.
N is calibrated per driver so one measurement takes about ``--seconds``.
Drivers are interleaved, in a rotating order, within every repetition so that
they share the machine's noise.

CPU placement (``--pin``, default ``same``): the worker pins itself and its
own server backend to one CPU, because on a small VM cross-CPU wake-ups make
unpinned rates bimodal from run to run (see `pin`). ``--pin none`` measures
the unpinned case, ``--pin split`` client and backend on different CPUs. Each
measurement also records how busy the rest of the machine was; one where other
processes kept more than ``--max-noise`` cores busy is re-run.

Transports: TCP and unix socket. Give one or more DSNs (``--dsn``, repeatable
or comma-separated, or the environment variable ``TRIOQ_DSN``); if they cover
only one transport, the other is discovered from the server
(``unix_socket_directories`` / ``listen_addresses``) when it is local and
reachable. Use ``--no-discover`` to measure exactly the DSNs given.

The table ``trioq_bench_pg`` is created at the start and dropped at the end.

Usage::

    python bench/bench_pg.py --dsn postgresql://postgres@127.0.0.1:55432/postgres
    python bench/bench_pg.py --dsn '...' --repeat 5 --seconds 3 --json bench.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

TABLE = "trioq_bench_pg"
DRIVERS = ("trioq", "asyncio", "sync")
DRIVER_LABELS = {
    "trioq": "trioq.pg (trio)",
    "asyncio": "psycopg async (asyncio)",
    "sync": "psycopg sync",
}
QUERIES = {
    "select1": "SELECT 1",
    "update": f"UPDATE {TABLE} SET n = n + 1 WHERE id = %s RETURNING n",
}
QUERY_LABELS = {"select1": "SELECT 1", "update": "UPDATE .. RETURNING"}
TARGET_RATIO = 0.85
CALIBRATE_SECONDS = 0.5
LOOPBACK = {"127.0.0.1", "::1", "localhost"}

# ---------------------------------------------------------------------------
# Worker side: one driver, one query, one connection, one measurement.
# ---------------------------------------------------------------------------

Params = tuple[int, ...] | None


def _params(query: str, rows: int) -> list[Params]:
    if query == "select1":
        return [None]
    return [(i,) for i in range(1, rows + 1)]


def _check_row(query: str, row: Any) -> None:
    if row is None or (query == "select1" and row != (1,)):
        raise RuntimeError(f"unexpected result for {query}: {row!r}")


@dataclass
class Timing:
    """What one worker measured over its timed loop."""

    count: int
    wall: float  # seconds
    cpu: float  # client process CPU seconds (user + system)
    server_cpu: float | None  # CPU seconds of the server backend, if its /proc is readable
    others: float | None  # cores busy with anything else (other processes, steal), on average
    pinned: str  # CPU placement actually used: "same", "split" or "none"


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine_busy() -> float | None:
    """CPU seconds the whole machine spent not idle since boot (Linux only)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    # guest time is already counted in user/nice
    return (sum(fields[:8]) - idle) / _TICK


def _process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) of process ``pid`` (Linux only)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


class Clock:
    """Wall, client CPU, server backend CPU and machine CPU around the timed loop.

    ``others`` (the machine's busy time minus client and backend, per second)
    says how noisy the measurement was: on a 2-core box, anything else running
    competes with the client/backend ping-pong.
    """

    def __init__(self, backend_pid: int, pinned: str) -> None:
        self.backend_pid = backend_pid
        self.pinned = pinned
        self.machine = _machine_busy()
        self.server = _process_cpu(backend_pid)
        self.wall = time.perf_counter()
        self.cpu = time.process_time()

    def stop(self, count: int) -> Timing:
        cpu = time.process_time() - self.cpu
        wall = time.perf_counter() - self.wall
        server_end = _process_cpu(self.backend_pid)
        machine_end = _machine_busy()
        server = None
        if server_end is not None and self.server is not None:
            server = server_end - self.server
        others = None
        if machine_end is not None and self.machine is not None and server is not None:
            others = max(0.0, (machine_end - self.machine - cpu - server) / wall)
        return Timing(count, wall, cpu, server, others, self.pinned)


def _is_backend_of(pid: int, sock_fd: int) -> bool:
    """Whether local process ``pid`` is the server backend at the other end of ``sock_fd``.

    The backend pid comes from the server, which may be remote or in another
    pid namespace: check the process title ("postgres: user db host(port) ...")
    names our socket before touching the process.
    """
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            title = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    if not title.startswith("postgres:"):
        return False
    with socket.socket(fileno=os.dup(sock_fd)) as sock:
        if sock.family == socket.AF_UNIX:
            return " [local] " in title
        return f"({sock.getsockname()[1]}) " in title


def pin(mode: str, sock_fd: int, backend_pid: int) -> str:
    """Pin this process and its server backend to CPUs; return the placement achieved.

    On a small VM the kernel moves the client and the backend between CPUs
    from run to run, and a cross-CPU wake-up costs more than a round trip's
    whole client CPU: unpinned rates are bimodal (measured 4k-13k rt/s for the
    same sync loop). ``same`` puts both on one CPU, so a round trip costs client
    CPU + server CPU and the comparison between drivers is stable; ``split``
    forces the cross-CPU case. Only the affinity of this connection's own
    backend changes, and it ends with the connection. A backend that is not
    a local process (remote server) is left alone and "none" returned.
    """
    if mode == "none" or not hasattr(os, "sched_setaffinity"):
        return "none"
    if not _is_backend_of(backend_pid, sock_fd):
        return "none"
    cpus = sorted(os.sched_getaffinity(0))
    if mode == "split" and len(cpus) < 2:
        return "none"
    client_cpu, backend_cpu = (cpus[-1], cpus[-1]) if mode == "same" else (cpus[0], cpus[-1])
    try:
        os.sched_setaffinity(backend_pid, {backend_cpu})
    except OSError:  # not allowed
        return "none"
    os.sched_setaffinity(0, {client_cpu})
    return mode


@dataclass
class Spec:
    """What one worker measures."""

    dsn: str
    query: str
    rows: int
    warmup: int
    iterations: int  # timed round trips; ignored when calibrating
    calibrate: float  # if > 0: run for this many seconds instead, to size ``iterations``
    pin: str  # "same", "split" or "none": see `pin`

    def chunks(self) -> tuple[int, float]:
        """(round trips per timed chunk, minimum seconds)."""
        if self.calibrate > 0:
            return 200, self.calibrate
        return self.iterations, 0.0


def run_sync(spec: Spec) -> Timing:
    query = spec.query
    sql = QUERIES[query]
    params = _params(query, spec.rows)
    nparams = len(params)
    with psycopg.Connection.connect(spec.dsn, autocommit=True) as conn:
        pinned = pin(spec.pin, conn.pgconn.socket, conn.info.backend_pid)
        cur = conn.cursor()

        def loop(n: int) -> None:
            for i in range(n):
                cur.execute(sql, params[i % nparams])
                cur.fetchone()

        for i in range(spec.warmup):
            cur.execute(sql, params[i % nparams])
            _check_row(query, cur.fetchone())
        chunk, min_seconds = spec.chunks()
        clock = Clock(conn.info.backend_pid, pinned)
        count = 0
        while True:
            loop(chunk)
            count += chunk
            if time.perf_counter() - clock.wall >= min_seconds:
                return clock.stop(count)


async def _async_body(conn: Any, spec: Spec) -> Timing:
    """The timed loop shared by the trio and asyncio workers (identical code)."""
    query = spec.query
    sql = QUERIES[query]
    params = _params(query, spec.rows)
    nparams = len(params)
    pinned = pin(spec.pin, conn.pgconn.socket, conn.info.backend_pid)
    cur = conn.cursor()

    async def loop(n: int) -> None:
        for i in range(n):
            await cur.execute(sql, params[i % nparams])
            await cur.fetchone()

    for i in range(spec.warmup):
        await cur.execute(sql, params[i % nparams])
        _check_row(query, await cur.fetchone())
    chunk, min_seconds = spec.chunks()
    clock = Clock(conn.info.backend_pid, pinned)
    count = 0
    while True:
        await loop(chunk)
        count += chunk
        if time.perf_counter() - clock.wall >= min_seconds:
            return clock.stop(count)


def run_asyncio(spec: Spec) -> Timing:
    async def main() -> Timing:
        async with await psycopg.AsyncConnection.connect(spec.dsn, autocommit=True) as conn:
            return await _async_body(conn, spec)

    return asyncio.run(main())


def run_trioq(spec: Spec) -> Timing:
    import trio

    import trioq

    def no_asyncio_loop() -> None:
        # An explicit check rather than ``assert``, so it holds under ``python -O`` too.
        if asyncio._get_running_loop() is not None:
            raise RuntimeError("an asyncio loop is running in the trio worker")

    async def main() -> Timing:
        no_asyncio_loop()
        async with await trioq.connect(spec.dsn, autocommit=True) as conn:
            if not isinstance(conn, trioq.pg.TrioConnection):
                raise TypeError(f"trioq.connect() returned {type(conn)!r}")
            timing = await _async_body(conn, spec)
            no_asyncio_loop()
        return timing

    return trio.run(main)


RUNNERS: dict[str, Callable[[Spec], Timing]] = {
    "trioq": run_trioq,
    "asyncio": run_asyncio,
    "sync": run_sync,
}


def worker_main(args: argparse.Namespace) -> int:
    spec = Spec(
        args.dsn[0],
        args.query,
        args.rows,
        args.warmup,
        args.iterations,
        args.calibrate,
        args.pin,
    )
    timing = RUNNERS[args.worker](spec)
    print(json.dumps(asdict(timing)), flush=True)
    return 0


# ---------------------------------------------------------------------------
# Parent side: targets, table, calibration, interleaved repetitions, report.
# ---------------------------------------------------------------------------


@dataclass
class Target:
    """One way to reach the server."""

    transport: str  # "tcp" or "unix"
    dsn: str
    server: str  # identity of the postmaster, to check all targets hit one server


@dataclass
class Result:
    driver: str
    query: str
    transport: str
    iterations: int
    rates: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    server_cpu_us: list[float | None] = field(default_factory=list)
    others: list[float | None] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    pinned: list[str] = field(default_factory=list)

    def add(self, t: Timing, attempts: int) -> None:
        self.pinned.append(t.pinned)
        self.rates.append(t.count / t.wall)
        self.cpu_us.append(t.cpu / t.count * 1e6)
        self.server_cpu_us.append(None if t.server_cpu is None else t.server_cpu / t.count * 1e6)
        self.others.append(t.others)
        self.attempts.append(attempts)

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu_us)


_DSN_SPLIT = re.compile(r",(?=\s*(?:postgres(?:ql)?://|\w+\s*=))")


def split_dsns(values: Sequence[str]) -> list[str]:
    """Split comma-separated DSNs; a comma inside one (multi-host) is left alone."""
    out: list[str] = []
    for value in values:
        out.extend(part.strip() for part in _DSN_SPLIT.split(value) if part.strip())
    return out


def safe_dsn(dsn: str) -> str:
    """``dsn`` without its password, for printing."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "<unparseable DSN>"
    params.pop("password", None)
    return make_conninfo("", **params)


def safe_argv(argv: Sequence[str]) -> list[str]:
    """The command line with passwords removed from ``--dsn`` values."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if i > 0 and argv[i - 1] == "--dsn":
            out.append(",".join(safe_dsn(d) for d in split_dsns([arg])))
        elif arg.startswith("--dsn="):
            out.append("--dsn=" + ",".join(safe_dsn(d) for d in split_dsns([arg[6:]])))
        else:
            out.append(arg)
    return out


def probe(dsn: str) -> tuple[Target, dict[str, str]]:
    """Connect once: the transport actually used, the server identity and settings."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        host = conn.info.host
        row = conn.execute(
            "SELECT pg_postmaster_start_time()::text, current_setting('port'),"
            " current_setting('server_version'), current_setting('unix_socket_directories'),"
            " current_setting('listen_addresses'), current_setting('fsync'),"
            " current_setting('synchronous_commit')"
        ).fetchone()
    assert row is not None
    started, port, version, sockdirs, listen, fsync, sync_commit = row
    transport = "unix" if host.startswith("/") else "tcp"
    settings = {
        "host": host,
        "port": port,
        "server_version": version,
        "unix_socket_directories": sockdirs,
        "listen_addresses": listen,
        "fsync": fsync,
        "synchronous_commit": sync_commit,
    }
    return Target(transport, dsn, f"{started}:{port}"), settings


def discover(target: Target, settings: dict[str, str]) -> str | None:
    """A DSN for the transport ``target`` does not use, if the server is local."""
    if target.transport == "unix":
        listen = {a.strip() for a in settings["listen_addresses"].split(",")}
        if listen & {"*", "0.0.0.0", "localhost", "127.0.0.1"}:
            return make_conninfo(target.dsn, host="127.0.0.1", port=settings["port"])
        return None
    if settings["host"] not in LOOPBACK:
        return None
    sockdirs = [d.strip() for d in settings["unix_socket_directories"].split(",") if d.strip()]
    for sockdir in sockdirs:
        if sockdir.startswith("/") and os.path.exists(
            os.path.join(sockdir, f".s.PGSQL.{settings['port']}")
        ):
            return make_conninfo(target.dsn, host=sockdir, port=settings["port"])
    return None


def resolve_targets(dsns: list[str], discover_other: bool) -> tuple[list[Target], dict[str, str]]:
    targets: dict[str, Target] = {}
    first_settings: dict[str, str] = {}
    for dsn in dsns:
        target, settings = probe(dsn)
        first_settings = first_settings or settings
        if target.transport in targets:
            print(f"note: more than one {target.transport} DSN; using the first", file=sys.stderr)
            continue
        targets[target.transport] = target
        if discover_other and len(dsns) == 1:
            other = discover(target, settings)
            if other is not None:
                try:
                    found, _ = probe(other)
                except psycopg.Error as ex:
                    print(f"note: no other transport: {ex}".strip(), file=sys.stderr)
                else:
                    targets.setdefault(found.transport, found)
    servers = {t.server for t in targets.values()}
    if len(servers) > 1:
        raise SystemExit(f"DSNs reach different servers: {sorted(servers)}")
    order = {"tcp": 0, "unix": 1}
    return sorted(targets.values(), key=lambda t: order[t.transport]), first_settings


def setup_table(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(f"CREATE TABLE {TABLE} (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0)")
        conn.execute(f"INSERT INTO {TABLE} (id) SELECT generate_series(1, %s)", (rows,))
        conn.execute(f"ANALYZE {TABLE}")


def drop_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")


def run_worker(
    driver: str,
    dsn: str,
    query: str,
    args: argparse.Namespace,
    *,
    iterations: int = 0,
    calibrate: float = 0.0,
) -> Timing:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        driver,
        "--dsn",
        dsn,
        "--query",
        query,
        "--rows",
        str(args.rows),
        "--warmup",
        str(args.warmup),
        "--iterations",
        str(iterations),
        "--calibrate",
        str(calibrate),
        "--pin",
        args.pin,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"worker {driver}/{query} failed with exit code {proc.returncode}")
    lines = proc.stdout.strip().splitlines()
    return Timing(**json.loads(lines[-1]))


def run_quiet(
    driver: str,
    dsn: str,
    query: str,
    args: argparse.Namespace,
    *,
    iterations: int = 0,
    calibrate: float = 0.0,
) -> tuple[Timing, int]:
    """`run_worker`, re-run while other load exceeded ``--max-noise``; the quietest wins."""
    best: Timing | None = None
    for attempt in range(1, args.retries + 2):
        t = run_worker(driver, dsn, query, args, iterations=iterations, calibrate=calibrate)
        if best is None or (t.others or 0.0) < (best.others or 0.0):
            best = t
        if t.others is None or t.others <= args.max_noise:
            return t, attempt
        if not args.quiet:
            print(
                f"  ({driver} {query}: {t.others:.2f} cores busy elsewhere, re-running)",
                file=sys.stderr,
                flush=True,
            )
    assert best is not None
    return best, args.retries + 1


def calibrate(targets: list[Target], args: argparse.Namespace) -> dict[tuple[str, str, str], int]:
    """Iterations per (driver, query, transport) so one measurement lasts ~``--seconds``."""
    sizes: dict[tuple[str, str, str], int] = {}
    for target in targets:
        for query in args.queries:
            for driver in args.drivers:
                key = (driver, query, target.transport)
                if args.iterations:
                    sizes[key] = args.iterations
                    continue
                t, _ = run_quiet(driver, target.dsn, query, args, calibrate=CALIBRATE_SECONDS)
                rate = t.count / t.wall
                sizes[key] = max(1000, math.ceil(rate * args.seconds / 1000.0) * 1000)
    return sizes


def measure(
    targets: list[Target], sizes: dict[tuple[str, str, str], int], args: argparse.Namespace
) -> list[Result]:
    results = {key: Result(*key, iterations=n) for key, n in sizes.items()}
    drivers = list(args.drivers)
    for rep in range(args.repeat):
        shift = rep % len(drivers)
        order = drivers[shift:] + drivers[:shift]
        for target in targets:
            for query in args.queries:
                for driver in order:
                    key = (driver, query, target.transport)
                    t, attempts = run_quiet(driver, target.dsn, query, args, iterations=sizes[key])
                    results[key].add(t, attempts)
                    if not args.quiet:
                        others = "?" if t.others is None else f"{t.others:.2f}"
                        print(
                            f"  rep {rep + 1}/{args.repeat} {target.transport:4} {query:7}"
                            f" {driver:7} {t.count:7d} rt in {t.wall:5.2f} s:"
                            f" {t.count / t.wall:8.0f} rt/s {t.cpu / t.count * 1e6:6.1f} us CPU/rt"
                            f" (others {others} cores)",
                            file=sys.stderr,
                            flush=True,
                        )
    return list(results.values())


def ratio(results: list[Result], res: Result) -> float | None:
    for other in results:
        if (other.driver, other.query, other.transport) == ("asyncio", res.query, res.transport):
            return res.median / other.median
    return None


def render(results: list[Result], targets: list[Target]) -> str:
    # Parent side only, like every use of _common here: it imports trio, which the asyncio
    # and sync workers must not.
    from _common import Table

    table = Table(
        (
            ("driver", 24, "<"),
            ("query", 19, "<"),
            ("transport", 9, "<"),
            ("rt/s median", 11, ">"),
            ("min-max", 13, ">"),
            ("CPU us/rt", 9, ">"),
            ("vs asyncio", 10, ">"),
        ),
        markdown=True,
    )
    order = {d: i for i, d in enumerate(DRIVERS)}
    tidx = {t.transport: i for i, t in enumerate(targets)}
    qidx = {q: i for i, q in enumerate(QUERIES)}
    rows = []
    for res in sorted(results, key=lambda r: (tidx[r.transport], qidx[r.query], order[r.driver])):
        r = ratio(results, res)
        mark = ""
        if res.driver == "trioq" and r is not None:
            mark = " ok" if r >= TARGET_RATIO else " MISS"
        rows.append(
            (
                DRIVER_LABELS[res.driver],
                QUERY_LABELS[res.query],
                res.transport,
                f"{res.median:.0f}",
                f"{min(res.rates):.0f}-{max(res.rates):.0f}",
                f"{res.cpu_median:.1f}",
                (f"{r:.2f}" if r is not None else "-") + mark,
            )
        )
    return table.render(rows)


def environment(settings: dict[str, str]) -> dict[str, Any]:
    from _common import client_versions, cpu_model

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=os.path.dirname(os.path.abspath(__file__)),
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "trioq_commit": commit,
        **client_versions(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "server_version": settings.get("server_version", ""),
        "server_fsync": settings.get("fsync", ""),
        "server_synchronous_commit": settings.get("synchronous_commit", ""),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--dsn",
        action="append",
        default=[],
        help="libpq DSN (repeatable or comma-separated); default $TRIOQ_DSN",
    )
    p.add_argument(
        "--no-discover",
        action="store_true",
        help="do not add the other transport (tcp/unix) of the same server",
    )
    p.add_argument(
        "--drivers",
        default=",".join(DRIVERS),
        help=f"comma-separated subset of {','.join(DRIVERS)}",
    )
    p.add_argument(
        "--queries",
        default=",".join(QUERIES),
        help=f"comma-separated subset of {','.join(QUERIES)}",
    )
    p.add_argument("--repeat", type=int, default=3, help="repetitions per measurement")
    p.add_argument(
        "--seconds",
        type=float,
        default=2.5,
        help="target duration of one measurement (sizes N by calibration)",
    )
    p.add_argument(
        "--iterations",
        type=int,
        default=0,
        help="fixed round trips per measurement (skips calibration)",
    )
    p.add_argument("--warmup", type=int, default=1000, help="untimed round trips first")
    p.add_argument("--rows", type=int, default=10, help="rows in the UPDATE table")
    p.add_argument(
        "--max-noise",
        type=float,
        default=0.25,
        help="re-run a measurement if other processes kept more cores than this busy",
    )
    p.add_argument("--retries", type=int, default=3, help="re-runs allowed per measurement")
    p.add_argument(
        "--pin",
        choices=("same", "split", "none"),
        default="same",
        help="CPU placement of client and server backend (default: both on one CPU)",
    )
    p.add_argument("--json", metavar="FILE", help="also write results as JSON")
    p.add_argument("--quiet", action="store_true", help="no per-measurement progress")
    p.add_argument("--worker", choices=DRIVERS, help=argparse.SUPPRESS)
    p.add_argument("--query", choices=list(QUERIES), help=argparse.SUPPRESS)
    p.add_argument("--calibrate", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.drivers = [d for d in args.drivers.split(",") if d]
    args.queries = [q for q in args.queries.split(",") if q]
    for name, values, allowed in (
        ("driver", args.drivers, DRIVERS),
        ("query", args.queries, tuple(QUERIES)),
    ):
        bad = [v for v in values if v not in allowed]
        if bad:
            p.error(f"unknown {name}: {', '.join(bad)}")
    if not args.dsn and os.environ.get("TRIOQ_DSN"):
        args.dsn = [os.environ["TRIOQ_DSN"]]
    if not args.dsn:
        p.error("give --dsn or set TRIOQ_DSN")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    targets, settings = resolve_targets(split_dsns(args.dsn), not args.no_discover)
    env = environment(settings)
    print(
        f"Python {env['python']}, trio {env['trio']}, psycopg {env['psycopg']}"
        f" ({env['psycopg_impl']}, libpq {env['libpq']}), PostgreSQL {env['server_version']};"
        f" {env['cpus']} CPUs ({env['cpu_model']}); trioq {env['trioq_commit'] or '?'}",
        flush=True,
    )
    for t in targets:
        print(f"{t.transport}: {safe_dsn(t.dsn)}", flush=True)
    setup_table(targets[0].dsn, args.rows)
    try:
        sizes = calibrate(targets, args)
        results = measure(targets, sizes, args)
    finally:
        drop_table(targets[0].dsn)
    print()
    print(render(results, targets))
    placements = sorted({p for r in results for p in r.pinned})
    print(f"\nCPU placement of client and backend: {', '.join(placements)} (--pin {args.pin})")
    noise = [x for r in results for x in r.others if x is not None]
    if noise:
        reran = sum(a - 1 for r in results for a in r.attempts)
        print(
            f"other load during measurements: median {statistics.median(noise):.2f},"
            f" max {max(noise):.2f} cores; {reran} measurement(s) re-run for noise"
        )
    trioq = [r for r in results if r.driver == "trioq"]
    ratios = [x for x in (ratio(results, r) for r in trioq) if x is not None]
    if ratios:
        worst = min(ratios)
        verdict = "meets" if worst >= TARGET_RATIO else "MISSES"
        print(
            f"\ntrioq.pg / asyncio psycopg: worst {worst:.2f}, {verdict} the"
            f" {TARGET_RATIO:.2f} target"
        )
    if args.json:
        from _common import write_json

        payload = {
            "environment": env,
            "command": safe_argv(sys.argv),
            "targets": [{"transport": t.transport, "dsn": safe_dsn(t.dsn)} for t in targets],
            "settings": {
                k: getattr(args, k)
                for k in ("repeat", "seconds", "warmup", "rows", "max_noise", "retries", "pin")
            },
            "results": [
                {
                    **asdict(r),
                    "median": r.median,
                    "cpu_us_median": r.cpu_median,
                    "ratio_vs_asyncio": ratio(results, r),
                }
                for r in results
            ],
        }
        write_json(Path(args.json), payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
