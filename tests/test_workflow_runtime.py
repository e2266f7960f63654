"""Workflows and batches run by a real worker (`trioq.serve`) and by `trioq.testing.drain`."""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio
from helpers import Counter, drained, scalar, serving, wait_until

import trioq
from trioq.testing import drain


async def test_a_dependant_starts_within_milliseconds_not_at_the_next_poll(dsn: str) -> None:
    """Its queue's fetcher sleeps (poll every 30 s); only the notification sent by the
    transaction that completes the dependency wakes it."""
    tasks = trioq.Registry()
    ended: dict[str, float] = {}
    started = Counter()

    @tasks.task(queue="first")
    async def first(job: trioq.JobContext) -> None:
        ended["first"] = time.monotonic()

    @tasks.task(queue="second")
    async def second(job: trioq.JobContext) -> None:
        started.hit(time.monotonic())

    queues = {"first": trioq.QueueConfig(concurrency=2), "second": trioq.QueueConfig()}
    async with serving(dsn, tasks, queues=queues, poll_interval=30) as (conn, _runtime):
        await trio.sleep(0.3)  # both fetchers found nothing and sleep until notified
        async with conn.transaction():
            a = await first.enqueue(conn)
            await trioq.enqueue(conn, "second", queue="second", after=[a.job_id])
        await started.wait_for(1, timeout=5)
    latency = started.calls[0] - ended["first"]
    print(f"the dependant started {latency * 1000:.1f} ms after its dependency returned")
    assert latency < 1.0


async def test_fan_out_fan_in_reads_the_results_of_its_dependencies(dsn: str) -> None:
    tasks = trioq.Registry()
    seen: list[Any] = []
    done = Counter()

    @tasks.task(keep_result=True)
    async def square(job: trioq.JobContext, n: int) -> int:
        return n * n

    @tasks.task(keep_result=True)
    async def total(job: trioq.JobContext) -> int:
        results = await job.dependency_results()
        deps = await job.dependencies()
        seen.append((results, [(d.task, d.outcome) for d in deps]))
        return sum(results.values())

    @tasks.task()
    async def report(job: trioq.JobContext) -> None:
        done.hit(await job.dependency_results())

    wf = trioq.Workflow()
    squares = wf.group("squares", [square.spec(n=n) for n in range(1, 6)])
    sum_step = wf.add("total", total).after(squares)
    wf.add("report", report).after(sum_step)
    async with serving(dsn, tasks, queues={"default": trioq.QueueConfig(concurrency=4)}) as (
        conn, _runtime,
    ):  # fmt: skip
        jobs = await wf.enqueue(conn)
        await done.wait_for(1)
        assert await trioq.result(conn, jobs["total"], timeout=5) == 55
    [(results, deps)] = seen
    assert results == {job_id: (i + 1) ** 2 for i, job_id in enumerate(jobs.group("squares"))}
    assert deps == [("square", "done")] * 5
    assert done.calls == [{jobs["total"]: 55}]


async def test_a_result_that_was_not_kept_is_a_clear_error(dsn: str) -> None:
    tasks = trioq.Registry()
    errors = Counter()

    @tasks.task()
    async def step(job: trioq.JobContext) -> int:
        return 1

    @tasks.task(max_attempts=1)
    async def reader(job: trioq.JobContext) -> None:
        try:
            await job.dependency_results()
        except trioq.JobNotFoundError as ex:
            errors.hit(str(ex))

    async with serving(dsn, tasks) as (conn, _runtime):
        async with conn.transaction():  # the running worker could finish `a` in between
            a = await step.enqueue(conn)
            b = await trioq.enqueue(conn, "reader", after=[a.job_id])
        await errors.wait_for(1)
    assert errors.calls == [
        f"dependency {a.job_id} (task 'step') of job {b.job_id} completed, but its result was "
        "not kept (or was pruned): register its task with keep_result=True"
    ]


