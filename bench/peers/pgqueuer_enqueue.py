"""pgqueuer's side of `bench/bench_single_enqueue.py`, run by the Python of its venv:
``--jobs`` calls of ``await Queries.enqueue("t", payload, 0)`` (one job per call) on one
asyncpg connection (uvloop, as ``pgq run`` uses), after installing pgqueuer's schema.
Prints one JSON line: wall seconds and this process's CPU seconds.

    python bench/peers/pgqueuer_enqueue.py --dsn DSN --jobs N
"""

from __future__ import annotations

import argparse
import json
import time

import asyncpg
import uvloop
from pgqueuer import AsyncpgDriver, Queries


async def main(dsn: str, jobs: int) -> None:
    conn = await _connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        await queries.enqueue("warm", None, 0)
        cpu0, t0 = time.process_time(), time.perf_counter()
        for i in range(jobs):
            await queries.enqueue("t", json.dumps({"n": i}).encode(), 0)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        await conn.close()
    print(json.dumps({"wall": wall, "cpu": cpu, "jobs": jobs}))


async def _connect(dsn: str) -> asyncpg.Connection:
    """asyncpg takes URLs only: a libpq ``key=value`` DSN (as psycopg prints them) is split
    into keywords."""
    if "://" in dsn:
        return await asyncpg.connect(dsn)
    names = {"dbname": "database"}
    fields = dict(part.split("=", 1) for part in dsn.split())
    return await asyncpg.connect(**{names.get(k, k): v for k, v in fields.items()})


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=5000)
    args = parser.parse_args()
    uvloop.run(main(args.dsn, args.jobs))
