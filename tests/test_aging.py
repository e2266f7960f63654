"""Aging (anti-starvation) on real Postgres: waiting jobs climb one priority level per the
queue's ``aging``, never past the best priority waiting, each job once per wait however
many rounds run at once; the claim then takes an aged job first in its class. Time moves
through ``trioq.now`` (no sleeping); the service's ``run_once`` is called directly."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import trio
from helpers import migrated

import trioq
from trioq import Queue
from trioq._flow import age_queue
from trioq._pg.pool import Pool
from trioq._worker.services.aging import Aging
from trioq.testing import set_clock

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
MIN = dt.timedelta(minutes=1)
SEC = dt.timedelta(seconds=1)
LEASE = dt.timedelta(seconds=30)
Q = Queue()


async def age(conn: Any, queue: str = "q", limit: int = 1000) -> int:
    return await age_queue(conn, Q.sql, queue, limit=limit)


async def priorities(conn: Any, queue: str = "q") -> dict[int, tuple[int, int]]:
    """Each job's (priority, aged) by id."""
    cur = await conn.execute(
        "SELECT id, priority, aged FROM trioq.jobs WHERE queue = %s ORDER BY id", (queue,)
    )
    return {row[0]: (row[1], row[2]) for row in await cur.fetchall()}


async def enqueue(conn: Any, priority: int, queue: str = "q", **kw: Any) -> int:
    return (await trioq.enqueue(conn, "t", queue=queue, priority=priority, **kw)).job_id


