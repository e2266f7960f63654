"""The worker runtime against real Postgres: jobs flow, fail, time out, get cancelled."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Awaitable, Callable
from typing import Any

import helpers
import pytest
import trio
from helpers import Counter, rows, wait_until

import trioq
from trioq.retry import Constant


def serving(dsn: str, registry: trioq.Registry, **options: Any) -> Any:
    """A migrated database, a connection to it, and a running runtime, stopped without
    grace at the end."""
    return helpers.serving(dsn, registry, graceful=False, **options)


async def test_jobs_flow_through_a_worker(dsn: str) -> None:
    tasks = trioq.Registry()
    seen = Counter()

    @tasks.task(queue="q")
    async def add(job: trioq.JobContext, a: int, b: int) -> None:
        assert job.queue == "q" and job.attempt == 1
        seen.hit(a + b)

    async with serving(dsn, tasks, queues={"q": trioq.QueueConfig(concurrency=5)}) as (conn, rt):
        await trioq.enqueue_many(
            conn, [trioq.JobSpec(task="add", queue="q", args={"a": i, "b": 1}) for i in range(50)]
        )
        await seen.wait_for(50)

        async def drained() -> bool:
            return await rows(conn, "SELECT count(*) FROM trioq.jobs") == [(0,)]

        await wait_until(drained)
        assert sorted(seen.calls) == list(range(1, 51))
        assert rt.statistics().claimed == 50


async def test_enqueue_from_task_handle_and_sync_handler(dsn: str) -> None:
    tasks = trioq.Registry()
    seen = Counter()
    main_thread = trio.lowlevel.current_trio_token()

    @tasks.task
    def blocking(job: trioq.JobContext, n: int) -> None:
        trio.from_thread.run_sync(seen.hit, n, trio_token=main_thread)

    async with serving(dsn, tasks) as (conn, _):
        await blocking.enqueue(conn, n=7)
        await seen.wait_for(1)
        assert seen.calls == [7]


async def test_retry_then_success_and_fatal_goes_dead(dsn: str) -> None:
    tasks = trioq.Registry()
    attempts = Counter()

    @tasks.task(retry=Constant(seconds=0), max_attempts=3)
    async def flaky(job: trioq.JobContext) -> None:
        attempts.hit(job.attempt)
        if job.attempt < 2:
            raise RuntimeError("not yet")

    @tasks.task(max_attempts=5)
    async def doomed(job: trioq.JobContext) -> None:
        raise trioq.FatalError("bad input")

    async with serving(dsn, tasks) as (conn, _):
        await flaky.enqueue(conn)
        r = await doomed.enqueue(conn)
        await attempts.wait_for(2)
        assert attempts.calls == [1, 2]

        async def buried() -> bool:
            return bool(await rows(conn, "SELECT 1 FROM trioq.dead_jobs WHERE id = %s", r.job_id))

        await wait_until(buried)
        dead = await trioq.Queue().dead_list(conn)
        assert [(d.task, d.reason, d.attempt) for d in dead] == [("doomed", "fatal error", 1)]
        assert dead[0].last_error == "FatalError: bad input"
        assert dead[0].traceback and "bad input" in dead[0].traceback


async def test_timeout_is_a_failure(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task(timeout=0.1, max_attempts=1)
    async def slow(job: trioq.JobContext) -> None:
        await trio.sleep_forever()

    async with serving(dsn, tasks) as (conn, _):
        await slow.enqueue(conn)

        async def dead() -> bool:
            return bool(await rows(conn, "SELECT 1 FROM trioq.dead_jobs"))

        await wait_until(dead)
        (d,) = await trioq.Queue().dead_list(conn)
        assert d.last_error == "timeout: handler ran over 0.1 s"


async def test_unknown_task_is_kept_and_explained(dsn: str) -> None:
    """Kept for a worker that knows the task, attempt refunded, with the reason (issue #10:
    it used to spend attempts and go dead; ``tests/test_misbehaving.py`` has the rest)."""
    async with serving(dsn, trioq.Registry(), queues=["default"]) as (conn, _):
        r = await trioq.enqueue(conn, "nobody_knows", max_attempts=1)

        async def given_back() -> bool:
            found = await rows(conn, "SELECT state, attempt FROM trioq.jobs WHERE id = %s",
                               r.job_id)  # fmt: skip
            return found == [("scheduled", 0)]

        await wait_until(given_back)
        error = await rows(conn, "SELECT last_error FROM trioq.jobs WHERE id = %s", r.job_id)
        assert "unknown task 'nobody_knows'" in error[0][0]
        assert await trioq.Queue().dead_list(conn) == []


async def test_snooze_refunds_the_attempt(dsn: str) -> None:
    tasks = trioq.Registry()
    seen = Counter()

    @tasks.task
    async def later(job: trioq.JobContext) -> None:
        seen.hit(job.attempt)
        if len(seen.calls) == 1:
            job.snooze(0.2)

    async with serving(dsn, tasks) as (conn, _):
        start = time.monotonic()
        await later.enqueue(conn)
        await seen.wait_for(2)
        assert seen.calls == [1, 1]
        assert time.monotonic() - start >= 0.2


async def test_cancel_a_running_job(dsn: str) -> None:
    tasks = trioq.Registry()
    started = Counter()

    @tasks.task
    async def forever(job: trioq.JobContext) -> None:
        started.hit()
        await trio.sleep_forever()

    async with serving(dsn, tasks) as (conn, _):
        r = await forever.enqueue(conn)
        await started.wait_for(1)
        assert (await trioq.Queue().cancel(conn, r.job_id)).status == "requested"

        async def cancelled() -> bool:
            found = await rows(conn, "SELECT state FROM trioq.jobs WHERE id = %s", r.job_id)
            return found == [("cancelled",)]

        await wait_until(cancelled)


async def test_lost_lease_cancels_the_handler_and_discards_its_result(dsn: str) -> None:
    tasks = trioq.Registry()
    started = Counter()
    stopped = Counter()

    @tasks.task
    async def hold(job: trioq.JobContext) -> None:
        started.hit()
        try:
            await trio.sleep_forever()
        finally:
            stopped.hit()

    async with serving(dsn, tasks) as (conn, _):
        r = await hold.enqueue(conn)
        await started.wait_for(1)
        # Another worker reclaimed it (as the sweeper + a claim would).
        await conn.execute(
            "UPDATE trioq.jobs SET lease_owner = 'someone-else', attempt = 2 WHERE id = %s",
            (r.job_id,),
        )
        await stopped.wait_for(1)
        assert await rows(
            conn, "SELECT state, lease_owner FROM trioq.jobs WHERE id = %s", r.job_id
        ) == [("running", "someone-else")]


async def test_exactly_once_effects_in_the_jobs_transaction(dsn: str) -> None:
    tasks = trioq.Registry()
    done = Counter()

    @tasks.task
    async def credit(job: trioq.JobContext, account: int) -> None:
        async with job.transaction() as tx:
            await tx.execute("INSERT INTO ledger VALUES (%s, %s)", (job.id, account))
        done.hit()

    async with serving(dsn, tasks) as (conn, _):
        await conn.execute("CREATE TABLE ledger (job_id bigint PRIMARY KEY, account int)")
        r = await credit.enqueue(conn, account=5)
        await done.wait_for(1)
        assert await rows(conn, "SELECT * FROM ledger") == [(r.job_id, 5)]
        assert await rows(conn, "SELECT count(*) FROM trioq.jobs") == [(0,)]


async def _stop_among_sleepers(
    dsn: str, *, jobs: int, slots: int,
    until: Callable[[Any, trioq.Runtime, Counter], Awaitable[None]],
) -> tuple[list[Any], list[tuple[Any, ...]]]:  # fmt: skip
    """``jobs`` jobs whose handlers never return, ``slots`` at a time, and a graceful stop
    (0.2 s of grace) once ``until(conn, runtime, started)`` returns. The ids the handlers
    started, and the jobs' ``(state, attempt, count)`` after the stop."""
    tasks = trioq.Registry()
    started = Counter()

    @tasks.task
    async def long(job: trioq.JobContext) -> None:
        started.hit(job.id)
        await trio.sleep_forever()

    queues = {"default": trioq.QueueConfig(concurrency=slots)}
    async with helpers.serving(dsn, tasks, shutdown_grace=0.2, queues=queues) as (conn, rt):
        await trioq.enqueue_many(conn, [trioq.JobSpec(task="long") for _ in range(jobs)])
        await until(conn, rt, started)
    async with await trioq.connect(dsn, autocommit=True) as conn:
        after = await rows(conn, "SELECT state, attempt, count(*) FROM trioq.jobs GROUP BY 1, 2")
    return started.calls, after


