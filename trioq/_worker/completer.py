"""The completer: batches job outcomes into one fenced statement per kind.

The runtime's slots hand each job's `Outcome` to `Completer.submit` (a bounded
channel, so a slow database slows the claiming down instead of piling up memory). The run
loop takes whatever is waiting, up to `MAX_BATCH`, and writes it: complete,
keep, fail, release and cancelled each in one statement. A database error
keeps the batch and retries it with backoff: outcomes are never dropped (if the
process dies first, the leases expire and the sweeper returns the jobs).

No outcome holds the others hostage. A write that fails for a reason in the data
(`DATA_ERRORS`: a value Postgres refuses, or one psycopg cannot send) would fail
again, so the batch is split and each outcome written alone; one that still fails is
written again made safe (`sanitized`: texts escaped and cut, delays clamped, a result
that cannot be stored turned into a failure), and if even that fails the job goes to
dead_jobs with the reason. Should that fail too, the outcome is dropped with an error
in the log and the job's lease left to expire (the sweeper returns it): the completer
never stops. Every fenced write is idempotent, so writing part of a batch again is safe.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import psycopg
import trio

from .._db.driver import Driver, FailResult
from .._job import MAX_RETRY_DELAY, Failure, Lease, encode_args
from .._outcome import CANCELLED, DEAD, DISCARDED, RETRIED, Kind, Outcome
from .._pg.pool import Pool
from .._progress import REFUSED, ProgressBuffer
from .._sanitize import DATA_ERRORS as VALUE_ERRORS
from .._sanitize import ERROR_LIMIT, TRACEBACK_LIMIT, safe_text

__all__ = [
    "DATA_ERRORS",
    "KEEPS_PROGRESS",
    "Completer",
    "dead_letter",
    "sanitized",
    "write_kind",
    "write_progress",
]

logger = logging.getLogger("trioq.runtime")

MAX_BATCH = 500
RETRY_MIN, RETRY_MAX = 0.05, 2.0

#: A write that failed with one of these failed because of a value in it: the same write
#: fails again, so the batch is split instead of retried. (Postgres's data exceptions,
#: class 22, and program limits, class 54; psycopg's refusals to send a value.)
DATA_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.DataError,
    psycopg.errors.ProgramLimitExceeded,
    *VALUE_ERRORS,
)


class Completer:
    def __init__(
        self,
        pool: Pool,
        driver: Driver,
        owner: str,
        *,
        capacity: int,
        written: Callable[[Sequence[Outcome]], None],
        unknown_task_timeout: dt.timedelta = dt.timedelta(days=1),
        progress: ProgressBuffer | None = None,
    ) -> None:
        self._pool = pool
        self._progress = progress  # written before the outcomes that keep the job's row
        self._driver = driver
        self._owner = owner
        self._written = written
        self._unknown_timeout = unknown_task_timeout
        self._send, self._receive = trio.open_memory_channel[Outcome](capacity)
        self.batches = 0
        self.outcomes = 0
        self.write_errors = 0  # failed writes (retried), for the metrics
        #: Set when `run` returns: wrote everything submitted (`drained`), or cancelled.
        self.finished = trio.Event()
        self.drained = False

    async def submit(self, outcome: Outcome) -> None:
        """Hand over one outcome; waits only while the channel is full.

        No checkpoint when there is room: the caller (a slot, once per job)
        checkpoints when it takes its next job, and a yield here would cost
        one more trip through trio's scheduler per job.
        """
        try:
            self._send.send_nowait(outcome)
        except trio.WouldBlock:
            await self._send.send(outcome)
        except trio.BrokenResourceError:
            # `run` ended without `close`: cancelled, with the whole runtime (serve cancelled
            # from outside, without a graceful stop). The caller is cancelled too: raise that
            # Cancelled (the leases expire and the sweepers return the jobs), not this.
            await trio.lowlevel.checkpoint()
            raise

    async def close(self) -> None:
        """No more outcomes: `run` returns once everything submitted is written."""
        await self._send.aclose()

    async def run(self) -> None:
        try:
            async with self._receive:
                async for first in self._receive:
                    batch = [first]
                    while len(batch) < MAX_BATCH:
                        try:
                            batch.append(self._receive.receive_nowait())
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    await self._write_until_done(batch)
            self.drained = True
        finally:
            self.finished.set()  # a shutdown waiting for it must not wait for a cancelled run

    async def _write_until_done(self, batch: list[Outcome]) -> None:
        """Write ``batch``, retrying database errors with backoff; isolate data errors."""
        done: set[Kind] = set()
        try:
            await self._write_retrying(batch, done)
        except DATA_ERRORS as ex:
            written = [o for o in batch if o.kind in done]
            rest = [o for o in batch if o.kind not in done]
            if len(rest) > 1:
                logger.warning("writing %d job outcomes failed on a value in them (%s): "
                               "writing them one by one", len(rest), _one_line(ex))  # fmt: skip
            if written:
                self._done(written)
            for outcome in rest:
                await self._write_alone(outcome)
            return
        self._done(batch)

    async def _write_alone(self, outcome: Outcome) -> None:
        """One outcome as it is, then made safe, then as a death; else dropped (logged)."""
        try:
            await self._write_retrying([outcome], set())
        except DATA_ERRORS as first:
            safe = sanitized(outcome, first)
            try:
                await self._write_retrying([safe], set())
            except DATA_ERRORS as second:
                try:
                    await self._write_retrying([dead_letter(outcome, second)], set())
                except DATA_ERRORS as third:
                    logger.error("job %d: its outcome cannot be written (%s); it is left to its "
                                 "lease, which will expire", outcome.lease.job_id,
                                 _one_line(third))  # fmt: skip
                else:
                    logger.error("job %d: its outcome cannot be written (%s): moved to "
                                 "dead_jobs", outcome.lease.job_id, _one_line(second))  # fmt: skip
            else:
                logger.warning("job %d: its outcome was written made safe (%s)",
                               outcome.lease.job_id, _one_line(first))  # fmt: skip
        self._done([outcome])

    async def _write_retrying(self, batch: list[Outcome], done: set[Kind]) -> None:
        """Write ``batch``; database errors other than `DATA_ERRORS` are retried forever.
        ``done`` collects the kinds written (each one statement), so none is written twice."""
        delay = RETRY_MIN
        while True:
            try:
                await self._write(batch, done)
            except DATA_ERRORS:
                raise
            except psycopg.Error as ex:
                self.write_errors += 1
                logger.warning("writing %d job outcomes failed, retrying: %s", len(batch), ex)
                await trio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                continue
            return

    def _done(self, batch: list[Outcome]) -> None:
        self.batches += 1
        self.outcomes += len(batch)
        self._written(batch)

    async def _write(self, batch: list[Outcome], done: set[Kind]) -> None:
        by_kind: dict[Kind, list[Outcome]] = {}
        for outcome in batch:
            if outcome.kind not in done:
                by_kind.setdefault(outcome.kind, []).append(outcome)
        async with self._pool.connection() as conn:
            if self._progress is not None:
                await write_progress(conn, self._driver, self._progress, batch, owner=self._owner)
            for kind, items in by_kind.items():
                written = await write_kind(
                    conn, self._driver, kind, items, owner=self._owner,
                    unknown_task_timeout=self._unknown_timeout,
                )  # fmt: skip
                done.add(kind)
                _log_unwritten(kind, items, written)


#: The outcomes after which the job's row stays (kept, retried, dead, given back, cancelled):
#: a progress value still pending is written just before them, so the last one is seen.
KEEPS_PROGRESS = frozenset({Kind.KEEP, Kind.FAIL, Kind.RELEASE, Kind.CANCELLED})


async def write_progress(
    conn: Any, q: Driver, buffer: ProgressBuffer, batch: Sequence[Outcome], *, owner: str
) -> int:
    """Write the pending progress of the jobs of ``batch`` whose outcome keeps their row
    (`KEEPS_PROGRESS`), fenced, in one statement: how many were written. A value the schema
    refuses is dropped (logged): the outcome matters more than the last progress."""
    if not len(buffer):  # no job of the process has reported anything unwritten
        return 0
    leases = [o.lease for o in batch if o.kind in KEEPS_PROGRESS]
    pending = buffer.snapshot(leases) if leases else []
    if not pending:
        return 0
    try:
        written = await q.progress_many(
            conn, owner=owner, leases=[lease for lease, _ in pending],
            values=[text for _, text in pending],
        )  # fmt: skip
    except REFUSED as ex:
        logger.warning("the last progress of %d jobs cannot be stored (%s): dropped",
                       len(pending), _one_line(ex))  # fmt: skip
        written = frozenset()
    buffer.written(pending)
    return len(written)


async def write_kind(
    conn: Any, q: Driver, kind: Kind, items: Sequence[Outcome], *, owner: str,
    unknown_task_timeout: dt.timedelta = dt.timedelta(days=1),
) -> frozenset[int]:  # fmt: skip
    """Write ``items`` (outcomes of ``kind``) in one fenced statement; the ids written.
    Sets each outcome's `Outcome.fate` where the kind does not say what became of it."""
    failures = [o.failure for o in items if o.failure is not None]
    if kind is Kind.FAIL:
        result = await q.fail_many(conn, owner=owner, failures=failures)
    elif kind is Kind.UNKNOWN:
        result = await q.release_unknown_many(
            conn, owner=owner, failures=failures, dead_after=unknown_task_timeout
        )
    else:
        written = await _write_leases(conn, q, kind, items, owner=owner)
        for outcome in items:
            if outcome.lease.job_id not in written:
                outcome.fate = DISCARDED
        return written
    _set_fates(items, result)
    return result.retried | result.dead | result.cancelled


