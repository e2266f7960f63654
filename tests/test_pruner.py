"""Retention: the pruner deletes kept done, cancelled and dead rows past their age, in
bounded batches, safely from many processes at once, on a big table; and it runs in
``serve``. Against real Postgres, one round at a time (``run_once``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

import trioq
from trioq import Failure, Lease, Queue
from trioq._worker.services.pruner import Pruner, PruneRound

UTC = dt.UTC
T0 = dt.datetime(2030, 1, 1, tzinfo=UTC)
HOUR = 3600.0
Q = Queue()
LEASE = dt.timedelta(seconds=30)


@asynccontextmanager
async def database(dsn: str, size: int = 1) -> AsyncIterator[tuple[Any, trioq.pg.Pool]]:
    """A migrated database, a connection and a pool, all on the clock `set_clock` sets."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        async with trioq.pg.Pool(dsn, max_size=size, connect_kwargs={"autocommit": True}) as pool:
            await set_clock(conn, pool, T0, size)
            yield conn, pool


async def set_clock(conn: Any, pool: trioq.pg.Pool, when: dt.datetime, size: int = 1) -> None:
    query = "SELECT set_config('trioq.now', %s, false)"
    await conn.execute(query, (when.isoformat(),))
    held = [await pool.getconn() for _ in range(size)]  # every connection of the pool
    for c in held:
        await c.execute(query, (when.isoformat(),))
    for c in held:
        await pool.putconn(c)


def pruner(pool: trioq.pg.Pool, **options: Any) -> Pruner:
    settings: dict[str, Any] = {
        "interval": 60, "batch": 1000, "retain_done": HOUR, "retain_cancelled": 2 * HOUR,
        "retain_dead": 3 * HOUR, **options,
    }  # fmt: skip
    return Pruner(pool, Q.sql, **settings)


async def finish(conn: Any, queue: str, how: str) -> int:
    """One job of ``queue`` taken to ``how``: done (kept), cancelled or dead."""
    job = await trioq.enqueue(conn, "t", queue=queue)
    if how == "cancelled":
        await Q.cancel(conn, job.job_id)
        return job.job_id
    (claimed,) = await Q.claim(conn, queue, owner="w", limit=1, lease=LEASE)
    lease = Lease(claimed.id, claimed.attempt)
    if how == "done":
        await Q.complete_many(conn, owner="w", leases=[lease], results=[{"n": 1}])
    else:
        await Q.fail_many(conn, owner="w", failures=[Failure(lease=lease, error="e", fatal=True)])
    return job.job_id


async def ids_left(conn: Any) -> set[int]:
    cur = await conn.execute("SELECT id FROM trioq.jobs UNION ALL SELECT id FROM trioq.dead_jobs")
    return {row[0] for row in await cur.fetchall()}


async def test_each_kind_goes_after_its_own_age_and_live_jobs_stay(dsn: str) -> None:
    async with database(dsn) as (conn, pool):
        old = {how: await finish(conn, "q", how) for how in ("done", "cancelled", "dead")}
        live = [
            (await trioq.enqueue(conn, "t", queue="q", delay=10 * HOUR)).job_id,
            (await trioq.enqueue(conn, "t", queue="other")).job_id,
        ]
        await trioq.enqueue(conn, "t", queue="r")
        await Q.claim(conn, "r", owner="w", limit=1, lease=dt.timedelta(days=1))
        live.append(max(await ids_left(conn)))
        everything = await ids_left(conn)
        p = pruner(pool)
        assert await p.run_once() == PruneRound()

        for hours, gone in ((1.5, {"done"}), (2.5, {"done", "cancelled"}),
                            (3.5, {"done", "cancelled", "dead"})):  # fmt: skip
            await set_clock(conn, pool, T0 + dt.timedelta(hours=hours))
            await p.run_once()
            assert await ids_left(conn) == everything - {old[how] for how in gone}
        assert set(live) <= await ids_left(conn)
        assert await p.run_once() == PruneRound()  # nothing twice

        # None keeps a kind forever.
        young = {how: await finish(conn, "q", how) for how in ("done", "cancelled", "dead")}
        await set_clock(conn, pool, T0 + dt.timedelta(days=365))
        keeper = pruner(pool, retain_done=None, retain_dead=None)
        assert await keeper.run_once() == PruneRound(cancelled=1)
        assert {young["done"], young["dead"]} <= await ids_left(conn)


