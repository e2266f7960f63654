"""Throughput of the queue API against Postgres, and against pgbench as the ceiling (not a test).

Three measurements, each in the database ``trioq_bench`` that the script creates (dropping a
leftover one first) and drops at the end:

a. Enqueue: ``--enqueue-jobs`` jobs in batches of 1,000 and 10,000, one transaction per batch,
   by each path of ``--enqueue-paths``: ``Queue.enqueue_bulk`` (one task, a list of args),
   ``Queue.enqueue_many`` of `JobSpec` objects differing only in args (the same statement),
   with mixed priorities (COPY), and with dedup keys (unnest). Reported twice: with the inputs
   built beforehand (the calls alone) and end to end (building the args list or the specs is
   part of the caller's cost). In the same repetitions, the ceiling: pgbench running a
   prepared 100-row ``INSERT INTO trioq.jobs`` with 1 and 2 clients. Repetitions interleave
   all of these; the table shows median, worst and best.
b. ``Queue.claim`` + ``Queue.complete_many`` alone (no worker runtime): ``--drain-jobs`` jobs
   drained with batch sizes 1, 10 and 100 (claim ``limit=N``, then complete those N, each
   statement its own autocommit transaction) by 1 and by 4 trio tasks, each on its own
   connection, all in this one process.
c. The ceiling: pgbench running the same two statements (rendered from `trioq._db.statements`, the
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

``--profile`` adds (d): where the enqueue time goes: ``enqueue_many``'s COPY path step by step
(a mixed batch), the server's raw COPY rate for prebuilt rows (the ceiling for COPY),
``enqueue_bulk`` step by step, and a cProfile of ``enqueue_bulk`` and ``enqueue_many``; and drain
prototypes: the other lease-index predicate and a claim whose generic plan is safe, applied to
the bench database only. Results are discussed in docs/queue-performance.md.

The COPY rows of the stage breakdown are built for whatever column list trioq's COPY statement
has (`copy_row_fn`), so the script follows schema changes such as the ``state`` column.

Usage::

    python bench/bench_queue.py                       # TRIOQ_DSN or the local test server
    python bench/bench_queue.py --dsn postgresql://postgres@127.0.0.1:55432/postgres \\
        --repeat 3 --profile --json bench_queue.json
    python bench/bench_queue.py --skip drain --enqueue-paths bulk,many --repeat 7
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as dt
import functools
import io
import os
import platform
import pstats
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio
from _common import (
    Table,
    add_common_options,
    children_cpu,
    client_versions,
    create_bench_db,
    drop_bench_db,
    find_pgbench,
    fmt,
    int_list,
    machine_busy,
    median_or_none,
    medians,
    patched,
    pgbench_drain_command,
    pgbench_drain_script,
    pgbench_tps,
    pgbench_version,
    process_cpu,
    scalar,
    show_settings,
    wait_quiet,
    write_json,
)
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

import trioq
import trioq._job as trioq_job
from trioq import JobSpec, Lease, Queue
from trioq._db import insert
from trioq._db.statements import Statements, statements
from trioq._job import check_payload, encode_args_runs

BENCH_DB = "trioq_bench"
QUEUE_NAME = "bench"
LEASE = dt.timedelta(seconds=30)
TARGET_ENQUEUE = 90_000  # jobs/s, the no-dedup path
SQL = statements("trioq")

Conn = Any  # trioq.TrioConnection


# -- machine noise ------------------------------------------------------------------------------


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


SERVER_SETTINGS = ("server_version", "fsync", "synchronous_commit", "full_page_writes",
                   "shared_buffers", "wal_level", "max_wal_size")  # fmt: skip


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
    return int(await scalar(conn, "SELECT pg_backend_pid()"))


# -- (a) enqueue_many ---------------------------------------------------------------------------


def bench_args(start: int, stop: int) -> list[dict[str, Any]]:
    return [{"user_id": i, "kind": "welcome"} for i in range(start, stop)]


def build_specs(n: int, *, dedup: bool, tag: str, mixed: bool = False) -> list[JobSpec]:
    """The benchmark's jobs as specs: differing only in args (the bulk statement), with a
    per-job dedup key (``dedup``, the unnest path) or priorities 0/1 (``mixed``, COPY)."""
    if dedup:
        return [
            JobSpec(task="bench.task", args=a, queue=QUEUE_NAME, dedup_key=f"{tag}-{i}")
            for i, a in enumerate(bench_args(0, n))
        ]
    if mixed:
        return [
            JobSpec(task="bench.task", args=a, queue=QUEUE_NAME, priority=i % 2)
            for i, a in enumerate(bench_args(0, n))
        ]
    return [JobSpec(task="bench.task", args=a, queue=QUEUE_NAME) for a in bench_args(0, n)]


#: The enqueue paths measured: label -> how to build the inputs (timed separately: that is the
#: caller's cost) and how to enqueue one batch of them.
ENQUEUE_PATHS: dict[str, tuple[str, str]] = {
    "bulk": ("enqueue_bulk (args only)", "args"),
    "many": ("enqueue_many, jobs differ in args only", "specs"),
    "copy": ("enqueue_many, mixed priorities (COPY)", "mixed"),
    "dedup": ("enqueue_many, dedup keys (unnest)", "dedup"),
}


async def enqueue_run(
    conn: Conn, n: int, batch: int, *, path: str, tag: str, queue: Queue | None = None
) -> dict[str, Any]:
    """One measurement: build n jobs' inputs, then enqueue them ``batch`` per transaction."""
    q = queue or Queue()
    kind = ENQUEUE_PATHS[path][1]
    t0, c0 = time.perf_counter(), time.process_time()
    if kind == "args":
        inputs: Sequence[Any] = bench_args(0, n)
    else:
        inputs = build_specs(n, dedup=kind == "dedup", tag=tag, mixed=kind == "mixed")
    build, build_cpu = time.perf_counter() - t0, time.process_time() - c0
    meter = Meter(server_pids=[await backend_pid(conn)])
    for i in range(0, n, batch):
        chunk = inputs[i : i + batch]
        async with conn.transaction():
            if kind == "args":
                results: Sequence[Any] = await q.enqueue_bulk(
                    conn, "bench.task", chunk, queue=QUEUE_NAME
                )
            else:
                results = await q.enqueue_many(conn, chunk)
        assert len(results) == len(chunk)
    m = meter.stop()
    assert await remaining(conn) == n
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


