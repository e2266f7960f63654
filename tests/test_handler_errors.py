"""Handlers that raise what is not an `Exception` fail their job, not the worker (issue #6).

KeyboardInterrupt, SystemExit, GeneratorExit, a "stray" `trio.Cancelled` (raised
while no enclosing cancel scope is cancelled) and groups of them, from async and
sync handlers: the job's attempt counts and its error is stored, the worker goes
on with other jobs, and ``stop()`` still shuts it down gracefully.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

import trioq
from trioq.retry import Constant

FAST: dict[str, Any] = {
    "lease": 1.5,
    "heartbeat_interval": 0.3,
    "poll_interval": 0.2,
    "sweep_interval": 0.3,
}
GOOD_JOBS = 10
#: The failed job is retried after an hour: the test sees it waiting as ``scheduled``.
LATER = Constant(seconds=3600)


def _keyboard_interrupt() -> None:
    raise KeyboardInterrupt


def _system_exit() -> None:
    raise SystemExit(3)


def _generator_exit() -> None:
    raise GeneratorExit


def _stray_cancelled() -> None:
    raise trio.Cancelled._create()


def _group() -> None:
    raise BaseExceptionGroup("boom", [KeyboardInterrupt(), SystemExit(3)])


def _group_with_stray_cancelled() -> None:
    raise BaseExceptionGroup("mixed", [trio.Cancelled._create(), ValueError("bad")])


RAISERS: dict[str, tuple[Callable[[], None], str]] = {
    "KeyboardInterrupt": (_keyboard_interrupt, "KeyboardInterrupt"),
    "SystemExit": (_system_exit, "SystemExit: 3"),
    "GeneratorExit": (_generator_exit, "GeneratorExit"),
    "stray Cancelled": (
        _stray_cancelled,
        "stray trio.Cancelled: raised while no enclosing cancel scope was cancelled",
    ),
    "group": (
        _group,
        "BaseExceptionGroup: boom (2 sub-exceptions): KeyboardInterrupt, SystemExit: 3",
    ),
    "group with stray Cancelled": (
        _group_with_stray_cancelled,
        "BaseExceptionGroup: mixed (2 sub-exceptions): stray trio.Cancelled, ValueError: bad",
    ),
}


@asynccontextmanager
async def serving(dsn: str, registry: trioq.Registry, **options: Any) -> AsyncIterator[Any]:
    """A running runtime; on exit, a graceful ``stop()`` that must finish in time."""
    config = trioq.Config(dsn=dsn, registry=registry, **{**FAST, **options})
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                runtime = await nursery.start(trioq.serve, config)
                yield conn, runtime
                runtime.stop()  # graceful: the nursery must close by itself


async def rows(conn: Any, query: str, *params: Any) -> list[tuple[Any, ...]]:
    cur = await conn.execute(query, params)
    result: list[tuple[Any, ...]] = await cur.fetchall()
    return result


async def wait_for_rows(conn: Any, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """Poll the database (bounded) until ``query`` returns rows."""
    with trio.fail_after(10):
        while not (found := await rows(conn, query, *params)):  # noqa: ASYNC110
            await trio.sleep(0.02)
    return found


def _registry(raiser: Callable[[], None], *, is_async: bool) -> trioq.Registry:
    tasks = trioq.Registry()

    if is_async:

        @tasks.task(name="bad", retry=LATER)
        async def bad_async(job: trioq.JobContext) -> None:
            await trio.lowlevel.checkpoint()
            raiser()

    else:

        @tasks.task(name="bad", retry=LATER)
        def bad_sync(job: trioq.JobContext) -> None:
            raiser()

    @tasks.task
    async def good(job: trioq.JobContext) -> None:
        await trio.lowlevel.checkpoint()

    return tasks


@pytest.mark.parametrize("mode", ["async", "sync"])
@pytest.mark.parametrize("case", list(RAISERS))
async def test_base_exception_fails_the_job_and_the_worker_goes_on(
    dsn: str, case: str, mode: str
) -> None:
    raiser, error = RAISERS[case]
    tasks = _registry(raiser, is_async=mode == "async")
    one_slot = {"default": trioq.QueueConfig(concurrency=1)}
    async with serving(dsn, tasks, queues=one_slot) as (conn, runtime):
        bad = await trioq.enqueue(conn, "bad", priority=-1, max_attempts=2)  # first: one slot
        await trioq.enqueue_many(conn, [trioq.JobSpec(task="good") for _ in range(GOOD_JOBS)])
        (row,) = await wait_for_rows(
            conn,
            "SELECT state, attempt, last_error FROM trioq.jobs WHERE id = %s AND attempt = 1"
            " AND state = 'scheduled'",
            bad.job_id,
        )
        assert row[2] == error, row
        await wait_for_rows(
            conn, "SELECT 1 FROM trioq.jobs WHERE task = 'good' HAVING count(*) = 0"
        )
        assert runtime.statistics().claimed == GOOD_JOBS + 1
    # serving() stopped the runtime gracefully; nothing is left running.
    assert await _after_stop(dsn) == [("scheduled", 1)]


async def _after_stop(dsn: str) -> list[tuple[Any, ...]]:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        return await rows(conn, "SELECT state, attempt FROM trioq.jobs")


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_base_exception_on_the_last_attempt_stores_the_traceback(dsn: str, mode: str) -> None:
    tasks = _registry(_system_exit, is_async=mode == "async")
    async with serving(dsn, tasks) as (conn, _):
        bad = await trioq.enqueue(conn, "bad", max_attempts=1)
        await wait_for_rows(conn, "SELECT 1 FROM trioq.dead_jobs WHERE id = %s", bad.job_id)
        (dead,) = await trioq.Queue().dead_list(conn)
        assert dead.reason == "attempts exhausted"
        assert dead.last_error == "SystemExit: 3"
        assert dead.traceback and "_system_exit" in dead.traceback


async def test_a_real_cancellation_is_not_mistaken_for_a_stray_one(dsn: str) -> None:
    """A handler cancelled by its timeout inside its own nursery: a timeout, as before."""
    tasks = trioq.Registry()

    @tasks.task(timeout=0.1, max_attempts=1)
    async def nursery_user(job: trioq.JobContext) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            nursery.start_soon(trio.sleep_forever)

    async with serving(dsn, tasks) as (conn, _):
        r = await nursery_user.enqueue(conn)
        await wait_for_rows(conn, "SELECT 1 FROM trioq.dead_jobs WHERE id = %s", r.job_id)
        (dead,) = await trioq.Queue().dead_list(conn)
        assert dead.last_error == "timeout: handler ran over 0.1 s"


async def test_a_sync_handler_blocking_past_its_timeout_keeps_its_job_until_it_returns(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The thread cannot be stopped: other jobs go on at once, but the job keeps its slot
    and lease, and fails as a timeout only once its thread returns (issue #10: it must not
    be retried while a copy still runs; before, it failed at once, beside the thread).

    (``trio.to_thread.run_sync(..., abandon_on_cancel=True)``: see docs/concepts.md#timeouts.)
    """
    tasks = trioq.Registry()
    release = threading.Event()
    main = trio.lowlevel.current_trio_token()
    ran = trio.Event()

    @tasks.task(timeout=0.2, max_attempts=1)
    def blocked(job: trioq.JobContext) -> None:
        trio.from_thread.run_sync(ran.set, trio_token=main)
        release.wait(5)

    @tasks.task
    async def good(job: trioq.JobContext) -> None:
        await trio.lowlevel.checkpoint()

    try:
        async with serving(dsn, tasks) as (conn, _):
            r = await blocked.enqueue(conn)
            await ran.wait()
            await trioq.enqueue_many(conn, [trioq.JobSpec(task="good") for _ in range(5)])
            await wait_for_rows(
                conn, "SELECT 1 FROM trioq.jobs WHERE task = 'good' HAVING count(*) = 0"
            )
            with trio.fail_after(10):
                while "it ran over its timeout of 0.2 s" not in caplog.text:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            assert not release.is_set()  # the thread is still blocked ...
            state = await rows(conn, "SELECT state FROM trioq.jobs WHERE id = %s", r.job_id)
            assert state == [("running",)]  # ... and its job still holds its lease
            release.set()
            with trio.fail_after(3):
                await wait_for_rows(conn, "SELECT 1 FROM trioq.dead_jobs WHERE id = %s", r.job_id)
            (dead,) = await trioq.Queue().dead_list(conn)
            assert dead.last_error == "timeout: handler ran over 0.2 s"
    finally:
        release.set()
