"""The claim and the fences, each tested directly (issue #10: bugs planted in these passed
every other test). Real Postgres; a second connection holds the locks."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest
import trio
from committing import Commits
from helpers import migrated, rows

import trioq
from trioq import Failure, Lease, Queue
from trioq._db.statements import LEASE_LOST_SQLSTATE, statements

LEASE = dt.timedelta(seconds=30)
Q = Queue()


def claimed_lease(job: trioq.Job) -> Lease:
    return Lease(job.id, job.attempt)


async def row(conn: Any, job_id: int) -> tuple[Any, ...]:
    found = await rows(
        conn, "SELECT state, attempt, lease_owner, lease_expires_at, run_at, last_error,"
        " cancel_requested FROM trioq.jobs WHERE id = %s", job_id,
    )  # fmt: skip
    assert found, f"job {job_id} is gone"
    return found[0]


# -- the claim -----------------------------------------------------------------------------------


async def test_the_claim_skips_a_locked_row_instead_of_waiting(dsn: str) -> None:
    """Another transaction holds the first job's row: the claim must return the second at
    once (SKIP LOCKED), not wait for the lock (here it would hit lock_timeout)."""
    async with migrated(dsn) as conn, await trioq.connect(dsn) as other:
        first = await trioq.enqueue(conn, "t", priority=-1)
        second = await trioq.enqueue(conn, "t")
        await other.execute("SELECT 1 FROM trioq.jobs WHERE id = %s FOR UPDATE", (first.job_id,))
        await conn.execute("SET lock_timeout = '200ms'")
        with trio.fail_after(2):
            claimed = await Q.claim(conn, "default", owner="w", limit=1, lease=LEASE)
        assert [job.id for job in claimed] == [second.job_id]
        await other.rollback()
        (again,) = await Q.claim(conn, "default", owner="w", limit=1, lease=LEASE)
        assert again.id == first.job_id


async def test_the_claim_takes_only_its_own_queue(dsn: str) -> None:
    async with migrated(dsn) as conn:
        elsewhere = [await trioq.enqueue(conn, "t", queue="other", priority=-100)
                     for _ in range(3)]  # fmt: skip
        mine = await trioq.enqueue(conn, "t", queue="mine", priority=100)
        claimed = await Q.claim(conn, "mine", owner="w", limit=10, lease=LEASE)
        assert [job.id for job in claimed] == [mine.job_id]
        assert [(await row(conn, j.job_id))[0] for j in elsewhere] == ["available"] * 3
        assert await Q.claim(conn, "mine", owner="w", limit=10, lease=LEASE) == []


# -- a zombie attempt of the same owner changes nothing --------------------------------------------


async def zombie_and_live(conn: Any) -> tuple[Lease, Lease, tuple[Any, ...]]:
    """Attempt 1 claimed by ``w``, expired and swept; attempt 2 claimed by ``w`` again.
    Returns the zombie's lease, the live lease, and the row as attempt 2 left it."""
    job = await trioq.enqueue(conn, "t", max_attempts=5)
    (first,) = await Q.claim(conn, "default", owner="w", limit=1, lease=LEASE)
    await conn.execute(
        "UPDATE trioq.jobs SET lease_expires_at = now() - interval '1 s' WHERE id = %s",
        (job.job_id,),
    )
    assert (await Q.sweep(conn)).returned == {job.job_id}
    (second,) = await Q.claim(conn, "default", owner="w", limit=1, lease=LEASE)
    assert (first.attempt, second.attempt) == (1, 2)
    return Lease(job.job_id, 1), Lease(job.job_id, 2), await row(conn, job.job_id)


async def test_a_zombie_attempts_complete_changes_nothing(dsn: str) -> None:
    async with migrated(dsn) as conn:
        zombie, _live, before = await zombie_and_live(conn)
        assert await Q.complete_many(conn, owner="w", leases=[zombie]) == frozenset()
        kept = await Q.complete_many(conn, owner="w", leases=[zombie], results=[{"x": 1}])
        assert kept == frozenset()
        assert await row(conn, zombie.job_id) == before


@pytest.mark.parametrize("fatal", [False, True], ids=["retry", "fatal"])
async def test_a_zombie_attempts_failure_changes_nothing(dsn: str, fatal: bool) -> None:
    async with migrated(dsn) as conn:
        zombie, _live, before = await zombie_and_live(conn)
        failure = Failure(lease=zombie, error="late", delay=dt.timedelta(seconds=60), fatal=fatal)
        result = await Q.fail_many(conn, owner="w", failures=[failure])
        assert result.retried == result.dead == result.cancelled == frozenset()
        assert await row(conn, zombie.job_id) == before
        assert await rows(conn, "SELECT 1 FROM trioq.dead_jobs") == []


async def test_a_zombie_attempts_release_changes_nothing(dsn: str) -> None:
    async with migrated(dsn) as conn:
        zombie, _live, before = await zombie_and_live(conn)
        released = await Q.release_many(conn, owner="w", leases=[zombie],
                                        delays=[dt.timedelta(seconds=60)])  # fmt: skip
        assert released == frozenset()
        assert await row(conn, zombie.job_id) == before