def pgbench_insert_script(rows: int) -> str:
    """One multi-row INSERT of the benchmark's jobs into trioq.jobs (ids from the identity)."""
    values = ",\n".join(
        f"('{QUEUE_NAME}', 'bench.task', '{{\"user_id\":{i},\"kind\":\"welcome\"}}')"
        for i in range(rows)
    )
    return f"INSERT INTO trioq.jobs (queue, task, args) VALUES\n{values};\n"


async def pgbench_insert(
    pgbench: str, dsn: str, script: Path, *, jobs: int, rows: int, clients: int
) -> dict[str, Any]:
    """pgbench running `pgbench_insert_script` (autocommit, prepared): the server's ceiling
    for inserting these rows with SQL, without any client-side work per job."""
    per_client = max(1, jobs // (rows * clients))
    cmd = [pgbench, "-n", "-M", "prepared", "-f", str(script), "-c", str(clients),
           "-j", str(clients), "-t", str(per_client), dsn]  # fmt: skip
    meter = Meter(child=True)
    proc = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, check=False)
    m = meter.stop()
    return {
        **m,
        "enqueue_jobs_s": pgbench_tps(proc) * rows,
        "jobs": per_client * clients * rows,
        "command": shlex.join([*cmd[:-1], "<dsn>"]),
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


async def pgbench_drain(
    pgbench: str, dsn: str, script: Path, *, jobs: int, batch: int, clients: int
) -> dict[str, Any]:
    per_client = jobs // (batch * clients)
    cmd = pgbench_drain_command(
        pgbench, script, dsn, clients=clients, transactions=per_client, batch=batch,
        queue=QUEUE_NAME,
    )  # fmt: skip
    meter = Meter(child=True)
    proc = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, check=False)
    m = meter.stop()
    tps = pgbench_tps(proc)
    xacts = per_client * clients
    return {
        **m,
        "tps": tps,
        "transactions": xacts,
        "pgbench_elapsed": xacts / tps,
        "command": shlex.join([*cmd[:-1], "<dsn>"]),
    }


