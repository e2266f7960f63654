"""A growing backlog: does what trioq does stay flat from 10k to 1M jobs? (not a test)

For each size of ``--sizes`` (default 10k, 100k, 1M) the schema ``--schema`` (default
``bench_backlog``, created in the ``--dsn`` database, dropped first and at the end) is filled
to that many available jobs of one queue through the public bulk path, ``Queue.enqueue_bulk``
(20,000 jobs per transaction; the fill rate is reported), then ``VACUUM ANALYZE``; then:

a. claim latency: trioq's claim (`Queue.claim`, the statement the runtime's fetcher runs for a
   queue without settings) at batch 1, 10 and 100, ``--repeat`` times each: median, p95, p99
   of the call as the client sees it; each claimed batch is completed (`Queue.complete_many`,
   the runtime's completion: a fenced DELETE, also timed) and as many new jobs are enqueued
   (not timed), so the backlog keeps its size;
b. the operator's view: ``trioq status``, ``status --json``, ``status --exact`` and
   ``trioq jobs list`` run as real subprocesses, ``--status-runs`` rounds each with
   ``trioq --version`` (Python's start) in the same round: median wall time and median
   excess over ``--version``; the
   statements ``trioq status`` runs (the depth statements at its cap, ``status_leases``; and
   ``status_queues``, what ``--exact`` runs instead) under EXPLAIN; and the metrics' depth
   sample (`trioq._obs.depth`: available, dead, scheduled/running, waiting), timed here;
c. a real ``trioq serve --app backlog_app:tasks`` (a no-op task, trioq's defaults) draining
   for ``--serve-seconds`` (``--serve-runs`` times) from that backlog while a feeder tops
   the backlog back up (only where the size is below 50,000; a larger one loses at most what
   the drain takes): the
   process's RSS (``VmRSS`` of /proc/<pid>/status every 50 ms: at ready, peak, end), its
   jobs/s, and the CPU its Postgres backends used (``PGAPPNAME`` marks them; /proc/<pid>/stat)
   so jobs/s per Postgres core, and the cores the rest of the box used meanwhile;
d. the jobs table's size: heap, each index, total (``pg_total_relation_size``).

Then one table per size and a summary: each metric's ratio largest/smallest size. On a busy
box the wall times move by tens of percent with the neighbours' load (reported as "others");
the claim's and ``trioq status``'s server time and buffers (``EXPLAIN (ANALYZE, BUFFERS)``,
rolled back) do not, so they are what says whether a statement's cost grows with the backlog.
Local server only for (c)'s backend CPU (it reads /proc); without it those cells are ``-``.

Usage::

    python bench/bench_backlog.py --dsn "$(trioq db url)" --json backlog.json
    python bench/bench_backlog.py --dsn "$(trioq db url)" --sizes 1000,10000   # smoke run
    python bench/bench_backlog.py --throwaway-cluster --json backlog-fsync-off.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
import trio
from _common import (
    Table,
    add_common_options,
    client_versions,
    cpu_model,
    fmt,
    int_list,
    machine_busy,
    median_or_none,
    process_cpu,
    scalar,
    serve_process,
    show_settings,
    wait_quiet,
    write_json,
)
from psycopg import sql

import trioq
from trioq import Lease, Queue
from trioq._cli.ops import STATUS_CAP
from trioq._db.sql.status import DEPTH_CAP
from trioq._db.sql.status import MAX_DEPTH_QUEUES as MAX_QUEUES
from trioq._db.statements import statements, validate_schema_name
from trioq.testing._postgres import session_cluster

QUEUE = "backlog"
TASK = "bench.noop"
LEASE = dt.timedelta(seconds=60)
FILL_BATCH = 20_000
FEED_BELOW = 50_000  # the serve phase's feeder keeps sizes below this topped up
APP_NAME = "bench_backlog_serve"
HERE = Path(__file__).resolve().parent
TRIOQ = (sys.executable, "-m", "trioq._cli")  # the real command line, of this interpreter
SERVER_SETTINGS = ("server_version", "fsync", "synchronous_commit", "shared_buffers",
                   "autovacuum", "autovacuum_vacuum_scale_factor")  # fmt: skip

Conn = Any  # trioq.TrioConnection


# -- filling ------------------------------------------------------------------------------------


async def fill_to(conn: Conn, q: Queue, size: int) -> dict[str, Any]:
    """Enqueue jobs until ``size`` are available; the jobs/s of that fill; VACUUM ANALYZE."""
    have = await available(conn, q.schema)
    todo = max(0, size - have)
    t0 = time.perf_counter()
    await enqueue(conn, q, todo, start=have)
    fill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    await conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(q.schema, "jobs")))
    return {
        "enqueued": todo,
        "fill_s": fill_s,
        "fill_jobs_s": todo / fill_s if todo else None,
        "vacuum_s": time.perf_counter() - t0,
    }


async def enqueue(conn: Conn, q: Queue, n: int, *, start: int = 0) -> None:
    """``n`` no-op jobs through `Queue.enqueue_bulk`, `FILL_BATCH` per transaction."""
    for lo in range(start, start + n, FILL_BATCH):
        hi = min(lo + FILL_BATCH, start + n)
        async with conn.transaction():
            await q.enqueue_bulk(conn, TASK, [{"n": i} for i in range(lo, hi)], queue=QUEUE)


async def available(conn: Conn, schema: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {} WHERE state = 'available'").format(
        sql.Identifier(schema, "jobs")
    )
    return int(await scalar(conn, query))


# -- (a) claim and complete ---------------------------------------------------------------------


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """Median, p95, p99 and max of ``samples`` (seconds), in milliseconds."""
    ms = sorted(s * 1e3 for s in samples)
    cuts = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
    return {"median": statistics.median(ms), "p95": cuts[94], "p99": cuts[98], "max": ms[-1]}


async def claim_latency(conn: Conn, q: Queue, batch: int, repeat: int) -> dict[str, Any]:
    """``repeat`` claims of ``batch`` jobs, each completed and replaced by a new job."""
    claims, completes = [], []
    owner = f"bench-backlog-{os.getpid()}"
    for _ in range(repeat):
        t0 = time.perf_counter()
        jobs = await q.claim(conn, QUEUE, owner=owner, limit=batch, lease=LEASE)
        t1 = time.perf_counter()
        done = await q.complete_many(
            conn, owner=owner, leases=[Lease(j.id, j.attempt) for j in jobs]
        )
        t2 = time.perf_counter()
        if len(jobs) != batch or len(done) != batch:
            raise RuntimeError(f"claimed {len(jobs)}, completed {len(done)} of batch {batch}")
        claims.append(t1 - t0)
        completes.append(t2 - t1)
        await q.enqueue_bulk(conn, TASK, [{"n": -1}] * batch, queue=QUEUE)
    return {"batch": batch, "n": repeat, "claim_ms": percentiles(claims),
            "complete_ms": percentiles(completes)}  # fmt: skip


async def explain_analyze(
    conn: Conn, statement: sql.Composable, params: dict[str, Any], runs: int
) -> dict[str, Any]:
    """``statement`` under ``EXPLAIN (ANALYZE, BUFFERS)``, rolled back: the server's execution
    time (median of ``runs``) and the buffers it touched, which no neighbour's load changes."""
    explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + statement
    times, plan = [], {}
    for _ in range(runs):
        async with conn.transaction(force_rollback=True):
            cur = psycopg.AsyncClientCursor(conn)  # values bound as literals: a custom plan
            await cur.execute(explain, params)
            row = await cur.fetchone()
        assert row is not None
        times.append(row[0][0]["Execution Time"])
        plan = row[0][0]["Plan"]
    buffers = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    return {"execution_ms": statistics.median(times), "buffers": buffers}


