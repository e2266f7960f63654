"""Jobs that wait for others (``after``), workflows and batches, on real Postgres.

The queue's own statements drive the jobs here (claim, complete, fail, sweep, cancel ...),
so each test says exactly which path ended a dependency; tests/test_workflow_runtime.py
runs them in a worker, tests/test_workflow_state_machine.py explores the paths, and
tests/test_workflow_processes.py kills workers under a 10,000-job graph.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import trio
from helpers import wait_until_blocked

import trioq
from trioq import Failure, JobSpec, Lease, Queue
from trioq._worker.services.pruner import prune

T = TypeVar("T")
Q = Queue()
LEASE = dt.timedelta(seconds=30)


async def _conn(dsn: str) -> Any:
    conn = await trioq.connect(dsn, autocommit=True)
    await trioq.migrate(conn)
    return conn


async def _state(conn: Any, job_id: int) -> str:
    return (await trioq.job_status(conn, job_id)).state


async def _claim(conn: Any, n: int = 10, queue: str = "default") -> list[trioq.Job]:
    return await Q.claim(conn, queue, owner="w", limit=n, lease=LEASE)


async def _complete(conn: Any, jobs: list[trioq.Job], *, keep: bool = False) -> None:
    leases = [Lease(j.id, j.attempt) for j in jobs]
    results = [{"from": j.id} for j in jobs] if keep else None
    done = await Q.complete_many(conn, owner="w", leases=leases, results=results)
    assert done == {j.id for j in jobs}


async def _kill(conn: Any, jobs: list[trioq.Job], error: str = "boom") -> None:
    failures = [Failure(lease=Lease(j.id, j.attempt), error=error, fatal=True) for j in jobs]
    result = await Q.fail_many(conn, owner="w", failures=failures)
    assert result.dead == {j.id for j in jobs}


async def _move_clock(conn: Any, by: dt.timedelta) -> None:
    later = (dt.datetime.now(dt.UTC) + by).isoformat()
    await conn.execute("SELECT set_config('trioq.now', %s, false)", (later,))


async def _run_job(conn: Any, job_id: int) -> trioq.Job:
    [job] = [j for j in await _claim(conn, 100) if j.id == job_id]
    return job


# -- after=: waiting until every dependency has ended ------------------------------------------


async def test_a_dependant_waits_until_its_last_dependency_completes(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        a = (await trioq.enqueue(conn, "a")).job_id
        b = (await trioq.enqueue(conn, "b")).job_id
        c = (await trioq.enqueue(conn, "c", after=[a, b])).job_id
        assert await _state(conn, c) == "waiting"
        jobs = await _claim(conn)
        assert [j.id for j in jobs] == [a, b]  # the waiting job is never claimed
        await _complete(conn, jobs[:1])
        assert await _state(conn, c) == "waiting"
        await _complete(conn, jobs[1:], keep=True)
        assert await _state(conn, c) == "available"
        assert [j.id for j in await _claim(conn)] == [c]
        deps = await trioq.dependencies(conn, c)
        assert [(d.job_id, d.outcome, d.result_kept, d.result) for d in deps] == [
            (a, "done", False, None),
            (b, "done", True, {"from": b}),
        ]


async def test_readiness_notifies_the_queue_in_the_completing_transaction(dsn: str) -> None:
    async with await _conn(dsn) as conn, await trioq.connect(dsn, autocommit=True) as ear:
        a = (await trioq.enqueue(conn, "a", queue="first")).job_id
        await trioq.enqueue(conn, "b", queue="second", after=[a])
        await ear.execute("LISTEN trioq_trioq")
        jobs = await _claim(conn, queue="first")
        await _complete(conn, jobs)
        with trio.fail_after(5):
            async for note in ear.notifies():
                if note.payload == "second":
                    break


async def test_a_dependant_due_later_becomes_scheduled(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        a = (await trioq.enqueue(conn, "a")).job_id
        b = (await trioq.enqueue(conn, "b", after=[a], delay=3600)).job_id
        await _complete(conn, await _claim(conn))
        assert await _state(conn, b) == "scheduled"


@pytest.mark.parametrize("policy", ["cancel", "run"])
async def test_a_dead_dependency_applies_the_policy_and_the_reason_names_it(
    dsn: str, policy: str
) -> None:
    async with await _conn(dsn) as conn:
        a = (await trioq.enqueue(conn, "fetch")).job_id
        other = (await trioq.enqueue(conn, "other")).job_id
        b = (await trioq.enqueue(conn, "b", after=[a, other], on_dependency_failure=policy)).job_id
        jobs = await _claim(conn)
        await _kill(conn, [j for j in jobs if j.id == a], error="ValueError: 404")
        status = await trioq.job_status(conn, b)
        if policy == "cancel":
            assert status.state == "cancelled"
            assert status.last_error == (
                f"dependency {a} (task 'fetch') is dead: fatal error: ValueError: 404"
            )
            with pytest.raises(trioq.JobCancelledError, match=f"dependency {a} .task 'fetch'"):
                await trioq.result(conn, b)
        else:
            assert status.state == "waiting"  # still waits for `other`
            await _complete(conn, [j for j in jobs if j.id == other])
            assert await _state(conn, b) == "available"


async def test_cancelling_a_dependency_cancels_a_chain_of_any_length(dsn: str) -> None:
    """The cancellation runs down 600 levels in one statement (a round per level, no
    recursion: a recursive trigger would exceed the stack)."""
    async with await _conn(dsn) as conn:
        wf = trioq.Workflow()
        prev = wf.add("j0", "t")
        for i in range(1, 600):
            prev = wf.add(f"j{i}", "t").after(prev)
        jobs = await wf.enqueue(conn)
        assert (await Q.cancel(conn, jobs["j0"])).status == "cancelled"
        last = await trioq.job_status(conn, jobs["j599"])
        assert last.state == "cancelled"
        assert last.last_error is not None
        assert last.last_error.startswith(f"dependency {jobs['j598']} (task 't') was cancelled")
        assert len(last.last_error) <= 2000
        states = await _states(conn)
        assert set(states.values()) == {"cancelled"} and len(states) == 600


async def _states(conn: Any) -> dict[int, str]:
    cur = await conn.execute("SELECT id, state FROM trioq.jobs")
    return dict(await cur.fetchall())


async def test_cancelling_a_waiting_job(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        a = (await trioq.enqueue(conn, "a")).job_id
        b = (await trioq.enqueue(conn, "b", after=[a])).job_id
        c = (await trioq.enqueue(conn, "c", after=[b], on_dependency_failure="run")).job_id
        assert (await Q.cancel(conn, b)).status == "cancelled"
        assert await _state(conn, c) == "available"
        await _complete(conn, [j for j in await _claim(conn) if j.id == a])  # b stays cancelled
        assert await _state(conn, b) == "cancelled"


# -- every path that ends a job resolves its dependants ----------------------------------------


async def test_the_sweeper_resolves_dependants_of_jobs_whose_lease_expired(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        a = (await trioq.enqueue(conn, "a", max_attempts=1)).job_id
        b = (await trioq.enqueue(conn, "b", after=[a])).job_id
        c = (await trioq.enqueue(conn, "c", after=[a], on_dependency_failure="run")).job_id
        await _claim(conn)
        await conn.execute("UPDATE trioq.jobs SET lease_expires_at = now() - interval '1s'")
        swept = await Q.sweep(conn)
        assert swept.dead == {a}
        status = await trioq.job_status(conn, b)
        assert (status.state, status.last_error) == ("cancelled", (
            f"dependency {a} (task 'a') is dead: lease expired on the last attempt: "
            "lease expired: worker lost"))  # fmt: skip
        assert await _state(conn, c) == "available"


async def test_a_dead_workers_reclaimed_jobs_resolve_their_dependants(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        a = (await trioq.enqueue(conn, "a", max_attempts=1)).job_id
        b = (await trioq.enqueue(conn, "b", after=[a])).job_id
        await _claim(conn)
        await conn.execute(
            "INSERT INTO trioq.workers (name, host, pid, queues, seen_at, suspected_at)"
            " VALUES ('w', 'h', 1, '{}', now() - interval '1 minute', now() - interval '1 minute')"
        )
        await _move_clock(conn, dt.timedelta(seconds=5))
        result = await Q.reclaim_dead_workers(conn, grace=dt.timedelta(seconds=1))
        assert result.dead == {a}
        assert await _state(conn, b) == "cancelled"


async def test_an_unknown_task_that_dies_resolves_its_dependants(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        a = (await trioq.enqueue(conn, "gone")).job_id
        b = (await trioq.enqueue(conn, "b", after=[a], on_dependency_failure="run")).job_id
        job = await _run_job(conn, a)
        failures = [Failure(lease=Lease(a, job.attempt), error="unknown task 'gone'")]
        out = await Q.release_unknown_many(conn, owner="w", failures=failures,
                                           dead_after=dt.timedelta(0))  # fmt: skip
        assert out.dead == {a}
        assert await _state(conn, b) == "available"
        [dep] = await trioq.dependencies(conn, b)
        assert (dep.outcome, dep.error) == ("dead", "unknown task: unknown task 'gone'")


async def test_a_cancel_requested_while_running_resolves_as_cancelled(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        a = (await trioq.enqueue(conn, "a")).job_id
        b = (await trioq.enqueue(conn, "b", after=[a])).job_id
        job = await _run_job(conn, a)
        assert (await Q.cancel(conn, a)).status == "requested"
        assert await _state(conn, b) == "waiting"
        assert await Q.cancel_running_many(conn, owner="w", leases=[Lease(a, job.attempt)])
        assert await _state(conn, b) == "cancelled"


async def test_a_retry_is_not_an_ending(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        a = (await trioq.enqueue(conn, "a", max_attempts=3)).job_id
        b = (await trioq.enqueue(conn, "b", after=[a])).job_id
        for _ in range(2):
            job = await _run_job(conn, a)
            failures = [Failure(lease=Lease(a, job.attempt), error="again")]
            assert (await Q.fail_many(conn, owner="w", failures=failures)).retried == {a}
            assert await _state(conn, b) == "waiting"
        await _complete(conn, [await _run_job(conn, a)])
        assert await _state(conn, b) == "available"


async def test_a_dependency_deleted_by_hand_counts_as_failed(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        a = (await trioq.enqueue(conn, "a")).job_id
        b = (await trioq.enqueue(conn, "b", after=[a])).job_id
        await conn.execute("DELETE FROM trioq.jobs WHERE id = %s", (a,))
        status = await trioq.job_status(conn, b)
        assert (status.state, status.last_error) == (
            "cancelled", f"dependency {a} (task 'a') was deleted")  # fmt: skip


async def test_job_transaction_resolves_in_the_handlers_transaction(dsn: str) -> None:
    """A handler that completes in job.transaction() and rolls back frees nobody."""
    async with await _conn(dsn) as conn, await trioq.connect(dsn) as tx:
        a = (await trioq.enqueue(conn, "a")).job_id
        b = (await trioq.enqueue(conn, "b", after=[a])).job_id
        job = await _run_job(conn, a)
        async with tx.transaction(force_rollback=True):
            await Q.complete_many(tx, owner="w", leases=[Lease(a, job.attempt)])
            assert await _state(tx, b) == "available"  # inside: freed with the completion
        assert await _state(conn, b) == "waiting"  # rolled back with it


# -- enqueue: dependencies that have ended, or never were --------------------------------------


async def test_dependencies_that_already_ended(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        kept = (await trioq.enqueue(conn, "kept")).job_id
        dead = (await trioq.enqueue(conn, "dead")).job_id
        jobs = await _claim(conn)
        await _complete(conn, [j for j in jobs if j.id == kept], keep=True)
        await _kill(conn, [j for j in jobs if j.id == dead])
        after_kept = (await trioq.enqueue(conn, "x", after=[kept])).job_id
        assert await _state(conn, after_kept) == "available"
        cancelled = (await trioq.enqueue(conn, "y", after=[kept, dead])).job_id
        status = await trioq.job_status(conn, cancelled)
        assert (status.state, status.last_error) == (
            "cancelled", f"dependency {dead} (task 'dead') is dead: fatal error: boom")  # fmt: skip
        anyway = (await trioq.enqueue(conn, "z", after=[dead], on_dependency_failure="run")).job_id
        assert await _state(conn, anyway) == "available"


async def test_an_unknown_dependency_is_an_error_naming_it_and_nothing_is_enqueued(
    dsn: str,
) -> None:
    async with await _conn(dsn) as conn:
        a = (await trioq.enqueue(conn, "a")).job_id
        with pytest.raises(
            trioq.UnknownDependencyError, match="after lists job 424242, which"
        ) as e:
            await trioq.enqueue(conn, "b", after=[a, 424242])
        assert e.value.job_ids == (424242,)
        specs = [JobSpec(task="c"), JobSpec(task="d", after=[a, 99, 98])]
        with pytest.raises(trioq.UnknownDependencyError, match="jobs 98, 99, which do not"):
            await trioq.enqueue_many(conn, specs)
        assert await _states(conn) == {a: "available"}  # nothing of either call went in
        flagged = await conn.execute("SELECT has_dependants FROM trioq.jobs WHERE id = %s", (a,))
        assert await flagged.fetchone() == (False,)


async def test_after_input_is_checked_before_any_sql(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        for bad, error, match in [
            ("5", TypeError, "after must be a list of job ids"),
            ({1: 2}, TypeError, "after must be a list of job ids"),
            ([1, 1], ValueError, "after lists job 1 twice"),
            ([1.5], TypeError, r"after\[0\] must be an int"),
            ([True], TypeError, r"after\[0\] must be an int"),
            ([2**63], ValueError, r"after\[0\] must fit in a bigint"),
            (list(range(10_001)), ValueError, "a job may wait for at most 10000"),
        ]:
            with pytest.raises(error, match=match):
                await trioq.enqueue(conn, "t", after=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="cannot have a dedup_key or be unique"):
            await trioq.enqueue(conn, "t", after=[1], dedup_key="k")
        with pytest.raises(ValueError, match="on_dependency_failure must be 'cancel'"):
            await trioq.enqueue(conn, "t", after=[1], on_dependency_failure="ignore")
        assert await _states(conn) == {}


async def test_enqueue_many_and_bulk_with_dependencies(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        a = (await trioq.enqueue(conn, "a")).job_id
        results = await trioq.enqueue_many(conn, [
            JobSpec(task="plain"), JobSpec(task="after", after=[a]),
            JobSpec(task="unique", dedup_key="k"),
        ])  # fmt: skip
        assert [await _state(conn, r.job_id) for r in results] == [
            "available", "waiting", "available"]  # fmt: skip
        ids = await trioq.enqueue_bulk(conn, "fan", [{"i": i} for i in range(50)], after=[a])
        assert {await _state(conn, i) for i in ids} == {"waiting"}
        await _complete(conn, [await _run_job(conn, a)])
        assert {await _state(conn, i) for i in ids} == {"available"}
        assert await _state(conn, results[1].job_id) == "available"


async def _at_once(
    dsn: str, conn: Any, first: Callable[[Any], Awaitable[T]],
    then: Callable[[Any], Awaitable[object]],
) -> T:  # fmt: skip
    """``first`` in a transaction of a connection of its own, and ``then`` on another, which
    waits for a lock ``first`` took (``conn`` sees it wait) until that commits. What
    ``first`` returned."""
    async with (
        await trioq.connect(dsn) as one,
        await trioq.connect(dsn, autocommit=True) as two,
    ):
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery, one.transaction():
                result = await first(one)
                nursery.start_soon(then, two)
                await wait_until_blocked(conn, two)
    return result


async def test_concurrent_enqueue_and_completion_of_a_dependency(dsn: str) -> None:
    """The dependency completes while the dependant's enqueue is uncommitted: the
    completion waits for the enqueue's lock, then resolves the new edge."""
    async with await _conn(dsn) as conn:
        a = (await trioq.enqueue(conn, "a")).job_id
        job = await _run_job(conn, a)
        enqueued = await _at_once(  # the DELETE waits for the enqueue's commit
            dsn, conn, lambda c: trioq.enqueue(c, "b", after=[a]), lambda c: _complete(c, [job])
        )
        b = enqueued.job_id
        assert await _state(conn, a) == "unknown"
        assert await _state(conn, b) == "available"