async def remaining(conn: Conn) -> int:
    return int(await scalar(conn, "SELECT count(*) FROM trioq.jobs"))


# -- (d) profile of enqueue_many on the COPY path -----------------------------------------------


Stages = dict[str, float]


def _add(stages: Stages, name: str, seconds: float) -> None:
    stages[name] = stages.get(name, 0.0) + seconds


async def stage_breakdown(conn: Conn, n: int, batch: int) -> Stages:
    """enqueue_many's COPY path (batches whose jobs differ in more than args), as in
    trioq/_db/insert.py, timed step by step; seconds for ``n`` jobs.

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
    specs = build_specs(n, dedup=False, tag="", mixed=True)
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
    t = time.perf_counter()
    for spec in chunk:
        check_payload(spec.args_json, task=spec.task, max_bytes=q.max_payload_bytes)
    _add(stages, "check_payload", time.perf_counter() - t)
    t = time.perf_counter()
    keys = [spec.effective_dedup_key() for spec in chunk]
    assert not any(keys)
    _add(stages, "effective_dedup_key", time.perf_counter() - t)
    t = time.perf_counter()
    now, ids = await insert.reserve_ids(conn, q.sql, len(chunk))
    _add(stages, "reserve_ids (round trip)", time.perf_counter() - t)
    t = time.perf_counter()
    run_ats = [spec.run_at or now + spec.delay for spec in chunk]
    _add(stages, "run_ats", time.perf_counter() - t)
    t = time.perf_counter()
    row, stamps = copy_row_fn(), {now: now.isoformat()}
    text = "".join(
        row(job_id, s, run_at, now, stamps[run_at], s.args_json)
        for job_id, s, run_at in zip(ids, chunk, run_ats, strict=True)
    ).encode()
    build = time.perf_counter() - t
    assert text
    _add(stages, "_copy: build the COPY text (replica)", build)
    t = time.perf_counter()
    await insert._copy(conn, q.sql, chunk, ids=ids, run_ats=run_ats, now=now, trace=None)
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


async def bulk_breakdown(conn: Conn, n: int, batch: int) -> Stages:
    """enqueue_bulk's steps (as in trioq/_db/insert.py) timed one by one; seconds for ``n`` jobs."""
    q, spec = Queue(), JobSpec(task="bench.task", queue=QUEUE_NAME)
    stages: Stages = {}
    t_all = time.perf_counter()
    for i in range(0, n, batch):
        t = time.perf_counter()
        args = bench_args(i, min(i + batch, n))
        _add(stages, "the caller builds its args (dicts)", time.perf_counter() - t)
        t = time.perf_counter()
        runs = encode_args_runs(args, task="bench.task", max_bytes=q.max_payload_bytes)
        _add(stages, "encode_args_runs: json + checks", time.perf_counter() - t)
        t = time.perf_counter()
        statements = insert._bulk_statements(runs)
        _add(stages, "_bulk_statements: the JSON array text", time.perf_counter() - t)
        t = time.perf_counter()
        await conn.execute("BEGIN")
        _add(stages, "BEGIN (round trip)", time.perf_counter() - t)
        t = time.perf_counter()
        for jobs, text in statements:
            await insert._bulk_one(conn, q.sql, spec, jobs=jobs, args_array=text, notify=True,
                                   trace=None)
        _add(stages, "the statement: send, server, ids", time.perf_counter() - t)
        t = time.perf_counter()
        await conn.execute("COMMIT")
        _add(stages, "COMMIT (round trip)", time.perf_counter() - t)
    stages["total"] = time.perf_counter() - t_all
    return stages


