"""A job's status and its result: `trioq.job_status` and `trioq.result` (``docs/results.md``).

`job_status` reads one snapshot: the job is in ``jobs`` (any live state, or ``done`` /
``cancelled`` when kept), in ``dead_jobs``, or nowhere (``unknown``). Any state this
trioq does not know (one a later migration adds, such as a job waiting for others) is
taken for pending, so the waiting below keeps working.

`wait_result` returns a finished job's result at once. For a pending one it listens for
the job's end without a polling loop, and without making anybody else's jobs notify:

1. LISTEN on ``trioq_<schema>`` (on the caller's connection; UNLISTEN afterwards);
2. flag the job's row (``notify_finished``): the triggers of migration 5 notify
   ``@finished:<id>`` when a flagged row ends (done, cancelled, deleted as completed or
   dead). The flag is set under the row lock, so the transaction that ends the job
   either sees it (and notifies) or committed before it (and the next read sees that);
3. read the status again; if still pending, wait for the notification or, as the
   fallback for a lost one, ``poll_interval``, and go to 2 (a job brought back from
   ``dead_jobs`` is a new row without the flag).

Only flagged jobs notify, so only the jobs somebody waits for pay for it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs
import psycopg
from psycopg.pq import TransactionStatus

from ._db.statements import Statements
from ._exceptions import JobCancelledError, JobDeadError, JobNotFoundError
from ._job import JSONValue, check_job_id, to_delay
from ._pg.conn import Conn
from ._pg.times import tolerant
from ._progress import UnreadableProgress, read_progress

__all__ = [
    "FINAL_STATES",
    "FINISHED_PAYLOAD",
    "JobStatus",
    "job_status",
    "result_of",
    "wait_result",
]


#: States a job does not leave (``unknown``: no such row, also final for a reader).
FINAL_STATES = frozenset({"done", "cancelled", "dead"})
#: Notification payload prefix of a waited-for job that ended (queue names cannot hold '@').
FINISHED_PAYLOAD = "@finished:"
#: Bound on the shielded UNLISTEN when the wait ends (also when it is cancelled).
UNLISTEN_TIMEOUT = 5.0
DEFAULT_POLL_INTERVAL = 2.0


@attrs.frozen(kw_only=True)
class JobStatus:
    """Where one job is in its life, as `trioq.job_status` read it.

    ``state`` is ``waiting`` (for its dependencies, ``docs/workflows.md``, or for the earlier
    jobs of its sequence, ``docs/flow-control.md``), ``scheduled``,
    ``available``, ``running`` (``lease_owner`` and
    ``lease_expires_at`` set), ``done`` (kept: ``result``), ``cancelled``, ``dead``
    (``reason``, ``last_error``, ``traceback``; ``finished_at`` is when it died) or
    ``unknown`` (no such job: every other field is None).
    """

    id: int
    state: str
    queue: str | None = None
    task: str | None = None
    args: JSONValue = None
    priority: int | None = None
    attempt: int | None = None
    max_attempts: int | None = None
    run_at: dt.datetime | None = None
    enqueued_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    lease_owner: str | None = None
    lease_expires_at: dt.datetime | None = None
    cancel_requested: bool = False
    dedup_key: str | None = None
    result: JSONValue = None
    last_error: str | None = None
    reason: str | None = None
    traceback: str | None = None
    #: Its deadline to start while it has not started (the claim that starts it clears it),
    #: and for a job that died of it (``docs/flow-control.md``, "Deadlines to start").
    start_by: dt.datetime | None = None
    #: Its sequence (``docs/flow-control.md``, "Sequences") while it is in ``jobs`` (waiting
    #: behind an earlier job of its key, or its head; done or cancelled); None for a dead job
    #: (``dead_jobs`` does not keep it) and for a job without one.
    sequence_key: str | None = None
    #: What the job reported last with ``job.progress()`` (docs/progress.md), None if nothing;
    #: a retry shows the previous attempt's until it reports its own; a dead job its last. A
    #: stored value no reader can show (written by hand: too large, nested too deep) is an
    #: ``UnreadableProgress`` whose ``str`` says why.
    progress: JSONValue | UnreadableProgress = None
    #: When ``progress`` was written (by the database's clock).
    progress_at: dt.datetime | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> JobStatus:
        """From `trioq._db.statements`'s status columns, in field order (the progress: its
        text, its stored size and its time, `trioq._db.sql.common.PROGRESS_COLUMNS`)."""
        *fields, progress, stored, progress_at = row
        names = [f.name for f in attrs.fields(cls)][:-2]
        return cls(**dict(zip(names, fields, strict=True)),
                   progress=read_progress(progress, stored), progress_at=progress_at)  # fmt: skip

    @property
    def final(self) -> bool:
        """Whether the job has ended (done, cancelled or dead); ``unknown`` is not."""
        return self.state in FINAL_STATES

    @property
    def pending(self) -> bool:
        """Whether the job may still run: it exists and has not ended."""
        return self.state != "unknown" and not self.final

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (times in ISO 8601)."""
        return {
            k: v.isoformat() if isinstance(v, dt.datetime)
            else str(v) if isinstance(v, UnreadableProgress) else v
            for k, v in attrs.asdict(self).items()
        }  # fmt: skip