async def test_graceful_stop_leaves_nothing_running(dsn: str) -> None:
    async def all_started(conn: Any, runtime: trioq.Runtime, started: Counter) -> None:
        await started.wait_for(100)

    _, after = await _stop_among_sleepers(dsn, jobs=100, slots=100, until=all_started)
    assert after == [("available", 0, 100)]


def _prefetch(runtime: Any, queue: str, n: int) -> None:
    """Make the fetcher claim ``n`` jobs beyond its idle slots, once.

    It does so by itself only for jobs that finish while a claim is in flight,
    which a test cannot time; this sets what it would have measured.
    """
    state = runtime._queues[queue]
    state.prefetch = n
    state.room.set()


async def test_prefetched_jobs_are_released_at_shutdown(dsn: str) -> None:
    """Jobs claimed ahead into the prefetch buffer never start after a stop: refunded."""

    async def two_prefetched(conn: Any, runtime: trioq.Runtime, started: Counter) -> None:
        await started.wait_for(2)
        _prefetch(runtime, "default", 2)

        async def prefetched() -> bool:  # 2 running + 2 in the buffer
            return runtime.statistics().held_leases == 4 and await rows(
                conn, "SELECT count(*) FROM trioq.jobs WHERE state = 'running'"
            ) == [(4,)]

        await wait_until(prefetched)
        assert runtime.statistics().running == 2

    started, after = await _stop_among_sleepers(dsn, jobs=10, slots=2, until=two_prefetched)
    assert len(started) == 2
    assert after == [("available", 0, 10)]


