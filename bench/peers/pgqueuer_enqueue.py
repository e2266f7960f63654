"""pgqueuer's side of `bench/bench_enqueue_peers.py`, run by the Python of its venv: ``--jobs``
jobs enqueued by ``--producers`` asyncpg connections of one process, concurrently (uvloop, as
``pgq run`` uses), after installing pgqueuer's schema. ``--batch 1``: ``await
Queries.enqueue("t", payload, 0)`` per job; ``--batch B``: ``Queries.enqueue`` with lists of B
entrypoints, payloads and priorities per call (its bulk form). ``--pool K``: the
``--producers`` tasks share an asyncpg pool of K connections (``AsyncpgPoolDriver``) instead of
a connection each (`bench/bench_producers.py` tries both). Prints one JSON line: wall seconds
and this process's CPU seconds.

    python bench/peers/pgqueuer_enqueue.py --dsn DSN --jobs N [--batch B] [--producers P] [--pool K]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import asyncpg
import uvloop
from pgqueuer import AsyncpgDriver, AsyncpgPoolDriver, Queries


async def produce(queries: Queries, first: int, count: int, batch: int) -> None:
    if batch == 1:
        for i in range(first, first + count):
            await queries.enqueue("t", json.dumps({"n": i}).encode(), 0)
        return
    for start in range(first, first + count, batch):
        ns = range(start, min(start + batch, first + count))
        payloads: list[bytes | None] = [json.dumps({"n": i}).encode() for i in ns]
        await queries.enqueue(["t"] * len(payloads), payloads, [0] * len(payloads))


async def pooled(dsn: str, jobs: int, batch: int, producers: int, size: int) -> None:
    pool = await asyncpg.create_pool(min_size=size, max_size=size, **_keywords(dsn))
    try:
        queries = Queries(AsyncpgPoolDriver(pool))
        await queries.install()
        await asyncio.gather(*(queries.enqueue("warm", None, 0) for _ in range(size)))
        share = jobs // producers
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(produce(queries, k * share, share, batch) for k in range(producers)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        await pool.close()
    print(json.dumps({"wall": wall, "cpu": cpu, "jobs": share * producers}))


async def main(dsn: str, jobs: int, batch: int, producers: int) -> None:
    conns = [await _connect(dsn) for _ in range(producers)]
    try:
        every = [Queries(AsyncpgDriver(conn)) for conn in conns]
        await every[0].install()
        for queries in every:
            await queries.enqueue("warm", None, 0)
        share = jobs // producers
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(
            *(produce(q, k * share, share, batch) for k, q in enumerate(every))
        )
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        for conn in conns:
            await conn.close()
    print(json.dumps({"wall": wall, "cpu": cpu, "jobs": share * producers}))


async def _connect(dsn: str) -> asyncpg.Connection:
    """asyncpg takes URLs only: a libpq ``key=value`` DSN (as psycopg prints them) is split
    into keywords."""
    return await asyncpg.connect(**_keywords(dsn))


def _keywords(dsn: str) -> dict[str, str]:
    if "://" in dsn:
        return {"dsn": dsn}
    names = {"dbname": "database"}
    fields = dict(part.split("=", 1) for part in dsn.split())
    return {names.get(k, k): v for k, v in fields.items()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--producers", type=int, default=1)
    parser.add_argument("--pool", type=int, default=0)
    args = parser.parse_args()
    if args.pool:
        uvloop.run(pooled(args.dsn, args.jobs, args.batch, args.producers, args.pool))
    else:
        uvloop.run(main(args.dsn, args.jobs, args.batch, args.producers))
