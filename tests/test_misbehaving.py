"""Handlers that misbehave: none of them stops the worker or runs a job twice at once
(issue #10). Real workers against real Postgres; real forked processes."""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
import time
from typing import Any

import pytest
import trio
from helpers import Counter, rows, scalar, serving, wait_until

import trioq
from trioq.retry import Constant


class Overlap:
    """How many copies of a job run at once (from any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.started = 0

    def __enter__(self) -> None:
        with self._lock:
            self.running += 1
            self.started += 1
            self.most = max(self.most, self.running)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.running -= 1


async def state_of(conn: Any, job_id: int) -> tuple[str, int] | None:
    found = await rows(conn, "SELECT state, attempt FROM trioq.jobs WHERE id = %s", job_id)
    return None if not found else (found[0][0], found[0][1])


# -- sync handlers whose thread outlives their job ------------------------------------------------


async def test_a_sync_handler_past_its_timeout_is_not_retried_until_its_thread_ends(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    overlap = Overlap()
    tasks = trioq.Registry()

    @tasks.task(timeout=0.05, max_attempts=3, retry=Constant(seconds=0))
    def slow(job: trioq.JobContext) -> None:
        with overlap:
            time.sleep(0.6)

    with caplog.at_level(logging.INFO, logger="trioq.runtime"):
        async with serving(dsn, tasks, queues={"default": trioq.QueueConfig(concurrency=3)}) as (
            conn,
            _runtime,
        ):
            job = await slow.enqueue(conn)

            async def dead() -> bool:
                return bool(await scalar(conn, "SELECT count(*) FROM trioq.dead_jobs") == 1)

            await wait_until(dead, timeout=20)
    assert (overlap.started, overlap.most) == (3, 1)  # three attempts, never two at once
    expected = f"job {job.job_id} (slow): it ran over its timeout of 0.05 s, but its sync "
    assert expected in caplog.text
    assert "the job keeps its slot and lease until it returns" in caplog.text


async def test_a_cancelled_sync_handler_is_marked_at_once_and_keeps_its_slot(dsn: str) -> None:
    release = threading.Event()
    started = Counter()
    after: list[str] = []
    tasks = trioq.Registry()

    @tasks.task
    def blocking(job: trioq.JobContext) -> str:
        trio.from_thread.run_sync(started.hit)
        release.wait(30)
        return "ignored"

    @tasks.task
    async def next_one(job: trioq.JobContext) -> None:
        after.append("ran")

    async with serving(dsn, tasks, queues={"default": trioq.QueueConfig(concurrency=1)}) as (
        conn,
        _runtime,
    ):
        job = await trioq.enqueue(conn, "blocking")
        await started.wait_for(1)
        await trioq.enqueue(conn, "next_one")
        assert (await trioq.Queue().cancel(conn, job.job_id)).status == "requested"

        async def cancelled() -> bool:
            return await state_of(conn, job.job_id) == ("cancelled", 1)

        await wait_until(cancelled)  # marked while its thread still runs
        await trio.sleep(0.3)  # (the one slot must stay taken: nothing can make this pass early)
        assert after == []
        release.set()

        async def next_ran() -> bool:
            return after == ["ran"]

        await wait_until(next_ran)
        assert await state_of(conn, job.job_id) == ("cancelled", 1)


async def test_a_job_whose_old_thread_still_runs_is_not_started_again_here(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Its lease is reclaimed while its sync handler runs; this worker claims it again: it
    must give it back, not run a second copy beside the first."""
    overlap = Overlap()
    release = threading.Event()
    started = Counter()
    tasks = trioq.Registry()

    @tasks.task(max_attempts=5)
    def stubborn(job: trioq.JobContext) -> None:
        with overlap:
            trio.from_thread.run_sync(started.hit, job.attempt)
            if job.attempt == 1:
                release.wait(30)

    with caplog.at_level(logging.WARNING, logger="trioq.runtime"):
        async with serving(dsn, tasks, queues={"default": trioq.QueueConfig(concurrency=2)}) as (
            conn,
            _runtime,
        ):
            job = await trioq.enqueue(conn, "stubborn")
            await started.wait_for(1)
            # what the sweeper does to an expired lease (done here, so the heartbeat cannot
            # extend the lease first): the job is available again, its attempt spent
            await conn.execute(
                "UPDATE trioq.jobs SET state = 'available', lease_owner = NULL,"
                " lease_expires_at = NULL WHERE id = %s", (job.job_id,),
            )  # fmt: skip

            async def refused() -> bool:
                return "handler still runs in this process: given back" in caplog.text

            await wait_until(refused)
            assert overlap.most == 1 and started.calls == [1]
            release.set()
            await started.wait_for(2, timeout=20)  # attempt 2 runs once the thread is gone
    assert overlap.most == 1