async def test_a_dependency_moving_to_dead_jobs_meanwhile_is_dead_not_unknown(dsn: str) -> None:
    """The enqueue's lock waits for the death's transaction and finds the row gone; its
    snapshot, older than the death, did not see the dead row: it looks again (issue #22: 4
    of 40 tries raised UnknownDependencyError)."""
    async with await _conn(dsn) as conn:
        a = (await trioq.enqueue(conn, "a")).job_id
        job = await _run_job(conn, a)
        enqueued: list[trioq.EnqueueResult] = []

        async def dependant(c: Any) -> None:
            enqueued.append(await trioq.enqueue(c, "b", after=[a]))

        await _at_once(dsn, conn, lambda c: _kill(c, [job]), dependant)
        assert await _state(conn, a) == "dead"
        [b] = enqueued
        assert await _state(conn, b.job_id) == "cancelled"  # its policy: a dead dependency


async def test_the_last_two_dependencies_ending_at_once_free_the_dependant_once(
    dsn: str,
) -> None:
    async with await _conn(dsn) as conn:
        a = (await trioq.enqueue(conn, "a")).job_id
        b = (await trioq.enqueue(conn, "b")).job_id
        c = (await trioq.enqueue(conn, "c", after=[a, b])).job_id
        jobs = {j.id: j for j in await _claim(conn)}
        await _at_once(  # the second completion waits for c's row, locked by the first
            dsn, conn, lambda one: _complete(one, [jobs[a]]), lambda two: _complete(two, [jobs[b]])
        )
        assert await _state(conn, b) == "unknown"
        cur = await conn.execute(
            "SELECT state, dependencies_left FROM trioq.jobs WHERE id = %s", (c,)
        )
        assert await cur.fetchone() == ("available", 0)