async def claim_plan(conn: Conn, q: Queue, batch: int, runs: int) -> dict[str, Any]:
    """The claim's server time and buffers at ``batch`` (`explain_analyze`)."""
    params = {"queue": QUEUE, "owner": "bench-explain", "limit": batch, "lease": LEASE}
    return {"batch": batch, **await explain_analyze(conn, q.sql.claim, params, runs)}


# -- (b) the operator's view --------------------------------------------------------------------


#: The commands of (b); ``--version`` is what any command costs before it queries (Python's
#: start and trioq's imports), run in the same rounds so each round's difference is the query.
CLI_COMMANDS = (
    ["--version"], ["status"], ["status", "--json"], ["status", "--exact"], ["jobs", "list"],
)
#: The depth statements (trioq._obs.depth): the metrics' sample, and `trioq status` at its cap.
DEPTH_STATEMENTS = ("depth_available", "depth_dead", "depth_scheduled_running", "depth_waiting")


def cli_once(args: Sequence[str], dsn: str, schema: str) -> tuple[float, int]:
    """Wall seconds of ``trioq <args>`` as a subprocess, and its output's length."""
    cmd = [*TRIOQ, *args] if args == ["--version"] else [*TRIOQ, *args, "--dsn", dsn,
                                                          "--schema", schema]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"trioq {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return wall, len(done.stdout)


