"""trioq's side of `bench/bench_enqueue_peers.py`: ``--jobs`` jobs enqueued by ``--producers``
connections of one process, concurrently, each autocommit, into a database it migrates first
with whatever trioq this Python imports (so another checkout's venv measures that checkout).
``--batch 1``: ``await trioq.enqueue(conn, "t", {"n": i})`` per job (one statement, one
round trip each); ``--batch B``: ``await trioq.enqueue_bulk(conn, "t", args)`` of B jobs per
call. Prints one JSON line: wall seconds and this process's CPU seconds.

    python bench/peers/trioq_enqueue.py --dsn DSN --jobs N [--batch B] [--producers P]
"""

from __future__ import annotations

import argparse
import json
import time

import trio

import trioq


async def produce(conn: trioq.TrioConnection, first: int, count: int, batch: int) -> None:
    if batch == 1:
        for i in range(first, first + count):
            await trioq.enqueue(conn, "t", {"n": i})
        return
    for start in range(first, first + count, batch):
        args = [{"n": i} for i in range(start, min(start + batch, first + count))]
        await trioq.enqueue_bulk(conn, "t", args)


async def main(dsn: str, jobs: int, batch: int, producers: int) -> None:
    conns = [await trioq.connect(dsn, autocommit=True) for _ in range(producers)]
    try:
        await trioq.migrate(conns[0])
        for conn in conns:
            await trioq.enqueue(conn, "warm")  # the version check and first statement
            if batch > 1:
                await trioq.enqueue_bulk(conn, "warm", [{}] * batch)
        share = jobs // producers
        cpu0, t0 = time.process_time(), time.perf_counter()
        async with trio.open_nursery() as nursery:
            for k, conn in enumerate(conns):
                nursery.start_soon(produce, conn, k * share, share, batch)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        for conn in conns:
            await conn.close()
    print(json.dumps({"wall": wall, "cpu": cpu, "jobs": share * producers}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--producers", type=int, default=1)
    args = parser.parse_args()
    trio.run(main, args.dsn, args.jobs, args.batch, args.producers)
