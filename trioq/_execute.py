"""Running one claimed job's handler, and what its ending means for the job.

`Executor.run` calls the handler (async in the trio loop, sync in a worker thread)
inside whatever cancel scope the caller gives it, and turns what happened into an
`Outcome` for the completer. The rules, each a pure function tested without a
database (``tests/test_execute.py``):

- returned: complete (or keep the JSON result with ``keep_result``);
- ``Snooze``: release after its delay, the attempt refunded;
- ``LeaseLostError``: nothing (the lease is not ours);
- ``FatalError``: dead at once; any other ``Exception``: a failure, retried after the
  task's retry delay until attempts run out;
- a ``BaseException`` that is not the runtime's own cancellation (``KeyboardInterrupt``,
  ``SystemExit``, a stray ``trio.Cancelled``): a failure, like an ``Exception``;
- over the task's timeout: a failure;
- aborted by the runtime (`aborted`): lost lease -> nothing, cancel -> cancelled,
  shutdown -> released with the attempt refunded;
- a task this process does not know: a failure (`unknown_task`).
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import math
import traceback
from typing import Any

import trio

from ._context import JobContext, JobServices
from ._exceptions import FatalError, LeaseLostError, Snooze, leaves
from ._job import Failure, Job, Lease, encode_args
from ._outcome import Kind, Outcome
from ._registry import Registry, Task
from ._retry import Sidekiq

__all__ = [
    "MAX_RETRY_DELAY",
    "Executor",
    "aborted",
    "describe",
    "outcome_of_base_error",
    "outcome_of_error",
    "reraise_cancellation",
    "retry_delay",
    "unknown_task",
]

logger = logging.getLogger("trioq.runtime")

#: Longest a retry may be put off, whatever the policy says (Postgres timestamps are finite).
MAX_RETRY_DELAY = dt.timedelta(days=365)


class Executor:
    """Runs handlers of ``registry`` with ``services``; sync ones on at most
    ``sync_threads`` threads at a time."""

    def __init__(self, registry: Registry, services: JobServices, *, sync_threads: int) -> None:
        self.registry = registry
        self.services = services
        self._sync_limiter = trio.CapacityLimiter(sync_threads)

    async def run(self, job: Job, lease: Lease) -> Outcome:
        """Run the job's handler; raises Cancelled if a scope around the caller is cancelled."""
        task = self.registry.get(job.task)
        if task is None:
            return unknown_task(job, self.registry, lease)
        ctx = JobContext(job, self.services)
        outcome = await self._call(task, ctx, lease)
        if ctx.completed_in_transaction:
            return Outcome(kind=Kind.NOTHING, lease=lease, committed=True)
        return outcome

    async def _call(self, task: Task, ctx: JobContext, lease: Lease) -> Outcome:
        try:
            if task.timeout is None:
                result = await self._invoke(task, ctx)
            else:
                with trio.move_on_after(task.timeout) as deadline:
                    result = await self._invoke(task, ctx)
                if deadline.cancelled_caught:
                    error = f"timeout: handler ran over {task.timeout} s"
                    return failure(task, lease, error, None)
        except Exception as ex:
            return outcome_of_error(task, ctx.job, lease, ex)
        except BaseException as ex:  # KeyboardInterrupt, SystemExit, a stray Cancelled, ...
            reraise_cancellation(ex, ctx.job)
            return outcome_of_base_error(task, ctx.job, lease, ex)
        return outcome_of_result(task, lease, result)

    # KI-protected: a real Ctrl-C (without ``handle_signals``) that arrives while handler code
    # runs goes to trio's main task, as it does everywhere else in the runtime, instead of
    # being raised inside the handler, where it would look like the handler's own error.
    @trio.lowlevel.enable_ki_protection
    async def _invoke(self, task: Task, ctx: JobContext) -> Any:
        args = ctx.job.args
        if task.is_async:
            if isinstance(args, dict):
                return await task.fn(ctx, **args)
            return await task.fn(ctx, args)
        call = (
            functools.partial(task.fn, ctx, **args)
            if isinstance(args, dict)
            else functools.partial(task.fn, ctx, args)
        )
        return await trio.to_thread.run_sync(
            call, limiter=self._sync_limiter, abandon_on_cancel=True
        )


def outcome_of_result(task: Task, lease: Lease, result: Any) -> Outcome:
    """A handler returned ``result``: complete the job, or keep the result if it is JSON."""
    if not task.keep_result:
        return Outcome(kind=Kind.COMPLETE, lease=lease)
    try:
        encode_args(result)
    except ValueError as ex:
        error = f"result of task {task.name!r} is not JSON: {ex}"
        return failure(task, lease, error, None, fatal=True)
    return Outcome(kind=Kind.KEEP, lease=lease, result=result)


