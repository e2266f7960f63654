"""A job enqueued by name that did not choose ``max_attempts`` gets its task's, resolved by
the worker that claims it (issue 23): a producer without the registry (another service, a
script, `trioq.enqueue(conn, "name")`) used to fix 25 attempts in the row, so a task declared
with 2 ran 25 times and its ``dead`` hooks never fired. Real workers, real Postgres."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from helpers import rows, scalar, serving, wait_until

import trioq
from trioq.retry import Constant


def failing(max_attempts: int, died: list[int], ran: list[int]) -> trioq.Registry:
    tasks = trioq.Registry()

    @tasks.task(max_attempts=max_attempts, retry=Constant(seconds=0))
    async def flaky(job: trioq.JobContext) -> None:
        ran.append(job.attempt)
        raise RuntimeError(f"attempt {job.attempt} fails")

    @tasks.on("dead")
    async def buried(event: Any) -> None:
        died.append(event.job_id)

    return tasks


async def dead_attempts(conn: Any, job_id: int) -> tuple[int, int] | None:
    found = await rows(conn, "SELECT attempt, max_attempts FROM trioq.dead_jobs WHERE id = %s",
                       job_id)  # fmt: skip
    return found[0] if found else None


async def test_a_job_enqueued_by_name_gets_its_tasks_max_attempts(dsn: str) -> None:
    died: list[int] = []
    ran: list[int] = []
    async with serving(dsn, failing(2, died, ran)) as (conn, _runtime):
        job = await trioq.enqueue(conn, "flaky")
        await wait_until(lambda: dead_attempts(conn, job.job_id))
        assert await dead_attempts(conn, job.job_id) == (2, 2)
        await wait_until(lambda: _true(died == [job.job_id]))
    assert ran == [1, 2]


async def test_every_way_of_enqueueing_by_name_leaves_the_choice_to_the_task(dsn: str) -> None:
    """enqueue, enqueue_many, enqueue_bulk, a unique window, a workflow's job, a batch's
    callback and a cron entry: none chose, so each runs its task's 2 attempts."""
    died: list[int] = []
    ran: list[int] = []
    tasks = failing(2, died, ran)
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        ids = [
            (await trioq.enqueue(conn, "flaky")).job_id,
            (await trioq.enqueue(conn, "flaky", unique=trioq.Unique(period=60))).job_id,
            *[r.job_id for r in await trioq.enqueue_many(conn, [trioq.JobSpec(task="flaky")])],
            *await trioq.enqueue_bulk(conn, "flaky", [{}, {}]),
        ]
        flow = trioq.Workflow()
        flow.add("first", "flaky")
        flow.add("then", trioq.JobSpec(task="flaky"), after=["first"], on_dependency_failure="run")
        enqueued = await flow.enqueue(conn)
        ids += [enqueued["first"], enqueued["then"]]
        unset = await rows(conn, "SELECT id, max_attempts, max_attempts_unset FROM trioq.jobs "
                                 "ORDER BY id")  # fmt: skip
        assert unset == [(i, 25, True) for i in sorted(ids)]
    async with serving(dsn, tasks) as (conn, _runtime):
        for job_id in ids:
            await wait_until(lambda: dead_attempts(conn, job_id))  # noqa: B023
            assert await dead_attempts(conn, job_id) == (2, 2)
    assert sorted(ran) == sorted([1, 2] * len(ids))


async def test_a_batch_callback_and_a_cron_entry_by_name_leave_it_to_the_task(
    dsn: str,
) -> None:
    """An empty batch's callback is enqueued at once; another's by the database when its
    last member ends (migration 14's batch_members_ended): both leave it to the task."""
    died: list[int] = []
    ran: list[int] = []
    async with serving(dsn, failing(2, died, ran)) as (conn, _runtime):
        empty = await trioq.Batch(jobs=[], callback=trioq.JobSpec(task="flaky")).enqueue(conn)
        full = await trioq.Batch(jobs=[trioq.JobSpec(task="flaky")],
                                 callback=trioq.JobSpec(task="flaky")).enqueue(conn)  # fmt: skip
        assert empty.callback_job_id is not None
        await wait_until(lambda: _true(len(died) == 3), timeout=20)
        status = await trioq.batch_status(conn, full.batch_id)
        assert status is not None and status.callback_job_id is not None
        for job_id in (empty.callback_job_id, status.callback_job_id):
            assert await dead_attempts(conn, job_id) == (2, 2)
    entry = trioq.CronEntry(name="nightly", schedule="* * * * *", task="flaky")
    assert entry.max_attempts is None


