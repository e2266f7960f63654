"""``job.complete_with(query, params)``: a job's one statement and its fenced completion in
one transaction, in one round trip (exactly-once effects at the price of a single write).

**Own transaction** (the default). ``BEGIN``, the fence (``lock_one``: the lease checked and
the job's row locked, SQLSTATE ``TQ001`` when it was lost), the statement, the completion
(``complete_one``, prepared) and ``COMMIT`` go to the server together (pipeline mode, one
``Sync``). An error in any of them leaves the rest unrun and the pool rolls the transaction
back. The fence goes first: a job whose lease was lost does not run its statement at all,
and while the statement runs the job's row is locked, so a statement that runs longer than
the lease still commits (the sweeper skips locked rows). ``job.transaction()`` around one
``execute`` costs two round trips.

**Shared** (``shared=True``): group commit. Jobs that call it while a batch of their lane
is on its way wait for it to come back; then the first of them sends everyone who waits (at
most ``Config.shared_transaction_jobs``) in one transaction and one round trip: ``BEGIN``,
the fence of them all (``lock_in_transaction``), each job's statement, one completion of
them all, ``COMMIT``. Each call returns once that transaction has committed. No timer: an
idle worker sends a batch of one job at once; under load the batches fill up while the one
before is on its way.
``Config.shared_transactions`` lanes send batches side by side.

A batch that does not commit (a statement's error, a lost lease, a parameter that cannot be
sent, a broken connection, or `BATCH_TIMEOUT` passed: its statements are then cancelled on
the server) is given up, and each of its jobs is sent again alone, from its own task, as
above: so each gets its own error or `LeaseLostError`, under its own timeout, and the
others commit. A statement may therefore run twice on the server, the first run rolled
back. `check_statement` refuses, before anything is sent, the statements that could break
that: those that end or change the transaction or the session, and COPY.
"""

from __future__ import annotations

import collections
import logging
import re
from contextlib import ExitStack
from typing import Any

import attrs
import psycopg
import trio
from psycopg import sql

from ._db.params import fence as _fence
from ._db.statements import rendered
from ._exceptions import SharedTransactionError
from ._job import Lease
from ._job_transaction import (
    _BEGIN,
    _COMMIT,
    Committing,
    _can_pipeline,
    _completion,
    _lost,
    _lost_ids,
    _nested_transaction,
)
from ._lanes import Lanes
from ._pg.pipeline import execute_pipelined
from ._pg.pool import Pool
from ._queue import Queue

__all__ = ["CompletionStatistics", "SharedCompletions", "check_statement", "complete_with"]


class _NotCommitted(Exception):
    """A shared batch did not commit (how its members' `Committing` are told)."""

logger = logging.getLogger("trioq.complete_with")

#: How long a shared batch may take before its statements are cancelled on the server and
#: each of its jobs is sent alone (shielded meanwhile: it holds up its lane, at most this).
BATCH_TIMEOUT = 5.0

#: Statements `complete_with` refuses: they end or change the transaction (which, with
#: ``shared=True``, holds other jobs' statements too) or the session (which goes back to the
#: pool), or need a protocol of their own (COPY).
_REFUSED = frozenset({
    "ABORT", "BEGIN", "COMMIT", "COPY", "DEALLOCATE", "DISCARD", "END", "LISTEN", "PREPARE",
    "RELEASE", "RESET", "ROLLBACK", "SAVEPOINT", "SET", "START", "UNLISTEN",
})  # fmt: skip
#: Whitespace and comments ahead of a statement's first word.
_LEADING = re.compile(r"(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/)*", re.DOTALL)
_WORD = re.compile(r"[A-Za-z_]+")


def check_statement(query: Any) -> None:
    """Raise `psycopg.ProgrammingError` for a statement `complete_with` must not run (see
    `_REFUSED`), before anything is sent; `TypeError` for something that is no query."""
    if isinstance(query, sql.Composable):
        text = query.as_string(None)
    elif isinstance(query, bytes | bytearray):
        text = bytes(query).decode("utf-8", "replace")
    elif isinstance(query, str):
        text = query
    else:
        raise TypeError(
            "job.complete_with() takes a statement (str, bytes or psycopg.sql), "
            f"got {type(query).__name__}"
        )
    leading = _LEADING.match(text)
    start = leading.end() if leading else 0
    if start == len(text):
        raise psycopg.ProgrammingError(
            f"job.complete_with() needs one SQL statement, got {text[:60]!r}"
        )
    word = _WORD.match(text, start)
    keyword = "" if word is None else word.group().upper()  # none: "(SELECT ...)", say
    if keyword in _REFUSED:
        raise psycopg.ProgrammingError(
            f"job.complete_with() does not run {keyword} statements: it runs one statement in "
            "a transaction of trioq's (with shared=True, other jobs' statements too), which "
            "the statement must not end or change, nor leave session state behind, and COPY "
            "needs a protocol of its own; use job.transaction() for such work"
        )


