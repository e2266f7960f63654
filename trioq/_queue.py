"""The queue as a library: enqueue, claim, lease, outcomes, cancel, sweep.

Everything runs on a connection the caller passes in, inside whatever
transaction the caller has open (or autocommit). The worker runtime drives the
claim/heartbeat/outcome methods; applications mostly call `Queue.enqueue`.
The SQL is in `trioq._sql`; this module turns arguments into parameters and
rows into results.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import psycopg

from ._dead import DeadFilter, DeadJob, list_dead, purge_dead, retry_dead
from ._job import DEFAULT_MAX_ATTEMPTS, EnqueueResult, Job, JobSpec, JSONValue, encode_args
from ._schema import validate_schema_name
from ._sql import SCHEDULED_PAYLOAD, Statements, statements

__all__ = [
    "CancelOutcome",
    "FailResult",
    "Failure",
    "HeartbeatResult",
    "Lease",
    "PayloadTooLargeError",
    "Queue",
    "QueueStatus",
    "SweepResult",
    "WorkerLeases",
]

Conn = psycopg.AsyncConnection[Any]

DEFAULT_MAX_PAYLOAD = 1024 * 1024  # bytes of JSON args
_TWIN_LOOKUPS = 5  # a twin can finish between the conflict and the lookup: insert again


class PayloadTooLargeError(ValueError):
    """A job's JSON args exceed the queue's ``max_payload_bytes``."""


@attrs.frozen
class Lease:
    """A claimed job's fence: its id and the attempt this worker holds."""

    job_id: int
    attempt: int


@attrs.frozen(kw_only=True)
class Failure:
    """A failed attempt: retried after ``delay`` unless fatal or out of attempts."""

    lease: Lease
    error: str
    traceback: str | None = None
    delay: dt.timedelta = dt.timedelta(0)
    fatal: bool = False


@attrs.frozen(kw_only=True)
class FailResult:
    retried: frozenset[int]
    dead: frozenset[int]
    cancelled: frozenset[int] = frozenset()  # a cancel was requested while it ran


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


@attrs.frozen(kw_only=True)
class QueueStatus:
    queue: str
    available: int
    scheduled: int
    running: int
    dead: int
    oldest_wait_seconds: float | None  # how long the oldest due job has waited


@attrs.frozen(kw_only=True)
class WorkerLeases:
    worker: str
    running: int
    next_expiry_seconds: float  # negative: a lease already expired (a crashed worker)


@attrs.frozen
class CancelOutcome:
    """``cancelled`` (it was available), ``requested`` (running: the runtime will stop it),
    or ``not_found`` (no such job, or already finished)."""

    status: str


