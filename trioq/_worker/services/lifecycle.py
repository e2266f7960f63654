"""What happened to jobs outside their handlers, said once: a log line, an event, a count.

The runtime hands this module what was actually written, after it was written:

- `Lifecycle.written`: every batch the completer wrote (each `Outcome.fate` says what the
  fenced statement did): a retry (logged with its attempt and delay), a death (with its
  reason), a cancellation, an unknown task given back or dead, an outcome discarded because
  the lease was no longer ours;
- `Lifecycle.lease_lost`: a lease the heartbeat found taken (its handler was cancelled);
- `Lifecycle.swept`: jobs this process's sweeper moved to dead_jobs or cancelled (their
  worker died, or their lease expired); their details are read by `run` (one statement
  by id) before they are logged and reported.

Each becomes at most one log record (with the job's id, task, queue and attempt as
structured fields: ``record.job_id`` etc., the JSON log format's keys), one `JobEvent`
for the callbacks that want it (`trioq._hooks.EventDispatcher`), and one count in
`counts` (the Prometheus counters of events the history does not count). Discarded
outcomes, lost leases and unknown tasks are logged where they are noticed (the
completer, the heartbeat, the executor): here they only become events and counts.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
from collections.abc import Callable, Sequence
from typing import Any

import trio

from ..._db.statements import statements
from ..._hooks import EventDispatcher, JobEvent, fields
from ..._job import Job
from ..._outcome import CANCELLED, DEAD, DISCARDED, RETRIED, Kind, Outcome
from ..._pg.pool import Pool
from ..._sanitize import UndecodableArgs, decode_args
from ..leases import HeldJob
from ..wakeup import Wakeup
from .sweeper import SweepRound

__all__ = ["Lifecycle", "dead_reason"]

logger = logging.getLogger("trioq.runtime")

_COMPLETE, _KEEP, _RELEASE, _NOTHING = Kind.COMPLETE, Kind.KEEP, Kind.RELEASE, Kind.NOTHING
#: Swept jobs waiting for their details at most; more are counted and not reported.
MAX_PENDING_SWEPT = 10_000


def dead_reason(outcome: Outcome) -> str:
    """Why a failure killed its job: what the fail statement writes to ``dead_jobs.reason``."""
    failure = outcome.failure
    if outcome.kind is Kind.UNKNOWN:
        return "unknown task"
    if failure is None:
        return "attempts exhausted"
    return failure.reason or ("fatal error" if failure.fatal else "attempts exhausted")


class Lifecycle:
    def __init__(
        self, dispatcher: EventDispatcher, pool: Pool, schema: str,
        label: Callable[[str], str] = str,
    ) -> None:  # fmt: skip
        self._dispatcher = dispatcher
        self._pool = pool
        self._sql = statements(schema)
        #: The task label value of a task name (`trioq._obs.metrics.TaskLabels`).
        self._label = label
        #: (event, queue, task label) -> how many: lease_lost, discarded, unknown_task,
        #: swept_dead, swept_cancelled.
        self.counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._swept_dead: list[int] = []
        self._swept_cancelled: list[int] = []
        self._swept_wakeup = Wakeup()

    # -- what the completer wrote -----------------------------------------------------------

    def written(self, batch: Sequence[Outcome]) -> None:
        """Log, report and count what ``batch`` became (once per written batch)."""
        for outcome in batch:
            kind = outcome.kind
            fate = outcome.fate
            if fate is None and (
                kind is _COMPLETE or kind is _KEEP or kind is _RELEASE or kind is _NOTHING
            ):
                continue  # the common case: nothing to say
            self._report(outcome)

    def _report(self, outcome: Outcome) -> None:
        job, kind, fate = outcome.job, outcome.kind, outcome.fate
        if job is None:
            return  # not run by this runtime: nothing to name it by
        if fate == DISCARDED:
            self._discarded(outcome, job)
        elif kind is Kind.FAIL or kind is Kind.UNKNOWN:
            self._failed(outcome, job, fate)
        elif kind is Kind.CANCELLED:
            self._cancelled(job, outcome.lease.attempt)

    def _failed(self, outcome: Outcome, job: Job, fate: str | None) -> None:
        attempt = outcome.lease.attempt
        failure = outcome.failure
        error = None if failure is None else failure.error
        if fate == CANCELLED:
            self._cancelled(job, attempt)
        elif fate == DEAD:
            reason = dead_reason(outcome)
            logger.warning("job %d (%s) died after attempt %d of %d (%s): %s", job.id, job.task,
                           attempt, job.max_attempts, reason, error,
                           extra={**fields(job.id, job.task, job.queue, attempt),
                                  "reason": reason})  # fmt: skip
            self._emit("dead", job, attempt, error=error, reason=reason)
        elif fate == RETRIED and outcome.kind is Kind.UNKNOWN:
            self.counts["unknown_task", job.queue, self._label(job.task)] += 1
            self._emit("unknown_task", job, attempt, error=error)
        elif fate == RETRIED and failure is not None:
            delay = failure.delay
            logger.info("job %d (%s) attempt %d failed: %s (retrying in %s)", job.id, job.task,
                        attempt, error, _seconds(delay),
                        extra={**fields(job.id, job.task, job.queue, attempt),
                               "delay": delay.total_seconds()})  # fmt: skip
            self._emit("retried", job, attempt, delay=delay, error=error)

    def _cancelled(self, job: Job, attempt: int) -> None:
        logger.info("job %d (%s) attempt %d was cancelled", job.id, job.task, attempt,
                    extra=fields(job.id, job.task, job.queue, attempt))  # fmt: skip
        self._emit("cancelled", job, attempt)

    def _discarded(self, outcome: Outcome, job: Job) -> None:
        """Logged by the completer (`trioq._worker.completer._log_unwritten`)."""
        self.counts["discarded", job.queue, self._label(job.task)] += 1
        why = f"its outcome ({outcome.kind.value}) was discarded: the lease was taken"
        self._emit("lease_lost", job, outcome.lease.attempt, reason=why)

    # -- what the heartbeat and the sweeper found -------------------------------------------

    def lease_lost(self, held: HeldJob) -> None:
        """The heartbeat found ``held``'s lease taken (and logged it)."""
        job = held.job
        self.counts["lease_lost", job.queue, self._label(job.task)] += 1
        self._emit("lease_lost", job, held.lease.attempt,
                   reason="the heartbeat found the lease taken")  # fmt: skip

    def swept(self, sweep: SweepRound) -> None:
        """The sweeper killed or cancelled jobs: `run` reads their details and reports them."""
        dead = sweep.reclaimed.dead | sweep.swept.dead | sweep.expired.dead
        cancelled = sweep.reclaimed.cancelled | sweep.swept.cancelled
        if not dead and not cancelled:
            return
        room = MAX_PENDING_SWEPT - len(self._swept_dead) - len(self._swept_cancelled)
        self._swept_dead += sorted(dead)[: max(room, 0)]
        room = MAX_PENDING_SWEPT - len(self._swept_dead) - len(self._swept_cancelled)
        self._swept_cancelled += sorted(cancelled)[: max(room, 0)]
        self._swept_wakeup.set()

    async def run(self) -> None:
        """Report swept jobs as they come (a failed lookup is logged; its jobs are not
        reported: the sweep itself was logged, and dead_jobs has them)."""
        while True:
            await self._swept_wakeup.wait()
            try:
                await self.run_once()
            except Exception as ex:  # the database, mostly; Cancelled is not an Exception
                logger.warning("reading the details of swept jobs failed: %s", ex)

    async def run_once(self) -> int:
        """Read and report the swept jobs waiting; how many were reported."""
        dead, self._swept_dead = self._swept_dead, []
        cancelled, self._swept_cancelled = self._swept_cancelled, []
        if not dead and not cancelled:
            await trio.lowlevel.checkpoint()
            return 0
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                self._sql.swept_details, {"dead": dead, "cancelled": cancelled}
            )
            rows = await cur.fetchall()
        for row in rows:
            self._report_swept(row)
        return len(rows)

    def _report_swept(self, row: Sequence[Any]) -> None:
        job_id, what, queue, task, attempt, args, reason, error = row
        extra = fields(job_id, task, queue, attempt)
        self.counts[f"swept_{what}", queue, self._label(task)] += 1
        if what == "dead":
            logger.warning("job %d (%s) died after attempt %d (%s): %s", job_id, task, attempt,
                           reason, error, extra={**extra, "reason": reason})  # fmt: skip
        else:
            logger.info("job %d (%s) attempt %d was cancelled (its lease expired)", job_id,
                        task, attempt, extra=extra)  # fmt: skip
        if self._dispatcher.wants(what):
            self._dispatcher.emit(JobEvent(
                kind=what, job_id=job_id, queue=queue, task=task, attempt=attempt,
                args=_args(args), error=error, reason=reason,
            ))  # fmt: skip

    def _emit(
        self, kind: str, job: Job, attempt: int, *, delay: dt.timedelta | None = None,
        error: str | None = None, reason: str | None = None,
    ) -> None:  # fmt: skip
        if self._dispatcher.wants(kind):
            self._dispatcher.emit(JobEvent(
                kind=kind, job_id=job.id, queue=job.queue, task=job.task, attempt=attempt,
                args=job.args if not _undecodable(job) else None, delay=delay, error=error,
                reason=reason,
            ))  # fmt: skip


def _undecodable(job: Job) -> bool:
    return isinstance(job.args, UndecodableArgs)


def _args(text: str | None) -> Any:
    args = None if text is None else decode_args(text)
    return None if isinstance(args, UndecodableArgs) else args


def _seconds(delay: dt.timedelta) -> str:
    seconds = delay.total_seconds()
    return f"{seconds:g} s" if seconds < 3600 else str(delay)