def _set_fates(items: Sequence[Outcome], result: FailResult) -> None:
    """What the statement did with each failure (or unknown task): `Outcome.fate`."""
    for outcome in items:
        job_id = outcome.lease.job_id
        if job_id in result.dead:
            outcome.fate = DEAD
        elif job_id in result.cancelled:
            outcome.fate = CANCELLED
        elif job_id in result.retried:
            outcome.fate = RETRIED
        else:
            outcome.fate = DISCARDED


async def _write_leases(
    conn: Any, q: Driver, kind: Kind, items: Sequence[Outcome], *, owner: str
) -> frozenset[int]:
    leases: list[Lease] = [o.lease for o in items]
    if kind is Kind.COMPLETE:
        return await q.complete_many(conn, owner=owner, leases=leases)
    if kind is Kind.KEEP:
        results = [o.result for o in items]
        return await q.complete_many(conn, owner=owner, leases=leases, results=results)
    if kind is Kind.RELEASE:
        delays = [o.delay for o in items]
        return await q.release_many(conn, owner=owner, leases=leases, delays=delays)
    if kind is Kind.CANCELLED:
        return await q.cancel_running_many(conn, owner=owner, leases=leases)
    return frozenset(lease.job_id for lease in leases)  # NOTHING: nothing to write