async def test_the_last_two_members_of_a_batch_ending_at_once_enqueue_one_callback(
    dsn: str,
) -> None:
    async with await _conn(dsn) as conn:
        batch = trioq.Batch(jobs=[JobSpec(task="m"), JobSpec(task="m")],
                            callback=JobSpec(task="cb", queue="callbacks"))  # fmt: skip
        enqueued = await batch.enqueue(conn)
        jobs = await _claim(conn)
        await _at_once(  # the death waits for the batch row, locked by the completion
            dsn, conn, lambda one: _complete(one, jobs[:1]), lambda two: _kill(two, jobs[1:])
        )
        cur = await conn.execute("SELECT id, args FROM trioq.jobs WHERE task = 'cb'")
        [(callback, args)] = await cur.fetchall()
        assert args == {"batch": {"id": enqueued.batch_id, "total": 2, "succeeded": 1,
                                  "failed": 1, "cancelled": 0}}  # fmt: skip
        status = await trioq.batch_status(conn, enqueued.batch_id)
        assert status is not None and status.callback_job_id == callback and status.finished


async def test_batch_input_is_checked(dsn: str) -> None:
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"jobs": JobSpec(task="a"), "callback": JobSpec(task="b")}, TypeError, "jobs must be a"),
        ({"jobs": ["a"], "callback": JobSpec(task="b")}, TypeError, r"jobs\[0\] must be"),
        ({"jobs": [JobSpec(task="a", dedup_key="k")], "callback": JobSpec(task="b")},
         trioq.WorkflowError, r"jobs\[0\] has a dedup_key"),
        ({"jobs": [], "callback": JobSpec(task="b", args=[1])}, TypeError, "must be an object"),
        ({"jobs": [], "callback": JobSpec(task="b", args={"batch": 1})}, ValueError,
         "must not have a 'batch' key"),
        ({"jobs": [], "callback": JobSpec(task="b", delay=5)}, ValueError, "delay cannot be set"),
    ]  # fmt: skip
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            trioq.Batch(**kwargs)


