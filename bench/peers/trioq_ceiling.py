"""Two ceilings that bound trioq's burn-down in `bench/bench_peers.py` (prints numbers).

    python bench/peers/trioq_ceiling.py [--dsn ADMIN_DSN] [--jobs N] [--prototype NAME]
                                         [--only queue|runtime]

1. The queue layer alone: ``Queue.claim(limit=B)`` then ``Queue.complete_many`` of those
   leases, in a loop on one connection, no runtime (what pgbench does, through psycopg).
2. The runtime alone: ``trioq.serve`` with ``Driver.claim`` and ``Driver.complete_many``
   replaced by in-memory fakes that build the same `Job` objects and cost one checkpoint:
   the jobs/s and CPU per job of `trioq._worker.runtime` + `trioq._worker.completer` with an
   infinitely fast database. ``--prototype`` applies `trioq_prototypes` first.

The database ``trioq_peers_ceiling`` is created and dropped (the runtime still needs a schema,
LISTEN and its maintenance loops). Nothing under trioq/ is changed; the fakes are
monkeypatched in this process only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import os
import sys
import time
from typing import Any

import trio
from psycopg import sql
from psycopg.conninfo import make_conninfo

import trioq
from trioq import Job, Queue
from trioq._db.driver import Driver

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:55432/postgres"
DB = "trioq_peers_ceiling"
LEASE = dt.timedelta(seconds=30)


async def recreate(admin_dsn: str, *, drop_only: bool = False) -> str:
    async with await trioq.connect(admin_dsn, autocommit=True) as admin:
        await admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(DB)))  # fmt: skip
        if not drop_only:
            await admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB)))
    dsn = make_conninfo(admin_dsn, dbname=DB)
    if not drop_only:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            await trioq.migrate(conn)
    return dsn


async def queue_layer(dsn: str, jobs: int, batch: int) -> None:
    q = Queue()
    async with await trioq.connect(dsn, autocommit=True) as conn:
        specs = [trioq.JobSpec(task="noop", queue="bench", args={"n": i}) for i in range(jobs)]
        await trioq.enqueue_many(conn, specs)
        await conn.execute("VACUUM ANALYZE")
        await conn.execute("CHECKPOINT")
        done = 0
        t0, c0 = time.perf_counter(), time.process_time()
        while claimed := await q.claim(conn, "bench", owner="w", limit=batch, lease=LEASE):
            leases = [trioq.Lease(j.id, j.attempt) for j in claimed]
            done += len(await q.complete_many(conn, owner="w", leases=leases))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(
        f"queue layer, batch {batch:3}: {done / wall:>8,.0f} jobs/s  "
        f"client CPU {cpu / done * 1e6:5.1f} us/job  (claim + complete_many on one connection)"
    )


async def runtime_alone(dsn: str, jobs: int, concurrency: int, label: str) -> None:
    now = dt.datetime.now(dt.UTC)
    ids = itertools.count(1)
    handed = [0]

    async def fake_claim(self: Driver, conn: Any, queue: str, *, owner: str, limit: int,
                         lease: dt.timedelta, weighted: bool = False) -> list[Job]:  # fmt: skip
        await trio.lowlevel.checkpoint()
        n = min(limit, jobs - handed[0])
        handed[0] += n
        return [
            Job.from_row((next(ids), queue, "noop", {"n": 1}, 0, now, 1, 25, now, now))
            for _ in range(n)
        ]

    async def fake_complete(self: Driver, conn: Any, *, owner: str, leases: Any,
                            results: Any = None) -> frozenset[int]:  # fmt: skip
        await trio.lowlevel.checkpoint()
        return frozenset(lease.job_id for lease in leases)

    saved = Driver.claim, Driver.complete_many
    Driver.claim, Driver.complete_many = fake_claim, fake_complete  # type: ignore[method-assign]
    tasks = trioq.Registry()
    ran = [0]
    all_ran = trio.Event()

    @tasks.task(name="noop", queue="bench")
    async def noop(job: trioq.JobContext, n: int) -> None:
        ran[0] += 1
        if ran[0] == jobs:
            all_ran.set()

    config = trioq.Config(
        registry=tasks, dsn=dsn, queues={"bench": trioq.QueueConfig(concurrency=concurrency)}
    )
    try:
        async with trio.open_nursery() as nursery:
            runtime = await nursery.start(trioq.serve, config)
            t0, c0 = time.perf_counter(), time.process_time()
            await all_ran.wait()
            while runtime.statistics().outcomes_written < jobs:  # noqa: ASYNC110 - no event
                await trio.sleep(0.0005)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            runtime.stop(grace=False)
    finally:
        Driver.claim, Driver.complete_many = saved  # type: ignore[method-assign]
    print(
        f"runtime alone, c={concurrency:3} {label}: {jobs / wall:>8,.0f} jobs/s  "
        f"CPU {cpu / jobs * 1e6:5.1f} us/job  (claim/complete faked in memory)"
    )


async def main(admin_dsn: str, jobs: int, prototype: str | None, parts: str) -> None:
    dsn = await recreate(admin_dsn)
    try:
        for batch in (10, 100) if parts in ("all", "queue") else ():
            await queue_layer(dsn, jobs, batch)
        for concurrency in (10, 100) if parts in ("all", "runtime") else ():
            # each in a fresh process: a second runtime in one process runs slower (heap, gc)
            cmd = [sys.executable, __file__, "--dsn", dsn, "--jobs", str(jobs),
                   "--runtime-in", str(concurrency)]  # fmt: skip
            cmd += ["--prototype", prototype] if prototype else []
            await trio.run_process(cmd)
    finally:
        await recreate(admin_dsn, drop_only=True)


def cli() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--dsn", default=os.environ.get("TRIOQ_DSN") or DEFAULT_DSN)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--prototype", help="trioq_prototypes to apply, joined with +")
    p.add_argument("--only", choices=["all", "queue", "runtime"], default="all")
    p.add_argument("--runtime-in", type=int, help=argparse.SUPPRESS)  # internal: one runtime
    a = p.parse_args()
    if a.prototype:
        import trioq_prototypes

        trioq_prototypes.apply(a.prototype.split("+"))
    if a.runtime_in:
        label = f"prototype {a.prototype}" if a.prototype else "as is"
        trio.run(runtime_alone, a.dsn, a.jobs, a.runtime_in, label)
    else:
        trio.run(main, a.dsn, a.jobs, a.prototype, a.only)


if __name__ == "__main__":
    cli()