async def cprofile_enqueue(conn: Conn, n: int, batch: int, top: int) -> str:
    """cProfile of enqueue_bulk and of building specs + enqueue_many (args-only batches)."""
    q = Queue()
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(0, n, batch):
        async with conn.transaction():
            await q.enqueue_bulk(conn, "bench.task", bench_args(i, i + batch), queue=QUEUE_NAME)
    specs = build_specs(n, dedup=False, tag="")
    for i in range(0, n, batch):
        async with conn.transaction():
            await q.enqueue_many(conn, specs[i : i + batch])
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(r"trioq|attrs|json|psycopg", top)
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


# COPY rows are built for whatever column list trioq._db.statements's COPY statement has (it
# changes as trioq evolves: e.g. 'state' was added for scheduled jobs). Each known column has
# the Python expression trioq/_db/insert.py uses for it; the row function is compiled once from
# that list so the prototypes pay no per-row dispatch.
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
    current = str(await scalar(conn, "SELECT pg_get_indexdef('trioq.jobs_lease_idx'::regclass)"))
    normalized = current.replace("::text", "")
    variants: dict[str, Variant] = {"as is": (current, (), SQL.claim)}
    for predicate, label in _LEASE_PREDICATES.items():
        if f"WHERE ({predicate})" not in normalized:
            variants[label] = (lease_index_sql(predicate), (), SQL.claim)
    generic = ("SET plan_cache_mode = force_generic_plan",)
    fixed = lease_index_sql("lease_expires_at IS NOT NULL")
    variants["D2 D1 + claim id = ANY(ARRAY(..)) + generic plans"] = (fixed, generic, _CLAIM_ANY)
    return variants


def sql_property(stmts: Statements) -> property:
    """A `Queue.sql` that returns ``stmts``, for `patched`."""

    def get(_queue: Queue) -> Statements:
        return stmts

    return property(get)


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
            with patched(Queue, "sql", sql_property(SQL.replaced(claim=claim))):
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


# -- orchestration ------------------------------------------------------------------------------