# -- results of dependencies, and retention --------------------------------------------------


async def test_a_kept_dependency_outlives_retention_while_its_dependant_waits(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        a = (await trioq.enqueue(conn, "a")).job_id
        other = (await trioq.enqueue(conn, "other")).job_id
        b = (await trioq.enqueue(conn, "b", after=[a, other])).job_id
        lonely = (await trioq.enqueue(conn, "lonely")).job_id
        claimed = {j.id: j for j in await _claim(conn)}
        await _complete(conn, [claimed[a], claimed[lonely]], keep=True)
        await _move_clock(conn, dt.timedelta(days=3))
        ages: dict[str, Any] = {"retain_done": 60.0, "retain_cancelled": 60.0,
                                "retain_dead": 60.0, "limit": 100}  # fmt: skip
        pruned = await prune(conn, Q.sql, **ages)
        assert pruned.done == 1  # lonely
        assert await _state(conn, a) == "done"  # b still waits, and will read it
        await _complete(conn, [claimed[other]])
        await _complete(conn, [await _run_job(conn, b)])
        assert (await prune(conn, Q.sql, **ages)).done == 1
        assert await _state(conn, a) == "unknown"
        cur = await conn.execute("SELECT count(*) FROM trioq.job_dependencies")
        assert await cur.fetchone() == (0,)  # b's edges went with its row


# -- what a job without dependencies pays ------------------------------------------------------


async def test_jobs_without_dependencies_never_call_the_resolution(dsn: str) -> None:
    """The triggers' WHEN clauses keep every ordinary path from calling a function: claims,
    heartbeats, completions, keeps, retries, deaths, cancels, sweeps (counted by
    pg_stat_user_functions)."""
    async with await _conn(dsn) as conn:
        await conn.execute("SET track_functions = 'all'")
        ids = [(await trioq.enqueue(conn, "t", max_attempts=2)).job_id for _ in range(8)]
        jobs = await _claim(conn)
        await Q.heartbeat(conn, owner="w", leases=[Lease(j.id, j.attempt) for j in jobs],
                          lease=LEASE)  # fmt: skip
        await _complete(conn, jobs[:2])
        await _complete(conn, jobs[2:4], keep=True)
        await Q.fail_many(conn, owner="w", failures=[
            Failure(lease=Lease(j.id, j.attempt), error="x", fatal=i == 0)
            for i, j in enumerate(jobs[4:6])
        ])  # fmt: skip
        await Q.cancel(conn, ids[6])
        await conn.execute("UPDATE trioq.jobs SET lease_expires_at = now() - interval '1s'"
                           " WHERE state = 'running'")  # fmt: skip
        await Q.sweep(conn)
        await conn.execute("SELECT pg_stat_force_next_flush()")
        cur = await conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE schemaname = 'trioq'"
        )
        assert await cur.fetchone() == (0,)
        # ... and a job with a dependant does call it (so the count above means something)
        a = (await trioq.enqueue(conn, "a")).job_id
        await trioq.enqueue(conn, "b", after=[a])
        await _complete(conn, [await _run_job(conn, a)])
        await conn.execute("SELECT pg_stat_force_next_flush()")
        cur = await conn.execute(
            "SELECT funcname, calls FROM pg_stat_user_functions WHERE schemaname = 'trioq'"
            " ORDER BY funcname"
        )
        assert await cur.fetchall() == [("job_ended", 1), ("jobs_ended", 1)]