def cli_rounds(dsn: str, schema: str, runs: int) -> list[dict[str, Any]]:
    """`CLI_COMMANDS` in ``runs`` rounds: each one's median wall time, and its median excess
    over ``--version`` in the same round."""
    rounds = [[cli_once(args, dsn, schema) for args in CLI_COMMANDS] for _ in range(runs)]
    out = []
    for i, args in enumerate(CLI_COMMANDS):
        walls = [r[i][0] for r in rounds]
        out.append({
            "command": f"trioq {' '.join(args)}",
            "median_s": statistics.median(walls),
            "beyond_start_s": statistics.median(r[i][0] - r[0][0] for r in rounds),
            "runs": runs,
            "output_bytes": rounds[-1][i][1],
        })  # fmt: skip
    return out


async def depth_sample(conn: Conn, schema: str, runs: int) -> dict[str, float]:
    """Median milliseconds of each of the metrics' depth statements."""
    obs = statements(schema)
    params = {"cap": DEPTH_CAP, "max_queues": MAX_QUEUES}
    out = {}
    for name in DEPTH_STATEMENTS:
        walls = []
        for _ in range(runs):
            t0 = time.perf_counter()
            await (await conn.execute(getattr(obs, name), params)).fetchall()
            walls.append(time.perf_counter() - t0)
        out[name] = statistics.median(walls) * 1e3
    return out


async def operator_view(conn: Conn, dsn: str, schema: str, runs: int) -> dict[str, Any]:
    start, *cli = await trio.to_thread.run_sync(cli_rounds, dsn, schema, runs)
    stmts = obs = statements(schema)
    capped = {"cap": STATUS_CAP, "max_queues": MAX_QUEUES}
    # What `trioq status` runs (trioq/_cli/ops.py -> Queue.status), on the server: the depth
    # statements at its cap and the leases; `--exact` runs status_queues instead of the first.
    server = {
        name: await explain_analyze(conn, statement, params, max(runs, 3))
        for name, statement, params in (
            *((f"status {d}", getattr(obs, d), capped) for d in DEPTH_STATEMENTS),
            ("status_leases", stmts.status_leases, {}),
            ("status --exact: status_queues", stmts.status_queues, {}),
        )
    }
    return {"cli": cli, "cli_start_s": start["median_s"], "status_server": server,
            "depth_ms": await depth_sample(conn, schema, max(runs, 5))}  # fmt: skip


# -- (c) a real serve process -------------------------------------------------------------------


