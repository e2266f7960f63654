"""trioq's side of `bench/bench_single_enqueue.py`: ``--jobs`` calls of
``await trioq.enqueue(conn, "t", {"n": i})`` on one autocommit connection, into a database
it migrates first with whatever trioq this Python imports (so another checkout's venv
measures that checkout). Prints one JSON line: wall seconds and this process's CPU seconds.

    python bench/peers/trioq_enqueue.py --dsn DSN --jobs N
"""

from __future__ import annotations

import argparse
import json
import time

import trio

import trioq


async def main(dsn: str, jobs: int) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        await trioq.enqueue(conn, "warm")  # the version check and first statement
        cpu0, t0 = time.process_time(), time.perf_counter()
        for i in range(jobs):
            await trioq.enqueue(conn, "t", {"n": i})
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(json.dumps({"wall": wall, "cpu": cpu, "jobs": jobs}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=5000)
    args = parser.parse_args()
    trio.run(main, args.dsn, args.jobs)