async def test_a_prefetched_job_cancelled_before_it_starts_never_runs(dsn: str) -> None:
    tasks = trioq.Registry()
    started = Counter()
    release = trio.Event()

    @tasks.task
    async def gate(job: trioq.JobContext, name: str) -> None:
        started.hit(name)
        await release.wait()

    one_slot = {"default": trioq.QueueConfig(concurrency=1)}
    async with serving(dsn, tasks, queues=one_slot) as (conn, runtime):
        await gate.enqueue(conn, name="first", priority=-1)
        second = await gate.enqueue(conn, name="second")
        await started.wait_for(1)
        _prefetch(runtime, "default", 1)

        async def prefetched() -> bool:
            return bool(runtime.statistics().held_leases == 2)

        await wait_until(prefetched)
        assert (await trioq.Queue().cancel(conn, second.job_id)).status == "requested"

        async def flagged() -> bool:  # a heartbeat passed the request on to the runtime
            await trio.lowlevel.checkpoint()
            held = runtime._held.get(trioq.Lease(second.job_id, 1))
            return held is not None and held.reason == "cancel"

        await wait_until(flagged)
        release.set()

        async def cancelled() -> bool:
            found = await rows(conn, "SELECT state FROM trioq.jobs WHERE id = %s", second.job_id)
            return found == [("cancelled",)]

        await wait_until(cancelled)
        assert started.calls == ["first"]


async def test_listener_survives_its_backend_being_killed(dsn: str) -> None:
    tasks = trioq.Registry()
    seen = Counter()

    @tasks.task
    async def ping(job: trioq.JobContext) -> None:
        seen.hit()

    # Polling is slow here on purpose: only notifications (or the reconnect's wake-up) are fast.
    async with serving(dsn, tasks, poll_interval=60) as (conn, _):
        await ping.enqueue(conn)
        await seen.wait_for(1)
        killed = await rows(
            conn,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE query LIKE 'LISTEN%%' AND pid <> pg_backend_pid()"
            " AND datname = current_database()",  # a shared server has other tests' listeners
        )
        assert killed == [(True,)]
        await ping.enqueue(conn)
        await seen.wait_for(2, timeout=5)