async def test_a_batch_callback_gets_the_counts_once(dsn: str) -> None:
    tasks = trioq.Registry()
    callbacks = Counter()

    @tasks.task(max_attempts=1)
    async def member(job: trioq.JobContext, n: int) -> None:
        if n % 4 == 0:
            raise ValueError(f"bad {n}")
        await trio.sleep(0.001 * (n % 3))

    @tasks.task()
    async def finished(job: trioq.JobContext, album: int, batch: dict[str, int]) -> None:
        callbacks.hit((album, batch))

    batch = trioq.Batch(jobs=[member.spec(n=n) for n in range(1, 41)],
                        callback=finished.spec(album=7))  # fmt: skip
    queues = {"default": trioq.QueueConfig(concurrency=8)}
    async with serving(dsn, tasks, queues=queues) as (conn, _runtime):
        async with conn.transaction():
            enqueued = await batch.enqueue(conn)
            await trioq.Queue().cancel(conn, enqueued.job_ids[-1])  # n=40: cancelled, not run
        await callbacks.wait_for(1)
        await wait_until(lambda: drained(conn))  # every ending committed: no second callback
        status = await trioq.batch_status(conn, enqueued.batch_id)
        assert status is not None and status.finished
        assert status.callback_job_id is not None
    assert callbacks.calls == [
        (7, {"id": enqueued.batch_id, "total": 40, "succeeded": 30, "failed": 9, "cancelled": 1})
    ]


async def test_an_empty_batch_enqueues_its_callback_at_once(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        batch = trioq.Batch(jobs=[], callback=trioq.JobSpec(task="cb", args={"x": 1}))
        enqueued = await batch.enqueue(conn)
        assert enqueued.callback_job_id is not None
        status = await trioq.job_status(conn, enqueued.callback_job_id)
        assert status.state == "available"
        assert status.args == {
            "x": 1,
            "batch": {
                "id": enqueued.batch_id,
                "total": 0,
                "succeeded": 0,
                "failed": 0,
                "cancelled": 0,
            },
        }


async def test_drain_runs_a_workflow_in_order(dsn: str) -> None:
    tasks = trioq.Registry()
    order: list[str] = []

    @tasks.task(keep_result=True)
    async def step(job: trioq.JobContext, name: str) -> str:
        order.append(name)
        return name

    wf = trioq.Workflow()
    a = wf.add("a", step.spec(name="a"))
    b = wf.group("b", [step.spec(name=f"b{i}") for i in range(3)]).after(a)
    wf.add("c", step.spec(name="c")).after(b)
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        await wf.enqueue(conn)
        result = await drain(conn, tasks)
    assert result.completed == 5
    assert order[0] == "a" and sorted(order[1:4]) == ["b0", "b1", "b2"] and order[4] == "c"


async def test_job_transaction_frees_the_dependant_with_the_handlers_writes(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task()
    async def write(job: trioq.JobContext) -> None:
        async with job.transaction() as tx:
            await tx.execute("INSERT INTO ledger VALUES (%s)", (job.id,))

    @tasks.task()
    async def check(job: trioq.JobContext, dep: int) -> None:
        async with job.transaction() as tx:
            cur = await tx.execute("SELECT count(*) FROM ledger WHERE id = %s", (dep,))
            row = await cur.fetchone()
            await tx.execute("INSERT INTO ledger VALUES (%s)", (-1 if row == (1,) else -2,))

    async with serving(dsn, tasks) as (conn, _runtime):
        await conn.execute("CREATE TABLE ledger (id bigint)")
        async with conn.transaction():  # the running worker could finish `a` in between
            a = await write.enqueue(conn)
            await trioq.enqueue(conn, "check", {"dep": a.job_id}, after=[a.job_id])

        async def checked() -> bool:
            return bool(await scalar(conn, "SELECT count(*) FROM ledger WHERE id < 0"))

        await wait_until(checked)
        assert await scalar(conn, "SELECT min(id) FROM ledger") == -1


@pytest.mark.parametrize("size", [1])
async def test_status_counts_waiting_jobs(dsn: str, size: int) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        a = await trioq.enqueue(conn, "a")
        await trioq.enqueue_bulk(conn, "b", [{}] * (size + 2), after=[a.job_id])
        [queue], _ = await trioq.Queue().status(conn)
        assert (queue.available, queue.waiting) == (1, size + 2)