def _log_unwritten(kind: Kind, items: list[Outcome], written: frozenset[int]) -> None:
    """A fenced write that found a job no longer ours (its lease expired and was taken
    before the outcome reached the database): the outcome is dropped, and said so."""
    for outcome in items:
        if outcome.lease.job_id not in written:
            job = outcome.job
            extra: dict[str, Any] = {"job_id": outcome.lease.job_id,
                                     "attempt": outcome.lease.attempt}  # fmt: skip
            if job is not None:
                extra.update(task=job.task, queue=job.queue)
            logger.warning("job %d attempt %d: its outcome (%s) was discarded: its lease is no "
                           "longer this worker's (it expired, and the job was returned or taken "
                           "by another worker)", outcome.lease.job_id, outcome.lease.attempt,
                           kind.value, extra=extra)  # fmt: skip


def _one_line(ex: BaseException) -> str:
    text = safe_text(str(ex), ERROR_LIMIT).strip()
    return f"{type(ex).__name__}: {text.splitlines()[0]}" if text else type(ex).__name__


def sanitized(outcome: Outcome, why: BaseException) -> Outcome:
    """``outcome`` made safe to store: texts escaped and cut, delays within bounds, and a
    result that cannot be stored (``why`` it failed) turned into a fatal failure."""
    delay = min(max(outcome.delay, dt.timedelta(0)), MAX_RETRY_DELAY)
    if outcome.kind is Kind.FAIL and outcome.failure is not None:
        f = outcome.failure
        failure = attrs.evolve(
            f, error=safe_text(f.error, ERROR_LIMIT),
            traceback=None if f.traceback is None else safe_text(f.traceback, TRACEBACK_LIMIT),
            delay=min(max(f.delay, dt.timedelta(0)), MAX_RETRY_DELAY),
            reason=None if f.reason is None else safe_text(f.reason, 200),
        )  # fmt: skip
        return Outcome(kind=Kind.FAIL, lease=outcome.lease, failure=failure)
    if outcome.kind is Kind.KEEP:
        try:
            encode_args(outcome.result)
            error = f"the result could not be stored: {_one_line(why)}"
        except ValueError as ex:
            error = f"the result is not JSON: {ex}"
        failure = Failure(lease=outcome.lease, error=safe_text(error, ERROR_LIMIT), fatal=True,
                          reason="result not stored")  # fmt: skip
        return Outcome(kind=Kind.FAIL, lease=outcome.lease, failure=failure)
    return Outcome(kind=outcome.kind, lease=outcome.lease, delay=delay)


def dead_letter(outcome: Outcome, why: BaseException) -> Outcome:
    """The job goes to dead_jobs: its outcome could not be written, even made safe."""
    error = safe_text(f"its outcome ({outcome.kind.value}) could not be written: "
                      f"{_one_line(why)}", ERROR_LIMIT)  # fmt: skip
    failure = Failure(lease=outcome.lease, error=error, fatal=True, reason="outcome not written")
    return Outcome(kind=Kind.FAIL, lease=outcome.lease, failure=failure)