async def test_scheduled_job_runs_when_due(dsn: str) -> None:
    tasks = trioq.Registry()
    seen = Counter()

    @tasks.task
    async def tick(job: trioq.JobContext) -> None:
        seen.hit(time.monotonic())

    async with serving(dsn, tasks, poll_interval=60) as (conn, _):
        start = time.monotonic()
        await tick.enqueue(conn, delay=0.3)
        await seen.wait_for(1)
        assert seen.calls[0] - start >= 0.3


async def test_unmigrated_database_is_refused(dsn: str) -> None:
    config = trioq.Config(dsn=dsn, registry=trioq.Registry())
    with pytest.raises(trioq.SchemaMissingError, match="trioq migrate"):
        await trioq.serve(config)


async def test_cron_entry_fires_through_the_runtime(dsn: str) -> None:
    tasks = trioq.Registry()
    seen = Counter()

    @tasks.task
    async def beat(job: trioq.JobContext, n: int) -> None:
        seen.hit(n)

    entry = trioq.CronEntry(name="every-second", schedule="* * * * * *", task="beat", args={"n": 1})
    async with serving(dsn, tasks, cron=[entry]) as (conn, _):
        await seen.wait_for(2, timeout=10)
        ticks = await rows(conn, "SELECT count(*) FROM trioq.cron_ticks WHERE job_id IS NOT NULL")
        assert ticks[0][0] >= 2


async def test_a_backlog_drains_without_waiting_for_polls(dsn: str) -> None:
    """A full claim means more may wait: the fetcher claims again at once, not after a poll."""
    tasks = trioq.Registry()
    seen = Counter()

    @tasks.task
    async def quick(job: trioq.JobContext) -> None:
        seen.hit()

    async with serving(
        dsn, tasks, poll_interval=60, queues={"default": trioq.QueueConfig(concurrency=5)}
    ) as (conn, _):
        await trioq.enqueue_many(conn, [trioq.JobSpec(task="quick") for _ in range(300)])
        await seen.wait_for(300, timeout=20)


async def test_keep_result_stores_json_and_rejects_the_rest(dsn: str) -> None:
    tasks = trioq.Registry()
    done = Counter()

    @tasks.task(keep_result=True, max_attempts=3)
    async def compute(job: trioq.JobContext, x: int) -> Any:
        done.hit()
        return {"square": x * x} if x >= 0 else object()

    async with serving(dsn, tasks) as (conn, _):
        good = await compute.enqueue(conn, x=7)
        bad = await compute.enqueue(conn, x=-1)

        async def settled() -> bool:
            found = await rows(conn, "SELECT count(*) FROM trioq.jobs WHERE state = 'done'")
            dead = await rows(conn, "SELECT count(*) FROM trioq.dead_jobs")
            return found == [(1,)] and dead == [(1,)]

        await wait_until(settled)
        assert await rows(conn, "SELECT result FROM trioq.jobs WHERE id = %s", good.job_id) == [
            ({"square": 49},)
        ]
        (d,) = await trioq.Queue().dead_list(conn)
        assert d.id == bad.job_id and "is not JSON" in (d.last_error or "")
        assert len(done.calls) == 2  # a result that is not JSON is fatal: no retries


async def test_work_after_the_jobs_transaction_is_not_cancelled(dsn: str) -> None:
    tasks = trioq.Registry()
    finished = Counter()

    @tasks.task
    async def two_phase(job: trioq.JobContext) -> None:
        async with job.transaction() as tx:
            await tx.execute("SELECT 1")
        await trio.sleep(1.0)  # > 3 heartbeats: must not be taken for a lost lease
        finished.hit()

    async with serving(dsn, tasks) as (conn, _):
        await two_phase.enqueue(conn)
        await finished.wait_for(1)
        assert await rows(conn, "SELECT count(*) FROM trioq.jobs") == [(0,)]