def aborted(reason: str | None, lease: Lease) -> Outcome:
    """The outcome of a job the runtime stopped (or never started) for ``reason``:
    ``lost`` (its lease), ``cancel`` (requested), or ``shutdown`` (released, attempt
    refunded)."""
    if reason == "lost":
        return Outcome(kind=Kind.NOTHING, lease=lease)
    if reason == "cancel":
        return Outcome(kind=Kind.CANCELLED, lease=lease)
    return Outcome(kind=Kind.RELEASE, lease=lease)


def outcome_of_error(task: Task, job: Job, lease: Lease, ex: Exception) -> Outcome:
    """What a handler's exception means for its job (called inside the except block)."""
    if isinstance(ex, Snooze):
        return Outcome(kind=Kind.RELEASE, lease=lease, delay=ex.delay)
    if isinstance(ex, LeaseLostError):
        return Outcome(kind=Kind.NOTHING, lease=lease)
    fatal = isinstance(ex, FatalError)
    if not fatal:
        logger.info("job %d (%s) attempt %d failed: %s", job.id, job.task, job.attempt, ex)
    return failure(task, lease, describe(ex), traceback.format_exc(), fatal=fatal)


def reraise_cancellation(ex: BaseException, job: Job) -> None:
    """Re-raise ``ex`` if it is (or holds) a `trio.Cancelled` of a cancelled enclosing scope.

    Called in the ``except BaseException`` block of a handler call. A Cancelled
    while an enclosing scope is cancelled (lost lease, job cancel, shutdown, or
    whatever cancels `serve` itself) is the runtime's own: it propagates, and
    the scope that was cancelled decides the outcome. Anything else the handler
    raised returns to the caller, which fails the job: KeyboardInterrupt,
    SystemExit, GeneratorExit, and a "stray" Cancelled raised while no
    enclosing scope is cancelled. Of a group holding both, only the Cancelled
    part propagates; the rest is logged.
    """
    if trio.current_effective_deadline() != -math.inf:
        return  # nothing around us is cancelled: whatever this is, it is the handler's
    if isinstance(ex, trio.Cancelled):
        raise ex
    if isinstance(ex, BaseExceptionGroup):
        cancelled, rest = ex.split(trio.Cancelled)
        if cancelled is not None:
            if rest is not None:
                logger.warning("job %d (%s) raised while being cancelled: %s",
                               job.id, job.task, describe(rest))  # fmt: skip
            raise cancelled


def outcome_of_base_error(task: Task, job: Job, lease: Lease, ex: BaseException) -> Outcome:
    """A handler raised a BaseException that is not the runtime's cancellation: a failure."""
    error = describe(ex)
    if isinstance(ex, trio.Cancelled):
        error = "stray trio.Cancelled: raised while no enclosing cancel scope was cancelled"
    logger.warning("job %d (%s) attempt %d failed: %s", job.id, job.task, job.attempt, error)
    return failure(task, lease, error, traceback.format_exc())


def describe(ex: BaseException) -> str:
    """``Type: message`` of an exception; a group's members follow."""
    if isinstance(ex, trio.Cancelled):  # its text names no cause ("cancelled due to unknown")
        return "stray trio.Cancelled"
    text = str(ex)
    described = f"{type(ex).__name__}: {text}" if text else type(ex).__name__
    if isinstance(ex, BaseExceptionGroup):
        members = ", ".join(describe(leaf) for leaf in leaves(ex))
        described = f"{described}: {members}"
    return described


def failure(
    task: Task, lease: Lease, error: str, tb: str | None, *, fatal: bool = False
) -> Outcome:
    """A failed attempt of ``task``, retried after its retry delay (unless fatal or last)."""
    delay = retry_delay(task, lease.attempt)
    fail = Failure(lease=lease, error=error, traceback=tb, fatal=fatal, delay=delay)
    return Outcome(kind=Kind.FAIL, lease=lease, failure=fail)


def retry_delay(task: Task, attempt: int) -> dt.timedelta:
    """The task's retry delay, kept within [0, MAX_RETRY_DELAY]; a broken policy falls back."""
    try:
        delay = task.retry.delay(attempt)
        seconds = delay.total_seconds()
    except Exception:
        logger.exception("retry policy of task %r failed: using the default", task.name)
        return Sidekiq().delay(attempt)
    if not seconds >= 0:  # also catches NaN
        return dt.timedelta(0)
    return min(delay, MAX_RETRY_DELAY)


def unknown_task(job: Job, registry: Registry, lease: Lease) -> Outcome:
    """A task no handler here knows is failed (retried with backoff, then dead): not lost.

    Another deploy may know it; once attempts are spent it waits in dead_jobs,
    from where ``trioq dead retry`` brings it back.
    """
    known = ", ".join(sorted(t.name for t in registry)) or "none"
    error = f"unknown task {job.task!r}: no handler registered in this worker (known: {known})"
    logger.error("job %d: %s", job.id, error)
    fail = Failure(lease=lease, error=error, delay=Sidekiq().delay(lease.attempt))
    return Outcome(kind=Kind.FAIL, lease=lease, failure=fail)
