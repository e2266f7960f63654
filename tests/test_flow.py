"""Flow control as a library, on real Postgres: queue settings, pause, the limited claim
(global, per-key and rate limits), every exit from 'running' giving its slot back, and the
interleaving of two claims at once. Time moves through ``trioq.now`` (no sleeping)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
import trio
from helpers import migrated, wait_until_blocked

import trioq
from trioq import Failure, Lease, Queue, RateLimit
from trioq.testing import set_clock

UTC = dt.UTC
LEASE = dt.timedelta(seconds=30)
T0 = dt.datetime(2030, 1, 1, tzinfo=UTC)
SEC = dt.timedelta(seconds=1)
Q = Queue()
WAITING_ATTEMPTS = "SELECT DISTINCT attempt FROM trioq.jobs WHERE state = 'available'"


async def claim(conn: Any, limit: int, queue: str = "q", owner: str = "w") -> trioq.LimitedClaim:
    return await Q.claim_limited(conn, queue, owner=owner, limit=limit, lease=LEASE)


async def add(conn: Any, n: int, queue: str = "q", **kw: Any) -> list[int]:
    return [(await trioq.enqueue(conn, "t", {"i": i}, queue=queue, **kw)).job_id for i in range(n)]


def leases(got: trioq.LimitedClaim) -> list[Lease]:
    return [Lease(j.id, j.attempt) for j in got.jobs]


async def running(conn: Any, queue: str = "q") -> int:
    cur = await conn.execute(
        "SELECT count(*) FROM trioq.jobs WHERE queue = %s AND state = 'running'", (queue,)
    )
    row = await cur.fetchone()
    return int(row[0])


# -- settings -----------------------------------------------------------------------------------


async def test_settings_are_stored_changed_in_part_and_announced(dsn: str) -> None:
    async with migrated(dsn, T0) as conn, await trioq.connect(dsn, autocommit=True) as listener:
        await listener.execute("LISTEN trioq_trioq")
        s = await Q.set_limits(conn, "q", global_concurrency=5, rate_limit="100/1m")
        assert s == trioq.QueueSettings(
            name="q", global_concurrency=5, rate_limit=RateLimit(100, 60)
        )
        s = await Q.set_limits(conn, "q", key_concurrency=2)  # the others stay
        assert (s.global_concurrency, s.rate_limit, s.key_concurrency) == (5, RateLimit(100, 60), 2)
        s = await Q.pause(conn, "q")
        assert s.paused and s.global_concurrency == 5
        s = await Q.set_limits(conn, "q", rate_limit=None)  # None removes one
        assert s.rate_limit is None and s.paused
        assert (await Q.resume(conn, "q")).paused is False
        assert await Q.queue_settings(conn) == [
            trioq.QueueSettings(name="q", global_concurrency=5, key_concurrency=2)
        ]
        assert await Q.queue_settings(conn, ["nope"]) == []
        payloads = []
        with trio.move_on_after(5):
            async for note in listener.notifies():
                payloads.append(note.payload)
                if len(payloads) == 5:
                    break
        assert payloads == ["@queues"] * 5


async def test_two_changes_at_once_both_land(dsn: str) -> None:
    async with migrated(dsn, T0) as a, await trioq.connect(dsn, autocommit=True) as b:
        await Q.set_limits(a, "q", global_concurrency=1)
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await a.execute("BEGIN")
                await Q.set_limits(a, "q", global_concurrency=7)
                nursery.start_soon(lambda: Q.set_limits(b, "q", key_concurrency=3))
                await wait_until_blocked(a, b)  # b waits for a's row lock
                await a.execute("COMMIT")
        [s] = await Q.queue_settings(a)
        assert (s.global_concurrency, s.key_concurrency) == (7, 3)


# -- pause --------------------------------------------------------------------------------------


async def test_a_paused_queue_is_claimed_by_neither_claim_and_still_enqueues(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        await add(conn, 3)
        await Q.pause(conn, "q")
        [job_id] = await add(conn, 1)  # enqueueing goes on
        assert await Q.claim(conn, "q", owner="w", limit=10, lease=LEASE) == []
        got = await claim(conn, 10)
        assert (got.jobs, got.reason) == ([], "paused")
        await Q.resume(conn, "q")
        got = await claim(conn, 10)
        assert len(got.jobs) == 4 and job_id in {j.id for j in got.jobs}


async def test_the_plain_claim_refuses_any_controlled_queue(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        await add(conn, 2)
        await Q.set_limits(conn, "q", global_concurrency=100)
        assert await Q.claim(conn, "q", owner="w", limit=10, lease=LEASE) == []
        await Q.set_limits(conn, "q", global_concurrency=None)  # a row, but nothing set
        assert len(await Q.claim(conn, "q", owner="w", limit=10, lease=LEASE)) == 2


# -- global concurrency -------------------------------------------------------------------------


async def test_global_concurrency_counts_what_runs_now(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        await add(conn, 10)
        await Q.set_limits(conn, "q", global_concurrency=3)
        got = await claim(conn, 10)
        assert (len(got.jobs), got.reason, got.retry_in) == (3, "concurrency", None)
        assert got.concurrency_bound
        again = await claim(conn, 10, owner="other")
        assert (again.jobs, again.reason) == ([], "concurrency")
        await Q.complete_many(conn, owner="w", leases=leases(got)[:2])
        assert len((await claim(conn, 10, owner="other")).jobs) == 2
        # Waiting jobs spent no attempt.
        cur = await conn.execute(WAITING_ATTEMPTS)
        assert await cur.fetchall() == [(0,)]


async def test_lowering_a_limit_lets_the_running_jobs_finish_first(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        await add(conn, 8)
        got = await Q.claim(conn, "q", owner="w", limit=5, lease=LEASE)  # unlimited then
        await Q.set_limits(conn, "q", global_concurrency=2)
        assert (await claim(conn, 10)).jobs == []
        await Q.complete_many(conn, owner="w", leases=[Lease(j.id, j.attempt) for j in got[:4]])
        assert len((await claim(conn, 10)).jobs) == 1  # 1 running + 1 = 2


Exit = Callable[[Any, Lease], Awaitable[object]]


async def _complete(conn: Any, lease: Lease) -> object:
    return await Q.complete_many(conn, owner="w", leases=[lease])


async def _keep(conn: Any, lease: Lease) -> object:
    return await Q.complete_many(conn, owner="w", leases=[lease], results=[{"ok": 1}])


async def _retry(conn: Any, lease: Lease) -> object:
    return await Q.fail_many(conn, owner="w", failures=[Failure(lease=lease, error="e")])


async def _dead(conn: Any, lease: Lease) -> object:
    failure = Failure(lease=lease, error="e", fatal=True)
    return await Q.fail_many(conn, owner="w", failures=[failure])


async def _release(conn: Any, lease: Lease) -> object:
    return await Q.release_many(conn, owner="w", leases=[lease])


async def _snooze(conn: Any, lease: Lease) -> object:
    return await Q.release_many(conn, owner="w", leases=[lease], delays=[dt.timedelta(hours=1)])


async def _cancel(conn: Any, lease: Lease) -> object:
    await Q.cancel(conn, lease.job_id)
    return await Q.cancel_running_many(conn, owner="w", leases=[lease])


async def _swept(conn: Any, lease: Lease) -> object:
    await set_clock(conn, T0 + 2 * LEASE)  # the lease expired (a dead worker's slot)
    return await Q.sweep(conn)


async def _in_transaction(conn: Any, lease: Lease) -> object:
    async with conn.transaction():  # what job.transaction() does at its end
        return await Q.complete_many(conn, owner="w", leases=[lease])


async def _deleted(conn: Any, lease: Lease) -> object:
    return await conn.execute("DELETE FROM trioq.jobs WHERE id = %s", (lease.job_id,))


async def _heartbeat(conn: Any, lease: Lease) -> object:  # the control: still running
    return await Q.heartbeat(conn, owner="w", leases=[lease], lease=LEASE)


@pytest.mark.parametrize(
    ("exit_", "frees"),
    [(_complete, True), (_keep, True), (_retry, True), (_dead, True), (_release, True),
     (_snooze, True), (_cancel, True), (_swept, True), (_in_transaction, True),
     (_deleted, True), (_heartbeat, False)],
    ids=lambda v: getattr(v, "__name__", str(v)).strip("_"),
)  # fmt: skip
async def test_every_exit_from_running_gives_the_slot_back(
    dsn: str, exit_: Exit, frees: bool
) -> None:
    async with migrated(dsn, T0) as conn:
        await add(conn, 3)
        await Q.set_limits(conn, "q", global_concurrency=1, key_concurrency=1)
        await conn.execute("UPDATE trioq.jobs SET concurrency_key = 'k'")
        [lease] = leases(await claim(conn, 5))
        await exit_(conn, lease)
        got = await claim(conn, 5)
        assert len(got.jobs) == (1 if frees else 0), got


async def test_a_dead_job_keeps_its_concurrency_key_when_retried(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        job = await trioq.enqueue(conn, "t", queue="q", concurrency_key="acct-1")
        await Q.set_limits(conn, "q", key_concurrency=1)
        [lease] = leases(await claim(conn, 1))
        await Q.fail_many(conn, owner="w", failures=[Failure(lease=lease, error="x", fatal=True)])
        assert await Q.dead_retry(conn) == [job.job_id]
        cur = await conn.execute("SELECT concurrency_key FROM trioq.jobs WHERE id = %s",
                                 (job.job_id,))  # fmt: skip
        assert await cur.fetchone() == ("acct-1",)


async def test_two_claims_at_once_cannot_exceed_the_limit(dsn: str) -> None:
    """The second claim waits for the first one's transaction, then counts its jobs: with
    a limit of 4 and 3 taken by the first, the second gets 1 (without the lock, or with a
    count from before the wait, it would get 4)."""
    async with migrated(dsn, T0) as a, await trioq.connect(dsn, autocommit=True) as b:
        await set_clock(b, T0)
        await add(a, 10)
        await Q.set_limits(a, "q", global_concurrency=4)
        second: list[trioq.LimitedClaim] = []

        async def claim_b() -> None:
            second.append(await claim(b, 10, owner="b"))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await a.execute("BEGIN")
                first = await claim(a, 3, owner="a")
                nursery.start_soon(claim_b)
                await wait_until_blocked(a, b)  # b waits for the queue's row
                await a.execute("COMMIT")
        assert len(first.jobs) == 3
        assert len(second[0].jobs) == 1 and second[0].reason == "concurrency"
        assert await running(a) == 4


async def test_the_limited_claim_needs_read_committed(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        await Q.set_limits(conn, "q", global_concurrency=1)
        await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="READ COMMITTED"):
            await claim(conn, 1)
        await conn.execute("ROLLBACK")


# -- per-key limits -----------------------------------------------------------------------------


async def test_key_concurrency_holds_back_busy_keys_in_priority_order(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        ids = {}
        for name, key, prio in [("a1", "a", 0), ("a2", "a", 0), ("b1", "b", 1), ("n1", None, 2),
                                ("b2", "b", 3), ("c1", "c", 4)]:  # fmt: skip
            ids[name] = (await trioq.enqueue(conn, "t", queue="q", priority=prio,
                                             concurrency_key=key)).job_id  # fmt: skip
        await Q.set_limits(conn, "q", key_concurrency=1)
        got = await claim(conn, 3)
        assert [j.id for j in got.jobs] == [ids["a1"], ids["b1"], ids["n1"]]
        got = await claim(conn, 10)
        assert [j.id for j in got.jobs] == [ids["c1"]]
        assert (got.reason, got.retry_in) == ("keys", None)
        await Q.complete_many(conn, owner="w", leases=leases(got))  # c is free: nothing waits
        await Q.complete_many(conn, owner="w", leases=[Lease(ids["a1"], 1)])
        assert [j.id for j in (await claim(conn, 10)).jobs] == [ids["a2"]]


async def test_one_busy_key_with_a_deep_backlog_does_not_hide_the_others(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        specs = [trioq.JobSpec(task="t", queue="q", priority=-1, concurrency_key="hot")
                 for _ in range(1000)]  # fmt: skip
        specs += [trioq.JobSpec(task="t", queue="q", concurrency_key=f"k{i}") for i in range(5)]
        await Q.enqueue_many(conn, specs)
        await Q.set_limits(conn, "q", key_concurrency=1)
        got = await claim(conn, 10)
        keys = sorted({j.id for j in got.jobs})
        assert len(keys) == 6, got  # one of "hot", then all five others (a second pass)
        assert (await claim(conn, 10)).reason == "keys"


async def test_key_rate_limit_and_when_it_opens(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        a1, a2, b1 = [(await trioq.enqueue(conn, "t", queue="q", concurrency_key=k)).job_id
                      for k in ("a", "a", "b")]  # fmt: skip
        await Q.set_limits(conn, "q", key_rate_limit=RateLimit(1, 10))
        got = await claim(conn, 10)
        assert sorted(j.id for j in got.jobs) == [a1, b1]
        assert (got.reason, got.retry_in) == ("keys", 10.0)
        await Q.complete_many(conn, owner="w", leases=leases(got))  # rate: done is still a start
        await set_clock(conn, T0 + 4 * SEC)
        got = await claim(conn, 10)
        assert (got.jobs, got.reason, got.retry_in) == ([], "keys", 6.0)
        await set_clock(conn, T0 + 10 * SEC)
        assert [j.id for j in (await claim(conn, 10)).jobs] == [a2]


# -- rate limits --------------------------------------------------------------------------------


async def test_rate_limit_is_a_sliding_window_that_knows_when_it_opens(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        await add(conn, 10)
        await Q.set_limits(conn, "q", rate_limit=RateLimit(3, 10))
        assert len((await claim(conn, 2)).jobs) == 2  # at T0
        await set_clock(conn, T0 + SEC)
        got = await claim(conn, 5)
        # the third start fills the window: it opens when the starts of T0 are 10 s old
        assert (len(got.jobs), got.reason, got.retry_in) == (1, "rate", 9.0)
        assert not got.concurrency_bound
        await set_clock(conn, T0 + 9.5 * SEC)
        got = await claim(conn, 5)
        assert (got.jobs, got.reason, got.retry_in) == ([], "rate", 0.5)
        await set_clock(conn, T0 + 10 * SEC)  # (T0, T0 + 10]: T0's two starts are out
        got = await claim(conn, 5)
        assert (len(got.jobs), got.reason, got.retry_in) == (2, "rate", 1.0)
        cur = await conn.execute(WAITING_ATTEMPTS)
        assert await cur.fetchall() == [(0,)]  # jobs over the limit spent no attempt


async def test_removing_a_rate_limit_forgets_its_starts(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        await add(conn, 4)
        await Q.set_limits(conn, "q", rate_limit="1/1h")
        assert len((await claim(conn, 5)).jobs) == 1
        await Q.set_limits(conn, "q", rate_limit=None)
        await Q.set_limits(conn, "q", rate_limit="1/1h")
        assert len((await claim(conn, 5)).jobs) == 1  # a fresh window
        cur = await conn.execute("SELECT count(*) FROM trioq.rate_starts")
        assert await cur.fetchone() == (1,)


async def test_old_starts_are_pruned(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        await add(conn, 5)
        await Q.set_limits(conn, "q", rate_limit="1/1s")
        for second in range(5):
            await set_clock(conn, T0 + second * SEC)
            assert len((await claim(conn, 5)).jobs) == 1
        cur = await conn.execute("SELECT count(*) FROM trioq.rate_starts")
        assert await cur.fetchone() == (1,)


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda c: Q.set_limits(c, "q", global_concurrency=0), ValueError, "between 1 and"),
        (lambda c: Q.set_limits(c, "q", global_concurrency=2**31), ValueError, "between 1"),
        (lambda c: Q.set_limits(c, "q", global_concurrency=True), TypeError, "positive int"),
        (lambda c: Q.set_limits(c, "q", key_concurrency=-1), ValueError, "key_concurrency"),
        (lambda c: Q.set_limits(c, "q", rate_limit="0/1s"), ValueError, "rate limit"),
        (lambda c: Q.set_limits(c, "q", rate_limit="5/0s"), ValueError, "between 1 ms"),
        (lambda c: Q.set_limits(c, "q", rate_limit="5/400d"), ValueError, "366 days"),
        (lambda c: Q.set_limits(c, "q", rate_limit=""), ValueError, "N/PERIOD"),
        (lambda c: Q.set_limits(c, "q", rate_limit="5\x00/1s"), ValueError, "N/PERIOD"),
        (lambda c: Q.set_limits(c, "q", rate_limit="1" * 5000 + "/1s"), ValueError, "N/PERIOD"),
        (lambda c: Q.set_limits(c, "q", rate_limit="9999999999/1s"), ValueError, "between"),
        (lambda c: Q.set_limits(c, "q", rate_limit=5), TypeError, "RateLimit"),  # type: ignore[arg-type]
        (lambda c: Q.pause(c, "bad\x00name"), ValueError, "queue"),
        (lambda c: Q.pause(c, "\ud800"), ValueError, "queue"),
        (lambda c: Q.pause(c, ""), ValueError, "queue"),
        (lambda c: Q.queue_settings(c, ["x" * 100]), ValueError, "queue"),
        (lambda c: trioq.enqueue(c, "t", concurrency_key="a\x00b"), ValueError, "NUL"),
        (lambda c: trioq.enqueue(c, "t", concurrency_key="\udc80"), ValueError, "surrogate"),
        (lambda c: trioq.enqueue(c, "t", concurrency_key=""), ValueError, "concurrency_key"),
        (lambda c: trioq.enqueue(c, "t", concurrency_key="k" * 501), ValueError, "500"),
        (lambda c: trioq.enqueue(c, "t", concurrency_key=7), TypeError, "concurrency_key"),  # type: ignore[arg-type]
    ],
)
async def test_bad_settings_fail_before_any_sql(
    dsn: str, call: Callable[[Any], Awaitable[object]], error: type[Exception], match: str
) -> None:
    conn = await trioq.connect(dsn, autocommit=True)
    await conn.close()  # any statement would raise OperationalError instead
    with pytest.raises(error, match=match):
        await call(conn)


def test_rate_limit_text_round_trips() -> None:
    for text, limit, seconds in [("100/1m", 100, 60), ("5/s", 5, 1), ("10/500ms", 10, 0.5),
                                 ("1000/1h", 1000, 3600), ("7/2d", 7, 172800),
                                 (" 3 / 1.5s ", 3, 1.5)]:  # fmt: skip
        rate = RateLimit.parse(text)
        assert (rate.limit, rate.period.total_seconds()) == (limit, seconds)
        assert RateLimit.parse(str(rate)) == rate
    assert str(RateLimit(3, 1.5)) == "3/1500ms"