# -- an async handler that blocks the loop --------------------------------------------------------


async def test_a_blocked_loop_is_reported_with_its_job_and_stack(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    tasks = trioq.Registry()
    done = Counter()

    @tasks.task
    async def blocker(job: trioq.JobContext) -> None:
        time.sleep(1.0)  # noqa: ASYNC251 - the point of the test
        done.hit()

    with caplog.at_level(logging.WARNING, logger="trioq.runtime"):
        async with serving(dsn, tasks, loop_blocked_warning=0.25) as (conn, _runtime):
            job = await trioq.enqueue(conn, "blocker")
            await done.wait_for(1)
    warnings = [r.getMessage() for r in caplog.records if "trio loop has not run" in r.getMessage()]
    assert len(warnings) == 1  # once per stall
    assert f"the async handler of job {job.job_id} (task 'blocker') blocks it" in warnings[0]
    assert "time.sleep(1.0)" in warnings[0]


def test_the_watchdog_says_nothing_while_the_loop_runs() -> None:
    from trioq._worker.watchdog import Watchdog

    watchdog = Watchdog(threshold=1.0)
    assert watchdog.run_once() is None
    stall = watchdog.run_once(now=time.monotonic() + 5)
    assert stall is not None and stall.seconds > 4 and stall.job is None
    assert stall.culprit is None  # no user code on the stack
    assert "test_the_watchdog_says_nothing_while_the_loop_runs" in stall.stack
    assert watchdog.run_once(now=time.monotonic() + 6) is None  # the same stall, once


class LoopBlocker:
    """User code that holds the trio loop's thread while a thread beside it asks the watchdog
    what blocks the loop (`Watchdog.run_once`, what the watchdog's own thread calls)."""

    def __init__(self) -> None:
        self.watchdog: Any = None
        self.stall: Any = None
        self.checked = Counter()

    def block(self) -> None:
        """Called on the loop's thread, by the user code under test."""
        def check() -> None:
            self.stall = self.watchdog.run_once(now=time.monotonic() + 3600)  # a long stall

        thread = threading.Thread(target=check)
        thread.start()
        thread.join(30)  # the loop's thread waits here (or in start): the innermost frames
        self.checked.hit()


def _blocking_registry(kind: str, blocker: LoopBlocker) -> tuple[trioq.Registry, str]:
    """A registry whose ``kind`` of user code blocks the loop, and how the watchdog should
    name it (``{job}``: the job's id)."""
    tasks = trioq.Registry()

    class SlowPolicy:
        def delay(self, attempt: int) -> dt.timedelta:
            if kind == "retry policy":
                blocker.block()
            return dt.timedelta(0)

    @tasks.task(max_attempts=1 if kind == "dead callback" else 2, retry=SlowPolicy())
    async def stuck(job: trioq.JobContext) -> None:
        if kind.startswith("handler"):
            blocker.block()
        if kind in ("retry policy", "dead callback"):
            raise ValueError("fails, so that the policy or the callback runs")

    @tasks.middleware
    async def around(job: trioq.JobContext, call_next: trioq.CallNext) -> Any:
        if kind == "middleware":
            blocker.block()
        return await call_next()

    @tasks.on("dead")
    async def page_someone(event: trioq.JobEvent) -> None:
        if kind == "dead callback":
            blocker.block()

    handler = "the async handler of job {job} (task 'stuck')"
    return tasks, {
        "handler": handler,
        "handler under middleware": handler,
        "middleware": f"the middleware {around.__qualname__} of task 'stuck' (job {{job}})",
        "retry policy": f"the retry policy {SlowPolicy.__qualname__} of task 'stuck' "
                        "(job {job})",
        "dead callback": f"the dead callback {page_someone.__qualname__} of task 'stuck' "
                         "(job {job})",
    }[kind]  # fmt: skip


@pytest.mark.parametrize(
    "kind", ["handler", "handler under middleware", "middleware", "retry policy", "dead callback"]
)
async def test_the_watchdog_names_the_user_code_that_blocks_the_loop(
    dsn: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = LoopBlocker()
    tasks, culprit = _blocking_registry(kind, blocker)
    if kind == "handler":
        tasks.hooks.middleware.clear()  # the handler alone, as without middleware
    with caplog.at_level(logging.WARNING, logger="trioq.runtime"):
        async with serving(dsn, tasks, loop_blocked_warning=60) as (conn, runtime):
            blocker.watchdog = runtime._services.watchdog
            job = await trioq.enqueue(conn, "stuck")
            await blocker.checked.wait_for(1)
    assert blocker.stall is not None
    expected = culprit.format(job=job.job_id)
    assert blocker.stall.culprit == expected
    warnings = [r for r in caplog.records if "trio loop has not run" in r.getMessage()]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert f": {expected} blocks it (" in message
    assert "    blocker.block()\n" in message  # the stack: the user code's line, and inner
    assert (warnings[0].job_id, warnings[0].task) == (job.job_id, "stuck")  # type: ignore[attr-defined]


# -- tasks this worker does not know --------------------------------------------------------------


async def test_an_unknown_task_is_given_back_without_spending_attempts(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    known = Counter()
    tasks = trioq.Registry()

    @tasks.task
    async def known_task(job: trioq.JobContext) -> None:
        known.hit()

    with caplog.at_level(logging.ERROR, logger="trioq.runtime"):
        async with serving(dsn, tasks) as (conn, _runtime):
            a = await trioq.enqueue(conn, "nobody_knows", max_attempts=1)
            b = await trioq.enqueue(conn, "nobody_knows", max_attempts=1)
            await trioq.enqueue(conn, "known_task")
            await known.wait_for(1)

            async def given_back() -> bool:
                found = await rows(
                    conn, "SELECT state, attempt, unknown_since IS NOT NULL, last_error"
                    " FROM trioq.jobs WHERE id = ANY(%s)", [a.job_id, b.job_id],
                )  # fmt: skip
                return len(found) == 2 and all(r[:3] == ("scheduled", 0, True) for r in found)

            await wait_until(given_back)
            error = await scalar(conn, "SELECT last_error FROM trioq.jobs WHERE id = %s", a.job_id)
            assert error.startswith("unknown task 'nobody_knows': no handler registered")
    logged = [r for r in caplog.records if "unknown task 'nobody_knows'" in r.getMessage()]
    assert len(logged) == 1  # once per task name


async def test_an_unknown_task_goes_dead_after_the_timeout(dsn: str) -> None:
    async with serving(dsn, trioq.Registry(), unknown_task_timeout=60) as (conn, _runtime):
        await conn.execute("SELECT 1")
        async with conn.transaction():
            job = await trioq.enqueue(conn, "gone_for_good")
            await conn.execute(
                "UPDATE trioq.jobs SET unknown_since = now() - interval '2 minutes'"
                " WHERE id = %s", (job.job_id,),
            )  # fmt: skip

        async def dead() -> bool:
            return bool(await rows(conn, "SELECT 1 FROM trioq.dead_jobs WHERE id = %s",
                                   job.job_id))  # fmt: skip

        await wait_until(dead)
        (reason, attempt, error), = await rows(
            conn, "SELECT reason, attempt, last_error FROM trioq.dead_jobs WHERE id = %s",
            job.job_id,
        )  # fmt: skip
        assert (reason, attempt) == ("unknown task", 0)
        assert error.startswith("unknown task 'gone_for_good'")


async def test_a_worker_that_knows_the_task_runs_it(dsn: str) -> None:
    ran = Counter()
    knows = trioq.Registry()

    @knows.task(name="new_task")
    async def new_task(job: trioq.JobContext) -> None:
        ran.hit(job.attempt)

    async with serving(dsn, trioq.Registry(), poll_interval=0.05) as (conn, _old):
        job = await trioq.enqueue(conn, "new_task")

        async def given_back() -> bool:
            return await state_of(conn, job.job_id) == ("scheduled", 0)

        await wait_until(given_back)
    # the new deploy replaces the old one; the job is due now rather than in 5 s
    async with serving(dsn, knows, poll_interval=0.05) as (conn, _new):
        await conn.execute("UPDATE trioq.jobs SET run_at = now() WHERE id = %s", (job.job_id,))
        await ran.wait_for(1)
    assert ran.calls == [1]  # its first attempt: the give-backs spent none


# -- a handler whose lease was lost while it was paused -------------------------------------------


async def test_a_stale_handlers_discarded_outcome_is_logged(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    resume = trio.Event()
    started = Counter()
    tasks = trioq.Registry()

    @tasks.task
    async def paused(job: trioq.JobContext) -> None:
        started.hit()
        with trio.CancelScope(shield=True):  # "paused past its lease": deaf to the cancel
            await resume.wait()

    with caplog.at_level(logging.WARNING, logger="trioq.runtime"):
        async with serving(dsn, tasks) as (conn, runtime):
            job = await trioq.enqueue(conn, "paused")
            await started.wait_for(1)
            await conn.execute(
                "UPDATE trioq.jobs SET lease_owner = 'someone else' WHERE id = %s", (job.job_id,)
            )

            async def lost() -> bool:
                return "lost its lease: cancelling its handler" in caplog.text

            await wait_until(lost)
            resume.set()

            async def logged() -> bool:
                return "its outcome (complete) is discarded" in caplog.text

            await wait_until(logged)
            assert runtime.statistics().held_leases == 0
    expected = f"job {job.job_id} (paused) attempt 1: its handler finished after its lease"
    assert expected in caplog.text


# -- a handler that forks -------------------------------------------------------------------------


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_a_forked_child_never_acts_as_a_worker(dsn: str, sync: bool) -> None:
    """The child returns into trioq without exiting: trioq ends it before it does anything."""
    children: list[int] = []
    tasks = trioq.Registry()

    def fork_and_wait(job: trioq.JobContext) -> str:
        pid = os.fork()
        if pid == 0:
            return "the child returns into trioq"  # never reaches the completer
        children.append(os.waitpid(pid, 0)[1])
        return "parent"

    async def fork_async(job: trioq.JobContext) -> str:
        return fork_and_wait(job)

    tasks.task(name="forker", keep_result=True)(fork_and_wait if sync else fork_async)
    async with serving(dsn, tasks) as (conn, _runtime):
        job = await trioq.enqueue(conn, "forker")

        async def done() -> bool:
            return await state_of(conn, job.job_id) == ("done", 1)

        await wait_until(done)
        assert await scalar(conn, "SELECT result FROM trioq.jobs WHERE id = %s", job.job_id) == (
            "parent"
        )
        again = await trioq.enqueue(conn, "forker")  # the worker goes on

        async def done_again() -> bool:
            return await state_of(conn, again.job_id) == ("done", 1)

        await wait_until(done_again)
    assert children == [0, 0]  # each child exited with status 0, by os._exit(0)
