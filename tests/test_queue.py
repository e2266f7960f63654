"""The queue API against real Postgres: enqueue, claim, lease, outcomes, dead letters."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
import trio
from helpers import migrated

import trioq
from trioq import DeadFilter, Failure, JobSpec, Lease, Queue
from trioq.testing import set_clock

UTC = dt.UTC
LEASE = dt.timedelta(seconds=30)
T0 = dt.datetime(2030, 1, 1, tzinfo=UTC)

Q = Queue()


async def state_of(conn: Any, job_id: int) -> tuple[str, int] | None:
    cur = await conn.execute("SELECT state, attempt FROM trioq.jobs WHERE id = %s", (job_id,))
    row = await cur.fetchone()
    return None if row is None else (row[0], row[1])


async def test_enqueue_claim_complete(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        r = await trioq.enqueue(conn, "send", {"to": "ada"}, queue="mail")
        assert not r.duplicate
        jobs = await Q.claim(conn, "mail", owner="w1", limit=10, lease=LEASE)
        assert [(j.id, j.task, j.args, j.attempt) for j in jobs] == [
            (r.job_id, "send", {"to": "ada"}, 1)
        ]
        assert jobs[0].lease_expires_at == T0 + LEASE
        assert await Q.claim(conn, "mail", owner="w2", limit=10, lease=LEASE) == []
        done = await Q.complete_many(conn, owner="w1", leases=[Lease(r.job_id, 1)])
        assert done == {r.job_id}
        assert await state_of(conn, r.job_id) is None


async def test_enqueue_follows_callers_transaction(dsn: str) -> None:
    async with migrated(dsn, T0) as conn, await trioq.connect(dsn, autocommit=True) as other:
        await conn.set_autocommit(False)
        async with conn.transaction(force_rollback=True):
            await trioq.enqueue(conn, "t")
            cur = await other.execute("SELECT count(*) FROM trioq.jobs")
            assert await cur.fetchone() == (0,)  # not visible before commit
        cur = await other.execute("SELECT count(*) FROM trioq.jobs")
        assert await cur.fetchone() == (0,)  # rolled back with the caller
        await other.execute("LISTEN trioq_trioq")
        async with conn.transaction():
            await trioq.enqueue(conn, "t", queue="q1")
            await trioq.enqueue(conn, "t", queue="q1")
        cur = await other.execute("SELECT count(*) FROM trioq.jobs")
        assert await cur.fetchone() == (2,)
        notes = [n.payload async for n in other.notifies(timeout=0.5)]
        assert notes == ["q1"]  # one per queue per transaction


async def test_claim_order_priority_run_at_id(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        a = await trioq.enqueue(conn, "t", priority=5)
        b = await trioq.enqueue(conn, "t", priority=-5)
        c = await trioq.enqueue(conn, "t", run_at=T0 - dt.timedelta(hours=1))
        d = await trioq.enqueue(conn, "t")
        future = await trioq.enqueue(conn, "t", delay=60)
        jobs = await Q.claim(conn, "default", owner="w", limit=10, lease=LEASE)
        assert [j.id for j in jobs] == [b.job_id, c.job_id, d.job_id, a.job_id]
        assert await state_of(conn, future.job_id) == ("scheduled", 0)
        assert await Q.next_due(conn) == dt.timedelta(seconds=60)
        await set_clock(conn, T0 + dt.timedelta(seconds=59))
        assert await Q.promote_due(conn) == []
        await set_clock(conn, T0 + dt.timedelta(seconds=61))
        assert await Q.promote_due(conn) == ["default"]
        assert await Q.next_due(conn) is None
        jobs = await Q.claim(conn, "default", owner="w", limit=10, lease=LEASE)
        assert [j.id for j in jobs] == [future.job_id]


async def test_claim_batch_is_bounded_and_disjoint(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        await Q.enqueue_many(conn, [JobSpec(task="t", args={"i": i}) for i in range(25)])
        first = await Q.claim(conn, "default", owner="a", limit=10, lease=LEASE)
        second = await Q.claim(conn, "default", owner="b", limit=100, lease=LEASE)
        assert len(first) == 10
        assert len(second) == 15
        assert not {j.id for j in first} & {j.id for j in second}


async def test_concurrent_claimers_never_share_a_job(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        await Q.enqueue_many(conn, [JobSpec(task="t") for _ in range(300)])
    claimed: dict[str, list[int]] = {}

    async def claimer(name: str) -> None:
        async with await trioq.connect(dsn, autocommit=True) as c:
            await set_clock(c, T0)
            mine = claimed.setdefault(name, [])
            while jobs := await Q.claim(c, "default", owner=name, limit=7, lease=LEASE):
                mine.extend(j.id for j in jobs)

    async with trio.open_nursery() as nursery:
        for i in range(5):
            nursery.start_soon(claimer, f"w{i}")
    all_ids = [i for ids in claimed.values() for i in ids]
    assert len(all_ids) == 300
    assert len(set(all_ids)) == 300


async def test_dedup_fingerprint_and_key(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        a = await trioq.enqueue(conn, "t", {"x": 1, "y": 2}, unique=True)
        b = await trioq.enqueue(conn, "t", {"y": 2, "x": 1}, unique=True)  # same canonical args
        c = await trioq.enqueue(conn, "t", {"x": 1, "y": 2}, unique=True, queue="other")
        assert b == trioq.EnqueueResult(a.job_id, duplicate=True)
        assert not c.duplicate
        k1 = await trioq.enqueue(conn, "t", dedup_key="order-7")
        # Explicit keys are scoped by task (issue #13; before, this was a duplicate of k1).
        k2 = await trioq.enqueue(conn, "u", {"z": 1}, dedup_key="order-7")
        assert not k2.duplicate
        again_t = await trioq.enqueue(conn, "t", {"z": 2}, dedup_key="order-7")
        assert again_t == trioq.EnqueueResult(k1.job_id, duplicate=True)
        # A global key spans tasks.
        g1 = await trioq.enqueue(conn, "t", unique=trioq.Unique(key="g", by_task=False))
        g2 = await trioq.enqueue(conn, "u", unique=trioq.Unique(key="g", by_task=False))
        assert g2 == trioq.EnqueueResult(g1.job_id, duplicate=True)
        # Running still counts as live; finished frees the key.
        jobs = await Q.claim(conn, "default", owner="w", limit=10, lease=LEASE)
        assert (await trioq.enqueue(conn, "t", dedup_key="order-7")).duplicate
        await Q.complete_many(conn, owner="w", leases=[Lease(j.id, j.attempt) for j in jobs])
        again = await trioq.enqueue(conn, "t", dedup_key="order-7")
        assert not again.duplicate


async def test_enqueue_many_mixed_with_duplicates_in_order(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        first = await trioq.enqueue(conn, "t", dedup_key="k")
        specs = [
            JobSpec(task="t", args={"i": 0}),
            JobSpec(task="t", dedup_key="k"),
            JobSpec(task="t", dedup_key="new"),
            JobSpec(task="t", dedup_key="new"),
            JobSpec(task="t", args={"s": "tab\there \\ back"}, queue="q2", delay=5),
        ]
        results = await Q.enqueue_many(conn, specs)
        assert [r.duplicate for r in results] == [False, True, False, True, False]
        assert results[1].job_id == first.job_id
        assert results[3].job_id == results[2].job_id
        cur = await conn.execute(
            "SELECT args, run_at, state FROM trioq.jobs WHERE id = %s", (results[4].job_id,)
        )
        assert await cur.fetchone() == (
            {"s": "tab\there \\ back"},
            T0 + dt.timedelta(seconds=5),
            "scheduled",
        )


async def test_enqueue_many_copy_path_roundtrips_args(dsn: str) -> None:
    weird = {"s": 'new\nline\ttab\\slash \u2028 é "q"', "n": [1, 2.5, None, True]}
    async with migrated(dsn, T0) as conn:
        results = await Q.enqueue_many(conn, [JobSpec(task="t", args=weird) for _ in range(3)])
        assert len({r.job_id for r in results}) == 3
        jobs = await Q.claim(conn, "default", owner="w", limit=10, lease=LEASE)
        assert [j.args for j in jobs] == [weird] * 3
        assert [j.id for j in jobs] == [r.job_id for r in results]


async def test_heartbeat_extends_and_reports_lost(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        ids = [r.job_id for r in await Q.enqueue_many(conn, [JobSpec(task="t") for _ in range(3)])]
        jobs = await Q.claim(conn, "default", owner="w1", limit=3, lease=LEASE)
        leases = [Lease(j.id, j.attempt) for j in jobs]
        await set_clock(conn, T0 + LEASE + dt.timedelta(seconds=1))
        swept = await Q.sweep(conn)
        assert swept.returned == set(ids)
        stolen = await Q.claim(conn, "default", owner="w2", limit=1, lease=LEASE)
        beat = await Q.heartbeat(conn, owner="w1", leases=leases, lease=LEASE)
        assert beat.extended == set()
        assert beat.lost == set(leases)
        # The stale lease can no longer write anything.
        assert await Q.complete_many(conn, owner="w1", leases=leases) == set()
        assert await Q.release_many(conn, owner="w1", leases=leases) == set()
        fail = await Q.fail_many(conn, owner="w1", failures=[Failure(lease=leases[0], error="x")])
        assert fail.retried == fail.dead == set()
        assert await state_of(conn, stolen[0].id) == ("running", 2)
        ok = await Q.heartbeat(conn, owner="w2", leases=[Lease(stolen[0].id, 2)], lease=LEASE)
        assert ok.extended == {Lease(stolen[0].id, 2)}


async def test_fail_retries_then_dies_with_traceback(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        r = await trioq.enqueue(conn, "t", {"a": 1}, max_attempts=2)
        (job,) = await Q.claim(conn, "default", owner="w", limit=1, lease=LEASE)
        res = await Q.fail_many(
            conn,
            owner="w",
            failures=[
                Failure(lease=Lease(job.id, 1), error="boom", delay=dt.timedelta(seconds=10))
            ],
        )
        assert res.retried == {r.job_id}
        assert await state_of(conn, r.job_id) == ("scheduled", 1)  # backoff
        await set_clock(conn, T0 + dt.timedelta(seconds=10))
        assert await Q.promote_due(conn) == ["default"]
        (job,) = await Q.claim(conn, "default", owner="w", limit=1, lease=LEASE)
        assert job.attempt == 2
        res = await Q.fail_many(
            conn,
            owner="w",
            failures=[Failure(lease=Lease(job.id, 2), error="boom2", traceback="TB")],
        )
        assert res.dead == {r.job_id}
        (dead,) = await Q.dead_list(conn)
        assert (dead.id, dead.args, dead.attempt, dead.reason, dead.last_error, dead.traceback) == (
            r.job_id, {"a": 1}, 2, "attempts exhausted", "boom2", "TB",
        )  # fmt: skip


async def test_fatal_skips_retries_and_dead_retry_gives_fresh_attempts(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        r = await trioq.enqueue(conn, "t", max_attempts=5, dedup_key="d")
        (job,) = await Q.claim(conn, "default", owner="w", limit=1, lease=LEASE)
        res = await Q.fail_many(
            conn, owner="w", failures=[Failure(lease=Lease(job.id, 1), error="bad", fatal=True)]
        )
        assert res.dead == {r.job_id}
        twin = await trioq.enqueue(conn, "t", dedup_key="d")
        assert await Q.dead_retry(conn) == []  # its twin is live: retrying would duplicate
        (twin_job,) = await Q.claim(conn, "default", owner="w", limit=1, lease=LEASE)
        assert twin_job.id == twin.job_id
        await Q.complete_many(conn, owner="w", leases=[Lease(twin_job.id, 1)])
        assert await Q.dead_retry(conn, DeadFilter(task="t")) == [r.job_id]
        assert await state_of(conn, r.job_id) == ("available", 0)
        assert await Q.dead_list(conn) == []


async def test_dead_purge_filters(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        for queue in ("a", "b"):
            await trioq.enqueue(conn, "t", queue=queue, max_attempts=1)
            (job,) = await Q.claim(conn, queue, owner="w", limit=1, lease=LEASE)
            await Q.fail_many(
                conn, owner="w", failures=[Failure(lease=Lease(job.id, 1), error="e")]
            )
        assert len(await Q.dead_list(conn, DeadFilter(queue="a"))) == 1
        assert len(await Q.dead_purge(conn, DeadFilter(queue="a"))) == 1
        assert [d.queue for d in await Q.dead_list(conn)] == ["b"]
        assert await Q.dead_purge(conn, before=T0 - dt.timedelta(days=1)) == []


async def test_sweep_returns_or_kills_expired_leases(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        last = await trioq.enqueue(conn, "t", max_attempts=1)
        more = await trioq.enqueue(conn, "t", max_attempts=3)
        await Q.claim(conn, "default", owner="crashed", limit=2, lease=LEASE)
        assert (await Q.sweep(conn)).returned == set()  # not expired yet
        await set_clock(conn, T0 + LEASE + dt.timedelta(seconds=1))
        swept = await Q.sweep(conn)
        assert swept.returned == {more.job_id}
        assert swept.dead == {last.job_id}
        assert await state_of(conn, more.job_id) == ("available", 1)  # attempt stays spent
        (dead,) = await Q.dead_list(conn)
        assert dead.reason == "lease expired on the last attempt"


async def test_release_refunds_the_attempt(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        r = await trioq.enqueue(conn, "t")
        (job,) = await Q.claim(conn, "default", owner="w", limit=1, lease=LEASE)
        assert await Q.release_many(conn, owner="w", leases=[Lease(job.id, 1)]) == {r.job_id}
        assert await state_of(conn, r.job_id) == ("available", 0)


async def test_cancel_available_and_running(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        a = await trioq.enqueue(conn, "t")
        assert (await Q.cancel(conn, a.job_id)).status == "cancelled"
        assert await state_of(conn, a.job_id) == ("cancelled", 0)
        later = await trioq.enqueue(conn, "t", delay=100)
        assert (await Q.cancel(conn, later.job_id)).status == "cancelled"
        b = await trioq.enqueue(conn, "t")
        (job,) = await Q.claim(conn, "default", owner="w", limit=1, lease=LEASE)
        assert (await Q.cancel(conn, b.job_id)).status == "requested"
        beat = await Q.heartbeat(conn, owner="w", leases=[Lease(job.id, 1)], lease=LEASE)
        assert beat.cancel_requested == {Lease(b.job_id, 1)}
        assert await Q.cancel_running_many(conn, owner="w", leases=[Lease(job.id, 1)]) == {b.job_id}
        assert await state_of(conn, b.job_id) == ("cancelled", 1)
        assert (await Q.cancel(conn, b.job_id)).status == "not_found"
        assert (await Q.cancel(conn, 10**12)).status == "not_found"


async def test_complete_keeping_results(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        r = await trioq.enqueue(conn, "t")
        (job,) = await Q.claim(conn, "default", owner="w", limit=1, lease=LEASE)
        await Q.complete_many(conn, owner="w", leases=[Lease(job.id, 1)], results=[{"ok": 1}])
        cur = await conn.execute("SELECT state, result FROM trioq.jobs WHERE id = %s", (r.job_id,))
        assert await cur.fetchone() == ("done", {"ok": 1})


BAD_INPUT: list[tuple[Callable[[], Any], type[Exception], str]] = [
    (lambda: JobSpec(task="t", args={"x": object()}), ValueError, "args must be JSON"),
    (lambda: JobSpec(task="t", args={"x": float("nan")}), ValueError, "args must be JSON"),
    (lambda: JobSpec(task="t", args={"x": "a\x00b"}), ValueError, "NUL"),
    (lambda: JobSpec(task=""), ValueError, "task must be a non-empty string"),
    (lambda: JobSpec(task="a b"), ValueError, "task 'a b' is invalid"),
    (lambda: JobSpec(task="t", queue="x'; DROP TABLE jobs; --"), ValueError, "queue"),
    (lambda: JobSpec(task="t", queue=""), ValueError, "queue '' is invalid"),
    (lambda: JobSpec(task="t", priority=101), ValueError, "priority must be between"),
    (lambda: JobSpec(task="t", priority=1.5), TypeError, "priority must be an int"),  # type: ignore[arg-type]
    (lambda: JobSpec(task="t", run_at=dt.datetime(2030, 1, 1)), ValueError, "naive datetime"),
    (lambda: JobSpec(task="t", delay=-1), ValueError, "delay must not be negative"),
    (lambda: JobSpec(task="t", max_attempts=0), ValueError, "max_attempts must be between"),
    (lambda: JobSpec(task="t", run_at=T0, delay=5), ValueError, "run_at or delay"),
    (lambda: JobSpec(task="t", dedup_key=""), ValueError, "dedup_key"),
    (lambda: Queue(schema="Bad Schema"), ValueError, "schema name"),
    (lambda: Queue(max_payload_bytes=0), ValueError, "max_payload_bytes"),
]


@pytest.mark.parametrize(("build", "error", "message"), BAD_INPUT)
def test_bad_input_names_the_field(
    build: Callable[[], Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        build()


async def test_payload_limit_and_nothing_written(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        small = Queue(max_payload_bytes=100)
        with pytest.raises(trioq.PayloadTooLargeError, match="over the limit of 100"):
            await small.enqueue(conn, "t", {"blob": "x" * 200})
        with pytest.raises(trioq.PayloadTooLargeError):
            await small.enqueue_many(conn, [JobSpec(task="t"), JobSpec(task="t", args=["x" * 200])])
        cur = await conn.execute("SELECT count(*) FROM trioq.jobs")
        assert await cur.fetchone() == (0,)


async def test_stale_owner_with_same_attempt_number_changes_nothing(dsn: str) -> None:
    """Release refunds the attempt, so another worker can hold the same attempt number:
    the owner in the fence is what keeps the first worker's stale lease harmless."""
    async with migrated(dsn, T0) as conn:
        r = await trioq.enqueue(conn, "t")
        (job,) = await Q.claim(conn, "default", owner="a", limit=1, lease=LEASE)
        await Q.release_many(conn, owner="a", leases=[Lease(job.id, 1)])
        (again,) = await Q.claim(conn, "default", owner="b", limit=1, lease=LEASE)
        assert again.attempt == 1
        stale = [Lease(r.job_id, 1)]
        assert await Q.complete_many(conn, owner="a", leases=stale) == set()
        assert (await Q.heartbeat(conn, owner="a", leases=stale, lease=LEASE)).lost == set(stale)
        assert await state_of(conn, r.job_id) == ("running", 1)
