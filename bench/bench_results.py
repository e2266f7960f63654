"""What results cost (not a test): kept results, waited-for jobs, and enqueue -> result latency.

Two measurements, each on a fresh scratch database, with one `trioq.serve` worker
(``--concurrency`` slots) in this process:

1. **drain**: ``--jobs`` no-op jobs prefilled with `trioq.enqueue_bulk`, then timed from
   the worker's start until no job is live (a second connection polls every 5 ms). Three
   kinds, interleaved ``--repeat`` times: ``plain`` (the row is deleted), ``kept``
   (``keep_result=True``: the row stays ``done``), ``plain, triggers off`` (migration
   0002's two triggers disabled: what ordinary jobs cost before them), ``kept+waited``
   (every row flagged as a `trioq.result` waiter would flag it, so every completion
   batch notifies).
2. **statements**: the server's own execution time (``EXPLAIN ANALYZE``) of the claim and
   the completion of 1,000 jobs, with migration 0002's triggers enabled and disabled,
   interleaved ``--repeat`` x 3 times: the cost of the triggers without the client's noise.
3. **round trip**: ``--clients`` tasks each enqueue one kept job and `trioq.result` it, in a
   loop, for ``--seconds``; latency percentiles and round trips per second.

Usage::

    python bench/bench_results.py --dsn postgresql://postgres@/postgres?host=/tmp/pg
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg
import trio
from _common import add_common_options, create_bench_db, drop_bench_db
from psycopg import sql

import trioq

DB = "trioq_bench_results"
KINDS = ("plain", "plain, triggers off", "kept", "kept+waited")
TRIGGERS = {
    "DISABLE": "ALTER TABLE trioq.jobs DISABLE TRIGGER jobs_finished_notify,"
    " DISABLE TRIGGER jobs_deleted_notify",
    "ENABLE": "ALTER TABLE trioq.jobs ENABLE TRIGGER jobs_finished_notify,"
    " ENABLE TRIGGER jobs_deleted_notify",
}


def registry() -> trioq.Registry:
    tasks = trioq.Registry()

    @tasks.task(queue="bench")
    async def plain(job: trioq.JobContext) -> None:
        return None

    @tasks.task(queue="bench", keep_result=True)
    async def kept(job: trioq.JobContext) -> int:
        return job.id

    return tasks


def config(dsn: str, concurrency: int) -> trioq.Config:
    return trioq.Config(
        dsn=dsn, registry=registry(), queues={"bench": trioq.QueueConfig(concurrency=concurrency)},
        prune_interval=None,
    )  # fmt: skip


async def drain(dsn: str, kind: str, jobs: int, concurrency: int) -> float:
    """Seconds to drain ``jobs`` jobs of ``kind`` with one worker."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        await conn.execute("TRUNCATE trioq.jobs")
        task = "plain" if kind.startswith("plain") else "kept"
        enable = "DISABLE" if kind == "plain, triggers off" else "ENABLE"
        await conn.execute(TRIGGERS[enable])
        await trioq.enqueue_bulk(conn, task, [{}] * jobs, queue="bench")
        if kind == "kept+waited":
            await conn.execute("UPDATE trioq.jobs SET notify_finished = true")
        await conn.execute("VACUUM ANALYZE trioq.jobs")
        async with trio.open_nursery() as nursery:
            start = time.perf_counter()
            runtime = await nursery.start(trioq.serve, config(dsn, concurrency))
            while True:
                cur = await conn.execute(
                    "SELECT count(*) FROM trioq.jobs WHERE state NOT IN ('done', 'cancelled')"
                )
                row = await cur.fetchone()
                if row == (0,):
                    break
                await trio.sleep(0.005)
            took = time.perf_counter() - start
            runtime.stop()
    return took


