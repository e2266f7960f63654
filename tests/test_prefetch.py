"""The prefetch policy of a served queue (`trioq._worker.runtime._QueueState`), no database.

How many jobs the fetcher claims next: one for every idle slot, at once, plus as many
as finished while the last claim was in flight (short jobs: a claim is in flight while
the slots work through the buffer; long jobs: nothing beyond the idle slots). With every
slot busy, no claim smaller than half the slots.
"""

from __future__ import annotations

import datetime as dt

import pytest
import trio
import trio.testing

import trioq
from trioq._worker.leases import HeldJob
from trioq._worker.runtime import _QueueState

NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def state(
    concurrency: int, *, active: int = 0, buffered: int = 0, prefetch: int = 0
) -> _QueueState:
    s = _QueueState("q", trioq.QueueConfig(concurrency=concurrency))
    s.active = s.used = active  # cost-1 jobs: units are jobs
    s.buffer.extend(held(i) for i in range(buffered))
    s.buffered = buffered
    s.prefetch = prefetch
    return s


def held(i: int, units: int = 1) -> HeldJob:
    job = trioq.Job(
        id=i, queue="q", task="t", args={}, priority=0, run_at=NOW, attempt=1, max_attempts=1,
        enqueued_at=NOW, lease_expires_at=NOW,
    )  # fmt: skip
    return HeldJob(job, trioq.Lease(i, 1), units)


@pytest.mark.parametrize(
    ("concurrency", "active", "buffered", "prefetch", "wanted"),
    [
        (10, 0, 0, 0, 10),  # all idle: one job per slot
        (10, 4, 2, 0, 4),  # 4 slots have nothing to do
        (10, 4, 2, 3, 7),  # ... plus what finished during the last claim
        (10, 10, 0, 0, 0),  # all busy, nothing finished: wait for room
        (10, 10, 0, 4, 0),  # all busy, 4 finished: below half the slots, no tiny claim
        (10, 10, 0, 5, 5),  # half the slots' worth: claim ahead
        (10, 10, 0, 10, 10),  # short jobs: a whole batch ahead
        (10, 6, 4, 10, 10),  # the buffer counts as taken slots
        (1, 1, 0, 0, 0),
        (1, 1, 0, 1, 1),  # one slot: refill at 1
        (1, 0, 0, 0, 1),
    ],
)
def test_wanted(concurrency: int, active: int, buffered: int, prefetch: int, wanted: int) -> None:
    s = state(concurrency, active=active, buffered=buffered, prefetch=prefetch)
    assert s.wanted() == wanted


def test_the_buffer_stays_within_twice_the_slots() -> None:
    """Whatever the history, active + buffered + the next claim stay within 2 x concurrency."""
    for concurrency in (1, 2, 7, 10, 16):
        for active in range(concurrency + 1):
            for buffered in range(concurrency - active + 1):
                for prefetch in range(concurrency + 1):
                    s = state(concurrency, active=active, buffered=buffered, prefetch=prefetch)
                    assert active + buffered + s.wanted() <= 2 * concurrency


def test_short_jobs_that_starve_the_slots_start_the_prefetch() -> None:
    """Jobs shorter than a claim's round trip: the slots finish everything before the
    fetcher claims again (none finished *during* the claim, the buffer was empty), so the
    next claim must go out at once, ahead of the slots. Before, the prefetch stayed 0 and
    the fetcher and the slots took turns (round 3 of issue 15)."""
    s = state(100)
    s.claimed(sent=0.0, now=0.003, got=100, finished_before=0, starved=False, bound=False)
    assert s.prefetch == 0  # the first claim knows nothing yet
    s.finished = 100  # the slots ran all 100 within a millisecond of the claim's return
    assert s.starved(0.004)
    s.claimed(sent=0.004, now=0.007, got=100, finished_before=100, starved=True, bound=False)
    assert s.prefetch == 100
    s.put([held(i) for i in range(100)])  # the next claim goes out at once
    assert s.wanted() == 100


def test_long_jobs_do_not_start_a_prefetch() -> None:
    """Jobs longer than two round trips: a worker whose slots all finished claims for its
    idle slots only (the rest stays for other workers), as before."""
    s = state(100)
    s.claimed(sent=0.0, now=0.003, got=100, finished_before=0, starved=False, bound=False)
    s.finished = 100  # a second later
    assert not s.starved(1.0)
    s.claimed(sent=1.0, now=1.003, got=100, finished_before=100, starved=False, bound=False)
    assert s.prefetch == 0
    assert not state(100, active=1).starved(0.004)  # a job still running: not starved
    busy = state(100, buffered=1)
    busy.claimed(sent=0.0, now=0.003, got=1, finished_before=0, starved=False, bound=False)
    assert not busy.starved(0.004)  # jobs still buffered: not starved


