"""The floor of `bench/bench_enqueue_peers.py`'s single enqueue (``--batch 1`` only): trioq's
own insert-and-notify statement, prepared once per producer connection with one job's
parameters adapted once, sent through libpq's calls on trio (`_libpq`). Same output as
``trioq_enqueue.py``: one JSON line, wall seconds and this process's CPU seconds.

    python bench/peers/floor_enqueue.py --dsn DSN --jobs N [--producers P]
"""

from __future__ import annotations

import argparse
import json
import time

import trio
from _libpq import Prepared

import trioq
from trioq._db import insert
from trioq._db.statements import rendered, statements
from trioq._job import JobSpec


def _insert(conn: trioq.TrioConnection) -> Prepared:
    sql = statements("trioq")
    spec = JobSpec(task="t", args={"n": 1})
    params = {**insert._one_job(sql, spec, True), "dedup_key": None, "trace": None}
    return Prepared(conn, b"floor_insert", rendered("trioq", "insert"), params)


async def produce(statement: Prepared, count: int) -> None:
    for _ in range(count):
        await statement.run()


async def main(dsn: str, jobs: int, producers: int) -> None:
    conns = [await trioq.connect(dsn, autocommit=True) for _ in range(producers)]
    try:
        await trioq.migrate(conns[0])
        statements_ = [_insert(conn) for conn in conns]
        for statement in statements_:
            await statement.run()  # warm
        share = jobs // producers
        cpu0, t0 = time.process_time(), time.perf_counter()
        async with trio.open_nursery() as nursery:
            for statement in statements_:
                nursery.start_soon(produce, statement, share)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        for conn in conns:
            await conn.close()
    print(json.dumps({"wall": wall, "cpu": cpu, "jobs": share * producers}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=1, choices=[1])
    parser.add_argument("--producers", type=int, default=1)
    args = parser.parse_args()
    trio.run(main, args.dsn, args.jobs, args.producers)
