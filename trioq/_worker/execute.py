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
- a task this process does not know: given back, attempt refunded, for a worker
  that knows it (`unknown_task`);
- an error that came from a fault of the database on one of the job's own connections
  (``job.transaction()``, ``job.complete_with()``, ``job.connection()``: a restart, a cut
  connection, a read-only server): given back at once, the attempt refunded, at most
  `FAULT_RELEASES` times in a row (`Executor._fault`);
- args Python cannot decode: dead at once (`undecodable`); args that are not a JSON object
  and that the handler cannot take as its one positional argument: dead at once too
  (`misfit`: no retry changes them; object args that do not fit are retried, for the
  deploy that brings the parameter);
- claimed with no attempt left (a row written by hand with ``attempt >= max_attempts``,
  which the schema refuses since migration 12): dead at once, never run (`exhausted`).

A sync handler runs in a worker thread, which Python cannot stop. When its job is
stopped (timeout, cancel, lost lease) the thread runs on: the job keeps its slot (and,
until its outcome is written, its lease) until the thread returns, and this process
refuses to start another attempt of it meanwhile (`Executor.thread_of`). So one job
never runs twice at once in one process.

A handler that forks: a child that returns into trioq (from the handler, or by raising)
is ended at once with ``os._exit(0)``, before it can act as a worker (``docs/concepts.md``).
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import functools
import logging
import math
import os
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from .._context import JobContext, JobServices
from .._exceptions import FatalError, LeaseLostError, Snooze, Waiting, leaves
from .._hooks import fields, run_chain
from .._job import DEFAULT_MAX_RESULT, MAX_RETRY_DELAY, Failure, Job, Lease, encode_args
from .._outcome import Kind, Outcome
from .._pg.errors import connection_fault
from .._registry import Registry, Task
from .._retry import Sidekiq
from .._sanitize import ERROR_LIMIT, TRACEBACK_LIMIT, UndecodableArgs, safe_text

if TYPE_CHECKING:
    from .tracing import Tracing

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

#: A job whose earlier attempt's sync handler still runs here is given back for this long.
BUSY_THREAD_DELAY = dt.timedelta(seconds=5)
#: A job is given back for a database fault at most this many times in a row by one
#: process; the next fault is an ordinary failure (the attempt counted, the retry policy's
#: delay), so a handler whose own statement breaks its connection every time cannot loop.
FAULT_RELEASES = 3
#: Jobs whose faults one process remembers at most (the oldest are forgotten first).
FAULTS_REMEMBERED = 10_000