def rss_kib(pid: int) -> int | None:
    """VmRSS of ``pid`` in KiB; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


async def serve_pids(conn: Conn) -> list[int]:
    """The Postgres backends of the serve process (``PGAPPNAME``)."""
    cur = await conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (APP_NAME,)
    )
    return [int(r[0]) for r in await cur.fetchall()]


def backends_cpu(pids: Sequence[int]) -> dict[int, float]:
    found = {pid: process_cpu(pid) for pid in pids}
    return {pid: cpu for pid, cpu in found.items() if cpu is not None}


async def wait_ready(conn: Conn, schema: str, pid: int, proc: trio.Process) -> None:
    """Until the serve process has registered its worker row (bounded: 30 s)."""
    query = sql.SQL("SELECT count(*) FROM {} WHERE pid = %s").format(
        sql.Identifier(schema, "workers")
    )
    with trio.fail_after(30):
        while not await scalar(conn, query, (pid,)):
            if proc.returncode is not None:
                raise RuntimeError(f"trioq serve exited {proc.returncode} before it was ready")
            await trio.sleep(0.05)


async def feeder(conn: Conn, q: Queue, size: int, fed: list[int]) -> None:
    """Keep a backlog below `FEED_BELOW` at ``size`` available jobs (checked every 100 ms)."""
    if size >= FEED_BELOW:
        return
    while True:
        missing = size - await available(conn, q.schema)
        if missing > 0:
            await enqueue(conn, q, missing)
            fed[0] += missing
        await trio.sleep(0.1)


async def serve_drain(
    conn: Conn,
    feed_conn: Conn,
    q: Queue,
    *,
    dsn: str,
    size: int,
    seconds: float,
    concurrency: int | None = None,
) -> dict[str, Any]:
    """Run ``trioq serve`` for ``seconds`` after it is ready; RSS, jobs/s, backend CPU."""
    env = {**os.environ, "PGAPPNAME": APP_NAME, "PYTHONPATH": str(HERE)}
    cmd = [*TRIOQ, "serve", "--app", "backlog_app:tasks", "--dsn", dsn, "--schema", q.schema]
    if concurrency:
        cmd += ["--concurrency", str(concurrency)]
    rss: list[int] = []
    fed = [0]
    async with serve_process(cmd, env) as proc, trio.open_nursery() as nursery:
        nursery.start_soon(sample_rss, proc.pid, rss)
        await wait_ready(conn, q.schema, proc.pid, proc)
        ready_rss = rss[-1] if rss else rss_kib(proc.pid)
        nursery.start_soon(feeder, feed_conn, q, size, fed)
        before, t0 = await available(conn, q.schema), time.perf_counter()
        pids = await serve_pids(conn)
        cpu0, own0 = backends_cpu(pids), process_cpu(proc.pid) or 0.0
        m0, me0 = machine_busy(), time.process_time()
        await trio.sleep(seconds)
        cpu1, own1 = backends_cpu(pids), process_cpu(proc.pid) or 0.0
        machine, me = machine_busy() - m0, time.process_time() - me0
        end_rss = rss[-1] if rss else None
        nursery.cancel_scope.cancel()  # then serve_process stops it (SIGTERM) and checks it
    wall = time.perf_counter() - t0
    after = await available(conn, q.schema)
    drained = before - after + fed[0]
    pg_cpu = sum(cpu1[p] - cpu0[p] for p in cpu1 if p in cpu0) if cpu0 else None
    others = (machine - me - (own1 - own0) - (pg_cpu or 0.0)) / seconds
    return {
        "others_cores": max(0.0, others),  # the rest of the box (our feeder's backend too)
        "serve_cores": (own1 - own0) / seconds,
        "seconds": wall,
        "jobs": drained,
        "jobs_s": drained / wall,
        "fed": fed[0],
        "exit": proc.returncode,
        "rss_ready_kib": ready_rss,
        "rss_peak_kib": max(rss) if rss else None,
        "rss_end_kib": end_rss,
        "rss_samples": len(rss),
        "pg_backends": len(pids),
        "pg_cpu_s": pg_cpu,
        "pg_cores": None if pg_cpu is None else pg_cpu / wall,
        "jobs_s_per_pg_core": None if not pg_cpu else drained / pg_cpu,
    }


async def sample_rss(pid: int, out: list[int]) -> None:
    while (kib := rss_kib(pid)) is not None:
        out.append(kib)
        await trio.sleep(0.05)


# -- (d) sizes ----------------------------------------------------------------------------------


async def table_sizes(conn: Conn, schema: str) -> dict[str, int]:
    """Bytes: the jobs heap, each of its indexes, and the total (TOAST included)."""
    cur = await conn.execute(
        "SELECT c.relname, pg_relation_size(c.oid) FROM pg_index i"
        "  JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid"
        "  JOIN pg_namespace n ON n.oid = t.relnamespace"
        " WHERE n.nspname = %s AND t.relname = 'jobs' ORDER BY 1",
        (schema,),
    )
    out = {f"index {name}": int(b) for name, b in await cur.fetchall()}
    jobs = f"{schema}.jobs"
    out["heap"] = int(await scalar(conn, "SELECT pg_relation_size(%s::regclass)", (jobs,)))
    out["total"] = int(await scalar(conn, "SELECT pg_total_relation_size(%s::regclass)", (jobs,)))
    return out


async def dead_tuples(conn: Conn, schema: str) -> int | None:
    """The jobs table's dead tuples as the statistics say (updated within a second or so)."""
    cur = await conn.execute(
        "SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'jobs'",
        (schema,),
    )
    row = await cur.fetchone()
    return None if row is None else int(row[0])