N_BIG = 200_000
BATCH = 5_000

FILL = """
INSERT INTO trioq.jobs (queue, task, args, state, attempt, result, enqueued_at, finished_at)
SELECT 'big', 'report', jsonb_build_object('n', g), 'done', 1, jsonb_build_object('sum', g),
       %(t)s::timestamptz - interval '3 days', %(t)s::timestamptz - interval '2 days'
                                                + g * interval '1 millisecond'
  FROM generate_series(1, %(n)s) AS g
"""


async def test_a_big_table_goes_in_bounded_batches_from_two_processes(dsn: str) -> None:
    """200,000 old kept rows, two pruners at once: no round deletes more than a batch,
    together they delete each row once, and both finish. Young and live rows stay."""
    async with database(dsn, size=2) as (conn, pool):
        await conn.execute(FILL, {"t": T0, "n": N_BIG})
        young = await finish(conn, "q", "done")
        live = (await trioq.enqueue(conn, "t", queue="q")).job_id
        await conn.execute("VACUUM ANALYZE trioq.jobs")
        rounds: list[list[int]] = [[], []]

        async def run(i: int) -> None:
            p = pruner(pool, batch=BATCH)
            while True:
                r = await p.run_once()
                rounds[i].append(r.done)
                if not r.full:
                    return

        start = trio.current_time()
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, 0)
                nursery.start_soon(run, 1)
        took = trio.current_time() - start
        every = rounds[0] + rounds[1]
        print(f"\npruned {sum(every)} rows in {len(every)} rounds ({took:.2f} s): {rounds}")
        assert max(every) <= BATCH
        assert sum(every) == N_BIG
        assert len(rounds[0]) > 1 and len(rounds[1]) > 1  # both took part
        assert await ids_left(conn) == {young, live}


async def test_serve_prunes_kept_results_past_their_age(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task(keep_result=True)
    async def answer(job: trioq.JobContext) -> int:
        return 42

    config = trioq.Config(
        dsn=dsn, registry=tasks, lease=1.5, heartbeat_interval=0.3, poll_interval=0.2,
        retain_done=0.5, prune_interval=0.1,
    )  # fmt: skip
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        async with trio.open_nursery() as nursery:
            runtime = await nursery.start(trioq.serve, config)
            job = await answer.enqueue(conn)
            with trio.fail_after(10):
                assert await trioq.result(conn, job.job_id) == 42
                while (await trioq.job_status(conn, job.job_id)).state != "unknown":  # noqa: ASYNC110
                    await trio.sleep(0.05)
            runtime.stop(grace=False)
    assert attrs.evolve(config, prune_interval=None).prune_interval is None


@pytest.mark.parametrize("field", ["retain_done", "retain_cancelled", "retain_dead",
                                   "prune_interval"])  # fmt: skip
@pytest.mark.parametrize(
    ("value", "error"),
    [(0, ValueError), (-1, ValueError), (float("inf"), ValueError), (float("nan"), ValueError),
     ("60", TypeError), (True, TypeError)],  # a wrong type is a TypeError (trioq._rules)
)  # fmt: skip
def test_bad_retention_settings_are_named(field: str, value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=f"^{field} must be a positive finite number or None"):
        trioq.Config(registry=trioq.Registry(), **{field: value})


def test_retention_defaults_and_timedeltas() -> None:
    config = trioq.Config(registry=trioq.Registry(), retain_dead=dt.timedelta(days=30))
    assert (config.retain_done, config.retain_cancelled, config.retain_dead) == (
        86400.0, 86400.0, 30 * 86400.0,
    )  # fmt: skip
    assert (config.prune_interval, config.prune_batch) == (60.0, 1000)
    with pytest.raises(ValueError, match="prune_batch must be a positive int, got 0"):
        trioq.Config(registry=trioq.Registry(), prune_batch=0)