class Executor:
    """Runs handlers of ``registry`` with ``services``; sync ones on at most
    ``sync_threads`` threads at a time."""

    def __init__(
        self, registry: Registry, services: JobServices, *, sync_threads: int,
        tracing: Tracing | None = None, max_result_bytes: int = DEFAULT_MAX_RESULT,
    ) -> None:  # fmt: skip
        self._max_result = max_result_bytes
        self.registry = registry
        self._tracing = tracing  # a span per execution (OpenTelemetry), or None
        self.services = services
        self._sync_limiter = trio.CapacityLimiter(sync_threads)
        #: Jobs whose stopped sync handler's thread still runs: set when it returns.
        self._threads: dict[int, trio.Event] = {}
        #: Jobs whose handler runs now (an attempt claimed again before this process saw
        #: its lease lost must not start beside it).
        self._running: set[int] = set()
        self._unknown_logged: set[str] = set()
        #: Faults of the database in a row, by job (`FAULT_RELEASES`).
        self._faults: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._pid = os.getpid()
        self._middleware = tuple(registry.hooks.middleware)

    def thread_of(self, job_id: int) -> trio.Event | None:
        """Set when the thread of job ``job_id``'s stopped sync handler returns; None if no
        such thread runs."""
        return self._threads.get(job_id)

    async def run(self, job: Job, lease: Lease) -> Outcome:
        """Run the job's handler; raises Cancelled if a scope around the caller is cancelled."""
        if job.id in self._threads or job.id in self._running:
            logger.warning("job %d (%s): an earlier attempt's handler still runs in this "
                           "process: given back (attempt refunded) rather than run twice at "
                           "once", job.id, job.task, extra=_fields(job))  # fmt: skip
            return Outcome(kind=Kind.RELEASE, lease=lease, delay=BUSY_THREAD_DELAY)
        self._running.add(job.id)
        try:
            outcome = await self._run(job, lease)
        finally:
            self._running.discard(job.id)
        if self._faults and outcome.kind is not Kind.RELEASE:  # no longer faults in a row
            self._faults.pop(job.id, None)
        return outcome

    async def _run(self, job: Job, lease: Lease) -> Outcome:
        task = self.registry.get(job.task)
        if task is None:
            return self._unknown(job, lease)
        if isinstance(job.args, UndecodableArgs):
            return undecodable(job, lease)
        if job.attempt > job.max_attempts:
            return exhausted(job, lease)
        if not isinstance(job.args, dict) and (why := task.misfit(job.args)) is not None:
            return misfit(job, lease, why)
        ctx = JobContext(job, self.services)
        if self._tracing is None:
            outcome = await self._call(task, ctx, lease)
        else:
            outcome = await self._tracing.run(ctx, functools.partial(self._call, task, ctx, lease))
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
                    await self.outlived(ctx.job, f"it ran over its timeout of {task.timeout} s")
                    error = f"timeout: handler ran over {task.timeout} s"
                    return failure(task, lease, error, None)
        except Exception as ex:
            if (released := self._fault(ctx, lease, ex)) is not None:
                return released
            return outcome_of_error(task, ctx.job, lease, ex)
        except BaseException as ex:  # KeyboardInterrupt, SystemExit, a stray Cancelled, ...
            reraise_cancellation(ex, ctx.job)
            return outcome_of_base_error(task, ctx.job, lease, ex)
        return outcome_of_result(task, lease, result, max_bytes=self._max_result)

    def _fault(self, ctx: JobContext, lease: Lease, ex: Exception) -> Outcome | None:
        """The job given back at once, its attempt refunded, when the handler's error came
        from a fault of the database on one of the job's own connections (``ctx.fault``: a
        restart, a cut connection, a read-only server), not from the handler: its writes
        rolled back with that connection, and nothing about the job is wrong, so it must not
        wait the retry policy's backoff (a minute, by the fifth attempt). At most
        `FAULT_RELEASES` times in a row; None otherwise (an ordinary failure)."""
        if isinstance(ex, LeaseLostError | Snooze | Waiting) or ctx.fault is None:
            return None
        if connection_fault(ex) is not ctx.fault:
            return None
        job_id = ctx.job.id
        faults = self._faults.pop(job_id, 0) + 1
        if faults > FAULT_RELEASES:
            return None
        self._faults[job_id] = faults
        while len(self._faults) > FAULTS_REMEMBERED:
            self._faults.popitem(last=False)
        logger.warning("job %d (%s): the database failed under it (%s): given back at once, "
                       "attempt refunded (fault %d of at most %d in a row)", job_id,
                       ctx.job.task, describe(ctx.fault), faults, FAULT_RELEASES,
                       extra=_fields(ctx.job))  # fmt: skip
        return Outcome(kind=Kind.RELEASE, lease=lease, delay=dt.timedelta(0))

    # The watchdog knows this frame (``trioq/_worker/watchdog.py``): its local ``ctx`` names
    # the job whose handler runs (``wrap`` false, or no middleware).
    # KI-protected: a real Ctrl-C (without ``handle_signals``) that arrives while handler code
    # runs goes to trio's main task, as it does everywhere else in the runtime, instead of
    # being raised inside the handler, where it would look like the handler's own error.
    @trio.lowlevel.enable_ki_protection
    async def _invoke(self, task: Task, ctx: JobContext, wrap: bool = True) -> Any:
        if wrap and self._middleware:  # the registry's middleware around the handler
            return await run_chain(
                self._middleware, ctx, functools.partial(self._invoke, task, ctx, False)
            )
        args = ctx.job.args
        if task.is_async:
            try:
                if isinstance(args, dict):
                    return await task.fn(ctx, **args)
                return await task.fn(ctx, args)
            finally:
                self._end_forked_child()
        call = (
            functools.partial(task.fn, ctx, **args)
            if isinstance(args, dict)
            else functools.partial(task.fn, ctx, args)
        )
        return await self._in_thread(ctx.job.id, call)

    async def _in_thread(self, job_id: int, call: Callable[[], Any]) -> Any:
        """``call()`` in a worker thread. If the job is stopped, the thread runs on (Python
        cannot stop it): it is recorded in `_threads` until it returns."""
        done = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def ended() -> None:
            done.set()
            if self._threads.get(job_id) is done:
                del self._threads[job_id]

        def run() -> Any:
            try:
                return call()
            finally:
                self._end_forked_child()
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(ended)

        try:
            return await trio.to_thread.run_sync(
                run, limiter=self._sync_limiter, abandon_on_cancel=True
            )
        except trio.Cancelled:
            if not done.is_set():
                self._threads[job_id] = done
            raise

    def _end_forked_child(self) -> None:
        """In a child forked by a handler, which returned into trioq: end it now."""
        if os.getpid() != self._pid:
            os._exit(0)

    async def outlived(self, job: Job, why: str) -> None:
        """The job's handler was stopped (``why``); if it was a sync handler whose thread
        runs on, wait for the thread (logged): the job keeps its slot and lease meanwhile."""
        done = self._threads.get(job.id)
        if done is None:
            return
        logger.warning("job %d (%s): %s, but its sync handler's thread is still running: "
                       "the job keeps its slot and lease until it returns", job.id, job.task,
                       why, extra=_fields(job))  # fmt: skip
        await done.wait()
        logger.info("job %d (%s): the thread of its stopped sync handler returned", job.id,
                    job.task, extra=_fields(job))  # fmt: skip

    def _unknown(self, job: Job, lease: Lease) -> Outcome:
        first = job.task not in self._unknown_logged
        self._unknown_logged.add(job.task)
        return unknown_task(job, self.registry, lease, log=first)


