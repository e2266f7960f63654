"""Unique jobs with a window, on real Postgres: periods (finished jobs included), which
states count, which enqueue wins when two race, batches, task-level options, concurrency
keys derived from args, and the migration of the old global keys. Time moves through
``trioq.now``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import trio
from helpers import migrated, wait_until_blocked

import trioq
from trioq import Failure, JobSpec, Lease, Queue, Unique
from trioq.testing import set_clock

UTC = dt.UTC
LEASE = dt.timedelta(seconds=30)
T0 = dt.datetime(2030, 1, 1, tzinfo=UTC)  # a multiple of every period used here
START = T0 + dt.timedelta(minutes=10)  # where each test's clock starts
HOUR = dt.timedelta(hours=1)
Q = Queue()
HOURLY = Unique(key="report", period=HOUR)


async def finish_all(conn: Any) -> None:
    jobs = await Q.claim(conn, "default", owner="w", limit=100, lease=LEASE)
    await Q.complete_many(conn, owner="w", leases=[Lease(j.id, j.attempt) for j in jobs])


async def test_one_job_per_period_finished_ones_included(dsn: str) -> None:
    async with migrated(dsn, START) as conn:
        first = await trioq.enqueue(conn, "t", unique=HOURLY)
        assert not first.duplicate
        assert await trioq.enqueue(conn, "t", unique=HOURLY) == trioq.EnqueueResult(
            first.job_id, duplicate=True
        )
        await finish_all(conn)  # the row is gone, the key stays taken for the hour
        assert (await trioq.enqueue(conn, "t", unique=HOURLY)).job_id == first.job_id
        await set_clock(conn, T0 + 59 * dt.timedelta(minutes=1))
        assert (await trioq.enqueue(conn, "t", unique=HOURLY)).duplicate
        await set_clock(conn, T0 + HOUR)  # the next window
        second = await trioq.enqueue(conn, "t", unique=HOURLY)
        assert not second.duplicate and second.job_id != first.job_id
        # Another task with the same explicit key is another job (keys are scoped by task).
        assert not (await trioq.enqueue(conn, "u", unique=HOURLY)).duplicate
        # Expired records are pruned by later enqueues.
        await set_clock(conn, T0 + 5 * HOUR)
        await trioq.enqueue(conn, "t", unique=Unique(key="other", period=HOUR))
        cur = await conn.execute("SELECT count(*) FROM trioq.unique_keys")
        assert await cur.fetchone() == (1,)


async def test_which_states_count(dsn: str) -> None:
    async with migrated(dsn, START) as conn:
        default = Unique(key="a", period=HOUR)  # live + done
        job = await trioq.enqueue(conn, "t", unique=default)
        await Q.cancel(conn, job.job_id)
        assert not (await trioq.enqueue(conn, "t", unique=default)).duplicate  # cancelled: free

        with_cancelled = Unique(
            key="b", period=HOUR, states=["scheduled", "available", "running", "cancelled"]
        )
        job = await trioq.enqueue(conn, "t", unique=with_cancelled)
        await Q.cancel(conn, job.job_id)
        assert (await trioq.enqueue(conn, "t", unique=with_cancelled)).job_id == job.job_id

        live_only = Unique(key="c", period=HOUR, states=["scheduled", "available", "running"])
        await trioq.enqueue(conn, "t", unique=live_only)
        await finish_all(conn)
        assert not (await trioq.enqueue(conn, "t", unique=live_only)).duplicate  # done: free

        with_dead = Unique(
            key="d", period=HOUR, states=["scheduled", "available", "running", "dead"]
        )
        job = await trioq.enqueue(conn, "t", unique=with_dead)
        [claimed] = [
            j
            for j in await Q.claim(conn, "default", owner="w", limit=100, lease=LEASE)
            if j.id == job.job_id
        ]
        failure = Failure(lease=Lease(claimed.id, claimed.attempt), error="x", fatal=True)
        await Q.fail_many(conn, owner="w", failures=[failure])
        assert (await trioq.enqueue(conn, "t", unique=with_dead)).job_id == job.job_id


async def test_by_args_fields_and_queue(dsn: str) -> None:
    async with migrated(dsn, START) as conn:
        by_user = Unique(by_args=["user"], period=HOUR)
        a = await trioq.enqueue(conn, "t", {"user": 1, "note": "x"}, unique=by_user)
        b = await trioq.enqueue(conn, "t", {"note": "y", "user": 1}, unique=by_user)
        c = await trioq.enqueue(conn, "t", {"user": 2}, unique=by_user)
        d = await trioq.enqueue(conn, "t", {"user": 1}, unique=by_user, queue="other")
        assert b == trioq.EnqueueResult(a.job_id, duplicate=True)
        assert not c.duplicate
        assert d.duplicate  # by_queue=False: the queue does not count
        per_queue = Unique(by_args=["user"], by_queue=True)  # no period: while live
        e = await trioq.enqueue(conn, "t", {"user": 1}, unique=per_queue)
        f = await trioq.enqueue(conn, "t", {"user": 1}, unique=per_queue, queue="other")
        assert not e.duplicate and not f.duplicate
        # unique=True is the same fingerprint as before (task, queue, all args), while live.
        assert JobSpec(task="t", args={"x": 1}, unique=True).effective_dedup_key() == (
            JobSpec(
                task="t", args={"x": 1}, unique=Unique(by_args=True, by_queue=True)
            ).effective_dedup_key()
        )


async def test_the_first_to_take_the_key_wins_and_the_loser_waits_for_its_commit(
    dsn: str,
) -> None:
    async with migrated(dsn, START) as a, await trioq.connect(dsn, autocommit=True) as b:
        await set_clock(b, START)
        results: list[trioq.EnqueueResult] = []

        async def second() -> None:
            results.append(await trioq.enqueue(b, "t", unique=HOURLY))

        for outcome in ("COMMIT", "ROLLBACK"):
            results.clear()
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    await a.execute("BEGIN")
                    first = await trioq.enqueue(a, "t", unique=HOURLY)
                    nursery.start_soon(second)
                    await wait_until_blocked(a, b)  # b waits for a's transaction
                    await a.execute(outcome)
            if outcome == "COMMIT":
                assert results == [trioq.EnqueueResult(first.job_id, duplicate=True)]
                await a.execute("DELETE FROM trioq.unique_keys")
                await a.execute("DELETE FROM trioq.jobs")
            else:  # a's job never existed: b's enqueue is the one
                assert not results[0].duplicate and results[0].job_id != first.job_id


async def test_a_batch_with_windows_keeps_input_order(dsn: str) -> None:
    async with migrated(dsn, START) as conn:
        specs = [
            JobSpec(task="t", unique=HOURLY),
            JobSpec(task="t", dedup_key="plain"),
            JobSpec(task="t", unique=HOURLY),  # the first of two twins wins
            JobSpec(task="t", dedup_key="plain"),
            JobSpec(task="t", args={"i": 1}, concurrency_key="k"),
        ]
        results = await Q.enqueue_many(conn, specs)
        assert [r.duplicate for r in results] == [False, False, True, True, False]
        assert results[2].job_id == results[0].job_id
        assert results[3].job_id == results[1].job_id
        cur = await conn.execute(
            "SELECT concurrency_key FROM trioq.jobs WHERE id = %s", (results[4].job_id,)
        )
        assert await cur.fetchone() == ("k",)


async def test_task_options_unique_and_concurrency_key_from_args(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task(unique=Unique(by_args=["customer"], period=HOUR), concurrency_key="customer")
    async def sync(job: trioq.JobContext, customer: int, full: bool = False) -> None: ...

    @tasks.task(concurrency_key=lambda args: f"region-{args['region']}")
    async def ship(job: trioq.JobContext, region: str) -> None: ...

    async with migrated(dsn, START) as conn:
        a = await sync.enqueue(conn, customer=7)
        b = await sync.enqueue(conn, customer=7, full=True)
        c = await sync.enqueue(conn, customer=7, unique=False)  # the caller overrides
        d = await ship.enqueue(conn, region="eu")
        e = await sync.enqueue(conn, customer=8, concurrency_key="vip")
        assert b == trioq.EnqueueResult(a.job_id, duplicate=True) and not c.duplicate
        cur = await conn.execute("SELECT id, concurrency_key FROM trioq.jobs ORDER BY id")
        assert await cur.fetchall() == [
            (a.job_id, "customer=7"), (c.job_id, "customer=7"), (d.job_id, "region-eu"),
            (e.job_id, "vip"),
        ]  # fmt: skip
        with pytest.raises(ValueError, match=r"concurrency_key field\(s\) \['customer'\] miss"):
            await sync.enqueue(conn, {"other": 1})
        with pytest.raises(ValueError, match="NUL"):
            await ship.enqueue(conn, region="a\x00")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"key": "a\x00"}, ValueError, "NUL"),
        ({"key": ""}, ValueError, "Unique.key"),
        ({"key": 5}, TypeError, "Unique.key"),
        ({"by_args": []}, ValueError, "at least one field"),
        ({"by_args": "user"}, TypeError, "sequence of field names"),
        ({"by_args": [""]}, TypeError, "non-empty"),
        ({"states": ["available"]}, ValueError, "every live state"),
        ({"states": ["scheduled", "available", "running", "lost"]}, ValueError, "unknown"),
        ({"states": ["scheduled", "available", "running", "done"]}, ValueError, "needs a period"),
        ({"period": 0}, ValueError, "between 1 ms"),
        ({"period": dt.timedelta(days=400)}, ValueError, "366 days"),
        ({"period": float("nan")}, ValueError, "finite"),
        ({"period": "1h"}, TypeError, "timedelta"),
        ({"by_queue": 1}, TypeError, "by_queue"),
    ],
)
def test_bad_unique_options_name_the_field(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Unique(**kwargs)


def test_unique_conflicts_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="dedup_key or unique"):
        JobSpec(task="t", dedup_key="k", unique=Unique())
    with pytest.raises(ValueError, match="JSON object"):
        JobSpec(task="t", args=[1, 2], unique=Unique(by_args=["a"]))
    with pytest.raises(TypeError, match=r"unique must be a bool or a trioq\.Unique"):
        JobSpec(task="t", unique="yes")  # type: ignore[arg-type]


async def test_the_migration_scopes_old_keys_by_task(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn, target=1)
        await conn.execute(
            "INSERT INTO trioq.jobs (queue, task, dedup_key) VALUES"
            " ('default', 't', 'key:order-7'),"
            " ('default', 'report', 'key:cron:hourly@2030-01-01T01:00:00Z'),"
            " ('default', 't', 'fp:abc')"
        )
        await conn.execute(
            "INSERT INTO trioq.dead_jobs (id, queue, task, args, priority, attempt,"
            " max_attempts, dedup_key, reason, enqueued_at)"
            " VALUES (99, 'default', 'u', '{}', 0, 1, 1, 'key:x', 'fatal error', now())"
        )
        await trioq.migrate(conn)
        cur = await conn.execute("SELECT dedup_key FROM trioq.jobs ORDER BY id")
        assert [r[0] for r in await cur.fetchall()] == [
            "task:t|order-7",
            "key:cron:hourly@2030-01-01T01:00:00Z",
            "fp:abc",
        ]
        cur = await conn.execute("SELECT dedup_key FROM trioq.dead_jobs")
        assert await cur.fetchall() == [("task:u|x",)]
        # The old job still dedups the same task's new enqueues.
        assert (await trioq.enqueue(conn, "t", dedup_key="order-7")).duplicate
