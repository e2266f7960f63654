"""The prefetch policy of a served queue (`trioq._runtime._QueueState`), no database.

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
from trioq._leases import HeldJob
from trioq._runtime import _QueueState

NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def state(
    concurrency: int, *, active: int = 0, buffered: int = 0, prefetch: int = 0
) -> _QueueState:
    s = _QueueState("q", trioq.QueueConfig(concurrency=concurrency))
    s.active = active
    s.buffer.extend(held(i) for i in range(buffered))
    s.prefetch = prefetch
    return s


def held(i: int) -> HeldJob:
    job = trioq.Job(
        id=i, queue="q", task="t", args={}, priority=0, run_at=NOW, attempt=1, max_attempts=1,
        enqueued_at=NOW, lease_expires_at=NOW,
    )  # fmt: skip
    return HeldJob(job, trioq.Lease(i, 1))


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
            s.job_done()
        assert not s.fetcher_waits
        return s.finished

    assert trio.run(main) == 1
