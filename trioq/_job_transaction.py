"""The transaction of ``job.transaction()``: the handler's writes and the job's completion
commit together (exactly-once effects), in no more round trips than the handler's own plus
one.

**Own transaction** (the default). A connection of the app pool, with ``BEGIN`` deferred
(`TrioConnection.defer`): it travels with the handler's first statement. When the block
ends, the fenced completion (``complete_one`` of `trioq._db.statements`, prepared, which raises
SQLSTATE ``TQ001`` through migration 11's ``lease_lost`` when the lease was lost) and
``COMMIT`` go in one round trip (pipeline mode): the error aborts the transaction before
the ``COMMIT`` runs, so the writes of a run whose lease was lost roll back. A handler that
writes one row costs two round trips; it used to cost four (``BEGIN``, the write, the
``DELETE``, ``COMMIT``).

**Shared transactions** (``job.transaction(shared=True)``). Short blocks of several jobs
run one after another in one transaction, each under its own savepoint, and commit
together with all their completions (one fenced statement): exactly-once still holds,
because the writes and the completions commit atomically. `SharedTransactions` keeps a
few *lanes* (``Config.shared_transactions``), each at most one open transaction on a
connection of the app pool. A job takes the lane with the fewest others in or waiting,
waits its turn, runs its block (``SAVEPOINT`` deferred to its first statement; on success
``RELEASE`` deferred to the next job's first statement), and then waits for the commit.
The job that ends its block when nobody waits for the lane, or when the transaction holds
``Config.shared_transaction_jobs`` jobs, commits it (shielded, bounded), for everyone. No
timer: under load the transactions fill up, when idle each commits at once.

Each member's first statement carries its ``SAVEPOINT`` and its fence (``lock_member``:
the lease checked, the job's row held ``FOR KEY SHARE``, which the sweeper's reclaims skip
and the heartbeat's update does not wait for). A member whose lease was lost fails there,
alone: its savepoint rolls back, `LeaseLostError`. A job whose block fails rolls back to
its savepoint: the others are untouched. The completion of the fenced members cannot find
one gone, so a lost lease no longer fails the transaction. When the commit fails all the
same (the connection broke, a deferred constraint), every job of that transaction raises
`SharedTransactionError` (retried as a failure).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, ExitStack, asynccontextmanager
from typing import Any

import attrs
import psycopg
import trio
from psycopg.pq import TransactionStatus
from psycopg.types.numeric import Int4, Int8

from ._db.params import fence as _fence
from ._db.statements import LEASE_LOST_SQLSTATE, rendered
from ._exceptions import LeaseLostError, SharedTransactionError
from ._job import Lease
from ._lanes import Lanes
from ._pg.connection import TrioConnection
from ._pg.pipeline import execute_pipelined
from ._pg.pool import Pool
from ._queue import Queue

__all__ = ["SharedTransactions", "own_transaction"]

#: Bound on a shared transaction's commit (shielded: one job's cancellation must not
#: decide the fate of the others).
COMMIT_TIMEOUT = 30.0
_BEGIN = b"BEGIN"
_COMMIT = b"COMMIT"
_SAVEPOINT = b"SAVEPOINT trioq_job"
_RELEASE = b"RELEASE SAVEPOINT trioq_job"
_UNDO = b"ROLLBACK TO SAVEPOINT trioq_job; RELEASE SAVEPOINT trioq_job"
_IDLE = TransactionStatus.IDLE
_INERROR = TransactionStatus.INERROR
#: How long a job waits behind one block of its lane (one waiting on something slow: an
#: HTTP call, a lock) before it gives up the lane and runs in a transaction of its own
#: (`SharedTransactions.patience`). A block of short statements takes a round trip or a few.
SLOW_BLOCK = 0.05
#: While no block runs in a lane (it commits, or is being handed over), how often a job
#: waiting for it looks again whether one runs now.
_LOOK_AGAIN = 0.01
#: What a member's `Committing` is told when its commit failed.
_NOT_COMMITTED = LeaseLostError("the shared transaction did not commit this job")

#: The runtime's `HeldJobs.committing`: no heartbeat while the completion commits, forgotten
#: once it did, heartbeated again if it failed.
Committing = Callable[[Lease], AbstractContextManager[None]]


def _lost(lease: Lease) -> LeaseLostError:
    return LeaseLostError(f"job {lease.job_id} attempt {lease.attempt}: lease lost")


def _lost_ids(error: BaseException) -> frozenset[int] | None:
    """The job ids a ``lease_lost`` error names as lost; None: another error."""
    if not isinstance(error, psycopg.Error) or error.sqlstate != LEASE_LOST_SQLSTATE:
        return None
    detail = error.diag.message_detail or ""
    return frozenset(int(x) for x in detail.split(",") if x)


def _one(owner: str, lease: Lease) -> dict[str, Any]:
    """The parameters of one job's fence (``FENCE_ONE``), typed so that its prepared plan is
    generic."""
    return {"id": Int8(lease.job_id), "attempt": Int4(lease.attempt), "owner": owner}


def _completion(queue: Queue, owner: str, lease: Lease) -> tuple[Any, dict[str, Any]]:
    """The fenced completion of one job, with parameters, so it is prepared (its plan costs
    the server more than its run)."""
    return rendered(queue.schema, "complete_one"), _one(owner, lease)


async def _complete_one_and_commit(
    conn: TrioConnection[Any], queue: Queue, owner: str, lease: Lease
) -> None:
    """The fenced completion of one job and COMMIT in one round trip (pipeline mode): an
    error in the completion leaves the COMMIT unrun."""
    await execute_pipelined(conn, [_completion(queue, owner, lease)], then=[_COMMIT])


@asynccontextmanager
async def own_transaction(
    pool: Pool, queue: Queue, owner: str, lease: Lease, committing: Committing
) -> AsyncIterator[TrioConnection[Any]]:
    """The job's own transaction on a connection of ``pool`` (see the module docs)."""
    async with pool.connection() as conn:
        if not _can_pipeline(conn, queue):
            async with _nested_transaction(conn, queue, owner, lease, committing):
                yield conn
            return
        conn.defer(_BEGIN)
        conn.guard_transaction("job.transaction()")
        try:
            yield conn
            conn.guard_transaction(None)
            # No heartbeat while the completion commits: one racing the commit would find
            # the row gone and take the lease for lost. If the commit fails, heartbeats go
            # on (the runtime writes the failure, fenced; if the lease was lost, nothing).
            with committing(lease):
                if conn.discard_deferred():  # no statement ran: there is nothing to commit
                    if not await queue.complete_many(conn, owner=owner, leases=[lease]):
                        raise _lost(lease)
                    return
                try:
                    await _complete_one_and_commit(conn, queue, owner, lease)
                except psycopg.Error as ex:
                    if _lost_ids(ex) is not None:
                        raise _lost(lease) from None
                    raise
        finally:
            conn.guard_transaction(None)
            conn.discard_deferred()  # the pool rolls back whatever else is open


