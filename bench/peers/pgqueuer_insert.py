"""pgqueuer's side of `bench/bench_insert_peers.py`, run by the Python of its venv: one
``QueueManager`` on one asyncpg connection (uvloop, ``mode=drain``) drains ``--jobs``
prefilled jobs, each writing one ledger row on a connection of an asyncpg pool of
``--pool`` (10) connections, autocommit: pgqueuer has no way to commit it with the job's
completion, which it writes on its own connection afterwards (at least once, not exactly
once). Timed from the first handler call until ``run`` returns (the queue is empty and
pgqueuer has flushed its completions). Prints one JSON line.

    python bench/peers/pgqueuer_insert.py --dsn DSN --jobs N --batch B [--concurrency C]
"""

from __future__ import annotations

import argparse
import json
import time

import asyncpg
import uvloop
from _probe import server_cpu
from pgqueuer import AsyncpgDriver, Queries, QueueManager
from pgqueuer.domain.types import QueueExecutionMode
from pgqueuer.models import Job
from pgqueuer_enqueue import _connect


async def main(
    dsn: str, jobs: int, batch: int, concurrency: int, pool_size: int, *, pg_pid: int
) -> None:
    conn = await _connect(dsn)
    kwargs = {"dsn": dsn} if "://" in dsn else {
        {"dbname": "database"}.get(k, k): v for k, v in (p.split("=", 1) for p in dsn.split())
    }  # fmt: skip
    pool = await asyncpg.create_pool(min_size=pool_size, max_size=pool_size, **kwargs)
    started: list[float] = []
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        await conn.execute("CREATE TABLE ledger (job_id bigint PRIMARY KEY, n int)")
        payloads: list[bytes | None] = [json.dumps({"n": i}).encode() for i in range(jobs)]
        await queries.enqueue(["insert"] * jobs, payloads, [0] * jobs)
        await conn.execute("VACUUM ANALYZE")
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        async def insert(job: Job) -> None:
            if not started:
                started.extend((time.perf_counter(), time.process_time(), server_cpu(pg_pid)))
            n = json.loads(job.payload or b"{}")["n"]
            await pool.execute("INSERT INTO ledger (job_id, n) VALUES ($1, $2)", job.id, n)

        qm.entrypoint("insert")(insert)
        await qm.run(batch_size=batch, mode=QueueExecutionMode.drain,
                     max_concurrent_tasks=concurrency or None)  # fmt: skip
        wall, cpu = time.perf_counter() - started[0], time.process_time() - started[1]
        server = server_cpu(pg_pid) - started[2]
        counted = await conn.fetchrow("SELECT count(*), count(DISTINCT job_id) FROM ledger")
    finally:
        await pool.close()
        await conn.close()
    print(json.dumps({"wall": wall, "cpu": cpu, "jobs": jobs, "rows": counted[0],
                      "distinct": counted[1],
                      "server_cpu": server if pg_pid else None}))  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=0)
    parser.add_argument("--pool", type=int, default=10)
    parser.add_argument("--pg-pid", type=int, default=0,
                        help="the postmaster (local), to read the server's CPU per job")
    args = parser.parse_args()
    uvloop.run(main(args.dsn, args.jobs, args.batch, args.concurrency, args.pool,
                    pg_pid=args.pg_pid))