def test_an_idle_queues_first_jobs_do_not_start_a_prefetch() -> None:
    """A claim that found nothing (an idle queue's poll) brought nothing the slots could
    have run through: the next claim, soon after it, is not a starved one. Before, under
    load (a 0.5 s round trip) the claim that a notification sent within two round trips of
    an empty poll counted as starved, and a worker with 2 slots took 4 of 5 one-minute jobs,
    holding 2 that other workers could run (tests/test_metrics.py saw 1 available, not 3)."""
    s = state(2)
    s.claimed(sent=0.0, now=0.5, got=0, finished_before=0, starved=False, bound=False)
    assert not s.starved(0.6)  # the notification's claim, 0.1 s after the empty poll
    s.claimed(sent=0.6, now=1.1, got=2, finished_before=0, starved=s.starved(0.6), bound=False)
    assert s.prefetch == 0
    s.active = s.used = 2
    assert s.wanted() == 0  # both slots busy with minute-long jobs: nothing more is claimed


def test_no_prefetch_while_a_concurrency_limit_decides() -> None:
    s = state(100)
    s.claimed(sent=0.0, now=0.003, got=100, finished_before=0, starved=True, bound=True)
    assert s.prefetch == 0
    s.finished = 50
    s.claimed(sent=0.004, now=0.007, got=100, finished_before=0, starved=False, bound=False)
    assert s.prefetch == 50  # what finished during the round trip, as before
    s.claimed(sent=0.008, now=0.011, got=300, finished_before=0, starved=True, bound=False)
    assert s.prefetch == 100  # never above the slots


def test_slots_take_buffered_jobs_then_end_once_closed() -> None:
    async def main() -> list[int | None]:
        s = state(2)
        taken: list[int | None] = []

        async def slot() -> None:
            while (job := await s.take(checkpoint=False)) is not None:
                taken.append(job.lease.job_id)
            taken.append(None)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slot)
            await trio.testing.wait_all_tasks_blocked()
            s.put([held(1), held(2)])
            await trio.testing.wait_all_tasks_blocked()
            s.close()
        return taken

    assert trio.run(main) == [1, 2, None]


def test_a_finished_job_wakes_a_waiting_fetcher() -> None:
    async def main() -> int:
        s = state(1, active=1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(s.wait_for_room)
            await trio.testing.wait_all_tasks_blocked()
            assert s.fetcher_waits
            s.job_done(1)
        assert not s.fetcher_waits
        return s.finished

    assert trio.run(main) == 1


# -- weighted slots (docs/flow-control.md, "Weighted slots") ----------------------------------


def test_wanted_counts_units() -> None:
    """A running cost-3 job takes 3 of 4 slots; a buffered cost-2 job 2 more: nothing is
    claimed until units free (the head may go one job past the slots, never more)."""
    s = state(4)
    s.put([held(1, 3)])
    assert s.wanted() == 1
    s.put([held(2, 2)])
    assert s.wanted() == 0
    assert s.units(None) == 1 and s.units(3) == 3 and s.units(7) == 4  # runs alone


def test_a_big_job_waits_at_the_head_and_the_small_ones_behind_it_wait_too() -> None:
    """Four slots: a cost-3 job runs; a cost-2 job is next and does not fit; a cost-1 job
    behind it would, but must not pass it (a big job is never starved by small ones). When
    the cost-3 job ends, the cost-2 job starts, then the cost-1 job beside it."""

    async def main() -> list[tuple[int, int]]:
        s = state(4)
        started: list[tuple[int, int]] = []  # (job, units in use once it started)
        running: dict[int, HeldJob] = {}

        async def slot() -> None:
            while (job := await s.take(checkpoint=False)) is not None:
                s.start(job)
                started.append((job.lease.job_id, s.used))
                running[job.lease.job_id] = job
                await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(slot)
            await trio.testing.wait_all_tasks_blocked()
            s.put([held(1, 3), held(2, 2), held(3, 1)])
            await trio.testing.wait_all_tasks_blocked()
            assert started == [(1, 3)] and s.blocked  # 2 waits at the head, 3 behind it
            s.job_done(running[1].units)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        return started

    assert trio.run(main) == [(1, 3), (2, 2), (3, 3)]


def test_a_cost_4_job_runs_alone_and_four_cost_1_jobs_run_together() -> None:
    async def main() -> list[int]:
        s = state(4)
        peaks: list[int] = []

        async def slot() -> None:
            while (job := await s.take(checkpoint=False)) is not None:
                s.start(job)
                peaks.append(s.used)
                assert s.used <= 4
                await trio.sleep(0.01)
                s.job_done(job.units)

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(slot)
            s.put([held(1, 4), held(2, 1), held(3, 1), held(4, 1), held(5, 1), held(6, 4)])
            await trio.sleep(1)
            s.close()
        return peaks

    assert trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0)) == [4, 1, 2, 3, 4, 4]


def test_a_closed_buffer_gives_its_head_at_once() -> None:
    """At a stop the buffered jobs are released, not run: the head comes whatever its units."""

    async def main() -> int | None:
        s = state(4)
        s.used = 4
        s.put([held(1, 4)])
        s.close()
        job = await s.take(checkpoint=False)
        return None if job is None else job.lease.job_id

    assert trio.run(main) == 1