def _can_pipeline(conn: TrioConnection[Any], queue: Queue) -> bool:
    """Whether this block can own its transaction (deferred BEGIN, completion with COMMIT):
    an autocommit connection outside any transaction, and trioq's own completion. A
    connection already in a transaction (``trioq.testing``'s transaction-per-test), or a
    `Queue` whose ``complete_many`` is overridden (``trioq.testing.job_context``), gets a
    savepoint and ``complete_many`` instead, as before."""
    return (
        conn.autocommit
        and conn.pgconn.transaction_status == _IDLE
        and type(queue).complete_many is Queue.complete_many
    )


@asynccontextmanager
async def _nested_transaction(
    conn: TrioConnection[Any], queue: Queue, owner: str, lease: Lease, committing: Committing
) -> AsyncIterator[None]:
    """``conn.transaction()`` (a savepoint when one is open) and ``complete_many`` in it."""
    async with conn.transaction():
        yield
        with committing(lease):
            if lease.job_id not in await queue.complete_many(conn, owner=owner, leases=[lease]):
                raise _lost(lease)


@attrs.define(eq=False)
class _Member:
    lease: Lease
    committing: Committing
    #: Its block ran a statement, so its fence went first (its row is held): the completion
    #: cannot find it gone. A member without (no write of its own) is completed unfenced.
    fenced: bool