async def test_a_job_that_chose_max_attempts_keeps_its_choice(dsn: str) -> None:
    died: list[int] = []
    ran: list[int] = []
    async with serving(dsn, failing(2, died, ran)) as (conn, _runtime):
        job = await trioq.enqueue(conn, "flaky", max_attempts=3)
        await wait_until(lambda: dead_attempts(conn, job.job_id))
        assert await dead_attempts(conn, job.job_id) == (3, 3)
    assert ran == [1, 2, 3]


async def test_the_task_object_chooses_for_its_jobs(dsn: str) -> None:
    """`task.enqueue` writes the task's value as the job's choice: the row says so."""
    tasks = failing(2, [], [])
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        job = await tasks.get("flaky").enqueue(conn)  # type: ignore[union-attr]
        assert await rows(conn, "SELECT max_attempts, max_attempts_unset FROM trioq.jobs "
                                "WHERE id = %s", job.job_id) == [(2, False)]  # fmt: skip


async def test_the_worker_that_claims_resolves_it_again(dsn: str) -> None:
    """A deploy changed the task's max_attempts: a job that did not choose takes the new
    value at its next claim; one already past it gets this attempt as its last."""
    ran: list[int] = []
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        first = await trioq.enqueue(conn, "flaky")
        past = await trioq.enqueue(conn, "flaky")
        # As after two attempts under a deploy that allowed 5 (attempt 2 of 5, retry due).
        await conn.execute("UPDATE trioq.jobs SET attempt = 2, max_attempts = 5 WHERE id = %s",
                           (first.job_id,))  # fmt: skip
        await conn.execute("UPDATE trioq.jobs SET attempt = 4, max_attempts = 5 WHERE id = %s",
                           (past.job_id,))  # fmt: skip
    async with serving(dsn, failing(3, [], ran)) as (conn, _runtime):
        for job_id in (first.job_id, past.job_id):
            await wait_until(lambda: dead_attempts(conn, job_id))  # noqa: B023
        assert await dead_attempts(conn, first.job_id) == (3, 3)
        assert await dead_attempts(conn, past.job_id) == (5, 5)
    assert sorted(ran) == [3, 5]


async def test_the_claim_writes_the_resolved_value_into_the_row(dsn: str) -> None:
    """The claim wrote the resolved value into the row, so the sweeper (which has no
    registry) counts the task's attempts too: a worker that dies mid-job on its last attempt
    leaves a dead job, not a 25-attempt one."""
    tasks = trioq.Registry()
    started = trio.Event()

    @tasks.task(max_attempts=1)
    async def stuck(job: trioq.JobContext) -> None:
        started.set()
        await trio.sleep_forever()

    async with serving(dsn, tasks) as (conn, _runtime):
        job = await trioq.enqueue(conn, "stuck")
        with trio.fail_after(10):
            await started.wait()
        assert await scalar(conn, "SELECT max_attempts FROM trioq.jobs WHERE id = %s",
                            job.job_id) == 1  # fmt: skip


@pytest.mark.parametrize("value", [0, -1, True, "2", 2.0])
def test_max_attempts_none_means_the_tasks_and_others_are_still_refused(value: object) -> None:
    assert trioq.JobSpec(task="t").max_attempts is None
    assert trioq.JobSpec(task="t", max_attempts=None).max_attempts is None
    with pytest.raises((TypeError, ValueError)):
        trioq.JobSpec(task="t", max_attempts=value)  # type: ignore[arg-type]


async def _true(value: bool) -> bool:
    return value