def summarize(runs: Sequence[dict[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(runs), **medians(runs, keys)}
    for key in keys:
        values = [r[key] for r in runs if r.get(key) is not None]
        if key.endswith("jobs_s") and values:
            out[key + "_best"] = max(values)
            out[key + "_worst"] = min(values)
            out[key + "_all"] = [round(v) for v in values]
    return out


@dataclass
class Options:
    dsn: str
    database: str
    enqueue_paths: list[str]
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
    dsn = await create_bench_db(opts.dsn, opts.database)
    try:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            return await bench_in(conn, dsn, opts)
    finally:
        await drop_bench_db(opts.dsn, opts.database)


async def bench_in(conn: Conn, dsn: str, opts: Options) -> dict[str, Any]:
    async def quiet() -> float:
        return await wait_quiet(opts.quiet_cores, opts.quiet_wait)

    report: dict[str, Any] = {
        "environment": await environment(conn, opts),
        "enqueue": [],
        "drain": [],
        "profile": None,
    }
    if "enqueue" not in opts.skip:
        report["enqueue"] = await bench_enqueue(conn, dsn, opts, quiet, report["environment"])
    if "drain" not in opts.skip:
        report["drain"] = await bench_drain(conn, dsn, opts, quiet, report["environment"])
    if opts.profile:
        report["profile"] = await bench_profile(conn, dsn, opts, quiet)
    return report


async def environment(conn: Conn, opts: Options) -> dict[str, Any]:
    """The server's settings, the client's versions, and the pgbench binary (None: none)."""
    server = await show_settings(conn, SERVER_SETTINGS)
    major = int(str(server["server_version"]).split(".")[0])
    pgbench = None if "pgbench" in opts.skip else find_pgbench(opts.pgbench, major)
    env = {
        "server": server,
        **client_versions(),
        "trioq": trioq.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "pgbench": pgbench,
    }
    if pgbench:
        env["pgbench_version"] = await trio.to_thread.run_sync(pgbench_version, pgbench)
    return env


async def bench_enqueue(
    conn: Conn, dsn: str, opts: Options, quiet: Callable[[], Awaitable[float]], env: dict[str, Any]
) -> list[dict[str, Any]]:
    """Every enqueue path at every batch size, and pgbench's 100-row INSERTs (1 and 2
    clients), interleaved: each repetition runs each of them once, in turn."""
    pgbench: str | None = env["pgbench"]
    keys = ("enqueue_jobs_s", "end_to_end_jobs_s", "client_us_job", "server_us_job",
            "build_cpu_us_job", "cpu_bound_jobs_s", "others_cores")  # fmt: skip
    samples: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="trioq-bench-") as tmp:
        script = Path(tmp) / "insert_100.sql"
        script.write_text(pgbench_insert_script(100))
        for rep in range(opts.repeat):
            for batch in opts.enqueue_batches:
                for path in opts.enqueue_paths:
                    await reset_jobs(conn)
                    await quiet()
                    run = await enqueue_run(
                        conn, opts.enqueue_jobs, batch, path=path, tag=f"r{rep}-b{batch}"
                    )
                    samples.setdefault((path, batch), []).append(run)
            if pgbench is not None:
                for clients in (1, 2):
                    await reset_jobs(conn)
                    await quiet()
                    run = await pgbench_insert(
                        pgbench, dsn, script, jobs=opts.enqueue_jobs, rows=100, clients=clients
                    )
                    samples.setdefault((f"pgbench{clients}", 100), []).append(run)
            print(f"  enqueue: repetition {rep + 1} of {opts.repeat} done", flush=True)
    rows = []
    ceiling = [r["enqueue_jobs_s"] for r in samples.get(("pgbench1", 100), [])]
    for (path, batch), runs in samples.items():
        if path.startswith("pgbench"):
            n = path.removeprefix("pgbench")
            label = f"pgbench 100-row INSERT, {n} client{'s' if n != '1' else ''}"
            row = {"path": label, "batch": batch, "pgbench": True, **summarize(runs, keys)}
            row["command"] = runs[0]["command"]
        else:
            row = {"path": ENQUEUE_PATHS[path][0], "key": path, "batch": batch,
                   "jobs": opts.enqueue_jobs, **summarize(runs, keys)}  # fmt: skip
            quiet_runs = [r for r in runs if (r["others_cores"] or 0) <= opts.quiet_cores]
            row["quiet_n"] = len(quiet_runs)
            row["quiet_end_to_end_jobs_s"] = median_or_none(
                r["end_to_end_jobs_s"] for r in quiet_runs
            )
            if len(ceiling) == len(runs):  # each repetition against its own pgbench run
                ratios = [r["enqueue_jobs_s"] / c for r, c in zip(runs, ceiling, strict=True)]
                row["vs_pgbench"] = median_or_none(ratios)
        rows.append(row)
    return rows


async def bench_drain(
    conn: Conn,
    dsn: str,
    opts: Options,
    quiet: Callable[[], Awaitable[float]],
    env: dict[str, Any],
) -> list[dict[str, Any]]:
    pgbench: str | None = env["pgbench"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="trioq-bench-") as tmp:
        script = Path(tmp) / "claim_complete.sql"
        script.write_text(pgbench_drain_script())
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
        await quiet()
        out["bulk_stages_s"] = await bulk_breakdown(conn, n, batch)
        await reset_jobs(conn)
        out["cprofile"] = await cprofile_enqueue(conn, n, batch, top=25)
    if "drain" not in opts.skip:
        out["drain_prototypes"] = await run_drain_prototypes(
            conn, dsn, opts.drain_jobs, opts.repeat, quiet
        )
    return out


# -- output -------------------------------------------------------------------------------------


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
    if report["drain"]:
        print()
        print(DRAIN_TABLE.render(drain_cells(row) for row in report["drain"]))
        print()
        print(
            "medians of",
            report["drain"][0]["trioq"]["n"],
            "runs, as median (best); trioq/pgbench compares medians; 'others' = cores busy with"
            " other processes during the trioq run; us/job = CPU microseconds per job.",
        )
    if report["enqueue"]:
        print_enqueue_table(report["enqueue"])
    if report["profile"]:
        print_profile(report["profile"])


DRAIN_TABLE = Table(
    (
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
)


def drain_cells(row: dict[str, Any]) -> list[str]:
    t, p = row["trioq"], row.get("pgbench", {})
    server_us = None if t["server_cpu"] is None else t["server_cpu"] / row["jobs"] * 1e6
    return [
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
    ]


def spread(summary: dict[str, Any], key: str) -> str:
    """``median [worst-best] ±x%`` of a jobs/s figure (x: half the range, of the median)."""
    median, lo, hi = summary.get(key), summary.get(key + "_worst"), summary.get(key + "_best")
    if median is None or lo is None or hi is None:
        return "-"
    return f"{median:,.0f} [{lo:,.0f}-{hi:,.0f}] ±{(hi - lo) / 2 / median:.0%}"


ENQUEUE_TABLE = Table(
    (
        ("path", 42, "<"),
        ("batch", 6, ">"),
        ("enqueue jobs/s", 30, ">"),
        ("end to end jobs/s", 30, ">"),
        ("quiet e2e (n)", 14, ">"),
        ("1/cpu", 7, ">"),
        ("vs pgb", 6, ">"),
        ("build", 5, ">"),
        ("client", 6, ">"),
        ("server", 6, ">"),
        ("others", 6, ">"),
    )
)


def enqueue_cells(r: dict[str, Any]) -> list[str]:
    pgbench = r.get("pgbench")
    return [
        r["path"],
        str(r["batch"]),
        spread(r, "enqueue_jobs_s"),
        "" if pgbench else spread(r, "end_to_end_jobs_s"),
        "" if pgbench else f"{fmt(r['quiet_end_to_end_jobs_s'])} ({r['quiet_n']})",
        fmt(r.get("cpu_bound_jobs_s")),
        fmt(r.get("vs_pgbench"), ".2f"),
        fmt(r.get("build_cpu_us_job"), ".1f"),
        fmt(r.get("client_us_job"), ".1f"),
        fmt(r.get("server_us_job"), ".1f"),
        fmt(r.get("others_cores"), ".2f"),
    ]


def print_enqueue_table(rows: Sequence[dict[str, Any]]) -> None:
    jobs = next((r["jobs"] for r in rows if "key" in r), 0)
    print(
        f"\nenqueue: {jobs:,} jobs, one transaction per batch, runs interleaved; jobs/s as "
        "median [worst-best] ±half-range"
    )
    print(ENQUEUE_TABLE.render(enqueue_cells(r) for r in rows))
    print(
        f"  {rows[0]['n']} runs each. 'enqueue': the call(s) alone, inputs built beforehand; "
        "'end to end': including building the\n  args dicts (enqueue_bulk) or the JobSpecs "
        "(build: CPU us per job for that). client/server: CPU us per job of this\n  process "
        "(pgbench's, for its rows) / of the server backend; others: cores busy with other "
        "processes meanwhile.\n  quiet e2e: median end to end of the runs with others <= "
        "--quiet-cores (how many). 1/cpu: 1e6 / (client + server us/job), the rate with\n  "
        "client and server back to back and nothing else running. vs pgb: median over "
        "repetitions of enqueue jobs/s / pgbench 1 client's in the same repetition."
    )
    for r in rows:
        if r.get("pgbench"):
            print(f"  {r['path']}: {r['command']}")
    best = max((r for r in rows if "key" in r), key=lambda r: r["end_to_end_jobs_s"] or 0)
    verdict = "meets" if (best["end_to_end_jobs_s"] or 0) >= TARGET_ENQUEUE else "is BELOW"
    print(
        f"fastest path end to end: {best['path']}, batch {best['batch']:,}: median "
        f"{best['end_to_end_jobs_s']:,.0f} jobs/s {verdict} the {TARGET_ENQUEUE:,} jobs/s target."
    )


def print_profile(profile: dict[str, Any]) -> None:
    if "stages_s" in profile:
        print_enqueue_profile(profile)
    print_drain_prototypes(profile)
    if "cprofile" in profile:
        print("\ncProfile (enqueue_bulk, then specs + enqueue_many), top by own time:")
        print(profile["cprofile"])


def print_enqueue_profile(profile: dict[str, Any]) -> None:
    n = profile["jobs"]
    print(
        f"\nenqueue_many COPY path (mixed priorities), {n:,} jobs, batches of {profile['batch']:,}:"
    )
    for name, seconds in profile["stages_s"].items():
        print(f"  {name:52} {seconds:7.3f} s  {seconds / n * 1e6:6.2f} us/job")
    print("\nserver ingest ceiling (prebuilt COPY text, no per-row Python):")
    for name, value in profile["raw_copy"].items():
        print(f"  {name:52} {value:>10,.1f}")
    if "bulk_stages_s" in profile:
        print(f"\nenqueue_bulk, {n:,} jobs in batches of {profile['batch']:,}: stages")
        for name, seconds in profile["bulk_stages_s"].items():
            print(f"  {name:52} {seconds:7.3f} s  {seconds / n * 1e6:6.2f} us/job")


PROTOTYPES_TABLE = Table(
    (
        ("variant", 52, "<"),
        ("batch", 5, ">"),
        ("cl", 2, ">"),
        ("jobs/s", 16, ">"),
        ("client", 6, ">"),
        ("server", 6, ">"),
        ("others", 6, ">"),
    )
)


def print_drain_prototypes(profile: dict[str, Any]) -> None:
    if profile.get("drain_prototypes"):
        print("\ndrain prototypes (bench database only): median (best) jobs/s, CPU us per job")
        print("  " + PROTOTYPES_TABLE.heading()[0])
        for r in profile["drain_prototypes"]:
            cells = (r["variant"], str(r["batch"]), str(r["clients"]), both(r, "jobs_s"),
                     fmt(r["client_us_job"], ".1f"), fmt(r["server_us_job"], ".1f"),
                     fmt(r["others_cores"], ".2f"))  # fmt: skip
            print("  " + PROTOTYPES_TABLE.row(*cells))


# -- entry point --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> Options:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_options(
        p, creates=f"the database --database ({BENCH_DB})", repeat=3, quiet_cores=0.3,
        quiet_wait=20.0, pgbench=True,
    )  # fmt: skip
    p.add_argument(
        "--database", default=BENCH_DB, help="scratch database, dropped first and at the end"
    )
    p.add_argument("--enqueue-jobs", type=int, default=200_000)
    p.add_argument(
        "--enqueue-paths",
        default=",".join(ENQUEUE_PATHS),
        help=f"comma list of: {', '.join(f'{k} ({v[0]})' for k, v in ENQUEUE_PATHS.items())}",
    )
    p.add_argument("--enqueue-batches", type=int_list, default=[1_000, 10_000])
    p.add_argument("--drain-jobs", type=int, default=20_000)
    p.add_argument("--drain-batches", type=int_list, default=[1, 10, 100])
    p.add_argument("--clients", type=int_list, default=[1, 4])
    p.add_argument(
        "--profile", action="store_true", help="profile enqueue_many and measure the fix prototypes"
    )
    p.add_argument("--skip", default="", help="comma list of: enqueue, drain, pgbench")
    a = p.parse_args(argv)
    unknown = set(a.enqueue_paths.split(",")) - set(ENQUEUE_PATHS) - {""}
    if unknown:
        p.error(f"unknown --enqueue-paths: {', '.join(sorted(unknown))}")
    opts = Options(
        dsn=a.dsn,
        database=a.database,
        enqueue_paths=[x for x in a.enqueue_paths.split(",") if x],
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
        f"{target.get('port', 5432)} (database {opts.database}, created and dropped)",
        flush=True,
    )
    report = trio.run(bench, opts)
    report["options"] = {
        k: sorted(v) if isinstance(v, set) else v for k, v in asdict(opts).items() if k != "dsn"
    }
    print_table(report)
    if opts.json:
        write_json(opts.json, report)
        print(f"wrote {opts.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
