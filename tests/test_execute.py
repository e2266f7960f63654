"""What a handler's ending means for its job: the rules of `trioq._worker.execute`, no database.

The handlers here never touch a connection, so the `JobServices` around them holds a
pool that is never opened.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from typing import Any

import pytest
import trio
from committing import Commits

import trioq
from trioq._outcome import Kind, Outcome
from trioq._worker.execute import (
    MAX_RETRY_DELAY,
    Executor,
    aborted,
    describe,
    outcome_of_base_error,
    outcome_of_error,
    outcome_of_result,
    reraise_cancellation,
    retry_delay,
    unknown_task,
)
from trioq.retry import Constant

UTC = dt.UTC
NOW = dt.datetime(2030, 1, 1, tzinfo=UTC)
LEASE = trioq.Lease(7, 2)


def job(task: str = "t", args: Any = None, attempt: int = 2) -> trioq.Job:
    return trioq.Job(
        id=7, queue="q", task=task, args={} if args is None else args, priority=0, run_at=NOW,
        attempt=attempt, max_attempts=5, enqueued_at=NOW, lease_expires_at=NOW,
    )  # fmt: skip


def task(fn: Any = None, **options: Any) -> trioq.Task:
    options.setdefault("retry", Constant(seconds=3))
    return trioq.Task(name="t", fn=fn or (lambda ctx: None), **options)


def services() -> trioq.JobServices:
    never_opened = trioq.pg.Pool("postgresql://nobody@127.0.0.1:1/nothing", max_size=1)
    return trioq.JobServices(
        app_pool=never_opened, queue=trioq.Queue(), owner="w", committing=Commits()
    )


def raised(ex: BaseException) -> BaseException:
    """``ex`` with a traceback, as the rules see it inside an ``except`` block."""
    try:
        raise ex
    except BaseException as caught:
        return caught


def outcome_of(ex: Exception, t: trioq.Task | None = None) -> Outcome:
    try:
        raise ex
    except Exception as caught:
        return outcome_of_error(t or task(), job(), LEASE, caught)


# -- exceptions -> outcomes ---------------------------------------------------------------------


def test_snooze_releases_after_its_delay() -> None:
    out = outcome_of(trioq.Snooze(dt.timedelta(seconds=9)))
    assert (out.kind, out.lease, out.delay) == (Kind.RELEASE, LEASE, dt.timedelta(seconds=9))


def test_a_lost_lease_writes_nothing() -> None:
    assert outcome_of(trioq.LeaseLostError("gone")).kind is Kind.NOTHING


def test_fatal_error_dies_at_once_with_its_traceback() -> None:
    out = outcome_of(trioq.FatalError("bad input"))
    assert out.kind is Kind.FAIL and out.failure is not None
    assert out.failure.fatal
    assert out.failure.error == "FatalError: bad input"
    assert out.failure.traceback is not None and "FatalError: bad input" in out.failure.traceback


def test_other_errors_retry_after_the_tasks_delay() -> None:
    out = outcome_of(ValueError("nope"))
    assert out.kind is Kind.FAIL and out.failure is not None
    assert not out.failure.fatal
    assert out.failure.error == "ValueError: nope"
    assert out.failure.delay == dt.timedelta(seconds=3)  # the task's Constant(3)
    assert out.failure.lease == LEASE


def test_an_error_without_a_message_is_named_by_its_type() -> None:
    out = outcome_of(MemoryError())
    assert out.failure is not None and out.failure.error == "MemoryError"


@pytest.mark.parametrize("ex", [KeyboardInterrupt(), SystemExit(3), GeneratorExit()])
def test_base_exceptions_fail_only_their_job(ex: BaseException) -> None:
    out = outcome_of_base_error(task(), job(), LEASE, raised(ex))
    assert out.kind is Kind.FAIL and out.failure is not None and not out.failure.fatal
    assert out.failure.error.startswith(type(ex).__name__)


def test_a_stray_cancelled_is_named_as_such() -> None:
    async def main() -> Outcome:
        with trio.CancelScope() as scope:
            scope.cancel()
            try:
                await trio.lowlevel.checkpoint()
            except trio.Cancelled as ex:
                stray = ex
        return outcome_of_base_error(task(), job(), LEASE, stray)

    out = trio.run(main)
    assert out.failure is not None
    assert out.failure.error.startswith("stray trio.Cancelled")


def test_the_runtimes_cancellation_propagates_and_anything_else_returns() -> None:
    async def main() -> list[str]:
        seen = []
        reraise_cancellation(raised(KeyboardInterrupt()), job())  # nothing cancelled: returns
        seen.append("returned")
        with trio.CancelScope() as scope:
            scope.cancel()
            try:
                await trio.lowlevel.checkpoint()
            except trio.Cancelled as ex:
                try:
                    reraise_cancellation(ex, job())
                except trio.Cancelled:
                    seen.append("cancelled re-raised")
                    raise
        return seen

    assert trio.run(main) == ["returned", "cancelled re-raised"]


def test_groups_are_described_member_by_member() -> None:
    group = ExceptionGroup("two", [ValueError("a"), ExceptionGroup("in", [KeyError("b")])])
    assert describe(group) == "ExceptionGroup: two (2 sub-exceptions): ValueError: a, KeyError: 'b'"


# -- results, aborts, unknown tasks -------------------------------------------------------------


def test_results_complete_or_are_kept_when_json() -> None:
    assert outcome_of_result(task(), LEASE, object()).kind is Kind.COMPLETE
    kept = outcome_of_result(task(keep_result=True), LEASE, {"n": 1})
    assert (kept.kind, kept.result) == (Kind.KEEP, {"n": 1})
    bad = outcome_of_result(task(keep_result=True), LEASE, {1, 2})
    assert bad.kind is Kind.FAIL and bad.failure is not None and bad.failure.fatal
    assert "result of task 't' is not JSON" in bad.failure.error


@pytest.mark.parametrize(
    ("reason", "kind"),
    [("lost", Kind.NOTHING), ("cancel", Kind.CANCELLED), ("shutdown", Kind.RELEASE),
     (None, Kind.RELEASE)],
)  # fmt: skip
def test_aborted_jobs(reason: str | None, kind: Kind) -> None:
    out = aborted(reason, LEASE)
    assert (out.kind, out.lease, out.delay) == (kind, LEASE, dt.timedelta(0))


def test_an_unknown_task_is_given_back_naming_the_known_ones() -> None:
    """Issue #10: not a failure (no attempt spent); the completer gives it back."""
    registry = trioq.Registry()
    registry.add(task())
    out = unknown_task(job(task="missing"), registry, LEASE)
    assert out.kind is Kind.UNKNOWN and out.failure is not None and not out.failure.fatal
    assert out.failure.error == (
        "unknown task 'missing': no handler registered in this worker (known: t)"
    )
    assert out.failure.reason == "unknown task"


