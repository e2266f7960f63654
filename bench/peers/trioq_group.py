"""trioq's side of `bench/bench_producers.py`: ``--jobs`` single jobs enqueued by
``--producers`` trio tasks of one process, into a database it migrates first.

``--mode group``: the tasks share `trioq.open_group_producer` on one pool of ``--pool``
connections (``--flushers`` batches in flight); ``--mode pool``: each call is
``trioq.enqueue`` on a connection of that pool (autocommit: one transaction per job);
``--mode bulk``: one task, ``trioq.enqueue_bulk`` of ``--batch`` jobs per call (the ceiling
the group producer is compared with). Prints one JSON line: wall seconds, this process's
CPU seconds, and for ``group`` the batches it committed.

    python bench/peers/trioq_group.py --dsn DSN --jobs N --mode group --producers 100
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import trio

import trioq
from trioq.pg import Pool


async def main(args: argparse.Namespace) -> None:
    async with await trioq.connect(args.dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
    extra: dict[str, Any] = {}
    share = args.jobs // args.producers
    async with Pool(args.dsn, max_size=args.pool, connect_kwargs={"autocommit": True}) as pool:
        async with pool.connection() as conn:
            await trioq.enqueue(conn, "warm")
        if args.mode == "group":
            async with trioq.open_group_producer(pool, flushers=args.flushers) as producer:

                async def produce(first: int) -> None:
                    for i in range(first, first + share):
                        await producer.enqueue("t", {"n": i})

                await producer.enqueue("warm")
                cpu0, t0 = time.process_time(), time.perf_counter()
                async with trio.open_nursery() as nursery:
                    for k in range(args.producers):
                        nursery.start_soon(produce, k * share)
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                stats = producer.statistics()
                extra = {"batches": stats.batches - 1, "largest": stats.largest_batch}
        elif args.mode == "pool":

            async def produce(first: int) -> None:
                for i in range(first, first + share):
                    async with pool.connection() as conn:
                        await trioq.enqueue(conn, "t", {"n": i})

            cpu0, t0 = time.process_time(), time.perf_counter()
            async with trio.open_nursery() as nursery:
                for k in range(args.producers):
                    nursery.start_soon(produce, k * share)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        else:
            share, jobs = args.jobs, args.jobs
            async with pool.connection() as conn:
                cpu0, t0 = time.process_time(), time.perf_counter()
                for start in range(0, jobs, args.batch):
                    values = [{"n": i} for i in range(start, min(start + args.batch, jobs))]
                    await trioq.enqueue_bulk(conn, "t", values)
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            print(json.dumps({"wall": wall, "cpu": cpu, "jobs": jobs}))
            return
    print(json.dumps({"wall": wall, "cpu": cpu, "jobs": share * args.producers, **extra}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--mode", choices=["group", "pool", "bulk"], default="group")
    parser.add_argument("--producers", type=int, default=100)
    parser.add_argument("--pool", type=int, default=8)
    parser.add_argument("--flushers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1000)
    trio.run(main, parser.parse_args())