def outcome_of_result(
    task: Task, lease: Lease, result: Any, *, max_bytes: int = DEFAULT_MAX_RESULT
) -> Outcome:
    """A handler returned ``result``: complete the job, or keep the result if it is JSON of
    at most ``max_bytes`` (`Config.max_result_bytes`); else the job is dead, saying why."""
    if not task.keep_result:
        return Outcome(kind=Kind.COMPLETE, lease=lease)
    try:
        size = len(encode_args(result).encode())
    except ValueError as ex:
        error = f"result of task {task.name!r} is not JSON: {ex}"
        return failure(task, lease, error, None, fatal=True)
    if size > max_bytes:
        error = (f"result of task {task.name!r} is {size:,} bytes of JSON, over "
                 f"max_result_bytes ({max_bytes:,}): keep large values elsewhere (a table, "
                 "object storage) and return a reference to them")  # fmt: skip
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
    if isinstance(ex, LeaseLostError | Waiting):  # Waiting: parked by its own statement
        return Outcome(kind=Kind.NOTHING, lease=lease)
    fatal = isinstance(ex, FatalError)
    # Logged once written, with its delay or reason (`trioq._worker.services.lifecycle`).
    return failure(task, lease, describe(ex), _traceback(), fatal=fatal)


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
                               job.id, job.task, describe(rest), extra=_fields(job))  # fmt: skip
            raise cancelled


def outcome_of_base_error(task: Task, job: Job, lease: Lease, ex: BaseException) -> Outcome:
    """A handler raised a BaseException that is not the runtime's cancellation: a failure."""
    error = describe(ex)
    if isinstance(ex, trio.Cancelled):
        error = "stray trio.Cancelled: raised while no enclosing cancel scope was cancelled"
    logger.warning("job %d (%s) attempt %d: its handler raised %s, which is not an "
                   "Exception: the attempt fails as for an Exception", job.id, job.task,
                   job.attempt, safe_text(error, ERROR_LIMIT),
                   extra=_fields(job))  # fmt: skip
    return failure(task, lease, error, _traceback())


def describe(ex: BaseException) -> str:
    """``Type: message`` of an exception; a group's members follow. Never raises: an
    exception whose ``str()`` fails is described by its type."""
    if isinstance(ex, trio.Cancelled):  # its text names no cause ("cancelled due to unknown")
        return "stray trio.Cancelled"
    try:
        text = str(ex)
    except Exception as broken:
        text = f"<str() failed: {type(broken).__name__}>"
    described = f"{type(ex).__name__}: {text}" if text else type(ex).__name__
    if isinstance(ex, BaseExceptionGroup):
        members = ", ".join(describe(leaf) for leaf in leaves(ex))
        described = f"{described}: {members}"
    return described


