"""Guarantees that, before issue #22, only a slow or indirect test caught (each was planted as
a bug that the whole suite let through): each tested here directly, fast and deterministic,
with the slow path that could hide a broken fast one disabled.

- In its own transaction, a stale attempt of the same worker name commits nothing: the
  completion is fenced by the attempt, not only the owner (all four paths).
- A cancel reaches a running handler through its notification: with a 20 s heartbeat, the
  heartbeat cannot be what delivers it.
- A queue's global concurrency counts that queue's running jobs only, and an expired lease
  that no sweeper took yet still holds its slot (its worker may be running it).
- Pausing a queue gives back the jobs claimed ahead for it at once: with a 60 s poll, only
  the notification can deliver the pause.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import trio
from committing import Commits
from helpers import migrated, rows, scalar, serving, wait_until

import trioq
from trioq import Queue, QueueConfig
from trioq._complete_with import SharedCompletions
from trioq._job_transaction import SharedTransactions
from trioq.testing import set_clock

Q = Queue()
LEASE = dt.timedelta(seconds=30)
T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)

# -- the attempt fence of the job's own transaction -----------------------------------------


async def _stale_attempt(conn: Any) -> tuple[trioq.Job, tuple[Any, ...]]:
    """Attempt 1 claimed by ``w``, its lease expired and swept, attempt 2 claimed by ``w``
    again (a worker restarted under the same name, or this one): attempt 1's job, and the
    row as attempt 2 has it."""
    job = await trioq.enqueue(conn, "t", max_attempts=5)
    (first,) = await Q.claim(conn, "default", owner="w", limit=1, lease=LEASE)
    await conn.execute("UPDATE trioq.jobs SET lease_expires_at = now() - interval '1 s'"
                       " WHERE id = %s", (job.job_id,))  # fmt: skip
    assert (await Q.sweep(conn)).returned == {job.job_id}
    (second,) = await Q.claim(conn, "default", owner="w", limit=1, lease=LEASE)
    assert (first.attempt, second.attempt, second.id) == (1, 2, first.id)
    return first, await _row(conn, first.id)


async def _row(conn: Any, job_id: int) -> tuple[Any, ...]:
    [found] = await rows(conn, "SELECT state, attempt, lease_owner FROM trioq.jobs"
                               " WHERE id = %s", job_id)  # fmt: skip
    return found


async def _own(ctx: trioq.JobContext) -> None:
    async with ctx.transaction() as tx:
        await tx.execute("INSERT INTO effects VALUES (%s)", (ctx.id,))


async def _shared(ctx: trioq.JobContext) -> None:
    async with ctx.transaction(shared=True) as tx:
        await tx.execute("INSERT INTO effects VALUES (%s)", (ctx.id,))


async def _complete_with(ctx: trioq.JobContext) -> None:
    await ctx.complete_with("INSERT INTO effects VALUES (%s)", (ctx.id,))


async def _complete_with_shared(ctx: trioq.JobContext) -> None:
    await ctx.complete_with("INSERT INTO effects VALUES (%s)", (ctx.id,), shared=True)


PATHS = {"transaction": _own, "shared": _shared, "complete_with": _complete_with,
         "complete_with-shared": _complete_with_shared}  # fmt: skip


@pytest.mark.parametrize("path", PATHS.values(), ids=PATHS.keys())
async def test_a_stale_attempt_of_the_same_owner_commits_nothing(dsn: str, path: Any) -> None:
    async with migrated(dsn) as conn:
        await conn.execute("CREATE TABLE effects (job_id bigint)")
        stale, before = await _stale_attempt(conn)
        async with trioq.pg.Pool(dsn, max_size=2, connect_kwargs={"autocommit": True}) as pool:
            lanes = {"lanes": 1, "max_jobs": 10}
            services = trioq.JobServices(
                app_pool=pool, queue=Q, owner="w", committing=Commits(),
                shared=SharedTransactions(pool, Q, "w", **lanes),
                completions=SharedCompletions(pool, Q, "w", **lanes),
            )  # fmt: skip
            with pytest.raises(trioq.LeaseLostError):
                await path(trioq.JobContext(stale, services))
        assert await rows(conn, "SELECT * FROM effects") == []
        assert await _row(conn, stale.id) == before == ("running", 2, "w")


# -- a cancel, by its notification alone --------------------------------------------------------


async def test_a_cancel_is_delivered_by_its_notification_not_the_heartbeat(dsn: str) -> None:
    registry = trioq.Registry()
    started = trio.Event()
    stopped = trio.Event()

    @registry.task(name="forever")
    async def forever(job: trioq.JobContext) -> None:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            stopped.set()

    # The heartbeat (every 20 s) would see the cancel flag too: far later than this waits.
    async with serving(dsn, registry, lease=60, heartbeat_interval=20, sweep_interval=20) as (
        conn, _runtime,
    ):  # fmt: skip
        job_id = (await trioq.enqueue(conn, "forever")).job_id
        with trio.fail_after(5):
            await started.wait()
        await Q.cancel(conn, job_id)
        with trio.fail_after(5):
            await stopped.wait()
        await wait_until(lambda: scalar(conn, "SELECT state = 'cancelled' FROM trioq.jobs"
                                              " WHERE id = %s", job_id), timeout=5)  # fmt: skip


# -- global concurrency: its own queue's running jobs, expired leases included -------------


async def _claim_limited(conn: Any, queue: str, limit: int = 10) -> list[trioq.Job]:
    got = await Q.claim_limited(conn, queue, owner="w", limit=limit, lease=LEASE)
    return list(got.jobs)


async def test_global_concurrency_counts_its_own_queues_running_jobs_only(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        await trioq.enqueue_many(conn, [trioq.JobSpec(task="t", queue="other")] * 5)
        assert len(await Q.claim(conn, "other", owner="w", limit=5, lease=LEASE)) == 5
        await trioq.enqueue_many(conn, [trioq.JobSpec(task="t", queue="limited")] * 5)
        await Q.set_limits(conn, "limited", global_concurrency=2)
        assert len(await _claim_limited(conn, "limited")) == 2


async def test_an_expired_lease_not_yet_swept_still_holds_its_slot(dsn: str) -> None:
    """Its worker may still be running it: until a sweeper takes the job (and says so), the
    slot is taken."""
    async with migrated(dsn, T0) as conn:
        await trioq.enqueue_many(conn, [trioq.JobSpec(task="t", queue="limited")] * 3)
        await Q.set_limits(conn, "limited", global_concurrency=1)
        assert len(await _claim_limited(conn, "limited")) == 1
        await set_clock(conn, T0 + 2 * LEASE)  # expired, and no sweeper has run
        assert await _claim_limited(conn, "limited") == []
        assert (await Q.sweep(conn)).returned  # swept: the slot is free
        assert len(await _claim_limited(conn, "limited")) == 1


# -- a pause, by its notification alone, gives back what was claimed ahead -----------------


async def test_a_pause_gives_back_the_jobs_claimed_ahead_at_once(dsn: str) -> None:
    registry = trioq.Registry()
    block = trio.Event()
    hold = [False]
    started: list[int] = []

    @registry.task(queue="q", name="short")
    async def short(job: trioq.JobContext) -> None:
        started.append(job.id)
        if hold[0]:
            await block.wait()

    queues = {"q": QueueConfig(concurrency=1)}
    async with serving(dsn, registry, queues=queues, poll_interval=60) as (conn, runtime):
        await trioq.enqueue_bulk(conn, "short", [{}] * 2000, queue="q")

        def buffered() -> int:
            (gauge,) = runtime._gauges()
            return gauge.buffered

        # Short jobs: once some ran, the fetcher claims ahead of its one slot. Then the
        # slot's job blocks with a job claimed ahead waiting behind it.
        with trio.fail_after(20):
            while not (buffered() and len(started) > 50):  # noqa: ASYNC110 - polled state
                await trio.sleep(0.001)
        hold[0] = True
        with trio.fail_after(20):
            while not (buffered() and runtime._gauges()[0].busy):  # noqa: ASYNC110
                await trio.sleep(0.001)
        running = len(started)
        await Q.pause(conn, "q")
        with trio.fail_after(5):  # the poll (60 s) cannot be what delivers it
            while buffered():  # noqa: ASYNC110
                await trio.sleep(0.01)
        # The blocked one still runs; what was claimed ahead went back, unstarted.
        running_in_db = "SELECT count(*) = 1 FROM trioq.jobs WHERE state = 'running'"
        await wait_until(lambda: scalar(conn, running_in_db), timeout=5)
        assert await scalar(conn, "SELECT max(attempt) FROM trioq.jobs"
                                  " WHERE state = 'available'") == 0  # fmt: skip
        assert len(started) == running
        block.set()