def _positive(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be positive, got {value}")


def _schema(_inst: object, _attribute: attrs.Attribute[str], value: str) -> None:
    validate_schema_name(value)


@attrs.frozen(kw_only=True)
class Queue:
    """trioq's tables in one schema, and the limits applied on the way in."""

    schema: str = attrs.field(default="trioq", validator=_schema)
    max_payload_bytes: int = attrs.field(default=DEFAULT_MAX_PAYLOAD, validator=_positive)

    @property
    def sql(self) -> Statements:
        return statements(self.schema)

    # -- enqueue -------------------------------------------------------------------------------

    async def enqueue(
        self,
        conn: Conn,
        task: str,
        args: JSONValue = None,
        *,
        queue: str = "default",
        priority: int = 0,
        run_at: dt.datetime | None = None,
        delay: dt.timedelta | float | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        dedup_key: str | None = None,
        unique: bool = False,
        notify: bool = True,
    ) -> EnqueueResult:
        """Insert one job on ``conn``, in the caller's transaction if one is open.

        The job (and its wake-up notification) becomes visible when the caller
        commits. With ``dedup_key`` or ``unique=True`` a job whose twin is still
        available or running is not inserted: the result says ``duplicate`` and
        carries the twin's id.
        """
        spec = JobSpec(
            task=task, args=args, queue=queue, priority=priority, run_at=run_at, delay=delay,
            max_attempts=max_attempts, dedup_key=dedup_key, unique=unique,
        )  # fmt: skip
        self._check_payload(spec)
        key = spec.effective_dedup_key()
        params = {
            "queue": spec.queue,
            "task": spec.task,
            "args": spec.args_json,
            "priority": spec.priority,
            "run_at": spec.run_at,
            "delay": spec.delay,
            "max_attempts": spec.max_attempts,
            "dedup_key": key,
            "notify": notify,
            "channel": self.sql.channel,
        }
        for _ in range(_TWIN_LOOKUPS):
            cur = await conn.execute(self.sql.insert, params)
            row = await cur.fetchone()
            if row is not None:
                return EnqueueResult(int(row[0]))
            twins = await self._live_twins(conn, [key])
            if key in twins:
                return EnqueueResult(twins[key], duplicate=True)
        raise RuntimeError(f"dedup key {key!r} keeps conflicting with jobs that finish at once")

    async def enqueue_many(
        self, conn: Conn, jobs: Iterable[JobSpec], *, notify: bool = True
    ) -> list[EnqueueResult]:
        """Insert many jobs in a few statements; results are in input order.

        Jobs without dedup keys go through COPY; a batch with dedup keys uses
        one ``INSERT ... SELECT FROM unnest`` with ``ON CONFLICT DO NOTHING``.
        One notification per distinct queue (and one ``@scheduled`` for jobs due
        later), whatever the batch size.
        """
        specs = list(jobs)
        if not specs:
            return []
        for spec in specs:
            self._check_payload(spec)
        keys = [spec.effective_dedup_key() for spec in specs]
        now, ids = await self._reserve_ids(conn, len(specs))
        run_ats = [spec.run_at or now + spec.delay for spec in specs]
        if any(keys):
            inserted = await self._insert_unnest(conn, specs, ids, run_ats, keys)
        else:
            await self._copy(conn, specs, ids, run_ats, now)
            inserted = set(ids)
        results = [EnqueueResult(job_id) for job_id in ids]
        missing = [i for i, job_id in enumerate(ids) if job_id not in inserted]
        if missing:
            twins = await self._live_twins(conn, [keys[i] for i in missing])
            for i in missing:
                twin = twins.get(keys[i] or "")
                if twin is None:
                    raise RuntimeError(f"dedup key {keys[i]!r}: conflict with a job that finished")
                results[i] = EnqueueResult(twin, duplicate=True)
        if notify:
            payloads = sorted(
                {
                    spec.queue if run_at <= now else SCHEDULED_PAYLOAD
                    for spec, run_at, job_id in zip(specs, run_ats, ids, strict=True)
                    if job_id in inserted
                }
            )
            await conn.execute(self.sql.notify, {"channel": self.sql.channel, "queues": payloads})
        return results

    def _check_payload(self, spec: JobSpec) -> None:
        size = len(spec.args_json.encode())
        if size > self.max_payload_bytes:
            raise PayloadTooLargeError(
                f"args of task {spec.task!r} are {size} bytes of JSON, over the limit of "
                f"{self.max_payload_bytes} (Queue.max_payload_bytes)"
            )

    async def _reserve_ids(self, conn: Conn, n: int) -> tuple[dt.datetime, list[int]]:
        jobs_table = f"{self.schema}.jobs"
        cur = await conn.execute(self.sql.reserve_ids, {"jobs": jobs_table, "n": n})
        row = await cur.fetchone()
        assert row is not None
        return row[0], list(row[1])

    async def _insert_unnest(
        self,
        conn: Conn,
        specs: Sequence[JobSpec],
        ids: Sequence[int],
        run_ats: Sequence[dt.datetime],
        keys: Sequence[str | None],
    ) -> set[int]:
        params = {
            "ids": list(ids),
            "queues": [s.queue for s in specs],
            "tasks": [s.task for s in specs],
            "args": [s.args_json for s in specs],
            "priorities": [s.priority for s in specs],
            "run_ats": list(run_ats),
            "max_attempts": [s.max_attempts for s in specs],
            "dedup_keys": list(keys),
        }
        cur = await conn.execute(self.sql.insert_many, params)
        return {row[0] for row in await cur.fetchall()}

    async def _copy(
        self,
        conn: Conn,
        specs: Sequence[JobSpec],
        ids: Sequence[int],
        run_ats: Sequence[dt.datetime],
        now: dt.datetime,
    ) -> None:
        """COPY in text format, rows built by hand: names are validated, args escaped."""
        lines = [
            f"{job_id}\t{s.queue}\t{s.task}\t{_copy_escape(s.args_json)}\t{s.priority}\t"
            f"{run_at.isoformat()}\t{'scheduled' if run_at > now else 'available'}\t"
            f"{s.max_attempts}\n"
            for job_id, s, run_at in zip(ids, specs, run_ats, strict=True)
        ]
        async with conn.cursor() as cur, cur.copy(self.sql.copy_jobs) as copy:
            await copy.write("".join(lines).encode())

    async def _live_twins(self, conn: Conn, keys: Sequence[str | None]) -> dict[str, int]:
        cur = await conn.execute(self.sql.live_twins, {"keys": list(keys)})
        return {key: job_id for key, job_id in await cur.fetchall()}

    # -- claim and lease -----------------------------------------------------------------------

    async def claim(
        self, conn: Conn, queue: str, *, owner: str, limit: int, lease: dt.timedelta
    ) -> list[Job]:
        """Lease up to ``limit`` due jobs of ``queue`` to ``owner``, counting the attempt now.

        Ordered by priority, then run_at, then id; rows locked by another
        claimer are skipped, never waited for.
        """
        if limit < 1:
            return []
        params = {"queue": queue, "owner": owner, "limit": limit, "lease": lease}
        cur = await conn.execute(self.sql.claim, params)
        jobs = [Job.from_row(row) for row in await cur.fetchall()]
        jobs.sort(key=lambda j: (j.priority, j.run_at, j.id))
        return jobs

    async def heartbeat(
        self, conn: Conn, *, owner: str, leases: Sequence[Lease], lease: dt.timedelta
    ) -> HeartbeatResult:
        """Extend every lease of ``owner`` in one statement; report those it lost."""
        if not leases:
            return HeartbeatResult(
                extended=frozenset(), lost=frozenset(), cancel_requested=frozenset()
            )
        params = {**_fence(leases), "owner": owner, "lease": lease}
        cur = await conn.execute(self.sql.heartbeat, params)
        rows = await cur.fetchall()
        extended = frozenset(Lease(job_id, attempt) for job_id, attempt, _ in rows)
        return HeartbeatResult(
            extended=extended,
            lost=frozenset(leases) - extended,
            cancel_requested=frozenset(Lease(j, a) for j, a, cancel in rows if cancel),
        )

    # -- outcomes (each one statement for any number of jobs) ----------------------------------

    async def complete_many(
        self,
        conn: Conn,
        *,
        owner: str,
        leases: Sequence[Lease],
        results: Sequence[JSONValue] | None = None,
    ) -> frozenset[int]:
        """Finish jobs: delete them, or keep them as ``done`` with ``results``.

        Returns the ids actually completed (a lost lease completes nothing).
        """
        if not leases:
            return frozenset()
        params = {**_fence(leases), "owner": owner}
        if results is None:
            cur = await conn.execute(self.sql.complete, params)
        else:
            params["results"] = [encode_args(r) for r in results]
            cur = await conn.execute(self.sql.complete_keep, params)
        return frozenset(row[0] for row in await cur.fetchall())

    async def fail_many(self, conn: Conn, *, owner: str, failures: Sequence[Failure]) -> FailResult:
        """Record failed attempts: retry after each one's delay, or move to dead_jobs.

        Fatal failures and last attempts die; a job whose cancellation was
        requested while it ran is cancelled rather than retried.
        """
        if not failures:
            return FailResult(retried=frozenset(), dead=frozenset())
        params = {
            **_fence([f.lease for f in failures]),
            "owner": owner,
            "delays": [f.delay for f in failures],
            "errors": [f.error for f in failures],
            "tracebacks": [f.traceback for f in failures],
            "fatal": [f.fatal for f in failures],
        }
        cur = await conn.execute(self.sql.fail, params)
        rows = await cur.fetchall()
        return FailResult(
            retried=frozenset(r[0] for r in rows if r[1] == "retry"),
            dead=frozenset(r[0] for r in rows if r[1] == "dead"),
            cancelled=frozenset(r[0] for r in rows if r[1] == "cancelled"),
        )

    async def release_many(
        self,
        conn: Conn,
        *,
        owner: str,
        leases: Sequence[Lease],
        delays: Sequence[dt.timedelta] | None = None,
    ) -> frozenset[int]:
        """Give jobs back unfinished, attempt refunded: available now, or after ``delays``.

        Used when the runtime aborts a job (shutdown) or a handler snoozes. A job
        whose cancellation was requested meanwhile becomes cancelled instead.
        """
        if not leases:
            return frozenset()
        zero = dt.timedelta(0)
        params = {
            **_fence(leases),
            "owner": owner,
            "delays": list(delays) if delays is not None else [zero] * len(leases),
        }
        cur = await conn.execute(self.sql.release, params)
        return frozenset(row[0] for row in await cur.fetchall())

    async def cancel_running_many(
        self, conn: Conn, *, owner: str, leases: Sequence[Lease]
    ) -> frozenset[int]:
        """Mark running jobs whose handlers were stopped on request as cancelled."""
        return await self._fenced(conn, self.sql.cancel_running, owner, leases)

    async def _fenced(
        self, conn: Conn, statement: Any, owner: str, leases: Sequence[Lease]
    ) -> frozenset[int]:
        if not leases:
            return frozenset()
        cur = await conn.execute(statement, {**_fence(leases), "owner": owner})
        return frozenset(row[0] for row in await cur.fetchall())

    # -- cancel and sweep ----------------------------------------------------------------------

    async def cancel(self, conn: Conn, job_id: int) -> CancelOutcome:
        """Cancel a scheduled or available job at once; flag a running one for the runtime."""
        cur = await conn.execute(self.sql.cancel, {"id": job_id})
        row = await cur.fetchone()
        assert row is not None
        if row[0]:
            return CancelOutcome("cancelled")
        return CancelOutcome("requested" if row[1] else "not_found")

    async def sweep(self, conn: Conn, *, limit: int = 1000) -> SweepResult:
        """Deal with up to ``limit`` expired leases (jobs of crashed or stalled workers).

        Safe to run from many processes at once: rows are claimed with SKIP LOCKED.
        """
        cur = await conn.execute(self.sql.sweep, {"limit": limit})
        rows = await cur.fetchall()
        by_kind: dict[str, set[int]] = {"dead": set(), "cancelled": set(), "available": set()}
        for job_id, kind in rows:
            by_kind[kind].add(job_id)
        return SweepResult(
            returned=frozenset(by_kind["available"]),
            dead=frozenset(by_kind["dead"]),
            cancelled=frozenset(by_kind["cancelled"]),
        )

    # -- scheduled jobs ------------------------------------------------------------------------

    async def promote_due(self, conn: Conn, *, limit: int = 1000, notify: bool = True) -> list[str]:
        """Make up to ``limit`` due scheduled jobs available; the queues that got work.

        Safe to run from many processes at once (SKIP LOCKED). With ``notify``,
        one notification per queue that got work wakes the workers.
        """
        params = {"limit": limit, "notify": notify, "channel": self.sql.channel}
        cur = await conn.execute(self.sql.promote, params)
        return sorted(row[0] for row in await cur.fetchall())

    async def next_due(self, conn: Conn) -> dt.timedelta | None:
        """How long until the earliest scheduled job is due (negative if overdue), or None."""
        cur = await conn.execute(self.sql.next_due)
        row = await cur.fetchone()
        return None if row is None else row[0]

    # -- status --------------------------------------------------------------------------------

    async def status(self, conn: Conn) -> tuple[list[QueueStatus], list[WorkerLeases]]:
        """Per queue counts and the oldest wait; live leases per worker."""
        cur = await conn.execute(self.sql.status_queues)
        queues = [
            QueueStatus(
                queue=q,
                available=a,
                scheduled=s,
                running=r,
                dead=d,
                oldest_wait_seconds=None if w is None else float(w),
            )
            for q, a, s, r, d, w in await cur.fetchall()
        ]
        cur = await conn.execute(self.sql.status_leases)
        leases = [
            WorkerLeases(worker=w, running=n, next_expiry_seconds=e.total_seconds())
            for w, n, e in await cur.fetchall()
        ]
        return queues, leases

    # -- dead letters --------------------------------------------------------------------------

    async def dead_list(
        self, conn: Conn, where: DeadFilter | None = None, *, limit: int = 100
    ) -> list[DeadJob]:
        return await list_dead(conn, self.sql, where or DeadFilter(), limit=limit)

    async def dead_retry(self, conn: Conn, where: DeadFilter | None = None) -> list[int]:
        return await retry_dead(conn, self.sql, where or DeadFilter())

    async def dead_purge(
        self, conn: Conn, where: DeadFilter | None = None, *, before: dt.datetime | None = None
    ) -> list[int]:
        return await purge_dead(conn, self.sql, where or DeadFilter(), before=before)


def _fence(leases: Sequence[Lease]) -> dict[str, list[int]]:
    return {
        "ids": [lease.job_id for lease in leases],
        "attempts": [lease.attempt for lease in leases],
    }


def _copy_escape(text: str) -> str:
    """Escape for COPY text format. JSON text has no raw control characters."""
    return text.replace("\\", "\\\\")
