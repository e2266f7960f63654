"""trioq's side of `bench/bench_insert_peers.py`: one worker (``trioq.serve``, one queue of
``--concurrency`` slots, default pools) drains ``--jobs`` prefilled jobs, each writing one
ledger row in ``job.transaction(shared=False)`` (``--shared``: ``shared=True``; ``--default``:
no ``shared=``, so ``Config.group_commit`` decides), so the
row commits with the job's completion. Timed from the first handler call until no job is
left (polled every 2 ms on another connection once every handler was called). Prints one JSON line.

    python bench/peers/trioq_insert.py --dsn DSN --jobs N --concurrency C [--shared]
        [--slow-every N --slow-ms MS]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import trio
from _probe import server_cpu

import trioq

tasks = trioq.Registry()
started: list[float] = []
SHARED: list[bool | None] = [False]  # --shared: True; --default: None (Config.group_commit)
ONE = [False]  # --one: job.complete_with(statement)
SLOW: list[Any] = [0, 0.0]  # --slow-every N, --slow-ms: every Nth block sleeps in its transaction
TUNING: dict[str, Any] = {}  # Config fields from the command line (--lanes, ...)
JOBS = [0]  # --jobs
PG_PID = [0]  # --pg-pid: the postmaster, whose children's CPU is read (0: not local)


CALLS = [0]  # handler calls so far
ALL_CALLED: list[trio.Event] = []  # set once every job's handler was called


@tasks.task(name="insert", queue="bench")
async def insert(job: trioq.JobContext, n: int) -> None:
    CALLS[0] += 1
    if CALLS[0] == JOBS[0]:
        ALL_CALLED[0].set()
    if not started:
        started.append(time.perf_counter())
        started.append(time.process_time())
        started.append(server_cpu(PG_PID[0]))
    if ONE[0]:
        await job.complete_with(
            "INSERT INTO ledger (job_id, n) VALUES (%s, %s)", (job.id, n), shared=bool(SHARED[0])
        )
        return
    async with job.transaction(shared=SHARED[0]) as tx:
        await tx.execute("INSERT INTO ledger (job_id, n) VALUES (%s, %s)", (job.id, n))
        if SLOW[0] and n % SLOW[0] == 0:  # --slow-every: this block waits on something slow
            await trio.sleep(SLOW[1])


async def main(dsn: str, jobs: int, concurrency: int) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        await conn.execute("CREATE TABLE ledger (job_id bigint PRIMARY KEY, n int)")
        await trioq.enqueue_bulk(conn, "insert", [{"n": i} for i in range(jobs)], queue="bench")
        await conn.execute("VACUUM ANALYZE")
        config = trioq.Config(
            registry=tasks, dsn=dsn, queues={"bench": trioq.QueueConfig(concurrency=concurrency)},
            **TUNING,
        )
        JOBS[0] = jobs
        ALL_CALLED.append(trio.Event())
        async with trio.open_nursery() as nursery:
            runtime = await nursery.start(trioq.serve, config)
            # Poll for the last completion only once every handler ran: a poll every 2 ms
            # all along would cost the server CPU that the peer's run does not spend.
            await ALL_CALLED[0].wait()
            while True:
                cur = await conn.execute("SELECT count(*) FROM trioq.jobs")
                row = await cur.fetchone()
                if row is not None and row[0] == 0:
                    break
                await trio.sleep(0.002)
            wall, cpu = time.perf_counter() - started[0], time.process_time() - started[1]
            server = server_cpu(PG_PID[0]) - started[2]
            runtime.stop()
        cur = await conn.execute("SELECT count(*), count(DISTINCT job_id) FROM ledger")
        counted = await cur.fetchone()
        assert counted is not None
    print(json.dumps({"wall": wall, "cpu": cpu, "jobs": jobs, "rows": counted[0],
                      "distinct": counted[1],
                      "server_cpu": server if PG_PID[0] else None}))  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--shared", action="store_true")
    parser.add_argument("--default", action="store_true",
                        help="job.transaction() without shared=: the worker's default")
    parser.add_argument("--one", action="store_true", help="job.complete_with(the INSERT)")
    parser.add_argument("--lanes", type=int, help="Config.shared_transactions")
    parser.add_argument("--lane-jobs", type=int, help="Config.shared_transaction_jobs")
    parser.add_argument("--app-pool", type=int, help="Config.app_pool_size")
    parser.add_argument("--slow-every", type=int, default=0,
                        help="every Nth job's block sleeps --slow-ms inside its transaction")
    parser.add_argument("--slow-ms", type=float, default=200.0)
    parser.add_argument("--pg-pid", type=int, default=0,
                        help="the postmaster (local), to read the server's CPU per job")
    args = parser.parse_args()
    PG_PID[0] = args.pg_pid
    SLOW[:] = [args.slow_every, args.slow_ms / 1000]
    SHARED[0] = None if args.default else args.shared
    ONE[0] = args.one
    for field, value in (("shared_transactions", args.lanes),
                         ("shared_transaction_jobs", args.lane_jobs),
                         ("app_pool_size", args.app_pool)):  # fmt: skip
        if value is not None:
            TUNING[field] = value
    trio.run(main, args.dsn, args.jobs, args.concurrency)