async def complete_with(
    pool: Pool, queue: Queue, owner: str, lease: Lease, committing: Committing, *, query: Any,
    params: Any = None,
) -> psycopg.AsyncCursor[Any]:  # fmt: skip
    """``query`` and the completion of ``lease``'s job in a transaction of their own, in one
    round trip; the statement's cursor (see the module docs)."""
    async with pool.connection() as conn:
        if not _can_pipeline(conn, queue):  # trioq.testing: a savepoint and complete_many
            async with _nested_transaction(conn, queue, owner, lease, committing):
                return await conn.execute(query, params)
        conn.defer(_BEGIN)
        completion = _completion(queue, owner, lease)
        lock = (rendered(queue.schema, "lock_one"), completion[1])
        # Its row is locked from the fence on: no heartbeat for it meanwhile (one would wait
        # for the lock); if the transaction fails, heartbeats go on.
        try:
            with committing(lease):
                cursors = await execute_pipelined(
                    conn, [lock, (query, params), completion], then=[_COMMIT]
                )
        except psycopg.Error as ex:
            if _lost_ids(ex) is not None:
                raise _lost(lease) from None
            raise
        finally:
            conn.discard_deferred()  # the pool rolls back whatever else is open
        return cursors[1]


@attrs.define(eq=False)
class _Request:
    """One job's statement, waiting for (or in) a batch."""

    lease: Lease
    committing: Committing
    query: Any
    params: Any
    taken: bool = False  # in a batch that went out: it can no longer be withdrawn
    done: bool = False  # its batch came back
    cursor: psycopg.AsyncCursor[Any] | None = None  # None once done: it did not commit


@attrs.define(eq=False)
class _Lane:
    lock: trio.Lock = attrs.field(factory=trio.Lock)  # held while a batch is on its way
    pending: collections.deque[_Request] = attrs.field(factory=collections.deque)

    def load(self) -> int:
        return len(self.pending) + self.lock.locked()


@attrs.frozen
class CompletionStatistics:
    """Totals of a `SharedCompletions`, since it was made."""

    batches: int  # transactions committed (a batch of one job counts)
    jobs: int  # jobs completed in them (not those of split batches)
    split: int  # batches that did not commit: their jobs were sent again one at a time


class SharedCompletions(Lanes[_Lane]):
    """The lanes of ``job.complete_with(..., shared=True)`` in one worker (module docs)."""

    LANE = _Lane
    _batches = _jobs = _split = 0  # counts (each instance's own once it counts)

    def statistics(self) -> CompletionStatistics:
        return CompletionStatistics(batches=self._batches, jobs=self._jobs, split=self._split)

    async def complete(
        self, lease: Lease, committing: Committing, query: Any, params: Any = None
    ) -> psycopg.AsyncCursor[Any]:
        """``query`` and the job's completion, committed in a batch; the statement's cursor."""
        lane = self._least_busy(_Lane.load)
        request = _Request(lease, committing, query, params)
        lane.pending.append(request)
        try:
            async with lane.lock:
                while not request.done:  # else an earlier holder of the lock sent it
                    await self._send_next(lane)
        except BaseException:
            if not request.taken:  # cancelled before it went out: nothing of it ran
                lane.pending.remove(request)
            raise
        if request.cursor is not None:
            return request.cursor
        # Its batch did not commit: alone, in this job's own task (under its own timeout,
        # holding no lane), so it gets its own error and holds up nobody else.
        return await complete_with(
            self._pool, self._queue, self._owner, lease, committing, query=query, params=params
        )

    async def _send_next(self, lane: _Lane) -> None:
        """The oldest waiting requests of ``lane`` as one batch (shielded: one member's
        cancellation must not decide for the others; bounded by `BATCH_TIMEOUT`, after which
        the server's statement is cancelled and each job goes alone)."""
        batch = [lane.pending.popleft() for _ in range(min(self.max_jobs, len(lane.pending)))]
        for request in batch:
            request.taken = True
        cursors = None
        # Their rows are locked from the fence on: no heartbeat for them meanwhile; if the
        # batch does not commit, heartbeats go on until each job is sent alone.
        try:
            with ExitStack() as committing:
                for request in batch:
                    committing.enter_context(request.committing(request.lease))
                with trio.move_on_after(BATCH_TIMEOUT, shield=True):
                    try:
                        cursors = await self._together(batch)
                    except Exception as ex:  # nothing committed: each sent alone, own error
                        logger.debug("a shared batch of %d jobs did not commit (%s): each is "
                                     "sent alone", len(batch), ex)  # fmt: skip
                if cursors is None:
                    raise _NotCommitted  # every member is heartbeated again
        except _NotCommitted:
            pass
        if cursors is None:
            self._split += 1
        else:
            for request, cursor in zip(batch, cursors, strict=True):
                request.cursor = cursor
            self._batches += 1
            self._jobs += len(batch)
        for request in batch:
            request.done = True

    async def _together(self, batch: list[_Request]) -> list[psycopg.AsyncCursor[Any]]:
        """``BEGIN``, the fence of all the jobs (their rows locked), every statement, one
        completion of them all and ``COMMIT``, in one round trip; raises whatever failed
        (then nothing committed)."""
        queue = self._queue
        fence = {**_fence([r.lease for r in batch]), "owner": self._owner}
        statements: list[tuple[Any, Any]] = [
            (rendered(queue.schema, "lock_in_transaction"), fence),
            *((r.query, r.params) for r in batch),
            (rendered(queue.schema, "complete_in_transaction"), fence),
        ]  # fmt: skip
        async with self._pool.connection() as conn:
            if not _can_pipeline(conn, queue):
                raise SharedTransactionError("not on an autocommit connection: one by one")
            conn.defer(_BEGIN)
            try:
                cursors = await execute_pipelined(conn, statements, then=[_COMMIT])
            finally:
                conn.discard_deferred()  # the pool rolls back whatever else is open
        return cursors[1:-1]