# -- the run ------------------------------------------------------------------------------------


async def one_size(
    conn: Conn, feed_conn: Conn, q: Queue, opts: argparse.Namespace, *, size: int,
    quiet: Callable[[], Awaitable[float]],
) -> dict[str, Any]:  # fmt: skip
    row: dict[str, Any] = {"size": size, "fill": await fill_to(conn, q, size)}
    print(f"  {size:>9,} jobs: filled in {row['fill']['fill_s']:.1f} s", flush=True)
    row["others_cores"] = await quiet()
    row["claims"] = [await claim_latency(conn, q, b, opts.repeat) for b in opts.batches]
    row["available_after_claims"] = await available(conn, q.schema)  # still ``size``
    row["dead_tuples_after_claims"] = await dead_tuples(conn, q.schema)
    row["claim_plans"] = [await claim_plan(conn, q, b, 5) for b in opts.batches]
    row["operator"] = await operator_view(conn, opts.dsn, q.schema, opts.status_runs)
    row["sizes_bytes"] = await table_sizes(conn, q.schema)
    runs = []
    for _ in range(opts.serve_runs):
        await fill_to(conn, q, size)
        runs.append(await serve_drain(
            conn, feed_conn, q, dsn=opts.dsn, size=size, seconds=opts.serve_seconds,
            concurrency=opts.serve_concurrency,
        ))  # fmt: skip
    row["serve_runs"], row["serve"] = runs, serve_summary(runs)
    return row