async def test_handlers_holding_connections_cannot_starve_heartbeats(dsn: str) -> None:
    tasks = trioq.Registry()
    done = Counter()

    @tasks.task
    async def hog(job: trioq.JobContext) -> None:
        async with job.connection() as c:
            await c.execute("SELECT pg_sleep(2.5)")  # longer than the 1.5 s lease
        done.hit(job.attempt)

    async with serving(dsn, tasks, pool_size=2, app_pool_size=4) as (conn, _):
        await trioq.enqueue_many(conn, [trioq.JobSpec(task="hog") for _ in range(4)])
        await done.wait_for(4, timeout=20)
        assert done.calls == [1, 1, 1, 1]  # no lease was lost, so nothing ran twice


async def test_a_broken_retry_policy_does_not_kill_the_worker(dsn: str) -> None:
    class Broken:
        def delay(self, attempt: int) -> dt.timedelta:
            raise RuntimeError("policy bug")

    class Huge:
        def delay(self, attempt: int) -> dt.timedelta:
            return dt.timedelta.max

    tasks = trioq.Registry()
    seen = Counter()

    @tasks.task(retry=Broken())
    async def broken(job: trioq.JobContext) -> None:
        raise RuntimeError("fails")

    @tasks.task(retry=Huge())
    async def huge(job: trioq.JobContext) -> None:
        raise RuntimeError("fails")

    @tasks.task
    async def fine(job: trioq.JobContext) -> None:
        seen.hit()

    async with serving(dsn, tasks) as (conn, _):
        a = await broken.enqueue(conn)
        b = await huge.enqueue(conn)

        async def both_rescheduled() -> bool:
            found = await rows(
                conn, "SELECT count(*) FROM trioq.jobs WHERE state = 'scheduled' AND attempt = 1"
            )
            return found == [(2,)]

        await wait_until(both_rescheduled)
        (delay,) = await rows(
            conn,
            "SELECT run_at - now() < interval '366 days' FROM trioq.jobs WHERE id = %s",
            b.job_id,
        )
        assert delay == (True,)  # capped
        assert a.job_id != b.job_id
        await fine.enqueue(conn)
        await seen.wait_for(1)  # the worker is alive


async def test_a_claimed_job_carries_the_rows_values(dsn: str) -> None:
    """The claim returns args as JSON text and times as epoch µs: `Job` gives them back."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        args = {"text": "ünïcode \\u0000-free", "n": [1, 2.5, None, True], "nested": {"a": {}}}
        r = await trioq.enqueue(conn, "t", args, queue="q", priority=-3, max_attempts=7)
        lease = dt.timedelta(seconds=30)
        (job,) = await trioq.Queue().claim(conn, "q", owner="me", limit=5, lease=lease)
        ((run_at, enqueued_at, expires),) = await rows(
            conn, "SELECT run_at, enqueued_at, lease_expires_at FROM trioq.jobs WHERE id = %s",
            r.job_id,
        )  # fmt: skip
        assert (job.id, job.queue, job.task, job.args) == (r.job_id, "q", "t", args)
        assert (job.priority, job.attempt, job.max_attempts) == (-3, 1, 7)
        assert (job.run_at, job.enqueued_at, job.lease_expires_at) == (run_at, enqueued_at, expires)
        assert job.run_at.tzinfo is not None
        assert job == trioq.Job.from_row(
            (job.id, "q", "t", args, -3, run_at, 1, 7, enqueued_at, expires)
        )


async def test_a_stop_during_the_start_up_still_hands_the_runtime_to_nursery_start() -> None:
    """The server accepts the worker's connection and never answers; the stop comes then.
    ``nursery.start`` gets the runtime, already stopped, rather than "child exited without
    calling task_status.started()" (which failed a `serve --processes` worker)."""
    from trioq._worker.runtime import Runtime

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    dsn = f"postgresql://nobody@127.0.0.1:{port}/app?connect_timeout=60"
    runtime = Runtime(trioq.Config(registry=trioq.Registry(), dsn=dsn), dsn)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def stop_once_connecting() -> None:
                stream = await listeners[0].accept()
                runtime.stop()
                await stream.aclose()

            nursery.start_soon(stop_once_connecting)
            started = await nursery.start(runtime.run)
    assert started is runtime
    assert runtime.statistics().stopping
    await listeners[0].aclose()