def failure(
    task: Task, lease: Lease, error: str, tb: str | None, *, fatal: bool = False
) -> Outcome:
    """A failed attempt of ``task``, retried after its retry delay (unless fatal or last).

    The texts are made safe to store here (`safe_text`: NUL and lone surrogates escaped,
    cut at a limit), so whatever an exception holds, its job's outcome can be written.
    """
    delay = retry_delay(task, lease.attempt)
    fail = Failure(
        lease=lease, error=safe_text(error, ERROR_LIMIT),
        traceback=None if tb is None else safe_text(tb, TRACEBACK_LIMIT),
        fatal=fatal, delay=delay,
    )  # fmt: skip
    return Outcome(kind=Kind.FAIL, lease=lease, failure=fail)


def retry_delay(task: Task, attempt: int) -> dt.timedelta:
    """The task's retry delay, kept within [0, MAX_RETRY_DELAY]; a broken policy falls back.

    The watchdog knows this frame: its local ``task`` names the policy that runs (and a
    ``lease`` or ``ctx`` further out, its job)."""
    try:
        delay = task.retry.delay(attempt)
        seconds = delay.total_seconds()
    except Exception:
        logger.exception("retry policy of task %r failed: using the default", task.name)
        return Sidekiq().delay(attempt)
    if not seconds >= 0:  # also catches NaN
        return dt.timedelta(0)
    return min(delay, MAX_RETRY_DELAY)


def undecodable(job: Job, lease: Lease) -> Outcome:
    """Args Python cannot decode: the job goes to dead_jobs alone, with the decode error."""
    assert isinstance(job.args, UndecodableArgs)
    error = f"args cannot be decoded: {job.args.reason}"  # logged once written (its death)
    fail = Failure(lease=lease, error=error, fatal=True, reason="undecodable args")
    return Outcome(kind=Kind.FAIL, lease=lease, failure=fail)


def exhausted(job: Job, lease: Lease) -> Outcome:
    """Claimed past its last attempt: the job goes to dead_jobs without running."""
    error = (
        f"claimed as attempt {job.attempt} of {job.max_attempts}: no attempt was left (a row "
        "written with attempt >= max_attempts), so the handler did not run"
    )
    fail = Failure(lease=lease, error=error, fatal=True, reason="attempts exhausted")
    return Outcome(kind=Kind.FAIL, lease=lease, failure=fail)


def misfit(job: Job, lease: Lease, why: str) -> Outcome:
    """Args that are not a JSON object and that the handler cannot take: dead at once."""
    kind = type(job.args).__name__
    error = f"args do not fit the handler: a JSON {_JSON_KINDS.get(kind, kind)} {why}"
    fail = Failure(lease=lease, error=error, fatal=True, reason="args do not fit the handler")
    return Outcome(kind=Kind.FAIL, lease=lease, failure=fail)


#: The JSON names of what args that are not an object decode to.
_JSON_KINDS = {"list": "array", "str": "string", "int": "number", "float": "number",
               "bool": "boolean", "NoneType": "null"}  # fmt: skip


def _fields(job: Job) -> dict[str, Any]:
    """A log record's structured fields about ``job`` (`trioq._hooks.fields`)."""
    return fields(job.id, job.task, job.queue, job.attempt)


def _traceback() -> str:
    """The traceback being handled, as text; never raises (a frame's repr may)."""
    try:
        return traceback.format_exc()
    except Exception as ex:
        return f"<the traceback could not be formatted: {type(ex).__name__}>"


def unknown_task(job: Job, registry: Registry, lease: Lease, *, log: bool = True) -> Outcome:
    """A task no handler here knows is given back, attempt refunded: another process (a
    newer or older deploy) may know it. The completer moves it to dead_jobs once it has
    been unknown for ``Config.unknown_task_timeout``. Logged once per task name."""
    known = ", ".join(sorted(t.name for t in registry)) or "none"
    error = f"unknown task {job.task!r}: no handler registered in this worker (known: {known})"
    if log:
        logger.error("job %d: %s: its jobs are given back (attempts refunded) for a worker "
                     "that knows the task; logged once per task name", job.id, error,
                     extra=_fields(job))  # fmt: skip
    fail = Failure(lease=lease, error=error, reason="unknown task")
    return Outcome(kind=Kind.UNKNOWN, lease=lease, failure=fail)