async def statement_ms(dsn: str, triggers: bool, batch: int = 1000) -> tuple[float, float]:
    """Server execution ms of one claim and one completion of ``batch`` jobs."""
    queue = trioq.Queue()
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await conn.execute(TRIGGERS["ENABLE" if triggers else "DISABLE"])
        await conn.execute("TRUNCATE trioq.jobs")
        await trioq.enqueue_bulk(conn, "plain", [{}] * batch, queue="bench")
        await conn.execute("VACUUM ANALYZE trioq.jobs")
        cur = psycopg.AsyncClientCursor(conn)
        explain = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ")
        lease = dt.timedelta(seconds=30)
        params = {"queue": "bench", "owner": "w", "limit": batch, "lease": lease}
        await cur.execute(explain + queue.sql.claim, params)
        claim = await cur.fetchone()
        ids = [r[0] for r in await (await conn.execute("SELECT id FROM trioq.jobs")).fetchall()]
        params = {"ids": ids, "attempts": [1] * len(ids), "owner": "w"}
        await cur.execute(explain + queue.sql.complete, params)
        complete = await cur.fetchone()
        await conn.execute(TRIGGERS["ENABLE"])
    assert claim is not None and complete is not None
    return claim[0][0]["Execution Time"], complete[0][0]["Execution Time"]


async def round_trips(dsn: str, clients: int, seconds: float, concurrency: int) -> list[float]:
    """Latencies (s) of enqueue -> result by ``clients`` concurrent loops."""
    latencies: list[float] = []
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        await conn.execute("TRUNCATE trioq.jobs")
    async with trio.open_nursery() as nursery:
        runtime = await nursery.start(trioq.serve, config(dsn, concurrency))
        deadline = trio.current_time() + seconds

        async def client() -> None:
            async with await trioq.connect(dsn, autocommit=True) as conn:
                while trio.current_time() < deadline:
                    start = time.perf_counter()
                    job = await trioq.enqueue(conn, "kept", queue="bench")
                    await trioq.result(conn, job.job_id, timeout=30)
                    latencies.append(time.perf_counter() - start)

        async with trio.open_nursery() as loops:
            for _ in range(clients):
                loops.start_soon(client)
        runtime.stop()
    return latencies


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def run(fn: Callable[..., Any], *args: Any) -> Any:
    return trio.run(fn, *args)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_common_options(p, creates=DB, repeat=3, quiet_cores=0.3, quiet_wait=0, pgbench=False)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 20])
    p.add_argument("--seconds", type=float, default=5.0)
    a = p.parse_args()
    dsn = run(create_bench_db, a.dsn, DB)
    try:
        took: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for _ in range(a.repeat):
            for kind in KINDS:
                took[kind].append(run(drain, dsn, kind, a.jobs, a.concurrency))
        print(f"drain of {a.jobs} no-op jobs, concurrency {a.concurrency}, {a.repeat} runs each")
        print(f"  {'kind':<20} {'jobs/s (median)':>16}  runs")
        for kind in KINDS:
            rates = [a.jobs / t for t in took[kind]]
            runs = ", ".join(f"{r:,.0f}" for r in rates)
            print(f"  {kind:<20} {statistics.median(rates):>16,.0f}  {runs}")
        exec_ms: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for _ in range(3 * a.repeat):
            for triggers in (False, True):
                exec_ms[triggers].append(run(statement_ms, dsn, triggers))
        print("\nserver execution of 1,000 jobs' claim and completion (median ms)")
        for triggers in (False, True):
            claim = statistics.median(x[0] for x in exec_ms[triggers])
            done = statistics.median(x[1] for x in exec_ms[triggers])
            label = "triggers on" if triggers else "triggers off"
            print(f"  {label:<13} claim {claim:6.2f}  complete {done:6.2f}")
        print(f"\nenqueue -> trioq.result round trips, {a.seconds:g} s each")
        print(f"  {'clients':>7} {'trips/s':>8} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7}")
        for clients in a.clients:
            lat = run(round_trips, dsn, clients, a.seconds, a.concurrency)
            ms = [x * 1000 for x in lat]
            print(f"  {clients:>7} {len(lat) / a.seconds:>8,.0f} {percentile(ms, 50):>7.1f} "
                  f"{percentile(ms, 90):>7.1f} {percentile(ms, 99):>7.1f}")  # fmt: skip
    finally:
        run(drop_bench_db, a.dsn, DB)


if __name__ == "__main__":
    main()
