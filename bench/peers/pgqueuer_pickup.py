"""pgqueuer's side of `bench/bench_pickup_peers.py`, run by the Python of its venv: idle
pickup. One ``QueueManager`` (continuous mode, its defaults, on its own asyncpg connection,
uvloop as ``pgq run`` uses) and, in the same process, a producer on another connection:
``--jobs`` times, wait ``--gap`` ms (randomized +-50 %, seeded), then ``await
Queries.enqueue("pick", payload, 0)`` (its insert; its trigger sends the notification) and
wait for the handler to start. Latency: the ``perf_counter`` just before the enqueue call to
the handler's first line. Prints one JSON line with every latency in ms.

    python bench/peers/pgqueuer_pickup.py --dsn DSN --jobs N --gap MS
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import uvloop
from pgqueuer import AsyncpgDriver, Queries, QueueManager
from pgqueuer.models import Job
from pgqueuer_enqueue import _connect


async def main(dsn: str, jobs: int, gap_ms: float) -> None:
    rng = random.Random(15)
    started: list[float] = []
    arrived = [asyncio.Event()]
    worker_conn, producer_conn = await _connect(dsn), await _connect(dsn)
    latencies: list[float] = []
    try:
        producer = Queries(AsyncpgDriver(producer_conn))
        await producer.install()
        qm = QueueManager(Queries(AsyncpgDriver(worker_conn)))

        async def pick(job: Job) -> None:
            started.append(time.perf_counter())
            arrived[0].set()

        qm.entrypoint("pick")(pick)
        worker = asyncio.create_task(qm.run())
        await producer.enqueue("pick", None, 0)  # warm both sides
        await arrived[0].wait()
        for i in range(jobs):
            await asyncio.sleep(gap_ms * rng.uniform(0.5, 1.5) / 1000)
            arrived[0] = asyncio.Event()
            t0 = time.perf_counter()
            await producer.enqueue("pick", json.dumps({"n": i}).encode(), 0)
            await arrived[0].wait()
            latencies.append((started[-1] - t0) * 1000)
        qm.shutdown.set()
        await worker
    finally:
        await producer_conn.close()
        await worker_conn.close()
    print(json.dumps({"latencies_ms": latencies}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--gap", type=float, default=20.0)
    args = parser.parse_args()
    uvloop.run(main(args.dsn, args.jobs, args.gap))
