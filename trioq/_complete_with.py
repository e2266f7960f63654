"""``job.complete_with(query, params)``: a job's one statement and its fenced completion in
one transaction, in one round trip (exactly-once effects at the price of a single write).

**Own transaction** (the default). ``BEGIN``, the statement, the completion
(``complete_one``, prepared) and ``COMMIT`` go to the server together (pipeline mode, one
``Sync``). An error in the statement or in the completion (the lease was lost: SQLSTATE
``TQ001``) leaves the ``COMMIT`` unrun, and the pool rolls the transaction back.
``job.transaction()`` around one ``execute`` costs two round trips: the statement's, and
the completion's with ``COMMIT``.

**Shared** (``shared=True``): group commit. Jobs that call it while another batch of their
lane is on its way wait for it to come back, then the first of them sends everyone who
waits (at most ``Config.shared_transaction_jobs``) in one transaction and one round trip:
``BEGIN``, each job's statement, one fenced completion of them all, ``COMMIT``. Each job's
call returns once that transaction has committed. No timer: when the worker is idle a batch
holds one job and goes at once; under load the batches fill up while the one before is on
its way. ``Config.shared_transactions`` lanes send batches side by side.

A batch that fails (a statement's error, a lost lease, a parameter that cannot be sent, a
broken connection) commits nothing: its jobs are then sent one by one, each in its own
transaction as above, so each gets its own statement's error or `LeaseLostError` and the
others commit. Statements must therefore not depend on running in one transaction with the
other jobs' statements, and may run twice on the server (the first run rolled back).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import attrs
import psycopg
import trio

from ._exceptions import SharedTransactionError
from ._job import Lease
from ._job_transaction import (
    _BEGIN,
    _COMMIT,
    COMMIT_TIMEOUT,
    _can_pipeline,
    _completion,
    _lost,
    _lost_ids,
    _nested_transaction,
)
from ._pg_pipeline import execute_pipelined
from ._pool import Pool
from ._queue import Queue, _fence
from ._sql import rendered

__all__ = ["CompletionStatistics", "SharedCompletions", "complete_with"]

Forget = Callable[[Lease], None]


async def complete_with(
    pool: Pool, queue: Queue, owner: str, lease: Lease, forget: Forget, *, query: Any,
    params: Any = None,
) -> psycopg.AsyncCursor[Any]:  # fmt: skip
    """``query`` and the completion of ``lease``'s job in a transaction of their own, in one
    round trip; the statement's cursor (see the module docs)."""
    async with pool.connection() as conn:
        if not _can_pipeline(conn, queue):  # trioq.testing: a savepoint and complete_many
            async with _nested_transaction(conn, queue, owner, lease, forget):
                return await conn.execute(query, params)
        conn.defer(_BEGIN)
        forget(lease)  # no heartbeat racing the COMMIT (see `own_transaction`)
        try:
            cursors = await execute_pipelined(
                conn, [(query, params), _completion(queue, owner, lease)], then=[_COMMIT]
            )
        except psycopg.Error as ex:
            if _lost_ids(ex) is not None:
                raise _lost(lease) from None
            raise
        finally:
            conn.discard_deferred()  # the pool rolls back whatever else is open
        return cursors[0]


@attrs.define(eq=False)
class _Request:
    """One job's statement, waiting for (or in) a batch."""

    lease: Lease
    forget: Forget
    query: Any
    params: Any
    taken: bool = False  # in a batch that went out: it can no longer be withdrawn
    done: bool = False
    cursor: psycopg.AsyncCursor[Any] | None = None
    error: BaseException | None = None


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
    split: int  # batches that failed and were sent again one job at a time


class SharedCompletions:
    """The lanes of ``job.complete_with(..., shared=True)`` in one worker (module docs)."""

    def __init__(
        self, pool: Pool, queue: Queue, owner: str, *, lanes: int, max_jobs: int
    ) -> None:
        self._pool = pool
        self._queue = queue
        self._owner = owner
        self._lanes = [_Lane() for _ in range(lanes)]
        self.max_jobs = max_jobs
        self._batches = self._jobs = self._split = 0

    def statistics(self) -> CompletionStatistics:
        return CompletionStatistics(batches=self._batches, jobs=self._jobs, split=self._split)

    async def complete(
        self, lease: Lease, forget: Forget, query: Any, params: Any = None
    ) -> psycopg.AsyncCursor[Any]:
        """``query`` and the job's completion, committed in a batch; the statement's cursor."""
        lane = min(self._lanes, key=_Lane.load)
        request = _Request(lease, forget, query, params)
        lane.pending.append(request)
        try:
            async with lane.lock:
                while not request.done:  # else an earlier holder of the lock sent it
                    await self._send_next(lane)
        except BaseException:
            if not request.taken:  # cancelled before it went out: nothing of it ran
                lane.pending.remove(request)
            raise
        if request.error is not None:
            raise request.error
        assert request.cursor is not None
        return request.cursor

    async def _send_next(self, lane: _Lane) -> None:
        """The oldest waiting requests of ``lane`` as one batch (shielded, bounded)."""
        batch = [lane.pending.popleft() for _ in range(min(self.max_jobs, len(lane.pending)))]
        for request in batch:
            request.taken = True
            request.forget(request.lease)  # no heartbeat racing the COMMIT
        with trio.move_on_after(COMMIT_TIMEOUT, shield=True):
            await self._write(batch)
        for request in batch:
            if not request.done:  # the timeout: it may or may not have committed
                request.error = SharedTransactionError(
                    f"job {request.lease.job_id}: its statement and completion took over "
                    f"{COMMIT_TIMEOUT} s (it is retried, unless it committed)"
                )
                request.done = True

    async def _write(self, batch: list[_Request]) -> None:
        if len(batch) == 1:
            if await self._alone(batch[0]):
                self._batches += 1
                self._jobs += 1
            return
        try:
            cursors = await self._together(batch)
        except Exception:  # each job gets its own error when sent alone
            self._split += 1
            for request in batch:
                await self._alone(request)
            return
        for request, cursor in zip(batch, cursors, strict=True):
            request.cursor, request.done = cursor, True
        self._batches += 1
        self._jobs += len(batch)

    async def _alone(self, request: _Request) -> bool:
        """One job's statement and completion in their own transaction; whether it committed."""
        try:
            request.cursor = await complete_with(
                self._pool, self._queue, self._owner, request.lease, request.forget,
                query=request.query, params=request.params,
            )  # fmt: skip
        except Exception as ex:  # handed to the job's own task
            request.error = ex
        request.done = True
        return request.error is None

    async def _together(self, batch: list[_Request]) -> list[psycopg.AsyncCursor[Any]]:
        """``BEGIN``, every statement, one fenced completion of them all and ``COMMIT``, in
        one round trip; raises whatever failed (then nothing committed)."""
        queue = self._queue
        statements: list[tuple[Any, Any]] = [(r.query, r.params) for r in batch]
        leases = [r.lease for r in batch]
        statements.append((rendered(queue.schema, "complete_in_transaction"),
                           {**_fence(leases), "owner": self._owner}))  # fmt: skip
        async with self._pool.connection() as conn:
            if not _can_pipeline(conn, queue):
                raise SharedTransactionError("not on an autocommit connection: one by one")
            conn.defer(_BEGIN)
            try:
                cursors = await execute_pipelined(conn, statements, then=[_COMMIT])
            finally:
                conn.discard_deferred()  # the pool rolls back whatever else is open
        return cursors[:-1]