async def job_status(conn: Conn, sql: Statements, job_id: int) -> JobStatus:
    """The job's status in one snapshot; ``state='unknown'`` when there is no such job."""
    check_job_id(job_id)
    cur = await tolerant(conn).execute(sql.job_status, {"id": job_id})
    row = await cur.fetchone()
    return JobStatus(id=job_id, state="unknown") if row is None else JobStatus.from_row(row)


def result_of(status: JobStatus, *, seen_pending: bool = False) -> JSONValue:
    """The result of a finished job, or the error saying why there is none.

    ``seen_pending``: the caller saw the job pending before, so an ``unknown`` job is one
    that completed without keeping its result (and the error says so).
    """
    what = f"job {status.id} (task {status.task!r})"
    if status.state == "done":
        return status.result
    if status.state == "dead":
        raise JobDeadError(
            f"{what} is dead: {status.reason} after {status.attempt} of {status.max_attempts} "
            f"attempts; last error: {status.last_error}",
            job_id=status.id, status=status,
        )  # fmt: skip
    if status.state == "cancelled":
        last = f"; last error: {status.last_error}" if status.last_error else ""
        raise JobCancelledError(f"{what} was cancelled{last}", job_id=status.id, status=status)
    if status.state == "unknown":
        message = (
            f"job {status.id} completed, but its result was not kept: register its task with "
            "keep_result=True"
            if seen_pending
            else f"no job {status.id}: never enqueued, completed without keep_result=True, "
            "or deleted by retention"
        )
        raise JobNotFoundError(message, job_id=status.id)
    raise ValueError(f"job {status.id} is still {status.state}: it has no result yet")


async def wait_result(
    conn: Conn,
    sql: Statements,
    job_id: int,
    *,
    timeout: float | dt.timedelta | None = None,  # noqa: ASYNC109 - see docs/results.md
    poll_interval: float = DEFAULT_POLL_INTERVAL,
) -> JSONValue:
    """The job's result once it has finished; see the module docs.

    ``timeout`` is ``with trio.fail_after(timeout)`` around the call (`trio.TooSlowError`).
    """
    import trio  # here, not at the top: trioq.producer imports this module, never trio

    check_job_id(job_id)
    seconds = _seconds(timeout, "timeout")
    poll = _seconds(poll_interval, "poll_interval")
    assert poll is not None
    with trio.fail_after(math.inf if seconds is None else seconds):
        return await _wait(conn, sql, job_id, poll)


def _seconds(value: float | dt.timedelta | None, field: str) -> float | None:
    """None, or positive finite seconds (TypeError or ValueError naming ``field``)."""
    if value is None:
        if field == "timeout":
            return None
        raise TypeError(f"{field} must be seconds or a timedelta, got None")
    seconds = to_delay(value, field).total_seconds()
    if seconds <= 0:
        raise ValueError(f"{field} must be positive, got {seconds:g} s")
    return seconds


async def _wait(conn: Conn, sql: Statements, job_id: int, poll: float) -> JSONValue:
    import trio

    status = await job_status(conn, sql, job_id)
    if not status.pending:
        return result_of(status)
    if not conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE:
        raise ValueError(
            f"job {job_id} is still {status.state}: waiting for it needs an autocommit "
            "connection outside a transaction (inside one, neither LISTEN nor the job's "
            "progress is seen)"
        )
    payload = f"{FINISHED_PAYLOAD}{job_id}"
    async with _listening(conn, sql) as own:
        while True:
            await conn.execute(sql.wait_flag, {"id": job_id, "channel": sql.channel})
            status = await job_status(conn, sql, job_id)
            if not status.pending:
                return result_of(status, seen_pending=True)
            with trio.move_on_after(poll):
                await _notified(conn, sql.channel, payload, drop_others=own)


@contextlib.asynccontextmanager
async def _listening(conn: Conn, sql: Statements) -> AsyncIterator[bool]:
    """LISTEN on the schema's channel unless the session already does; yields whether the
    LISTEN is ours (then UNLISTEN at the end, shielded and bounded, and the channel's
    leftover notifications are dropped)."""
    import trio

    cur = await conn.execute(sql.listening, {"channel": sql.channel})
    row = await cur.fetchone()
    if row is not None and row[0]:
        yield False
        return
    await conn.execute(sql.listen)
    try:
        yield True
    finally:
        with trio.move_on_after(UNLISTEN_TIMEOUT, shield=True):
            with contextlib.suppress(psycopg.Error):  # a broken connection listens no more
                if not conn.closed:
                    await conn.execute(sql.unlisten)
        _take(conn, sql.channel, None, drop_others=True)


async def _notified(conn: Conn, channel: str, payload: str, *, drop_others: bool) -> None:
    """Wait until ``payload`` arrives on ``channel``; other notifications stay in the
    connection's backlog for their reader, except our channel's when ``drop_others``."""
    while not _take(conn, channel, payload, drop_others=drop_others):
        async with conn.lock:
            await conn.wait(psycopg.generators.notifies(conn.pgconn))


def _take(conn: Conn, channel: str, payload: str | None, *, drop_others: bool) -> bool:
    """Remove ``payload``'s notifications on ``channel`` (and, with ``drop_others``, every
    other one on it) from the backlog; whether ``payload`` was among them."""
    backlog = conn._notifies_backlog
    if backlog is None:
        return False
    found = False
    kept = []
    for note in backlog:
        if note.channel == channel and note.payload == payload:
            found = True
        elif note.channel != channel or not drop_others:
            kept.append(note)
    if len(kept) != len(backlog):
        backlog.clear()
        backlog.extend(kept)
    return found
