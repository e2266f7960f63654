"""trioq's side of `bench/bench_pickup_peers.py`: idle pickup. One worker (``trioq.serve``,
default settings, one queue of 10 slots) and, in the same process, a producer on its own
autocommit connection: ``--jobs`` times, wait ``--gap`` ms (randomized +-50 %, seeded) so
the worker is idle again, then ``await trioq.enqueue(conn, "pick", ...)`` (the insert and its
notification, one statement) and wait for the handler to start. Latency: the ``perf_counter``
just before the enqueue call to the handler's first line. Prints one JSON line with every
latency in ms.

    python bench/peers/trioq_pickup.py --dsn DSN --jobs N --gap MS
"""

from __future__ import annotations

import argparse
import json
import random
import time

import trio

import trioq

tasks = trioq.Registry()
started: list[float] = []
arrived = [trio.Event()]


@tasks.task(name="pick", queue="bench")
async def pick(job: trioq.JobContext, n: int) -> None:
    started.append(time.perf_counter())
    arrived[0].set()


async def main(dsn: str, jobs: int, gap_ms: float) -> None:
    arrived[0] = trio.Event()
    rng = random.Random(15)
    latencies: list[float] = []
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        config = trioq.Config(registry=tasks, dsn=dsn,
                              queues={"bench": trioq.QueueConfig(concurrency=10)})  # fmt: skip
        async with trio.open_nursery() as nursery:
            runtime = await nursery.start(trioq.serve, config)
            await trioq.enqueue(conn, "pick", {"n": -1}, queue="bench")  # warm both sides
            await arrived[0].wait()
            for i in range(jobs):
                await trio.sleep(gap_ms * rng.uniform(0.5, 1.5) / 1000)
                arrived[0] = trio.Event()
                t0 = time.perf_counter()
                await trioq.enqueue(conn, "pick", {"n": i}, queue="bench")
                await arrived[0].wait()
                latencies.append((started[-1] - t0) * 1000)
            runtime.stop()
    print(json.dumps({"latencies_ms": latencies}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--gap", type=float, default=20.0)
    args = parser.parse_args()
    trio.run(main, args.dsn, args.jobs, args.gap)