async def test_a_zombie_attempts_heartbeat_changes_nothing(dsn: str) -> None:
    async with migrated(dsn) as conn:
        zombie, live, before = await zombie_and_live(conn)
        beat = await Q.heartbeat(conn, owner="w", leases=[zombie],
                                 lease=dt.timedelta(hours=1))  # fmt: skip
        assert beat.extended == frozenset() and beat.lost == {zombie}
        assert await row(conn, zombie.job_id) == before
        assert (await Q.heartbeat(conn, owner="w", leases=[live], lease=LEASE)).extended == {live}


async def test_a_zombie_attempts_cancel_and_unknown_task_change_nothing(dsn: str) -> None:
    async with migrated(dsn) as conn:
        zombie, _live, before = await zombie_and_live(conn)
        assert await Q.cancel_running_many(conn, owner="w", leases=[zombie]) == frozenset()
        unknown = Failure(lease=zombie, error="unknown task", reason="unknown task")
        given_back = await Q.release_unknown_many(conn, owner="w", failures=[unknown],
                                                  dead_after=dt.timedelta(0))  # fmt: skip
        assert given_back.retried == given_back.dead == frozenset()
        assert await row(conn, zombie.job_id) == before


async def test_a_zombie_in_a_batch_is_not_paired_with_another_jobs_attempt(dsn: str) -> None:
    """The zombie (attempt 1) shares a batch with another job at attempt 2, the zombie's
    current attempt: each lease is checked as the pair it is, never id against any attempt
    of the batch."""
    async with migrated(dsn) as conn:
        zombie, _live, before = await zombie_and_live(conn)
        other = await trioq.enqueue(conn, "t", max_attempts=5)
        (first,) = await Q.claim(conn, "default", owner="w", limit=1, lease=LEASE)
        await conn.execute(
            "UPDATE trioq.jobs SET attempt = 2 WHERE id = %s", (other.job_id,)
        )  # fmt: skip
        assert first.id == other.job_id
        batch = [zombie, Lease(other.job_id, 2)]
        beat = await Q.heartbeat(conn, owner="w", leases=batch, lease=dt.timedelta(hours=1))
        assert beat.extended == {Lease(other.job_id, 2)} and beat.lost == {zombie}
        assert await Q.cancel_running_many(conn, owner="w", leases=[zombie]) == frozenset()
        await conn.execute("BEGIN")
        shared = statements("trioq").complete_in_transaction  # job.transaction(shared=True)'s
        params = {"ids": [lease.job_id for lease in batch],
                  "attempts": [lease.attempt for lease in batch], "owner": "w"}  # fmt: skip
        with pytest.raises(psycopg.Error) as lost:
            await conn.execute(shared, params)
        assert lost.value.sqlstate == LEASE_LOST_SQLSTATE
        assert lost.value.diag.message_detail == str(zombie.job_id)
        await conn.execute("ROLLBACK")
        assert await Q.complete_many(conn, owner="w", leases=batch) == {other.job_id}
        assert await row(conn, zombie.job_id) == before


# -- job.transaction() when the lease is taken mid-transaction -------------------------------------


async def test_a_transaction_whose_lease_is_taken_meanwhile_rolls_back(dsn: str) -> None:
    """While the handler's transaction is open, the sweeper takes the job (its lease
    expired) and another worker claims it: the completion's fence fails, the user's write
    is rolled back, and LeaseLostError is raised. Deterministic: events, no timing."""
    async with migrated(dsn) as conn:
        await conn.execute("CREATE TABLE effects (job_id bigint, attempt int)")
        job = await trioq.enqueue(conn, "t")
        (claimed,) = await Q.claim(conn, "default", owner="w", limit=1, lease=LEASE)
        forgotten = Commits()
        async with trioq.pg.Pool(dsn, max_size=1, connect_kwargs={"autocommit": True}) as pool:
            services = trioq.JobServices(app_pool=pool, queue=Q, owner="w",
                                         committing=forgotten)  # fmt: skip
            ctx = trioq.JobContext(claimed, services)
            with pytest.raises(trioq.LeaseLostError, match=f"job {job.job_id} attempt 1"):
                async with ctx.transaction() as tx:
                    await tx.execute("INSERT INTO effects VALUES (%s, 1)", (job.job_id,))
                    # meanwhile: the lease expires, is swept, and another worker claims it
                    await conn.execute(
                        "UPDATE trioq.jobs SET lease_expires_at = now() - interval '1 s'"
                        " WHERE id = %s", (job.job_id,),
                    )  # fmt: skip
                    await Q.sweep(conn)
                    (stolen,) = await Q.claim(conn, "default", owner="other", limit=1,
                                              lease=LEASE)  # fmt: skip
                    assert stolen.attempt == 2
        assert await rows(conn, "SELECT * FROM effects") == []  # rolled back
        assert (await row(conn, job.job_id))[:3] == ("running", 2, "other")
        # No heartbeat while the completion and COMMIT went out together; the completion
        # found the lease lost, nothing committed, and heartbeats would go on (they find it
        # lost: the handler is cancelled).
        lease = claimed_lease(claimed)
        assert forgotten.events == [("committing", lease), ("heartbeated again", lease)]
        assert forgotten == [] and not ctx.completed_in_transaction