async def test_a_waiting_job_climbs_a_level_per_aging_and_stops_at_the_best(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        low = await enqueue(conn, 3)
        best = await enqueue(conn, 0)
        await set_clock(conn, T0 + MIN - SEC)
        assert await age(conn) == 0  # not waited a full level yet
        await set_clock(conn, T0 + MIN)
        assert await age(conn) == 1
        assert await priorities(conn) == {low: (2, 1), best: (0, 0)}
        assert await age(conn) == 0  # the same wait earns nothing twice
        await set_clock(conn, T0 + 2 * MIN + 30 * SEC)
        assert await age(conn) == 1
        assert await priorities(conn) == {low: (1, 2), best: (0, 0)}
        await set_clock(conn, T0 + 60 * MIN)  # an hour's wait: as far as the best, no further
        assert await age(conn) == 1
        assert await priorities(conn) == {low: (0, 3), best: (0, 0)}
        assert await age(conn) == 0


async def test_an_aged_job_is_claimed_before_newer_jobs_of_its_new_class(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        starved = await enqueue(conn, 5)
        for minute in range(1, 11):  # a steady stream of priority-0 jobs, one a minute
            await set_clock(conn, T0 + minute * MIN)
            await enqueue(conn, 0)
            await age(conn)
        got = await Q.claim(conn, "q", owner="w", limit=1, lease=LEASE)
        assert [j.id for j in got] == [starved]
        assert got[0].priority == 0


async def test_without_aging_priority_is_strict(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        await Q.set_limits(conn, "q", aging=None)
        starved = await enqueue(conn, 5)
        await enqueue(conn, 0)
        await set_clock(conn, T0 + 1000 * MIN)
        assert await age(conn) == 0
        got = await Q.claim(conn, "q", owner="w", limit=1, lease=LEASE)
        assert [j.id for j in got] != [starved]


async def test_the_queues_own_aging_sets_the_pace(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        await Q.set_limits(conn, "q", aging=10)
        await Q.set_limits(conn, "other", aging=dt.timedelta(hours=1))
        low, _ = await enqueue(conn, 9), await enqueue(conn, 0)
        slow, _ = await enqueue(conn, 9, "other"), await enqueue(conn, 0, "other")
        await set_clock(conn, T0 + 35 * SEC)  # three levels of 10 s in one round
        assert await age(conn) == 1 and await age(conn, "other") == 0
        assert (await priorities(conn))[low] == (6, 3)
        assert (await priorities(conn, "other"))[slow] == (9, 0)


async def test_only_waiting_jobs_of_worse_classes_age(dsn: str) -> None:
    """The best class, scheduled jobs, running jobs and other queues stay as they are."""
    async with migrated(dsn, T0) as conn:
        await enqueue(conn, 0)
        await enqueue(conn, 0)
        scheduled = await enqueue(conn, 4, delay=dt.timedelta(hours=2))
        running = await enqueue(conn, 4)
        await conn.execute(
            "UPDATE trioq.jobs SET state = 'running', attempt = 1, lease_owner = 'w', "
            "lease_expires_at = %s WHERE id = %s", (T0 + dt.timedelta(days=1), running)
        )  # fmt: skip
        await enqueue(conn, 4, "elsewhere")  # alone in its queue: it is the best there
        await set_clock(conn, T0 + 30 * MIN)
        assert await age(conn) == 0 and await age(conn, "elsewhere") == 0
        assert (await priorities(conn))[scheduled] == (4, 0)
        assert (await priorities(conn))[running] == (4, 0)


async def test_every_level_climbs_and_a_round_is_bounded_per_level(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        await enqueue(conn, -3)
        fives = [await enqueue(conn, 5) for _ in range(5)]
        nines = [await enqueue(conn, 9) for _ in range(5)]
        await set_clock(conn, T0 + MIN)
        assert await age(conn, limit=2) == 4  # two of each level, the oldest
        found = await priorities(conn)
        assert [found[i] for i in fives] == [(4, 1)] * 2 + [(5, 0)] * 3
        assert [found[i] for i in nines] == [(8, 1)] * 2 + [(9, 0)] * 3
        assert await age(conn, limit=2) == 4
        assert await age(conn, limit=2) == 2
        assert await age(conn, limit=2) == 0
        found = await priorities(conn)
        assert {found[i] for i in fives} == {(4, 1)} and {found[i] for i in nines} == {(8, 1)}


async def test_rounds_at_once_never_age_a_job_twice_nor_wait_for_a_claim(dsn: str) -> None:
    """A round skips the rows another transaction holds (a claim, another worker's round):
    it neither waits for them nor moves them; the next round does."""
    async with (
        migrated(dsn, T0) as a,
        await trioq.connect(dsn, autocommit=True) as b,
    ):
        await set_clock(b, T0)
        await enqueue(a, 0)
        held, free = await enqueue(a, 2), await enqueue(a, 2)
        await set_clock(a, T0 + MIN)
        await set_clock(b, T0 + MIN)
        async with b.transaction():
            await b.execute("SELECT 1 FROM trioq.jobs WHERE id = %s FOR UPDATE", (held,))
            with trio.fail_after(5):  # never blocks on the held row
                assert await age(a) == 1
            assert (await priorities(a))[free] == (1, 1)
        assert await age(b) == 1  # the held row, once free; the other is not aged again
        found = await priorities(a)
        assert found[held] == (1, 1) and found[free] == (1, 1)


async def test_the_service_ages_every_served_queue(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        for queue in ("a", "b", "c"):
            await enqueue(conn, 0, queue)
            await enqueue(conn, 7, queue)
        await Q.set_limits(conn, "c", aging=None)
        async with Pool(dsn, max_size=1, connect_kwargs={"autocommit": True}) as pool:
            async with pool.connection() as pooled:
                await set_clock(pooled, T0 + 2 * MIN)
            got = await Aging(pool, Q, ["a", "b", "c"]).run_once()
        assert got.aged == {"a": 1, "b": 1}


async def test_the_setting_is_stored_shown_and_checked(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        assert trioq.QueueSettings(name="q").aging == trioq.DEFAULT_AGING == MIN
        s = await Q.set_limits(conn, "q", aging=dt.timedelta(minutes=5))
        assert s.aging == dt.timedelta(minutes=5) and not s.controlled
        assert (await Q.set_limits(conn, "q", aging=None)).aging is None
        assert (await Q.set_limits(conn, "q", global_concurrency=3)).aging is None  # stays
        assert (await Q.pause(conn, "other")).aging == trioq.DEFAULT_AGING
        for bad, error, words in [
            (0, ValueError, "aging must be between 1 s and 366 days, got 0 s"),
            (0.5, ValueError, "aging must be between 1 s and 366 days, got 0.5 s"),
            (-60, ValueError, "aging must be between 1 s and 366 days, got -60 s"),
            (float("nan"), ValueError, "aging must be a finite number of seconds, got nan"),
            (10**30, ValueError, "aging must be between 1 s and 366 days"),
            (dt.timedelta(days=400), ValueError, "aging must be between 1 s and 366 days"),
            (True, TypeError, "aging must be a timedelta, seconds or None (off), got True"),
            ("1m", TypeError, "aging must be a timedelta, seconds or None (off), got '1m'"),
            ("\x00", TypeError, "aging must be a timedelta"),
        ]:
            with pytest.raises(error, match=None) as caught:
                await Q.set_limits(conn, "q", aging=bad)  # type: ignore[arg-type]
            assert words in str(caught.value)
            with pytest.raises(error) as caught:
                trioq.QueueConfig(aging=bad)
            assert words in str(caught.value)
        assert trioq.QueueConfig().limits() == {}
        assert trioq.QueueConfig(aging=None).limits() == {"aging": None}
        assert trioq.QueueConfig(aging=90).limits() == {"aging": dt.timedelta(seconds=90)}


async def test_the_schema_refuses_what_aging_cannot_use_and_readers_survive(dsn: str) -> None:
    import psycopg

    async with migrated(dsn, T0) as conn:
        for bad in ("-1 minute", "0.5 seconds", "1000 days"):
            with pytest.raises(psycopg.errors.CheckViolation):
                await conn.execute(
                    "INSERT INTO trioq.queues (name, aging) VALUES ('q', %s::interval)", (bad,)
                )
        with pytest.raises(psycopg.errors.CheckViolation):
            await conn.execute("INSERT INTO trioq.jobs (queue, task, aged) VALUES ('q', 't', -1)")
        # Priorities trioq never writes, by hand: aging goes on around them.
        zero = await enqueue(conn, 0)
        mine = await enqueue(conn, 3)
        await conn.execute(
            "INSERT INTO trioq.jobs (queue, task, priority, aged, run_at) VALUES "
            "('q', 't', 32767, 200, %(t)s), ('q', 't', 150, 0, %(t)s), "
            "('q', 't', -32768, 0, %(t)s)",
            {"t": T0},
        )
        await set_clock(conn, T0 + 2 * MIN)  # the best is -32768, taken as trioq's -100
        assert await age(conn) == 2
        found = await priorities(conn)
        assert (found[zero], found[mine]) == ((-2, 2), (1, 2))
        await set_clock(conn, T0 + 900 * MIN)
        assert await age(conn) >= 1
        found = await priorities(conn)
        assert found[mine] == (-100, 103)  # as far as trioq's best, not the row's -32768
        assert found[zero] == (-100, 100)
        assert sorted(p for p, _ in found.values())[-2:] == [150, 32767]  # left alone


async def test_jobs_not_due_again_never_take_a_rounds_place(dsn: str) -> None:
    """A level's round takes its oldest jobs that are due, not its oldest jobs: jobs that
    climbed into it and have not waited for the next level yet do not use up its batch."""
    async with migrated(dsn, T0) as conn:
        await enqueue(conn, 0)
        climbed = [await enqueue(conn, 5), await enqueue(conn, 5)]
        await set_clock(conn, T0 + 30 * SEC)
        due = await enqueue(conn, 4)
        await set_clock(conn, T0 + MIN)
        assert await age(conn, limit=2) == 2  # the two fives, to 4
        await set_clock(conn, T0 + 90 * SEC)  # the four has waited a level; the fives not two
        assert await age(conn, limit=2) == 1
        found = await priorities(conn)
        assert found[due] == (3, 1) and [found[i] for i in climbed] == [(4, 1), (4, 1)]