def serve_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the rates over the serve runs; the largest RSS; the sums of jobs and fed."""
    out: dict[str, Any] = {"n": len(runs)}
    for key in ("jobs_s", "jobs_s_per_pg_core", "pg_cores", "serve_cores", "others_cores",
                "seconds"):  # fmt: skip
        out[key] = median_or_none(r[key] for r in runs)
    for key in ("rss_ready_kib", "rss_peak_kib", "rss_end_kib", "pg_backends", "exit"):
        out[key] = max((r[key] for r in runs if r[key] is not None), default=None)
    for key in ("jobs", "fed"):
        out[key] = sum(r[key] for r in runs)
    return out


async def bench(opts: argparse.Namespace) -> dict[str, Any]:
    q = Queue(schema=opts.schema)
    schema = sql.Identifier(opts.schema)
    async with (
        await trioq.connect(opts.dsn, autocommit=True) as conn,
        await trioq.connect(opts.dsn, autocommit=True) as feed_conn,
    ):
        server = await show_settings(conn, SERVER_SETTINGS)
        env = {**client_versions(), "trioq": trioq.__version__, "cpus": os.cpu_count(),
               "cpu": cpu_model(), "server": server}  # fmt: skip
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(schema))
        await trioq.migrate(conn, opts.schema)
        try:

            async def quiet() -> float:
                return await wait_quiet(opts.quiet_cores, opts.quiet_wait)

            rows = [
                await one_size(conn, feed_conn, q, opts, size=s, quiet=quiet) for s in opts.sizes
            ]
        finally:
            with trio.move_on_after(30, shield=True):
                await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(schema))
    return {"environment": env, "sizes": rows, "summary": summarize(rows)}


# -- the report ---------------------------------------------------------------------------------


def mib(kib: int | None) -> float | None:
    return None if kib is None else kib / 1024


def metrics(row: dict[str, Any]) -> dict[str, float | None]:
    """The flat-or-not figures of one size, by name."""
    out: dict[str, float | None] = {}
    for c in row["claims"]:
        out[f"claim b{c['batch']} median ms"] = c["claim_ms"]["median"]
        out[f"claim b{c['batch']} p99 ms"] = c["claim_ms"]["p99"]
        out[f"complete b{c['batch']} median ms"] = c["complete_ms"]["median"]
    for c in row["claim_plans"]:
        out[f"claim b{c['batch']} server ms"] = c["execution_ms"]
        out[f"claim b{c['batch']} buffers"] = c["buffers"]
    for c in row["operator"]["cli"]:
        out[f"{c['command']} s"] = c["median_s"]
        out[f"{c['command']} s beyond start"] = c["beyond_start_s"]
    for name, plan in row["operator"]["status_server"].items():
        out[f"{name} server ms"] = plan["execution_ms"]
        out[f"{name} buffers"] = plan["buffers"]
    for name, ms in row["operator"]["depth_ms"].items():
        out[f"{name} ms"] = ms
    serve = row["serve"]
    out["serve rss peak MiB"] = mib(serve["rss_peak_kib"])
    out["serve rss end MiB"] = mib(serve["rss_end_kib"])
    out["serve jobs/s"] = serve["jobs_s"]
    out["jobs/s per PG core"] = serve["jobs_s_per_pg_core"]
    out["table total MiB"] = row["sizes_bytes"]["total"] / 2**20
    return out


#: Growth (largest size / smallest) above which a metric is not called flat. Timings on a
#: shared 2-core box move by tens of percent from noise alone.
FLAT = 1.5


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    if len(rows) < 2:
        return []
    first, last = metrics(rows[0]), metrics(rows[-1])
    out = []
    for name, lo in first.items():
        hi = last.get(name)
        ratio = None if lo is None or hi is None or lo == 0 else hi / lo
        grows = name.startswith(("claim", "complete", "trioq", "depth", "status", "serve rss"))
        verdict = "-" if ratio is None or not grows else ("flat" if ratio <= FLAT else "GROWS")
        out.append({"metric": name, "small": lo, "large": hi, "ratio": ratio, "verdict": verdict})
    return out


SIZE_TABLE = Table((("metric", 38, "<"), ("value", 12, ">"), ("p95", 9, ">"), ("p99", 9, ">")))
SUMMARY_TABLE = Table(
    (("metric", 38, "<"), ("smallest", 10, ">"), ("largest", 10, ">"), ("ratio", 6, ">"),
     ("verdict", 7, "<"))
)  # fmt: skip


def size_cells(row: dict[str, Any]) -> list[list[str]]:
    cells = [["fill (enqueue_bulk) jobs/s", fmt(row["fill"]["fill_jobs_s"]), "", ""]]
    for c in row["claims"]:
        for kind in ("claim", "complete"):
            p = c[f"{kind}_ms"]
            cells.append([f"{kind} batch {c['batch']} ms (median)", fmt(p["median"], ".2f"),
                          fmt(p["p95"], ".2f"), fmt(p["p99"], ".2f")])  # fmt: skip
    for c in row["claim_plans"]:
        cells.append([f"claim batch {c['batch']} server ms / buffers",
                      f"{c['execution_ms']:.2f} / {c['buffers']}", "", ""])  # fmt: skip
    cells.append(["trioq --version s (Python start)", fmt(row["operator"]["cli_start_s"], ".2f"),
                  "", ""])  # fmt: skip
    for c in row["operator"]["cli"]:
        cells.append([f"{c['command']} s (beyond start)",
                      f"{c['median_s']:.2f} ({c['beyond_start_s']:.2f})", "", ""])  # fmt: skip
    for name, plan in row["operator"]["status_server"].items():
        cells.append([f"{name} server ms / buffers",
                      f"{plan['execution_ms']:.2f} / {plan['buffers']}", "", ""])  # fmt: skip
    for name, ms in row["operator"]["depth_ms"].items():
        cells.append([f"metrics {name} ms", fmt(ms, ".2f"), "", ""])
    s = row["serve"]
    cells += [
        ["serve RSS ready / peak / end MiB",
         "/".join(fmt(mib(v), ".0f")
                  for v in (s["rss_ready_kib"], s["rss_peak_kib"], s["rss_end_kib"])), "", ""],
        [f"serve jobs/s ({s['n']} x {s['seconds']:.1f} s, fed {s['fed']:,})", fmt(s["jobs_s"]),
         "", ""],
        ["serve cores / its PG backends' cores",
         f"{fmt(s['serve_cores'], '.2f')} / {fmt(s['pg_cores'], '.2f')}", "", ""],
        [f"  ({s['pg_backends']} backends; others busy meanwhile)",
         fmt(s["others_cores"], ".2f"), "", ""],
        ["serve jobs/s per PG core", fmt(s["jobs_s_per_pg_core"]), "", ""],
    ]  # fmt: skip
    cells.append(["dead tuples after the claims", fmt(row["dead_tuples_after_claims"]), "", ""])
    cells += [
        [f"size {k} MiB", fmt(v / 2**20, ".1f"), "", ""] for k, v in row["sizes_bytes"].items()
    ]
    return cells


def print_report(report: dict[str, Any]) -> None:
    env = report["environment"]
    server = env["server"]
    print(f"\ntrioq {env['trioq']}  PostgreSQL {server['server_version']} fsync={server['fsync']} "
          f"synchronous_commit={server['synchronous_commit']} shared_buffers="
          f"{server['shared_buffers']}  {env['cpus']} CPUs ({env['cpu']})")  # fmt: skip
    for row in report["sizes"]:
        print(f"\nbacklog {row['size']:,} jobs (others busy: {row['others_cores']:.2f} cores)")
        print(SIZE_TABLE.render(size_cells(row)))
    if report["summary"]:
        lo, hi = report["sizes"][0]["size"], report["sizes"][-1]["size"]
        print(f"\nsummary: {hi:,} jobs vs {lo:,} (flat: ratio <= {FLAT})")
        print(SUMMARY_TABLE.render(
            [s["metric"], fmt(s["small"], ".2f"), fmt(s["large"], ".2f"), fmt(s["ratio"], ".2f"),
             s["verdict"]] for s in report["summary"]
        ))  # fmt: skip


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_common_options(p, creates="the schema --schema", repeat=200, quiet_cores=0.5,
                       quiet_wait=10.0, pgbench=False)  # fmt: skip
    p.add_argument(
        "--schema",
        default="bench_backlog",
        help="scratch schema, named bench_*, dropped first and at the end (%(default)s)",
    )
    p.add_argument("--sizes", type=int_list, default=[10_000, 100_000, 1_000_000])
    p.add_argument("--batches", type=int_list, default=[1, 10, 100])
    p.add_argument("--status-runs", type=int, default=5, help="runs of each CLI command")
    p.add_argument(
        "--throwaway-cluster",
        action="store_true",
        help="instead of --dsn, a cluster of trioq.testing's (not durable: fsync off, on tmpfs), "
        "started and removed by this script",
    )
    p.add_argument("--serve-seconds", type=float, default=5.0, help="of each serve run")
    p.add_argument("--serve-runs", type=int, default=3, help="serve runs per size")
    p.add_argument(
        "--serve-concurrency", type=int, help="slots of the serve process (default: trioq's, 10)"
    )
    opts = p.parse_args(argv)
    if not opts.sizes or min(opts.sizes) < max(opts.batches):
        p.error("every --sizes value must be at least the largest --batches value")
    if min(opts.repeat, opts.status_runs, opts.serve_runs) < 1 or opts.serve_seconds <= 0:
        p.error("--repeat, --status-runs, --serve-runs and --serve-seconds must be positive")
    try:
        validate_schema_name(opts.schema, "--schema")
    except ValueError as ex:
        p.error(str(ex))
    if not opts.schema.startswith("bench_"):  # it is dropped: never an application's schema
        p.error(f"--schema {opts.schema!r} must start with 'bench_' (the script drops it)")
    opts.sizes = sorted(opts.sizes)
    return opts


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    print(f"trioq backlog benchmark: sizes {', '.join(f'{s:,}' for s in opts.sizes)} "
          f"in schema {opts.schema} (created and dropped)", flush=True)  # fmt: skip
    if opts.throwaway_cluster:
        os.environ.pop("TRIOQ_TEST_DSN", None)  # session_cluster would use it instead
        with session_cluster() as opts.dsn:
            print("on a throwaway cluster (fsync, synchronous_commit, full_page_writes off, "
                  "on tmpfs)", flush=True)  # fmt: skip
            report = trio.run(bench, opts)
    else:
        report = trio.run(bench, opts)
    report["options"] = {k: v for k, v in vars(opts).items() if k != "dsn"}
    print_report(report)
    if opts.json:
        write_json(opts.json, report)
        print(f"wrote {opts.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
