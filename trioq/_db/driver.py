"""The worker's side of the database: the claim, and every write fenced by a lease.

`Driver` is what the runtime and its services run (River's ``riverdriver``): claim a batch
(plain, or within a queue's limits), extend the leases a process holds, write outcomes
(complete, keep, fail, release, unknown task, cancelled), sweep expired leases and dead
workers' jobs, promote due jobs, and notify. Every call takes a connection and runs one
statement for any number of jobs; every write after the claim is fenced by id, attempt
and lease owner, so a worker whose lease was reclaimed changes nothing. `trioq.Queue`
offers the same calls to users who drive the queue by hand (``docs/queue.md``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from .._flow import LimitedClaim
from .._job import Failure, Job, JSONValue, Lease, encode_args
from .._pg.conn import Conn
from .._rules import rule
from .params import columns, fence
from .statements import Statements, rendered, statements, validate_schema_name

__all__ = [
    "RESTART_GRACE",
    "START_BY_REASON",
    "Driver",
    "FailResult",
    "HeartbeatResult",
    "SweepResult",
]

#: A sweeper's session suspects no worker until this long after its first check: after a
#: server restart every lock is free and every session new, and all workers reconnect.
RESTART_GRACE = dt.timedelta(seconds=2)

#: ``dead_jobs.reason`` of a job whose deadline to start passed (``last_error`` says when).
START_BY_REASON = "not started by its start_by deadline"


@attrs.frozen(kw_only=True)
class FailResult:
    retried: frozenset[int]
    dead: frozenset[int]
    cancelled: frozenset[int] = frozenset()  # a cancel was requested while it ran

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[Any, ...]], *, retried: str) -> FailResult:
        """From (id, what became of it) rows; ``retried`` names the state of a retry."""
        by_state: dict[str, set[int]] = {retried: set(), "dead": set(), "cancelled": set()}
        for job_id, state in rows:
            by_state.setdefault(state, set()).add(job_id)
        return cls(retried=frozenset(by_state[retried]), dead=frozenset(by_state["dead"]),
                   cancelled=frozenset(by_state["cancelled"]))  # fmt: skip


@attrs.frozen(kw_only=True)
class HeartbeatResult:
    extended: frozenset[Lease]
    lost: frozenset[Lease]  # not ours any more: cancel their handlers, discard their results
    cancel_requested: frozenset[Lease]  # still ours, but someone asked to cancel them


@attrs.frozen(kw_only=True)
class SweepResult:
    returned: frozenset[int]  # back to available (the attempt stays spent)
    dead: frozenset[int]  # lease expired on the last attempt
    cancelled: frozenset[int]  # lease expired while a cancel was requested
    #: The queues of the jobs returned (their workers may want a wake-up).
    queues: frozenset[str] = frozenset()
    #: After a dead-worker check, the rows left in ``workers`` (the fleet's size: how often
    #: each process checks, `trioq._worker.services.sweeper`); None after other sweeps.
    workers: int | None = None
    #: After a dead-worker check, the workers it suspected (lock free, no ping): each is
    #: taken for dead by the first check a grace later that still finds it so.
    suspected: int = 0

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[Any, ...]]) -> SweepResult:
        """From the sweep's (id, what became of it, queue) rows; a ``fleet`` row carries the
        count of workers in its id, a ``suspected`` row the count of workers suspected."""
        by_kind: dict[str, set[int]] = {"dead": set(), "cancelled": set(), "available": set()}
        workers = None
        suspected = 0
        for job_id, kind, _queue in rows:
            if kind == "fleet":
                workers = int(job_id)
            elif kind == "suspected":
                suspected = int(job_id)
            else:
                by_kind[kind].add(job_id)
        return cls(
            returned=frozenset(by_kind["available"]), dead=frozenset(by_kind["dead"]),
            cancelled=frozenset(by_kind["cancelled"]),
            queues=frozenset(queue for _id, kind, queue in rows if kind == "available"),
            workers=workers, suspected=suspected,
        )  # fmt: skip


_NO_FAILURES = FailResult(retried=frozenset(), dead=frozenset())


@attrs.frozen
class Driver:
    """The fenced calls on one schema's jobs (see the module docs)."""

    schema: str = attrs.field(default="trioq", validator=rule(validate_schema_name))

    @property
    def sql(self) -> Statements:
        return statements(self.schema)

    # -- the claim ----------------------------------------------------------------------------

    async def claim(
        self, conn: Conn, queue: str, *, owner: str, limit: int, lease: dt.timedelta,
        weighted: bool = False,
    ) -> list[Job]:  # fmt: skip
        """Lease up to ``limit`` due jobs of ``queue`` to ``owner``, counting the attempt now.

        Ordered by priority, then run_at, then id; rows locked by another
        claimer are skipped, never waited for. A queue with settings (a pause, a limit)
        gives nothing here: `claim_limited` claims from it.

        ``limit`` counts units (weighted slots, ``docs/flow-control.md``): the jobs are
        kept in order while the units taken before each are fewer than ``limit`` (a job
        costs its ``cost``, 1 when None); the rest are given back at once, attempt refunded
        and place kept. Jobs that cost 1 are never given back. ``weighted``: count the units
        in the statement (nothing to give back, a little more server time: for a queue whose
        jobs have costs).
        """
        if limit < 1:
            return []
        params = {"queue": queue, "owner": owner, "limit": limit, "lease": lease}
        name = "claim_weighted" if weighted else "claim"
        cur = await conn.execute(rendered(self.schema, name), params)
        rows = await cur.fetchall()
        rows.sort(key=_claim_order)  # UPDATE ... RETURNING keeps no order
        jobs = [Job.from_row(row) for row in rows]
        kept = units_fit(jobs, limit)
        if kept < len(jobs):
            back = [Lease(job.id, job.attempt) for job in jobs[kept:]]
            await self._fenced(conn, "release", owner, back, delays=[None] * len(back))
            del jobs[kept:]
        return jobs

    async def claim_limited(
        self, conn: Conn, queue: str, *, owner: str, limit: int, lease: dt.timedelta
    ) -> LimitedClaim:
        """`claim` for a queue with settings: within its limits, nothing while paused, and
        why it took fewer than ``limit``. Runs in one statement; needs READ COMMITTED (the
        default) or autocommit."""
        params = {"queue": queue, "owner": owner, "limit": limit, "lease": lease}
        cur = await conn.execute(self.sql.claim_limited, params)
        rows = await cur.fetchall()
        reason: str | None = None
        retry_in: float | None = None
        jobs = []
        fields = len(Job.COLUMNS)  # then why it took fewer, and when to try again
        for row in rows:
            if row[0] is None:
                reason, retry_in = row[fields], row[fields + 1]
            else:  # a job's cost rides in retry_in (migration 24); no trace context here
                cost = row[fields + 1]
                jobs.append((*row[:fields], None, None if cost is None else int(cost)))
        jobs.sort(key=_claim_order)
        return LimitedClaim(jobs=[Job.from_row(r) for r in jobs], reason=reason,
                            retry_in=retry_in)  # fmt: skip

    async def resolve_max_attempts(
        self, conn: Conn, *, owner: str, jobs: Sequence[tuple[Job, int]]
    ) -> dict[int, int]:
        """Write each claimed job's ``max_attempts`` (``jobs``: the job and its task's
        value) where its row left it to the task; the id and value of each row written."""
        params = {**fence([Lease(job.id, job.attempt) for job, _ in jobs]), "owner": owner,
                  "max_attempts": [value for _, value in jobs]}  # fmt: skip
        cur = await conn.execute(self.sql.resolve_max_attempts, params)
        return {job_id: value for job_id, value in await cur.fetchall()}

    async def resolve_cost(
        self, conn: Conn, *, owner: str, jobs: Sequence[tuple[Job, int, bool]]
    ) -> dict[int, bool]:
        """Write each claimed job's cost where its row left it to the task (``jobs``: the
        job, its task's cost, and whether to give it back in the same statement: a queue
        with a global limit); the id of each row written, and whether it was given back."""
        params = {**fence([Lease(job.id, job.attempt) for job, _, _ in jobs]), "owner": owner,
                  "costs": [cost for _, cost, _ in jobs],
                  "back": [back for _, _, back in jobs]}  # fmt: skip
        cur = await conn.execute(self.sql.resolve_cost, params)
        return {job_id: bool(back) for job_id, back in await cur.fetchall()}

    # -- leases -------------------------------------------------------------------------------

    async def heartbeat(
        self, conn: Conn, *, owner: str, leases: Sequence[Lease], lease: dt.timedelta
    ) -> HeartbeatResult:
        """Extend every lease of ``owner`` in one statement; report those it lost."""
        if not leases:
            return HeartbeatResult(
                extended=frozenset(), lost=frozenset(), cancel_requested=frozenset()
            )
        params = {**fence(leases), "owner": owner, "lease": lease}
        cur = await conn.execute(rendered(self.schema, "heartbeat"), params)
        rows = await cur.fetchall()
        extended = frozenset(Lease(job_id, attempt) for job_id, attempt, _ in rows)
        return HeartbeatResult(
            extended=extended,
            lost=frozenset(leases) - extended,
            cancel_requested=frozenset(Lease(j, a) for j, a, cancel in rows if cancel),
        )

    # -- outcomes (each one statement for any number of jobs) ---------------------------------

    async def complete_many(
        self, conn: Conn, *, owner: str, leases: Sequence[Lease],
        results: Sequence[JSONValue] | None = None,
    ) -> frozenset[int]:  # fmt: skip
        """Finish jobs: delete them, or keep them as ``done`` with ``results``.

        Returns the ids actually completed (a lost lease completes nothing).
        """
        if results is None:
            return await self._fenced(conn, "complete", owner, leases)
        return await self._fenced(conn, "complete_keep", owner, leases,
                                  results=[encode_args(r) for r in results])  # fmt: skip

    async def progress_many(
        self, conn: Conn, *, owner: str, leases: Sequence[Lease], values: Sequence[str]
    ) -> frozenset[int]:
        """Write the latest progress of running jobs (JSON texts `trioq._progress` encoded
        and checked), fenced: the ids written (a lost lease writes nothing)."""
        return await self._fenced(conn, "progress", owner, leases, values=list(values))

    async def fail_many(self, conn: Conn, *, owner: str, failures: Sequence[Failure]) -> FailResult:
        """Record failed attempts: retry after each one's delay, or move to dead_jobs.

        Fatal failures and last attempts die; a job whose cancellation was
        requested while it ran is cancelled rather than retried.
        """
        if not failures:
            return _NO_FAILURES
        params = {
            **fence([f.lease for f in failures]), "owner": owner,
            **columns(failures, delays="delay", errors="error", tracebacks="traceback",
                       fatal="fatal", reasons="reason"),
        }  # fmt: skip
        cur = await conn.execute(rendered(self.schema, "fail"), params)
        return FailResult.from_rows(await cur.fetchall(), retried="retry")

    async def release_many(
        self, conn: Conn, *, owner: str, leases: Sequence[Lease],
        delays: Sequence[dt.timedelta] | None = None,
    ) -> frozenset[int]:  # fmt: skip
        """Give jobs back unfinished, attempt refunded: available now, or after ``delays``.

        Used when the runtime aborts a job (shutdown) or a handler snoozes. A job
        whose cancellation was requested meanwhile becomes cancelled instead.
        """
        given = list(delays) if delays is not None else [dt.timedelta(0)] * len(leases)
        return await self._fenced(conn, "release", owner, leases, delays=given)

    async def release_unknown_many(
        self, conn: Conn, *, owner: str, failures: Sequence[Failure], dead_after: dt.timedelta
    ) -> FailResult:
        """Give back jobs whose task the worker does not know, attempt refunded; move those
        unknown for longer than ``dead_after`` to dead_jobs (reason ``unknown task``)."""
        if not failures:
            return _NO_FAILURES
        params = {**fence([f.lease for f in failures]), "owner": owner,
                  "errors": [f.error for f in failures], "timeout": dead_after}  # fmt: skip
        cur = await conn.execute(self.sql.release_unknown, params)
        return FailResult.from_rows(await cur.fetchall(), retried="scheduled")

    async def cancel_running_many(
        self, conn: Conn, *, owner: str, leases: Sequence[Lease]
    ) -> frozenset[int]:
        """Mark running jobs whose handlers were stopped on request as cancelled."""
        return await self._fenced(conn, "cancel_running", owner, leases)

    async def _fenced(
        self, conn: Conn, name: str, owner: str, leases: Sequence[Lease], **more: list[Any]
    ) -> frozenset[int]:
        """Run the fenced statement ``name`` on ``leases``: the ids it wrote."""
        if not leases:
            return frozenset()
        cur = await conn.execute(rendered(self.schema, name), {**fence(leases), "owner": owner,
                                                               **more})  # fmt: skip
        return frozenset(row[0] for row in await cur.fetchall())

    # -- maintenance --------------------------------------------------------------------------

    async def sweep(self, conn: Conn, *, limit: int = 1000) -> SweepResult:
        """Deal with up to ``limit`` expired leases (jobs of crashed or stalled workers).

        Safe to run from many processes at once: rows are claimed with SKIP LOCKED.
        """
        params = {
            "limit": limit,
            "dead_reason": "lease expired on the last attempt",
            "lost_error": "lease expired: worker lost",
        }
        cur = await conn.execute(self.sql.sweep, params)
        return SweepResult.from_rows(await cur.fetchall())

    async def expire_start_by(self, conn: Conn, *, limit: int = 1000) -> SweepResult:
        """Move up to ``limit`` jobs whose deadline to start (``start_by``) passed before a
        claim took them to dead_jobs (``dead``), earliest deadline first.

        Safe to run from many processes at once, and beside claims: rows are locked with
        SKIP LOCKED, and a job a claim took is no longer pending once locked.
        """
        cur = await conn.execute(self.sql.expire_start_by, {"limit": limit,
                                                            "reason": START_BY_REASON})
        return SweepResult.from_rows(await cur.fetchall())

    async def reclaim_dead_workers(self, conn: Conn, *, grace: dt.timedelta) -> SweepResult:
        """Sweep the running jobs of workers that are provably gone, without waiting for their
        leases: their liveness lock free and no ping for longer than ``grace``, found by an
        earlier check at least ``grace`` ago (which `suspected` them: see
        `trioq._worker.services.liveness`). Their rows in ``workers`` are deleted; the count
        of those left is in ``workers``, of those suspected now in ``suspected``. Safe in
        every process."""
        params = {
            "grace": grace,
            "restart_grace": RESTART_GRACE,
            "space": self.sql.lock_space,
            "dead_reason": "worker died on the last attempt",
            "lost_error": "worker died (its liveness lock was free)",
        }
        cur = await conn.execute(self.sql.reclaim, params)
        return SweepResult.from_rows(await cur.fetchall())

    async def notify_queues(self, conn: Conn, queues: Iterable[str]) -> None:
        """One wake-up notification per queue (as enqueue sends them)."""
        payloads = sorted(set(queues))
        if payloads:
            await conn.execute(self.sql.notify, {"channel": self.sql.channel, "queues": payloads})

    async def promote_due(self, conn: Conn, *, limit: int = 1000, notify: bool = True) -> list[str]:
        """Make up to ``limit`` due scheduled jobs available; the queues that got work.

        Safe to run from many processes at once (SKIP LOCKED). With ``notify``,
        one notification per queue that got work wakes the workers.
        """
        params = {"limit": limit, "notify": notify, "channel": self.sql.channel}
        cur = await conn.execute(self.sql.promote, params)
        return sorted(row[0] for row in await cur.fetchall())

    async def clock(self, conn: Conn) -> dt.datetime:
        """The database's clock (``NOW``): what every statement takes for now."""
        cur = await conn.execute(self.sql.clock)
        row = await cur.fetchone()
        assert row is not None
        return row[0]  # type: ignore[no-any-return]

    async def next_due(self, conn: Conn) -> dt.timedelta | None:
        """How long until the earliest scheduled job is due (negative if overdue; at most a
        day either way: the scheduler looks again by then), or None."""
        cur = await conn.execute(self.sql.next_due)
        row = await cur.fetchone()
        return None if row is None else row[0]


def _claim_order(row: Sequence[Any]) -> tuple[Any, ...]:
    """priority, run_at, id of a claimed row (`Job.COLUMNS`)."""
    return (row[4], row[5], row[0])


def units_fit(jobs: Sequence[Job], limit: int) -> int:
    """How many of ``jobs`` (in claim order) a claim of ``limit`` units keeps: each while the
    units taken before it are fewer than ``limit`` (weighted slots; a cost of None is 1)."""
    units = 0
    for kept, job in enumerate(jobs):
        if units >= limit:
            return kept
        cost = job.cost
        units += 1 if cost is None else cost
    return len(jobs)
