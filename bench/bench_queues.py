"""Many queues: does what trioq does stay flat from 1 queue to 10,000? (not a test)

For each count of ``--counts`` (default 1, 1,000, 10,000), a fresh schema gets that many queues
sharing ``--jobs`` available jobs evenly (the same backlog in every run: what changes is how
many queues hold it), each with a row in ``queues`` with a setting, as a tenant's queue would
have; ``VACUUM ANALYZE``; then:

a. the claim of one queue (`Queue.claim`, batch 10, completed and replaced): median and p99;
b. ``trioq status`` as a subprocess (median wall time, and beyond ``trioq --version``);
c. the metrics' depth sample (`trioq._obs.depth`'s statements), median ms;
d. the dashboard's overview: ``trioq web`` on a free port, ``GET /`` (median, p95);
e. where there are 50 queues or more, a real ``trioq serve`` serving 50 of them
   (``--queues``), draining ``--drain-per-queue`` jobs of each: jobs/s.

Then one table, and each figure's ratio to the first count's (the goal: within 1.2x of one
queue's; the serve figure against the first count with 50 queues).

Usage::

    python bench/bench_queues.py --dsn "$(trioq db url)" --json queues.json
    python bench/bench_queues.py --counts 1,100 --repeat 50   # smoke run
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from _common import (
    Table,
    default_dsn,
    drop_schema,
    fmt,
    fresh_schema,
    int_list,
    serve_process,
    time_page,
    write_report,
)
from bench_backlog import DEPTH_STATEMENTS, percentiles
from psycopg import sql

import trioq
from trioq import Lease, Queue
from trioq._db.sql.status import DEPTH_CAP
from trioq._db.sql.status import MAX_DEPTH_QUEUES as MAX_QUEUES
from trioq._db.statements import statements

SCHEMA = "bench_queues"
TASK = "bench.noop"
LEASE = dt.timedelta(seconds=60)
HERE = Path(__file__).resolve().parent
TRIOQ = (sys.executable, "-m", "trioq._cli")
SERVED = 50

Conn = Any


def queue_name(i: int) -> str:
    return f"tenant_{i:05d}"


async def fill(conn: Conn, count: int, jobs_total: int) -> None:
    await fresh_schema(conn, SCHEMA)
    jobs, queues = sql.Identifier(SCHEMA, "jobs"), sql.Identifier(SCHEMA, "queues")
    await conn.execute(sql.SQL(
        "INSERT INTO {} (queue, task, args) SELECT 'tenant_' || lpad(q::text, 5, '0'), %s, '{{}}'"
        "  FROM generate_series(0, %s - 1) q, generate_series(1, %s) n").format(jobs),
        (TASK, count, max(1, jobs_total // count)))  # fmt: skip
    await conn.execute(sql.SQL(
        "INSERT INTO {} (name, global_concurrency) SELECT 'tenant_' || lpad(q::text, 5, '0'), 100"
        "  FROM generate_series(0, %s - 1) q").format(queues), (count,))  # fmt: skip
    await conn.execute(sql.SQL("VACUUM ANALYZE {}").format(jobs))


async def claims(conn: Conn, q: Queue, repeat: int) -> dict[str, float]:
    walls = []
    name = queue_name(0)
    for _ in range(repeat):
        t0 = time.perf_counter()
        jobs = await q.claim(conn, name, owner="bench-queues", limit=10, lease=LEASE)
        walls.append(time.perf_counter() - t0)
        await q.complete_many(conn, owner="bench-queues",
                              leases=[Lease(j.id, j.attempt) for j in jobs])  # fmt: skip
        await q.enqueue_bulk(conn, TASK, [{}] * len(jobs), queue=name)
    return percentiles(walls)


def cli_median(args: list[str], dsn: str, runs: int) -> tuple[float, float]:
    """Median wall seconds of ``trioq <args>``, and of its excess over ``trioq --version``."""
    walls, excess = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([*TRIOQ, "--version"], capture_output=True, check=True)
        t1 = time.perf_counter()
        done = subprocess.run([*TRIOQ, *args, "--dsn", dsn, "--schema", SCHEMA],
                              capture_output=True, text=True, check=False)  # fmt: skip
        t2 = time.perf_counter()
        if done.returncode != 0:
            raise RuntimeError(f"trioq {args} exited {done.returncode}: {done.stderr}")
        walls.append(t2 - t1)
        excess.append((t2 - t1) - (t1 - t0))
    return statistics.median(walls), statistics.median(excess)


async def depth(conn: Conn, runs: int) -> float:
    obs = statements(SCHEMA)
    params = {"cap": DEPTH_CAP, "max_queues": MAX_QUEUES}
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for name in DEPTH_STATEMENTS:
            await (await conn.execute(getattr(obs, name), params)).fetchall()
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls) * 1e3


def overview(dsn: str, requests: int) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
        proc = subprocess.Popen([*TRIOQ, "web", "--dsn", dsn, "--schema", SCHEMA, "--bind",
                                 "127.0.0.1:0"], stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            url = None
            while url is None and time.monotonic() < deadline:
                for line in Path(log.name).read_text().splitlines():
                    if line.startswith("trioq web: serving "):
                        url = line.split()[3].rstrip("/")
                if proc.poll() is not None:
                    raise RuntimeError(f"trioq web exited: {Path(log.name).read_text()}")
                time.sleep(0.05)
            if url is None:
                raise RuntimeError("trioq web did not start")
            host, port = url.removeprefix("http://").split(":")
            return time_page(host, int(port), "/", requests)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


async def drain(dsn: str, conn: Conn, per_queue: int) -> float:
    """Jobs/s of one serve process serving `SERVED` queues, each given ``per_queue`` jobs."""
    served = [queue_name(i) for i in range(SERVED)]
    q = Queue(schema=SCHEMA)
    jobs = sql.Identifier(SCHEMA, "jobs")
    await conn.execute(sql.SQL("DELETE FROM {} WHERE queue = ANY(%s)").format(jobs), (served,))
    async with conn.transaction():
        for name in served:
            await q.enqueue_bulk(conn, TASK, [{}] * per_queue, queue=name)
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    cmd = [*TRIOQ, "serve", "--app", "backlog_app:tasks", "--dsn", dsn, "--schema", SCHEMA,
           "--queues", ",".join(served)]  # fmt: skip
    left = sql.SQL("SELECT count(*) FROM {} WHERE queue = ANY(%s)").format(jobs)
    total = per_queue * SERVED
    async with serve_process(cmd, env):
        t0 = None
        with trio.fail_after(300):
            while True:
                n = (await (await conn.execute(left, (served,))).fetchone() or [0])[0]
                if t0 is None and n < total:
                    t0 = time.perf_counter()  # the first job done: the process is ready
                    first = total - n
                if n == 0:
                    break
                await trio.sleep(0.02)
        assert t0 is not None
        wall = time.perf_counter() - t0
    return float(total - first) / wall


async def one_count(dsn: str, count: int, opts: argparse.Namespace) -> dict[str, Any]:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await fill(conn, count, opts.jobs)
        q = Queue(schema=SCHEMA)
        claim = await claims(conn, q, opts.repeat)
        status, status_beyond = await trio.to_thread.run_sync(
            cli_median, ["status"], dsn, opts.cli_runs)  # fmt: skip
        depth_ms = await depth(conn, max(5, opts.cli_runs))
        page = await trio.to_thread.run_sync(overview, dsn, opts.web_requests)
        jobs_s = await drain(dsn, conn, opts.drain_per_queue) if count >= SERVED else None
    return {"count": count, "claim_ms": claim, "status_s": status,
            "status_beyond_start_s": status_beyond, "depth_ms": depth_ms, "overview": page,
            "serve_50_jobs_s": jobs_s}  # fmt: skip


def report(results: list[dict[str, Any]]) -> None:
    base = results[0]
    serve_base = next((r["serve_50_jobs_s"] for r in results if r["serve_50_jobs_s"]), None)
    table = Table([("queues", 6, ">"), ("claim p50 ms", 12, ">"), ("p99", 6, ">"),
                   ("status beyond start s", 21, ">"), ("depth ms", 8, ">"),
                   ("overview ms", 11, ">"), ("serve 50 q jobs/s", 17, ">")],
                  markdown=True)  # fmt: skip

    def cell(value: float | None, first: float | None, spec: str) -> str:
        if value is None or not first:
            return fmt(value, spec)
        return f"{fmt(value, spec)} ({value / first:.2f}x)"

    rows = [[fmt(r["count"]),
             cell(r["claim_ms"]["median"], base["claim_ms"]["median"], ".2f"),
             fmt(r["claim_ms"]["p99"], ".2f"),
             cell(r["status_beyond_start_s"], base["status_beyond_start_s"], ".3f"),
             cell(r["depth_ms"], base["depth_ms"], ".2f"),
             cell(r["overview"]["median_ms"], base["overview"]["median_ms"], ".1f"),
             cell(r["serve_50_jobs_s"], serve_base, ",.0f")]
            for r in results]  # fmt: skip
    print(table.render(rows))


async def main(opts: argparse.Namespace) -> None:
    results = []
    for count in opts.counts:
        result = await one_count(opts.dsn, count, opts)
        print(result, flush=True)
        results.append(result)
    await drop_schema(opts.dsn, SCHEMA)
    report(results)
    if opts.json:
        write_report(opts.json, opts, results)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=default_dsn())
    parser.add_argument("--counts", type=int_list, default=[1, 1000, 10000])
    parser.add_argument("--jobs", type=int, default=100_000, help="the backlog, all queues")
    parser.add_argument("--repeat", type=int, default=300, help="claims per count")
    parser.add_argument("--cli-runs", type=int, default=5)
    parser.add_argument("--web-requests", type=int, default=20)
    parser.add_argument("--drain-per-queue", type=int, default=200)
    parser.add_argument("--json", type=Path)
    return parser.parse_args()


if __name__ == "__main__":
    trio.run(main, parse())