# -- retry delays -------------------------------------------------------------------------------


class Broken:
    def delay(self, attempt: int) -> dt.timedelta:
        raise ZeroDivisionError


class Returns:
    def __init__(self, value: Any) -> None:
        self.value = value

    def delay(self, attempt: int) -> dt.timedelta:
        return self.value  # type: ignore[no-any-return]


class NotANumber:
    def total_seconds(self) -> float:
        return math.nan


def test_retry_delay_is_kept_within_bounds() -> None:
    assert retry_delay(task(), 1) == dt.timedelta(seconds=3)
    assert retry_delay(task(retry=Returns(dt.timedelta(days=10_000))), 1) == MAX_RETRY_DELAY
    assert retry_delay(task(retry=Returns(dt.timedelta(seconds=-5))), 1) == dt.timedelta(0)
    default = retry_delay(task(retry=Broken()), 2)  # falls back to Sidekiq: 2**4 + 15 + ...
    assert dt.timedelta(seconds=31) <= default <= dt.timedelta(seconds=31 + 29 * 3)
    assert retry_delay(task(retry=Returns(NotANumber())), 1) == dt.timedelta(0)


# -- the executor, end to end (no database) -----------------------------------------------------


def run(t: trioq.Task, args: Any = None) -> Outcome:
    registry = trioq.Registry()
    registry.add(t)
    executor = Executor(registry, services(), sync_threads=2)
    return trio.run(executor.run, job(args=args), LEASE)


def test_executor_calls_async_and_sync_handlers_with_their_args() -> None:
    seen: list[Any] = []

    async def handler(ctx: trioq.JobContext, a: int, b: int) -> None:
        seen.append((ctx.id, ctx.attempt, a + b))

    def sync(ctx: trioq.JobContext, values: list[int]) -> None:
        seen.append(("sync", sum(values)))

    assert run(task(handler), {"a": 1, "b": 2}).kind is Kind.COMPLETE
    assert run(task(sync), [1, 2, 3]).kind is Kind.COMPLETE
    assert seen == [(7, 2, 3), ("sync", 6)]


def test_executor_fails_a_handler_past_its_timeout() -> None:
    async def slow(ctx: trioq.JobContext) -> None:
        await trio.sleep_forever()

    out = run(task(slow, timeout=0.01))
    assert out.kind is Kind.FAIL and out.failure is not None
    assert out.failure.error == "timeout: handler ran over 0.01 s"


def test_executor_fails_a_sync_handler_past_its_timeout() -> None:
    def slow(ctx: trioq.JobContext) -> None:
        time.sleep(0.2)

    out = run(task(slow, timeout=0.01))
    assert out.failure is not None and out.failure.error.startswith("timeout")


def test_executor_turns_base_exceptions_into_failures() -> None:
    async def exits(ctx: trioq.JobContext) -> None:
        raise SystemExit(2)

    out = run(task(exits))
    assert out.kind is Kind.FAIL and out.failure is not None
    assert out.failure.error == "SystemExit: 2"


def test_executor_knows_no_unregistered_task() -> None:
    executor = Executor(trioq.Registry(), services(), sync_threads=1)
    out = trio.run(executor.run, job(task="nobody"), LEASE)
    assert out.kind is Kind.UNKNOWN
    assert out.failure is not None and "unknown task 'nobody'" in out.failure.error


def test_undecodable_args_die_alone() -> None:
    from trioq._sanitize import decode_args

    executor = Executor(trioq.Registry(), services(), sync_threads=1)
    registry_task = task()
    executor.registry.add(registry_task)
    bad = trioq.Job.from_row((7, "q", "t", "[" * 5000 + "]" * 5000, 0, 0, 1, 5, 0, 0))
    assert bad.args == decode_args("[" * 5000 + "]" * 5000)
    out = trio.run(executor.run, bad, LEASE)
    assert out.kind is Kind.FAIL and out.failure is not None and out.failure.fatal
    assert out.failure.reason == "undecodable args"
    assert out.failure.error.startswith("args cannot be decoded: RecursionError")