@attrs.define(eq=False)
class _Batch:
    """One open shared transaction."""

    conn: TrioConnection[Any]
    members: list[_Member] = attrs.field(factory=list)
    done: trio.Event = attrs.field(factory=trio.Event)
    #: Why the transaction did not commit (None: it did).
    error: BaseException | None = None
    #: Members whose leases were lost: nothing was written for them.
    lost: frozenset[int] = frozenset()


@attrs.define(eq=False)
class _Lane:
    lock: trio.Lock = attrs.field(factory=trio.Lock)
    batch: _Batch | None = None
    users: int = 0  # in the lane or waiting for it
    #: When the block running in the lane started (trio's clock); None: none runs.
    block_started: float | None = None

    def slow_since(self, patience: float) -> float | None:
        """When the running block became slow (ran ``patience`` s); None: no block."""
        return None if self.block_started is None else self.block_started + patience

    def waiting(self) -> int:
        return self.lock.statistics().tasks_waiting


@attrs.frozen
class SharedStatistics:
    """Totals of a `SharedTransactions`, since it was made."""

    transactions: int  # committed
    jobs: int  # completed in them
    failed: int  # transactions that did not commit
    #: Jobs that did not wait behind a slow block (`SharedTransactions.patience`) and ran
    #: in a transaction of their own.
    alone: int = 0


