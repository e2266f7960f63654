"""Hooks (issue #11): middleware around every execution, and event callbacks that fire after
the worker wrote what they report. Real workers against real Postgres; callbacks that raise,
hang and fall behind."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import pytest
import trio
import trio.testing
from helpers import FAST, Counter, rows, scalar, serving, wait_until

import trioq
import trioq.testing
from trioq._hooks import EventDispatcher, JobEvent
from trioq.retry import Constant

# -- middleware ---------------------------------------------------------------------------------


async def test_middleware_wraps_the_handler_outermost_first(dsn: str) -> None:
    seen: list[Any] = []
    tasks = trioq.Registry()

    @tasks.middleware
    async def outer(job: trioq.JobContext, call_next: trioq.CallNext) -> Any:
        seen.append(("outer in", job.task, job.attempt))
        result = await call_next()
        seen.append(("outer out", result))
        return result

    @tasks.middleware
    async def inner(job: trioq.JobContext, call_next: trioq.CallNext) -> Any:
        seen.append("inner in")
        return {"wrapped": await call_next()}

    @tasks.task(keep_result=True)
    async def work(job: trioq.JobContext, n: int) -> int:
        seen.append("handler")
        return n * 2

    async with serving(dsn, tasks) as (conn, _runtime):
        job = await work.enqueue(conn, n=21)
        with trio.fail_after(10):
            assert await trioq.result(conn, job.job_id) == {"wrapped": 42}
    assert seen == [
        ("outer in", "work", 1), "inner in", "handler", ("outer out", {"wrapped": 42})
    ]


async def test_what_a_middleware_returns_or_raises_is_the_handlers(dsn: str) -> None:
    """It may catch the handler's error (the job completes), raise FatalError (dead at once),
    skip the handler, and must not call call_next twice (the attempt fails)."""
    handled = Counter()
    tasks = trioq.Registry()

    @tasks.middleware
    async def policy(job: trioq.JobContext, call_next: trioq.CallNext) -> Any:
        mode = job.job.kwargs.get("mode")
        if mode == "skip":
            return "skipped"
        if mode == "twice":
            await call_next()
            return await call_next()
        try:
            return await call_next()
        except LookupError:
            return "forgiven"
        except OSError as ex:
            raise trioq.FatalError(f"no point retrying: {ex}") from ex

    @tasks.task(keep_result=True, max_attempts=3, retry=Constant(seconds=60))
    async def work(job: trioq.JobContext, mode: str) -> str:
        handled.hit(mode)
        if mode == "lookup":
            raise KeyError("missing")
        if mode == "os":
            raise OSError("disk gone")
        return "ran"

    async with serving(dsn, tasks) as (conn, _runtime):
        ids = {m: (await work.enqueue(conn, mode=m)).job_id for m in ("lookup", "os", "skip",
                                                                        "twice")}  # fmt: skip
        with trio.fail_after(10):
            assert await trioq.result(conn, ids["lookup"]) == "forgiven"
            assert await trioq.result(conn, ids["skip"]) == "skipped"

        async def os_dead() -> bool:
            return (await trioq.job_status(conn, ids["os"])).state == "dead"

        await wait_until(os_dead)
        dead = await trioq.job_status(conn, ids["os"])
        assert dead.reason == "fatal error" and dead.attempt == 1
        assert dead.last_error == "FatalError: no point retrying: disk gone"

        async def twice_failed() -> bool:
            status = await trioq.job_status(conn, ids["twice"])
            return status.state == "scheduled"

        await wait_until(twice_failed)
        status = await trioq.job_status(conn, ids["twice"])
        assert status.last_error is not None and "called call_next() twice" in status.last_error
    assert "skip" not in handled.calls  # skipped: the handler never ran


async def test_a_middleware_is_bounded_by_the_timeout_and_cannot_swallow_cancelled(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    tasks = trioq.Registry()

    @tasks.middleware
    async def stubborn(job: trioq.JobContext, call_next: trioq.CallNext) -> Any:
        if job.job.kwargs.get("hang_here"):
            await trio.sleep_forever()
        try:
            return await call_next()
        except trio.Cancelled:
            return "swallowed"  # what a middleware must not do

    @tasks.task(timeout=0.3, keep_result=True, retry=Constant(seconds=60))
    async def slow(job: trioq.JobContext, hang_here: bool) -> str:
        await trio.sleep_forever()
        return "never"

    with caplog.at_level(logging.ERROR, logger="trioq.hooks"):
        async with serving(dsn, tasks) as (conn, _runtime):
            hangs = await slow.enqueue(conn, hang_here=True)
            swallows = await slow.enqueue(conn, hang_here=False)

            async def both_timed_out() -> bool:
                found = await rows(
                    conn, "SELECT id, state, last_error FROM trioq.jobs WHERE id = ANY(%s)",
                    [hangs.job_id, swallows.job_id],
                )  # fmt: skip
                return len(found) == 2 and all(r[1] == "scheduled" for r in found)

            await wait_until(both_timed_out)
            errors = await rows(conn, "SELECT DISTINCT last_error FROM trioq.jobs")
    assert errors == [("timeout: handler ran over 0.3 s",)]  # neither completed
    swallowed = [r for r in caplog.records if "swallowed trio.Cancelled" in r.getMessage()]
    assert len(swallowed) == 1 and swallowed[0].job_id == swallows.job_id  # type: ignore[attr-defined]


def test_hooks_are_checked_when_registered() -> None:
    tasks = trioq.Registry()

    def plain(job: Any, call_next: Any) -> Any:
        return call_next()

    with pytest.raises(TypeError, match="middleware must be an async function"):
        tasks.middleware(plain)
    with pytest.raises(ValueError, match="event kind must be one of retried, dead"):
        tasks.on("died")
    with pytest.raises(TypeError, match="callback for 'dead' must be an async function"):
        tasks.on("dead")(print)  # type: ignore[arg-type]
    assert tasks.hooks.middleware == [] and not any(tasks.hooks.callbacks.values())


async def test_middleware_runs_in_the_test_drain_too(dsn: str) -> None:
    tasks = trioq.Registry()
    wrapped = Counter()

    @tasks.middleware
    async def count(job: trioq.JobContext, call_next: trioq.CallNext) -> Any:
        wrapped.hit(job.id)
        return await call_next()

    @tasks.task
    async def noop(job: trioq.JobContext) -> None:
        pass

    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        job = await noop.enqueue(conn)
        result = await trioq.testing.drain(conn, tasks)
    assert [r.outcome for r in result.runs] == ["completed"] and wrapped.calls == [job.job_id]


# -- events -------------------------------------------------------------------------------------


async def test_events_fire_after_their_outcome_is_written(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """retried (with its delay), dead (with its reason), cancelled, lease_lost, unknown_task:
    each once, each after the database says so, each logged once with structured fields."""
    events: list[tuple[JobEvent, Any]] = []
    seen = Counter()
    tasks = trioq.Registry()
    started = Counter()
    resume = trio.Event()

    async def record(event: JobEvent) -> None:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            status = await trioq.job_status(conn, event.job_id)
        events.append((event, status.state))  # what the database said when it fired
        seen.hit(event.kind)

    for kind in ("retried", "dead", "cancelled", "lease_lost", "unknown_task"):
        tasks.on(kind)(record)

    @tasks.task(max_attempts=2, retry=Constant(seconds=0.05))
    async def failing(job: trioq.JobContext) -> None:
        raise ValueError(f"attempt {job.attempt} failed")

    @tasks.task
    async def sleeper(job: trioq.JobContext) -> None:
        started.hit(job.id)
        await trio.sleep_forever()

    @tasks.task
    async def paused(job: trioq.JobContext) -> None:
        started.hit(job.id)
        with trio.CancelScope(shield=True) as deaf:  # deaf to the lost lease's cancel
            deaf.deadline = trio.current_time() + 20  # (but never past the test)
            await resume.wait()

    with caplog.at_level(logging.INFO, logger="trioq"):
        async with serving(dsn, tasks) as (conn, _runtime):
            fail = await failing.enqueue(conn)
            unknown = await trioq.enqueue(conn, "nobody_knows")
            cancel = await sleeper.enqueue(conn)
            lost = await paused.enqueue(conn)
            await started.wait_for(2)
            assert (await conn.execute("SELECT 1")) is not None
            await trioq.Queue().cancel(conn, cancel.job_id)
            await conn.execute(
                "UPDATE trioq.jobs SET lease_owner = 'someone else' WHERE id = %s", (lost.job_id,)
            )
            with trio.fail_after(10):
                while {"retried", "dead", "cancelled", "lease_lost", "unknown_task"} - set(
                    seen.calls
                ):
                    await seen.wait_for(len(seen.calls) + 1)
            resume.set()  # its outcome is discarded: no second event for the same lost lease

            async def paused_done() -> bool:
                return "its outcome (complete) is discarded" in caplog.text

            await wait_until(paused_done)
    by_kind: dict[str, list[tuple[JobEvent, Any]]] = {}
    for event, state in events:
        by_kind.setdefault(event.kind, []).append((event, state))
    (retried, state), = by_kind["retried"]
    assert (retried.job_id, retried.task, retried.queue, retried.attempt) == (
        fail.job_id, "failing", "default", 1)  # fmt: skip
    assert retried.delay == dt.timedelta(seconds=0.05) and state in ("scheduled", "available",
                                                                     "running", "dead")
    assert retried.error == "ValueError: attempt 1 failed"
    (dead, state), = by_kind["dead"]
    assert (dead.job_id, dead.attempt, dead.reason, state) == (
        fail.job_id, 2, "attempts exhausted", "dead")  # fmt: skip
    assert dead.args == {} and dead.error == "ValueError: attempt 2 failed"
    unknown_event, state = by_kind["unknown_task"][0]  # given back every 5 s or so
    assert unknown_event.job_id == unknown.job_id and state == "scheduled"
    assert unknown_event.error is not None and "unknown task 'nobody_knows'" in unknown_event.error
    (cancelled, state), = by_kind["cancelled"]
    assert cancelled.job_id == cancel.job_id and state == "cancelled"
    reasons = [(e.job_id, e.reason) for e, _ in by_kind["lease_lost"]]
    assert reasons == [(lost.job_id, "the heartbeat found the lease taken")]

    def logged(text: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if text in r.getMessage()]

    (retry_log,) = logged("attempt 1 failed: ValueError: attempt 1 failed (retrying in 0.05 s)")
    assert (retry_log.job_id, retry_log.task, retry_log.queue, retry_log.attempt,  # type: ignore[attr-defined]
            retry_log.delay) == (fail.job_id, "failing", "default", 1, 0.05)  # type: ignore[attr-defined]
    (death_log,) = logged("died after attempt 2 of 2 (attempts exhausted)")
    assert death_log.reason == "attempts exhausted" and death_log.job_id == fail.job_id  # type: ignore[attr-defined]
    (cancel_log,) = logged(f"job {cancel.job_id} (sleeper) attempt 1 was cancelled")
    assert cancel_log.queue == "default"  # type: ignore[attr-defined]
    (lost_log,) = logged("lost its lease: cancelling its handler")
    assert lost_log.job_id == lost.job_id and lost_log.task == "paused"  # type: ignore[attr-defined]
    (discard_log,) = logged("its outcome (complete) is discarded")
    assert discard_log.job_id == lost.job_id and discard_log.task == "paused"  # type: ignore[attr-defined]


async def test_a_callback_that_raises_or_hangs_changes_nothing(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    tasks = trioq.Registry()
    after = Counter()

    @tasks.on("dead")
    async def broken(event: JobEvent) -> None:
        raise RuntimeError("the pager is down")

    @tasks.on("dead")
    async def stuck(event: JobEvent) -> None:
        await trio.sleep_forever()

    @tasks.on("dead")
    async def fine(event: JobEvent) -> None:
        after.hit(event.job_id)

    @tasks.task(max_attempts=1)
    async def doomed(job: trioq.JobContext) -> None:
        raise ValueError("no")

    @tasks.task
    async def ok(job: trioq.JobContext) -> None:
        pass

    with caplog.at_level(logging.WARNING, logger="trioq.hooks"):
        async with serving(dsn, tasks, hook_timeout=0.3) as (conn, runtime):
            first = await doomed.enqueue(conn)
            await after.wait_for(1)  # after the one that raised and the one that hung
            second = await doomed.enqueue(conn)
            for _ in range(5):
                await ok.enqueue(conn)
            await after.wait_for(2)

            async def drained() -> bool:
                return bool(await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0)

            await wait_until(drained)
            stats = runtime._services.events.statistics()
    assert after.calls == [first.job_id, second.job_id]
    assert (stats.failed, stats.timed_out, stats.delivered) == (2, 2, 2)
    raised = [r for r in caplog.records if "raised" in r.getMessage()]
    assert len(raised) == 2 and raised[0].exc_info is not None
    assert "RuntimeError: the pager is down" in caplog.text
    assert caplog.text.count("ran over its timeout of 0.3 s: cancelled") == 2


async def test_events_beyond_the_buffer_are_dropped_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = trio.Event()
    got: list[int] = []

    async def slow(event: JobEvent) -> None:
        await release.wait()
        got.append(event.job_id)

    dispatcher = EventDispatcher({"dead": [slow]}, timeout=10, concurrency=1, buffer=2)
    with caplog.at_level(logging.WARNING, logger="trioq.hooks"):
        for job_id in range(5):  # nothing runs yet: two fit, three are dropped
            dispatcher.emit(JobEvent(kind="dead", job_id=job_id, queue="q", task="t", attempt=1))
        dispatcher.emit(JobEvent(kind="retried", job_id=9, queue="q", task="t", attempt=1))
    assert dispatcher.statistics().dropped == 3 and dispatcher.statistics().pending == 2
    assert caplog.text.count("job events dropped so far") == 1  # rate-limited
    async with trio.open_nursery() as nursery:
        nursery.start_soon(dispatcher.run)
        await trio.testing.wait_all_tasks_blocked()
        release.set()
        await dispatcher.close()
        with trio.fail_after(5):
            await dispatcher.finished.wait()
    assert got == [0, 1]  # the retried event had no callback: never buffered
    assert dispatcher.statistics().delivered == 2


async def test_a_swept_death_is_reported_with_its_args(dsn: str) -> None:
    """A job whose worker vanished on its last attempt: this worker's sweeper moves it to
    dead_jobs, and the dead callback gets it with its args and reason."""
    tasks = trioq.Registry()
    got = Counter()

    @tasks.on("dead")
    async def record(event: JobEvent) -> None:
        got.hit(event)

    async with serving(dsn, tasks) as (conn, _runtime):
        job_id = await scalar(
            conn, "INSERT INTO trioq.jobs (queue, task, args, state, attempt, max_attempts,"
            " lease_owner, lease_expires_at) VALUES ('elsewhere', 'gone', '{\"user\": 7}',"
            " 'running', 1, 1, 'ghost:1:x', now() - interval '1 minute') RETURNING id",
        )  # fmt: skip
        await got.wait_for(1)
    (event,) = got.calls
    assert (event.kind, event.job_id, event.queue, event.task, event.attempt) == (
        "dead", job_id, "elsewhere", "gone", 1)  # fmt: skip
    assert event.args == {"user": 7} and event.reason == "lease expired on the last attempt"


async def test_buffered_events_are_delivered_at_shutdown(dsn: str) -> None:
    tasks = trioq.Registry()
    delivered: list[int] = []

    @tasks.on("dead")
    async def slow(event: JobEvent) -> None:
        await trio.sleep(0.05)
        delivered.append(event.job_id)

    @tasks.task(max_attempts=1)
    async def doomed(job: trioq.JobContext) -> None:
        raise ValueError("no")

    async with serving(dsn, tasks, hook_concurrency=1) as (conn, _runtime):
        ids = [(await doomed.enqueue(conn)).job_id for _ in range(8)]

        async def all_dead() -> bool:
            return bool(await scalar(conn, "SELECT count(*) FROM trioq.dead_jobs") == 8)

        await wait_until(all_dead)
    assert sorted(delivered) == ids  # the stop waited for the callbacks


async def test_an_outcome_written_too_late_is_a_lost_lease(dsn: str) -> None:
    """The fenced write found the lease taken (it expired unnoticed): the outcome is marked
    discarded, and the lease_lost event says so."""
    from trioq._outcome import DISCARDED, Kind, Outcome
    from trioq._worker.completer import write_kind
    from trioq._worker.services.lifecycle import Lifecycle

    got: list[JobEvent] = []

    async def record(event: JobEvent) -> None:
        got.append(event)

    dispatcher = EventDispatcher({"lease_lost": [record]}, timeout=5, concurrency=1, buffer=10)
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        queue = trioq.Queue()
        await queue.enqueue(conn, "t", {"n": 1})
        (job,) = await queue.claim(conn, "default", owner="me", limit=1,
                                   lease=dt.timedelta(seconds=30))  # fmt: skip
        await conn.execute("UPDATE trioq.jobs SET lease_owner = 'thief'")
        outcome = Outcome(kind=Kind.COMPLETE, lease=trioq.Lease(job.id, job.attempt))
        outcome.job = job
        written = await write_kind(conn, queue.driver, Kind.COMPLETE, [outcome], owner="me")
        assert written == frozenset()
        assert outcome.fate == DISCARDED
        async with trioq.pg.Pool(dsn, max_size=1) as pool:
            lifecycle = Lifecycle(dispatcher, pool, "trioq")
            lifecycle.written([outcome])
            async with trio.open_nursery() as nursery:
                nursery.start_soon(dispatcher.run)
                await dispatcher.close()
    (event,) = got
    assert (event.kind, event.job_id, event.args) == ("lease_lost", job.id, {"n": 1})
    assert event.reason == "its outcome (complete) was discarded: the lease was taken"
    assert lifecycle.counts["discarded", "default", "t"] == 1


async def test_a_cancel_during_the_shutdown_flush_ends_serve_at_once(dsn: str) -> None:
    """A graceful stop, then the enclosing scope cancelled while the flush waits for a
    callback: the cancel ends the services too, so the flush must not then wait out its
    bound (`FLUSH_TIMEOUT`, 10 s) for a service that is gone (it did: "event callbacks had
    not finished at shutdown: 0 events not delivered", 10 s late)."""
    from trioq._worker.wiring import FLUSH_TIMEOUT

    tasks = trioq.Registry()
    entered = trio.Event()

    @tasks.on("dead")
    async def hang(event: JobEvent) -> None:
        entered.set()
        await trio.sleep_forever()

    @tasks.task(max_attempts=1)
    async def doomed(job: trioq.JobContext) -> None:
        raise ValueError("no")

    config = trioq.Config(dsn=dsn, registry=tasks, hook_timeout=600, **FAST)
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        async with trio.open_nursery() as nursery:
            runtime: trioq.Runtime = await nursery.start(trioq.serve, config)
            await doomed.enqueue(conn)
            with trio.fail_after(10):
                await entered.wait()
            runtime.stop()
            events = runtime._services.events
            with trio.fail_after(10):
                while not events._closed:  # noqa: ASYNC110 - the flush has begun to wait on it
                    await trio.sleep(0.001)
            nursery.cancel_scope.cancel()
            cancelled_at = trio.current_time()
    assert trio.current_time() - cancelled_at < FLUSH_TIMEOUT / 4
