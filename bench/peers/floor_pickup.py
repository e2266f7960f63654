"""The floor of `bench/bench_pickup_peers.py`'s idle pickup: trioq's own insert-and-notify and
claim statements, prepared once (`_libpq`), a third connection that LISTENs; no runtime,
nothing of psycopg's Python per call. ``--jobs`` times: wait ``--gap`` ms (randomized +-50 %,
the same seeded sequence as the other cells), send the insert, and as soon as its
notification arrives send the claim. Latency: just before the insert is sent to the claim's
answer (where trioq's latency ends at its handler's first line). Prints one JSON line with
every latency in ms.

    python bench/peers/floor_pickup.py --dsn DSN --jobs N --gap MS
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import time

import trio
from _libpq import Prepared

import trioq
from trioq._db import insert
from trioq._db.statements import rendered, statements
from trioq._job import JobSpec

OWNER = "floor"


async def _notified(conn: trioq.TrioConnection) -> None:
    pgconn = conn.pgconn
    while True:
        pgconn.consume_input()
        if pgconn.notifies() is not None:
            return
        await trio.lowlevel.wait_readable(pgconn.socket)


async def main(dsn: str, jobs: int, gap_ms: float) -> None:
    producer, claimer, listener = [await trioq.connect(dsn, autocommit=True) for _ in range(3)]
    try:
        await trioq.migrate(producer)
        sql = statements("trioq")
        await listener.execute(f"LISTEN {sql.channel}")
        spec = JobSpec(task="pick", queue="bench", args={"n": 1})
        params = {**insert._one_job(sql, spec, True), "dedup_key": None, "trace": None}
        enqueue = Prepared(producer, b"floor_insert", rendered("trioq", "insert"), params)
        claim = Prepared(claimer, b"floor_claim", rendered("trioq", "claim"), {
            "queue": "bench", "owner": OWNER, "limit": 10, "lease": dt.timedelta(seconds=30)})
        listener.pgconn.nonblocking = 1
        rng = random.Random(15)
        latencies: list[float] = []
        for i in range(jobs + 1):  # the first warms every connection
            await trio.sleep(gap_ms * rng.uniform(0.5, 1.5) / 1000)
            t0 = time.perf_counter()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(enqueue.run)
                await _notified(listener)
                claimed = await claim.run()
                t1 = time.perf_counter()
            if claimed.ntuples != 1:
                raise RuntimeError(f"the claim took {claimed.ntuples} jobs, not 1")
            if i:
                latencies.append((t1 - t0) * 1000)
    finally:
        for conn in (producer, claimer, listener):
            await conn.close()
    print(json.dumps({"latencies_ms": latencies}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--gap", type=float, default=20.0)
    args = parser.parse_args()
    trio.run(main, args.dsn, args.jobs, args.gap)