class SharedTransactions(Lanes[_Lane]):
    """The lanes of ``job.transaction(shared=True)`` in one worker (see the module docs)."""

    LANE = _Lane
    _committed = _jobs = _failed = _alone = 0  # counts (each instance's own once it counts)
    #: How long a job waits behind one block before it runs in a transaction of its own.
    patience = SLOW_BLOCK

    def statistics(self) -> SharedStatistics:
        return SharedStatistics(
            transactions=self._committed, jobs=self._jobs, failed=self._failed,
            alone=self._alone,
        )  # fmt: skip

    @asynccontextmanager
    async def member(
        self, lease: Lease, committing: Committing
    ) -> AsyncIterator[TrioConnection[Any]]:
        """A turn in a shared transaction for the job of ``lease``; returns once committed.
        Behind a block that has run ``patience`` s (it waits on something slow), the job
        does not wait: it runs in a transaction of its own (`own_transaction`)."""
        lane = await self._take_lane()
        if lane is None:
            self._alone += 1
            async with own_transaction(self._pool, self._queue, self._owner, lease,
                                       committing) as conn:  # fmt: skip
                yield conn
            return
        try:
            try:
                batch = await self._enter(lane)
                try:
                    async with self._turn(lane, batch, lease, committing) as conn:
                        yield conn
                except psycopg.errors.ActiveSqlTransaction as ex:  # SET TRANSACTION, ...
                    raise psycopg.errors.ActiveSqlTransaction(
                        f"{ex} (job.transaction() shares its transaction with other jobs' "
                        "blocks, group commit: give it one of its own with "
                        "job.transaction(shared=False))"
                    ) from ex
                except psycopg.Error as ex:
                    if _lost_ids(ex) is not None:  # its fence: rolled back alone
                        raise _lost(lease) from None
                    raise
            finally:
                await self._leave(lane)
        finally:
            lane.users -= 1
        await batch.done.wait()
        if lease.job_id in batch.lost:
            raise _lost(lease)
        if batch.error is not None:
            raise SharedTransactionError(
                f"job {lease.job_id}: the shared transaction holding its writes did not "
                f"commit: {batch.error}"
            ) from batch.error

    async def _take_lane(self) -> _Lane | None:
        """The least busy lane whose block is not slow, its lock held (``users`` counted);
        None when every lane's block is slow, or became slow while this job waited."""
        now = trio.current_time()
        fast = [lane for lane in self._lanes if not _slow(lane.slow_since(self.patience), now)]
        if not fast:
            return None
        lane = min(fast, key=lambda lane: lane.users)
        lane.users += 1
        try:
            if not lane.lock.locked():  # free: taken at once, no deadline (cancel scope) needed
                await lane.lock.acquire()
                return lane
            while True:
                block, slow = lane.block_started, lane.slow_since(self.patience)
                if slow is None:  # no block runs (the lane commits, or is handed over)
                    slow = trio.current_time() + max(self.patience, _LOOK_AGAIN)
                with trio.move_on_at(slow):
                    await lane.lock.acquire()
                    return lane
                if block is not None and lane.block_started == block:
                    lane.users -= 1  # the same block ran past patience: do not wait for it
                    return None
        except BaseException:
            lane.users -= 1
            raise

    async def _enter(self, lane: _Lane) -> _Batch:
        """The lane's open transaction, or a new one (BEGIN deferred). Holds the lock."""
        if lane.batch is None:
            conn = await self._pool.getconn()
            conn.defer(_BEGIN)
            lane.batch = _Batch(conn)
        return lane.batch

    @asynccontextmanager
    async def _turn(
        self, lane: _Lane, batch: _Batch, lease: Lease, committing: Committing
    ) -> AsyncIterator[TrioConnection[Any]]:
        """One job's block under a savepoint, its fence (`LOCK_MEMBER`) first, both
        deferred to its first statement; undone (to the savepoint) if it fails, else the
        job joins the batch's members."""
        conn = batch.conn
        conn.defer(_SAVEPOINT)
        conn.defer_statement(rendered(self._queue.schema, "lock_member"), _one(self._owner, lease))
        conn.guard_transaction("job.transaction(shared=True)")
        lane.block_started = trio.current_time()
        try:
            yield conn
        except BaseException:
            lane.block_started = None
            conn.guard_transaction(None)
            await self._undo(lane, batch)
            raise
        finally:
            lane.block_started = None
            conn.guard_transaction(None)
        if conn.deferred_statements:  # no statement ran: savepoint and fence never went out
            _drop_savepoint(conn)
            batch.members.append(_Member(lease, committing, fenced=False))
            return
        if conn.pgconn.transaction_status == _INERROR:
            # The block caught its statement's error and went on: the transaction cannot
            # take another statement until its savepoint is rolled back.
            await self._undo(lane, batch)
            raise psycopg.errors.InFailedSqlTransaction(
                f"job {lease.job_id}: a statement of its job.transaction(shared=True) block "
                "failed and the block went on; its writes were rolled back"
            )
        conn.defer(_RELEASE)
        batch.members.append(_Member(lease, committing, fenced=True))

    async def _undo(self, lane: _Lane, batch: _Batch) -> None:
        """Roll the failed job's block back to its savepoint; if that fails, the whole
        transaction is lost (its jobs are told so when it is finished)."""
        conn = batch.conn
        if conn.deferred_statements:  # nothing of this job reached the server
            _drop_savepoint(conn)
            return
        with trio.move_on_after(COMMIT_TIMEOUT, shield=True) as scope:
            try:
                await conn.execute(_UNDO)
                return
            except psycopg.Error as ex:
                batch.error = ex
        if scope.cancelled_caught:
            batch.error = SharedTransactionError("rolling back to the job's savepoint hung")

    async def _leave(self, lane: _Lane) -> None:
        """Hand the lane to the next job, or finish its transaction when nobody waits (or
        it is full, or broken); then release the lock (handed over, never free between)."""
        try:
            batch = lane.batch
            if batch is not None and (
                not lane.waiting()
                or len(batch.members) >= self.max_jobs
                or batch.error is not None
            ):
                lane.batch = None
                await self._finish(batch)
        finally:
            lane.lock.release()

    async def _finish(self, batch: _Batch) -> None:
        """Commit the members' writes with their completions (shielded, bounded), or roll
        back; give the connection back; wake the members."""
        conn = batch.conn
        try:
            with trio.move_on_after(COMMIT_TIMEOUT, shield=True) as scope:
                await self._commit(batch)
            if scope.cancelled_caught and batch.error is None:
                batch.error = SharedTransactionError(f"the commit took over {COMMIT_TIMEOUT} s")
        finally:
            conn.discard_deferred()
            try:
                await self._pool.putconn(conn)  # rolls back what did not commit
            finally:
                if batch.error is None:
                    self._committed += 1
                    self._jobs += len(batch.members)
                elif batch.members:
                    self._failed += 1
                batch.done.set()

    async def _commit(self, batch: _Batch) -> None:
        """The members' completions with COMMIT (none heartbeated meanwhile, as in
        `own_transaction`); what did not commit is in ``batch.error`` and ``batch.lost``."""
        if batch.error is not None or not batch.members:
            return
        with ExitStack() as stack:
            settle = {m.lease.job_id: m.committing(m.lease) for m in batch.members}
            for committing in settle.values():
                stack.enter_context(committing)
            try:
                batch.lost = await self._complete(batch.conn, batch.members)
            except psycopg.Error as ex:
                batch.error = ex
                batch.lost = _lost_ids(ex) or frozenset()
            stack.pop_all()  # each member settles alone: committed, or heartbeated again
        for job_id, committing in settle.items():
            failed = batch.error is not None or job_id in batch.lost
            committing.__exit__(*((LeaseLostError, _NOT_COMMITTED, None) if failed
                                  else (None, None, None)))  # fmt: skip

    async def _complete(self, conn: TrioConnection[Any], members: list[_Member]) -> frozenset[int]:
        """Complete ``members`` with the transaction's writes, in one round trip with the
        COMMIT; the ids whose leases were lost (members that wrote nothing: their fence
        never went out). A fenced member's row is held, so its completion raising
        (`lease_lost`) means something broke the fence, and nothing commits."""
        fenced = [m.lease for m in members if m.fenced]
        unfenced = [m.lease for m in members if not m.fenced]
        if conn.pgconn.transaction_status == _IDLE and conn.deferred:
            # No statement went out (BEGIN is still deferred): the completions alone.
            assert not fenced
            conn.discard_deferred()
            done = await self._queue.complete_many(conn, owner=self._owner, leases=unfenced)
            return frozenset(lease.job_id for lease in unfenced) - done
        owner = {"owner": self._owner}
        statements: list[tuple[bytes, dict[str, Any]]] = []
        if fenced:
            statements.append((rendered(self._queue.schema, "complete_in_transaction"),
                               {**_fence(fenced), **owner}))  # fmt: skip
        if unfenced:
            statements.append((rendered(self._queue.schema, "complete"),
                               {**_fence(unfenced), **owner}))  # fmt: skip
        cursors = await execute_pipelined(conn, statements, then=[_COMMIT])
        if not unfenced:
            return frozenset()
        completed = {int(row[0]) for row in await cursors[-1].fetchall()}
        return frozenset(lease.job_id for lease in unfenced) - completed


def _slow(since: float | None, now: float) -> bool:
    return since is not None and since <= now


def _drop_savepoint(conn: TrioConnection[Any]) -> None:
    """Take the job's SAVEPOINT (the last deferred command) and its fence (the deferred
    statement) back; keep the other commands."""
    pending = conn.discard_deferred()
    assert pending[-1] == _SAVEPOINT, pending
    conn.defer(*pending[:-1])
