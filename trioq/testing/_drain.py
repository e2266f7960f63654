"""`drain`: run enqueued jobs inline, one at a time, until none is due; and the SQL clock.

Each job goes the way a worker takes it, on the test's connection: claimed with
`trioq.Queue.claim` (state ``running``, the attempt counted), its handler run by the
runtime's own `trioq._worker.execute.Executor` (async in the loop, sync in a thread, the task's
timeout, the exception-to-outcome rules), and the outcome written by the completer's own
statements (done or deleted, retried with the task's backoff, dead, snoozed, cancelled).
Handlers get a real `trioq.JobContext` whose ``job.connection()``, ``job.transaction()``
and ``job.enqueue()`` use the test's connection too (a savepoint inside the test's
transaction, if one is open), so jobs a handler enqueues are drained as well.

The clock is the session's ``trioq.now`` setting, which every trioq statement reads
(`trioq._db.statements.NOW`). `set_clock` freezes it, `advance_clock` moves it, `reset_clock`
gives the real clock back. ``drain(..., advance=True)`` moves it to the next scheduled
job whenever nothing is due, so retries and snoozes run without waiting.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import attrs

from .._context import JobServices
from .._exceptions import DrainLimitError
from .._job import Job, Lease, to_delay
from .._outcome import Kind, Outcome
from .._pg.conn import first_row
from .._pg.connection import Conn, TrioConnection
from .._pg.pool import Pool
from .._progress import ProgressBuffer
from .._queue import Queue
from .._registry import Registry
from .._result import job_status
from .._worker.completer import write_kind, write_progress
from .._worker.execute import Executor

__all__ = ["DrainResult", "Run", "advance_clock", "drain", "reset_clock", "set_clock"]


#: The lease owner of jobs `drain` runs.
OWNER = "trioq.testing.drain"
#: Long enough never to expire during a test (nothing heartbeats a drained job).
LEASE = dt.timedelta(days=1)


@attrs.frozen(kw_only=True)
class Run:
    """One run of one job by `drain`, and what became of the job.

    ``outcome`` is ``completed`` (returned; deleted, or kept with ``result``),
    ``retried`` (failed with attempts left), ``dead``, ``snoozed`` (given back with the
    attempt refunded, due later: ``job.snooze``, a durable job's ``job.sleep`` or its
    ``job.wait_for`` with no signal yet), ``cancelled``, or ``lost`` (the handler raised
    `trioq.LeaseLostError`).
    """

    job_id: int
    task: str
    queue: str
    attempt: int
    args: Any
    outcome: str
    result: Any = None
    error: str | None = None
    traceback: str | None = None
    #: The last ``job.progress()`` of the run, when the job's row stays (kept, retried,
    #: dead, snoozed); None otherwise.
    progress: Any = None


@attrs.frozen
class DrainResult:
    """Every run `drain` made, in order, with counts by outcome."""

    runs: tuple[Run, ...]

    def _count(self, outcome: str) -> int:
        return sum(1 for run in self.runs if run.outcome == outcome)

    @property
    def completed(self) -> int:
        return self._count("completed")

    @property
    def retried(self) -> int:
        return self._count("retried")

    @property
    def dead(self) -> int:
        return self._count("dead")

    @property
    def snoozed(self) -> int:
        return self._count("snoozed")

    @property
    def cancelled(self) -> int:
        return self._count("cancelled")

    @property
    def failures(self) -> tuple[Run, ...]:
        """The runs that failed (retried or dead), with their errors and tracebacks."""
        return tuple(run for run in self.runs if run.error is not None)


async def drain(
    conn: TrioConnection[Any],
    registry: Registry,
    *,
    queues: Iterable[str] | None = None,
    schema: str = "trioq",
    advance: bool = False,
    max_jobs: int = 1000,
    sync_threads: int = 4,
) -> DrainResult:
    """Run the due jobs of ``queues`` (default: every queue of the registry's tasks) until
    none is left; see the module docs.

    ``conn`` is an autocommit `trioq.TrioConnection`. With ``advance``, whenever nothing
    is due the clock moves (`set_clock`) to the earliest scheduled job of those queues,
    until none is left at all. Raises `trioq.testing.DrainLimitError` rather than run more
    than ``max_jobs`` jobs (a job that snoozes or enqueues itself forever).
    """
    queue = Queue(schema=schema)
    names = sorted(set(queues) if queues is not None else registry.queues()) or ["default"]
    services = JobServices(
        app_pool=SharedConnection(conn), queue=queue, owner=OWNER,
        committing=_no_heartbeat, progress=ProgressBuffer(),
    )
    executor = Executor(registry, services, sync_threads=sync_threads)
    runs: list[Run] = []
    while True:
        await queue.promote_due(conn, notify=False)
        job = await _claim_next(conn, queue, names)
        if job is None:
            if advance and (due := await _first_scheduled(conn, queue, names)) is not None:
                await set_clock(conn, due)
                continue
            return DrainResult(tuple(runs))
        if len(runs) >= max_jobs:
            await queue.release_many(conn, owner=OWNER, leases=[Lease(job.id, job.attempt)])
            raise DrainLimitError(
                f"drain ran max_jobs={max_jobs} jobs and job {job.id} ({job.task}) is still "
                "due: does a job snooze, retry or enqueue itself forever?"
            )
        runs.append(await _run_one(conn, queue, executor, job))


class SharedConnection(Pool):
    """A "pool" that always hands out one connection: the test's (jobs run one at a time)."""

    def __init__(self, conn: TrioConnection[Any]) -> None:
        super().__init__("", max_size=1)
        self._conn = conn

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[TrioConnection[Any]]:
        yield self._conn


def _no_heartbeat(lease: Lease) -> AbstractContextManager[None]:
    """Nothing heartbeats a drained job: nothing to stop."""
    return contextlib.nullcontext()


async def _claim_next(conn: Conn, queue: Queue, names: Sequence[str]) -> Job | None:
    for name in names:
        jobs = await queue.claim(conn, name, owner=OWNER, limit=1, lease=LEASE)
        if jobs:
            return jobs[0]
    return None


async def _first_scheduled(conn: Conn, queue: Queue, names: Sequence[str]) -> dt.datetime | None:
    row = await first_row(conn, queue.sql.first_scheduled, {"queues": list(names)})
    return None if row is None else row[0]


async def _run_one(conn: Conn, queue: Queue, executor: Executor, job: Job) -> Run:
    lease = Lease(job.id, job.attempt)
    outcome = await executor.run(job, lease)
    # No writer runs beside a drained job: its last progress is written before its outcome
    # (when the outcome keeps its row, as the worker's completer does).
    progress = executor.services.progress
    await write_progress(conn, queue.driver, progress, [outcome], owner=OWNER)
    progress.forget(lease)
    await write_kind(conn, queue.driver, outcome.kind, [outcome], owner=OWNER)
    if outcome.kind is Kind.UNKNOWN:  # given back (as a worker would), but in a test a bug
        known = ", ".join(sorted(t.name for t in executor.registry)) or "none"
        raise LookupError(
            f"drain: job {job.id}'s task {job.task!r} is not in the registry given to drain "
            f"(known: {known})"
        )
    status = await job_status(conn, queue.sql, job.id)
    failure = outcome.failure
    return Run(
        job_id=job.id, task=job.task, queue=job.queue, attempt=job.attempt, args=job.args,
        outcome=_what_became(outcome, status.state), result=status.result,
        progress=status.progress,
        error=None if failure is None else failure.error,
        traceback=None if failure is None else failure.traceback,
    )  # fmt: skip


def _what_became(outcome: Outcome, state: str) -> str:
    """The `Run.outcome` of a run, from its outcome and the job's state once written."""
    if state in ("dead", "cancelled"):
        return state
    if outcome.kind is Kind.FAIL:
        return "retried"
    if outcome.kind is Kind.RELEASE:
        return "snoozed"  # job.snooze, or a durable job's sleep (a `trioq.Sleep` is a Snooze)
    if outcome.kind is Kind.NOTHING and state == "scheduled":
        return "snoozed"  # parked by its wait's own statement (`trioq.Waiting`): as a sleep
    if outcome.kind is Kind.NOTHING and state != "unknown":
        return "lost"  # the handler raised LeaseLostError: the row was not completed
    return "completed"


# -- the clock ---------------------------------------------------------------------------------


async def set_clock(conn: Conn, when: dt.datetime) -> None:
    """Freeze the session's SQL clock at ``when`` (aware): every trioq statement on
    ``conn`` takes it for now (enqueue delays, due times, retries, leases)."""
    if not isinstance(when, dt.datetime) or when.utcoffset() is None:
        raise ValueError(f"when must be an aware datetime, got {when!r}")
    await conn.execute(Queue().sql.set_clock, {"now": when.isoformat()})


async def advance_clock(conn: Conn, by: dt.timedelta | float) -> dt.datetime:
    """Move the session's SQL clock forward by ``by`` (seconds or a timedelta), freezing it
    there (from the real time, if it was not set); the new time."""
    delay = to_delay(by, "by")
    now: dt.datetime = await Queue().clock(conn) + delay
    await set_clock(conn, now)
    return now


async def reset_clock(conn: Conn) -> None:
    """Back to the real clock (``now()``)."""
    await conn.execute(Queue().sql.set_clock, {"now": ""})
