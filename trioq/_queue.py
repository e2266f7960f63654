"""The queue as a library: enqueue, claim, lease, outcomes, cancel, sweep.

Everything runs on a connection the caller passes in, inside whatever
transaction the caller has open (or autocommit). The worker runtime drives the
claim/heartbeat/outcome methods; applications mostly call `Queue.enqueue`.
The SQL is in `trioq._db.statements`; this module turns arguments into parameters and
rows into results.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import psycopg
from psycopg.pq import TransactionStatus

from ._db.migrate import latest_version
from ._db.obs_statements import obs_statements
from ._db.statements import (
    SCHEDULED_PAYLOAD,
    Statements,
    claim_query,
    rendered,
    statements,
    validate_schema_name,
)
from ._db.version import check_schema, schema_version
from ._dead import DeadFilter, DeadJob, list_dead, purge_dead, retry_dead
from ._dependencies import Dependency, GraphJob, insert_graph, read_dependencies
from ._exceptions import SchemaMissingError
from ._flow import (
    UNSET,
    LimitedClaim,
    QueueSettings,
    RateLimit,
    Unset,
    change_settings,
    claim_limited,
    read_settings,
)
from ._job import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_PAYLOAD,
    ENCODE_CHUNK,
    EnqueueResult,
    Failure,
    Job,
    JobSpec,
    JSONValue,
    Lease,
    check_max_payload,
    check_payload,
    encode_args,
    encode_args_runs,
    rule,
)
from ._obs.carrier import carrier
from ._obs.depth import read_depths
from ._result import DEFAULT_POLL_INTERVAL, JobStatus, wait_result
from ._result import job_status as read_job_status
from ._unique import Unique

__all__ = [
    "CancelOutcome",
    "FailResult",
    "HeartbeatResult",
    "Queue",
    "QueueStatus",
    "SweepResult",
    "WorkerLeases",
]

Conn = psycopg.AsyncConnection[Any]
# One bulk-insert statement carries at most this many jobs, or this many characters of JSON.
_BULK_STATEMENT_JOBS = 20_000
_BULK_STATEMENT_CHARS = 16 * 1024 * 1024
_TWIN_LOOKUPS = 5  # a twin can finish between the conflict and the lookup: insert again
#: A sweeper judges no worker dead on a connection younger than this: after a server
#: restart every lock is free and every connection new, and all workers reconnect.
RESTART_GRACE = dt.timedelta(seconds=2)


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
    #: The queues of the jobs returned (their workers may want a wake-up).
    queues: frozenset[str] = frozenset()


@attrs.frozen(kw_only=True)
class QueueStatus:
    queue: str
    available: int
    scheduled: int
    running: int
    dead: int
    oldest_wait_seconds: float | None  # how long the oldest due job has waited
    waiting: int = 0  # waiting for their dependencies
    #: The states whose count stopped at the cap of `Queue.status` (there are at least
    #: that many); empty when every count is exact.
    at_cap: tuple[str, ...] = ()


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


@attrs.frozen(kw_only=True)
class Queue:
    """trioq's tables in one schema, and the limits applied on the way in."""

    schema: str = attrs.field(default="trioq", validator=rule(validate_schema_name))
    max_payload_bytes: int = attrs.field(
        default=DEFAULT_MAX_PAYLOAD, validator=rule(check_max_payload)
    )
    #: Connections whose schema version was found current (see `_check_version`).
    _current: weakref.WeakKeyDictionary[Conn, bool] = attrs.field(
        factory=weakref.WeakKeyDictionary, init=False, repr=False, eq=False
    )

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
        unique: bool | Unique = False,
        concurrency_key: str | None = None,
        after: Sequence[int] | None = None,
        on_dependency_failure: str = "cancel",
        notify: bool = True,
    ) -> EnqueueResult:
        """Insert one job on ``conn``, in the caller's transaction if one is open.

        The job (and its wake-up notification) becomes visible when the caller
        commits. With ``dedup_key`` (scoped by task), ``unique=True`` or
        ``unique=trioq.Unique(...)`` a job whose twin holds the key is not inserted: the
        result says ``duplicate`` and carries the twin's id (docs/flow-control.md says
        which enqueue wins). ``concurrency_key`` is the job's key for the per-key limits
        of its queue. With ``after`` (ids of existing jobs) the job waits until they have
        all ended; ``on_dependency_failure`` says what one that dies or is cancelled does
        to it: ``cancel`` it too, or ``run`` it anyway (docs/workflows.md).
        """
        spec = JobSpec(
            task=task, args=args, queue=queue, priority=priority, run_at=run_at, delay=delay,
            max_attempts=max_attempts, dedup_key=dedup_key, unique=unique,
            concurrency_key=concurrency_key, after=after,
            on_dependency_failure=on_dependency_failure,
        )  # fmt: skip
        self._check_payload(spec)
        if spec.after:
            return (await self._insert_graph(conn, [spec], notify))[0]
        found = spec.uniqueness()
        if found is not None and found.windowed:
            with _migrated(conn, self.schema):
                await self._check_version(conn)
                return await self._enqueue_windowed(conn, spec, notify)
        key = None if found is None else found.key
        params = {**self._one_job(spec, notify), "dedup_key": key}
        insert = rendered(self.schema, "insert")
        if (trace := carrier()) is not None:  # an OpenTelemetry span is current
            params["trace"] = trace
            insert = rendered(self.schema, "insert", traced=True)
        with _migrated(conn, self.schema):
            await self._check_version(conn)
            for _ in range(_TWIN_LOOKUPS):
                cur = await conn.execute(insert, params)
                row = await cur.fetchone()
                if row is not None:
                    return EnqueueResult(int(row[0]))
                twins = await self._live_twins(conn, [key])
                if key in twins:
                    return EnqueueResult(twins[key], duplicate=True)
        raise RuntimeError(f"dedup key {key!r} keeps conflicting with jobs that finish at once")

    def _one_job(self, spec: JobSpec, notify: bool) -> dict[str, Any]:
        """The parameters of one job's insert (`_sql._INSERT`, ``enqueue_unique``)."""
        return {
            "queue": spec.queue,
            "task": spec.task,
            "args": spec.args_json,
            "priority": spec.priority,
            "run_at": spec.run_at,
            "delay": spec.delay,
            "max_attempts": spec.max_attempts,
            "concurrency_key": spec.concurrency_key,
            "notify": notify,
            "channel": self.sql.channel,
        }

    async def _enqueue_windowed(self, conn: Conn, spec: JobSpec, notify: bool) -> EnqueueResult:
        """A job whose key outlives it (a `Unique` with a period): ``enqueue_unique``."""
        found = spec.uniqueness()
        assert found is not None
        params = {**self._one_job(spec, notify), "key": found.key, "period": found.period,
                  "states": list(found.states)}  # fmt: skip
        cur = await conn.execute(self.sql.enqueue_unique, params)
        row = await cur.fetchone()
        assert row is not None
        return EnqueueResult(int(row[0]), duplicate=bool(row[1]))

    async def enqueue_many(
        self, conn: Conn, jobs: Iterable[JobSpec], *, notify: bool = True
    ) -> list[EnqueueResult]:
        """Insert many jobs in a few statements; results are in input order.

        Every job is checked before any SQL (errors name ``jobs[i]``). A batch
        without dedup keys whose jobs differ only in args is one statement (as
        `enqueue_bulk`); other batches without dedup keys reserve their ids, then
        go through COPY; a batch with dedup keys uses one ``INSERT ... SELECT FROM
        unnest`` with ``ON CONFLICT DO NOTHING``. One notification per distinct
        queue (and one ``@scheduled`` for jobs due later), whatever the batch size.
        """
        specs = list(jobs)
        if not specs:
            return []
        limit = self.max_payload_bytes
        for i, spec in enumerate(specs):
            if not isinstance(spec, JobSpec):
                raise TypeError(f"jobs[{i}] must be a JobSpec, got {spec!r}")
            check_payload(spec.args_json, task=spec.task, max_bytes=limit, where=f"jobs[{i}].args")
        if any(spec.after for spec in specs):
            return await self._insert_some_after(conn, specs, notify)
        keys = [spec.effective_dedup_key() for spec in specs]
        windowed = [i for i, s in enumerate(specs) if (u := s.uniqueness()) and u.windowed]
        with _migrated(conn, self.schema):
            await self._check_version(conn)
            trace = carrier()
            if not windowed:
                return await self._insert_specs(conn, specs, keys, notify, trace)
            return await self._insert_mixed(conn, specs, keys, set(windowed), notify, trace=trace)

    async def _insert_graph(
        self, conn: Conn, specs: Sequence[JobSpec], notify: bool
    ) -> list[EnqueueResult]:
        """Jobs with dependencies (`trioq._dependencies`), in one transaction."""
        ids = await self.enqueue_graph(conn, [GraphJob(spec=s) for s in specs], notify=notify)
        return [EnqueueResult(job_id) for job_id in ids]

    async def enqueue_graph(
        self, conn: Conn, jobs: Sequence[GraphJob], *, notify: bool = True
    ) -> list[int]:
        """Insert jobs that may wait for each other (``jobs[i].waits_for``, positions in
        ``jobs``) and for existing jobs (``spec.after``), in one transaction; their ids.
        What `trioq.Workflow` and `trioq.Batch` enqueue through (``docs/workflows.md``)."""
        for i, job in enumerate(jobs):
            check_payload(job.spec.args_json, task=job.spec.task,
                          max_bytes=self.max_payload_bytes, where=f"jobs[{i}].args")  # fmt: skip
        with _migrated(conn, self.schema):
            await self._check_version(conn)
            return await insert_graph(conn, self.sql, jobs, notify=notify)

    async def _insert_some_after(
        self, conn: Conn, specs: list[JobSpec], notify: bool
    ) -> list[EnqueueResult]:
        """A batch where some jobs have dependencies: those through `_insert_graph`, the
        others as usual; in one transaction, results in input order."""
        after = [i for i, spec in enumerate(specs) if spec.after]
        rest = [i for i, spec in enumerate(specs) if not spec.after]
        results: dict[int, EnqueueResult] = {}
        own = conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE
        async with conn.transaction() if own else contextlib.nullcontext():
            if rest:
                done = await self.enqueue_many(conn, [specs[i] for i in rest], notify=notify)
                results.update(zip(rest, done, strict=True))
            done = await self._insert_graph(conn, [specs[i] for i in after], notify)
            results.update(zip(after, done, strict=True))
        return [results[i] for i in range(len(specs))]

    async def _insert_mixed(
        self, conn: Conn, specs: list[JobSpec], keys: list[str | None], windowed: set[int],
        notify: bool, *, trace: str | None,
    ) -> list[EnqueueResult]:  # fmt: skip
        """A batch with unique windows: those one by one (in input order, so the first of
        two twins wins), the rest as usual; all in one transaction."""
        results: list[EnqueueResult | None] = [None] * len(specs)
        rest = [i for i in range(len(specs)) if i not in windowed]
        own = conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE
        async with conn.transaction() if own else contextlib.nullcontext():
            if rest:
                done = await self._insert_specs(
                    conn, [specs[i] for i in rest], [keys[i] for i in rest], notify, trace
                )
                for i, result in zip(rest, done, strict=True):
                    results[i] = result
            for i in sorted(windowed):
                results[i] = await self._enqueue_windowed(conn, specs[i], notify)
        return [r for r in results if r is not None]

    async def _insert_specs(
        self, conn: Conn, specs: list[JobSpec], keys: list[str | None], notify: bool,
        trace: str | None,
    ) -> list[EnqueueResult]:  # fmt: skip
        keyed = any(keys) or any(spec.concurrency_key for spec in specs)
        if not keyed and _only_args_differ(specs):
            ids = await self._insert_bulk(conn, specs[0], _args_runs(specs), notify, trace)
            return [EnqueueResult(job_id) for job_id in ids]
        now, ids = await self._reserve_ids(conn, len(specs))
        run_ats = [spec.run_at or now + spec.delay for spec in specs]
        if keyed:
            inserted = await self._insert_unnest(conn, specs, ids, run_ats, keys, trace=trace)
        else:
            await self._copy(conn, specs, ids, run_ats, now, trace=trace)
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

    async def enqueue_bulk(
        self,
        conn: Conn,
        task: str,
        args: Iterable[JSONValue],
        *,
        queue: str = "default",
        priority: int = 0,
        run_at: dt.datetime | None = None,
        delay: dt.timedelta | float | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        after: Sequence[int] | None = None,
        on_dependency_failure: str = "cancel",
        notify: bool = True,
    ) -> list[int]:
        """Insert one job of ``task`` per item of ``args``; their ids, in input order.

        The jobs share every other field, validated once as for `enqueue`; each
        ``args[i]`` is checked (JSON, no NUL, the payload limit) before any SQL,
        errors naming ``args[i]``. No dedup keys (use `enqueue_many`). The rows go
        in by one statement per 20,000 jobs, in the caller's transaction (or one of
        their own in autocommit), with one notification. With ``after``, every job waits
        for those jobs (as `enqueue`'s ``after``).
        """
        if isinstance(args, str | bytes | Mapping):
            raise TypeError(f"args must be a sequence with one job's args per item, got {args!r}")
        spec = JobSpec(
            task=task, queue=queue, priority=priority, run_at=run_at, delay=delay,
            max_attempts=max_attempts, after=after, on_dependency_failure=on_dependency_failure,
        )  # fmt: skip
        values = args if isinstance(args, Sequence) else list(args)
        runs = encode_args_runs(values, task=spec.task, max_bytes=self.max_payload_bytes)
        if spec.after:
            specs = [attrs.evolve(spec, args=value) for value in values]
            return [r.job_id for r in await self._insert_graph(conn, specs, notify)]
        with _migrated(conn, self.schema):
            await self._check_version(conn)
            return await self._insert_bulk(conn, spec, runs, notify, carrier())

    async def _check_version(self, conn: Conn) -> None:
        """Refuse to enqueue into a schema of another version than this trioq's (a newer
        trioq may have changed what a row means), as ``serve`` refuses to start. Checked
        once per connection; a schema that does not exist is left to the insert to report."""
        if conn in self._current:
            return
        version = await schema_version(conn, self.schema)
        if version is None:
            return
        if version != latest_version():
            await check_schema(conn, self.schema, latest_version(), writable=False)
        self._current[conn] = True

    def _check_payload(self, spec: JobSpec) -> None:
        check_payload(spec.args_json, task=spec.task, max_bytes=self.max_payload_bytes)

    async def _insert_bulk(
        self, conn: Conn, spec: JobSpec, runs: Sequence[tuple[int, str]], notify: bool,
        trace: str | None,
    ) -> list[int]:  # fmt: skip
        """Jobs like ``spec`` with the args in ``runs`` (see `encode_args_runs`): their ids."""
        chunks = _bulk_statements(runs)
        if not chunks:
            return []
        if len(chunks) == 1:
            return await self._insert_bulk_one(conn, spec, *chunks[0], notify, trace=trace)
        ids: list[int] = []
        own = conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE
        async with conn.transaction() if own else contextlib.nullcontext():
            for jobs, text in chunks:
                ids += await self._insert_bulk_one(conn, spec, jobs, text, notify, trace=trace)
        return ids

    async def _insert_bulk_one(
        self, conn: Conn, spec: JobSpec, jobs: int, args_array: str, notify: bool, *,
        trace: str | None,
    ) -> list[int]:  # fmt: skip
        params = {
            "jobs": f"{self.schema}.jobs",
            "args": args_array,
            "queue": spec.queue,
            "task": spec.task,
            "priority": spec.priority,
            "run_at": spec.run_at,
            "delay": spec.delay,
            "max_attempts": spec.max_attempts,
            "channel": self.sql.channel,
            "notify": notify,
            "trace": trace,
        }
        cur = await conn.execute(statements(self.schema, traced=trace is not None).insert_bulk,
                                 params)  # fmt: skip
        row = await cur.fetchone()
        assert row is not None and row[0] == jobs, (row, jobs)
        if row[2] is not None:  # ids not consecutive (another session drew ids meanwhile)
            return list(row[2])
        return list(range(row[1] + 1, row[1] + 1 + jobs))

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
        *,
        trace: str | None,
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
            "trace": trace,
            "concurrency_keys": [s.concurrency_key for s in specs],
        }
        traced = statements(self.schema, traced=trace is not None)
        cur = await conn.execute(traced.insert_many, params)
        return {row[0] for row in await cur.fetchall()}

    async def _copy(
        self,
        conn: Conn,
        specs: Sequence[JobSpec],
        ids: Sequence[int],
        run_ats: Sequence[dt.datetime],
        now: dt.datetime,
        *,
        trace: str | None,
    ) -> None:
        """COPY in text format, rows built by hand: names are validated, args escaped."""
        # the trace context, as the last field of every row (JSON text, escaped like args)
        end = "\n" if trace is None else f"\t{_copy_escape(trace)}\n"
        stamps: dict[dt.datetime, str] = {}  # isoformat() once per distinct run_at
        lines = []
        for job_id, s, run_at in zip(ids, specs, run_ats, strict=True):
            stamp = stamps.get(run_at)
            if stamp is None:
                stamp = stamps[run_at] = run_at.isoformat()
            args = _copy_escape(s.args_json) if "\\" in s.args_json else s.args_json
            lines.append(
                f"{job_id}\t{s.queue}\t{s.task}\t{args}\t{s.priority}\t{stamp}\t"
                f"{'scheduled' if run_at > now else 'available'}\t{s.max_attempts}{end}"
            )
        copy_jobs = statements(self.schema, traced=trace is not None).copy_jobs
        async with conn.cursor() as cur, cur.copy(copy_jobs) as copy:
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
        cur = await conn.execute(claim_query(self.sql.schema), params)
        rows = await cur.fetchall()
        rows.sort(key=_claim_order)  # UPDATE ... RETURNING keeps no order
        return [Job.from_row(row) for row in rows]

    async def heartbeat(
        self, conn: Conn, *, owner: str, leases: Sequence[Lease], lease: dt.timedelta
    ) -> HeartbeatResult:
        """Extend every lease of ``owner`` in one statement; report those it lost."""
        if not leases:
            return HeartbeatResult(
                extended=frozenset(), lost=frozenset(), cancel_requested=frozenset()
            )
        params = {**_fence(leases), "owner": owner, "lease": lease}
        cur = await conn.execute(rendered(self.schema, "heartbeat"), params)
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
            cur = await conn.execute(rendered(self.schema, "complete"), params)
        else:
            params["results"] = [encode_args(r) for r in results]
            cur = await conn.execute(rendered(self.schema, "complete_keep"), params)
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
            "reasons": [f.reason for f in failures],
        }
        cur = await conn.execute(rendered(self.schema, "fail"), params)
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
        cur = await conn.execute(rendered(self.schema, "release"), params)
        return frozenset(row[0] for row in await cur.fetchall())

    async def release_unknown_many(
        self, conn: Conn, *, owner: str, failures: Sequence[Failure], dead_after: dt.timedelta
    ) -> FailResult:
        """Give back jobs whose task the worker does not know, attempt refunded; move those
        unknown for longer than ``dead_after`` to dead_jobs (reason ``unknown task``)."""
        if not failures:
            return FailResult(retried=frozenset(), dead=frozenset())
        params = {
            **_fence([f.lease for f in failures]),
            "owner": owner,
            "errors": [f.error for f in failures],
            "timeout": dead_after,
        }
        cur = await conn.execute(self.sql.release_unknown, params)
        rows = await cur.fetchall()
        return FailResult(
            retried=frozenset(r[0] for r in rows if r[1] == "scheduled"),
            dead=frozenset(r[0] for r in rows if r[1] == "dead"),
            cancelled=frozenset(r[0] for r in rows if r[1] == "cancelled"),
        )

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
        """Cancel a scheduled or available job at once; flag a running one for the runtime,
        and notify its worker (``@cancel:<id>``), which stops the handler at once."""
        cur = await conn.execute(self.sql.cancel, {"id": job_id, "channel": self.sql.channel})
        row = await cur.fetchone()
        assert row is not None
        if row[0]:
            return CancelOutcome("cancelled")
        return CancelOutcome("requested" if row[1] else "not_found")

    async def sweep(self, conn: Conn, *, limit: int = 1000) -> SweepResult:
        """Deal with up to ``limit`` expired leases (jobs of crashed or stalled workers).

        Safe to run from many processes at once: rows are claimed with SKIP LOCKED.
        """
        params = {
            "limit": limit,
            "dead_reason": "lease expired on the last attempt",
            "lost_error": "lease expired: worker lost",
        }
        return _swept(await (await conn.execute(self.sql.sweep, params)).fetchall())

    async def reclaim_dead_workers(self, conn: Conn, *, grace: dt.timedelta) -> SweepResult:
        """Sweep the running jobs of workers that are provably gone, without waiting for their
        leases: no ping for longer than ``grace`` and their liveness lock free (see
        `trioq._worker.services.liveness`). Their rows in ``workers`` are deleted. Safe in every
        process."""
        params = {
            "grace": grace,
            "restart_grace": RESTART_GRACE,
            "space": self.sql.lock_space,
            "dead_reason": "worker died on the last attempt",
            "lost_error": "worker died (its liveness lock was free)",
        }
        return _swept(await (await conn.execute(self.sql.reclaim, params)).fetchall())

    async def notify_queues(self, conn: Conn, queues: Iterable[str]) -> None:
        """One wake-up notification per queue (as enqueue sends them)."""
        payloads = sorted(set(queues))
        if payloads:
            await conn.execute(self.sql.notify, {"channel": self.sql.channel, "queues": payloads})

    # -- scheduled jobs ------------------------------------------------------------------------

    async def promote_due(self, conn: Conn, *, limit: int = 1000, notify: bool = True) -> list[str]:
        """Make up to ``limit`` due scheduled jobs available; the queues that got work.

        Safe to run from many processes at once (SKIP LOCKED). With ``notify``,
        one notification per queue that got work wakes the workers.
        """
        params = {"limit": limit, "notify": notify, "channel": self.sql.channel}
        cur = await conn.execute(self.sql.promote, params)
        return sorted(row[0] for row in await cur.fetchall())

    async def clock(self, conn: Conn) -> dt.datetime:
        """The database's clock (`trioq._db.statements.NOW`): what every statement takes for now."""
        cur = await conn.execute(self.sql.clock)
        row = await cur.fetchone()
        assert row is not None
        return row[0]  # type: ignore[no-any-return]

    async def next_due(self, conn: Conn) -> dt.timedelta | None:
        """How long until the earliest scheduled job is due (negative if overdue), or None."""
        cur = await conn.execute(self.sql.next_due)
        row = await cur.fetchone()
        return None if row is None else row[0]

    # -- status --------------------------------------------------------------------------------

    async def status(
        self, conn: Conn, *, cap: int | None = None
    ) -> tuple[list[QueueStatus], list[WorkerLeases]]:
        """Per queue counts and the oldest wait; live leases per worker.

        ``cap=None`` counts every job (a read of the whole jobs table: it grows with the
        backlog). With a ``cap``, each count per queue and state is exact up to ``cap`` and
        stops there (`QueueStatus.at_cap` names those), read through the indexes at a
        bounded cost whatever the backlog (`trioq._obs.depth`, as the metrics do); the oldest
        wait is then that of the queue's next job to be claimed.
        """
        if cap is None:
            cur = await conn.execute(self.sql.status_queues)
            queues = [
                QueueStatus(queue=q, available=a, scheduled=s, running=r, dead=d,
                            oldest_wait_seconds=None if w is None else float(w), waiting=waiting)
                for q, a, s, r, d, w, waiting in await cur.fetchall()
            ]  # fmt: skip
        else:
            queues = await self._capped_status(conn, _check_cap(cap))
        cur = await conn.execute(self.sql.status_leases)
        leases = [
            WorkerLeases(worker=w, running=n, next_expiry_seconds=e.total_seconds())
            for w, n, e in await cur.fetchall()
        ]
        return queues, leases

    async def _capped_status(self, conn: Conn, cap: int) -> list[QueueStatus]:
        depths = await read_depths(conn, obs_statements(self.schema), cap)
        names = sorted({queue for queue, _ in depths.counts})

        def count(queue: str, state: str) -> int:
            return depths.counts.get((queue, state), 0)

        return [
            QueueStatus(
                queue=q, available=count(q, "available"), scheduled=count(q, "scheduled"),
                running=count(q, "running"), dead=count(q, "dead"),
                oldest_wait_seconds=depths.head_wait.get(q), waiting=count(q, "waiting"),
                at_cap=tuple(s for s in STATUS_STATES if count(q, s) >= cap),
            )
            for q in names
        ]  # fmt: skip

    # -- results (trioq._result) ----------------------------------------------------------------

    async def dependencies(self, conn: Conn, job_id: int) -> list[Dependency]:
        """The jobs job ``job_id`` waits (or waited) for, and what became of each
        (docs/workflows.md)."""
        return await read_dependencies(conn, self.sql, job_id)

    async def job_status(self, conn: Conn, job_id: int) -> JobStatus:
        """Where the job is in its life: every state, ``unknown`` when there is no such job."""
        return await read_job_status(conn, self.sql, job_id)

    async def result(
        self,
        conn: Conn,
        job_id: int,
        *,
        timeout: float | dt.timedelta | None = None,  # noqa: ASYNC109 - see docs/results.md
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> JSONValue:
        """The job's kept result, waiting for the job to finish if it has not.

        Raises `JobDeadError` or `JobCancelledError` (with the job's last error),
        or `JobNotFoundError` (no such job, or one that kept no result). A pending
        job is waited for with LISTEN on ``conn`` (autocommit, outside a
        transaction), re-read every ``poll_interval`` seconds should a
        notification be lost. ``timeout``: `trio.TooSlowError` after that many
        seconds, as ``with trio.fail_after(timeout)`` around the call would.
        """
        return await wait_result(
            conn, self.sql, job_id, timeout=timeout, poll_interval=poll_interval
        )

    # -- flow control (trioq._flow, docs/flow-control.md) --------------------------------------

    async def queue_settings(
        self, conn: Conn, names: Sequence[str] | None = None
    ) -> list[QueueSettings]:
        """The stored settings of ``names`` (default: every queue that has any), by name."""
        with _migrated(conn, self.schema):
            return await read_settings(conn, self.sql, names)

    async def pause(self, conn: Conn, queue: str) -> QueueSettings:
        """Stop every worker from claiming from ``queue`` (running jobs finish; enqueueing
        goes on). Stored, so it outlives restarts; workers hear of it by notification."""
        return await self._change(conn, queue, {"paused": True})

    async def resume(self, conn: Conn, queue: str) -> QueueSettings:
        """Let workers claim from ``queue`` again."""
        return await self._change(conn, queue, {"paused": False})

    async def set_limits(
        self,
        conn: Conn,
        queue: str,
        *,
        global_concurrency: int | Unset | None = UNSET,
        rate_limit: RateLimit | str | Unset | None = UNSET,
        key_concurrency: int | Unset | None = UNSET,
        key_rate_limit: RateLimit | str | Unset | None = UNSET,
    ) -> QueueSettings:
        """Change the limits of ``queue`` that are given (None removes one); the others stay.

        Takes effect for every claim that starts after the caller commits, in every process.
        """
        given = {
            "global_concurrency": global_concurrency,
            "rate_limit": rate_limit,
            "key_concurrency": key_concurrency,
            "key_rate_limit": key_rate_limit,
        }
        return await self._change(conn, queue, {k: v for k, v in given.items() if v is not UNSET})

    async def _change(self, conn: Conn, queue: str, changes: dict[str, Any]) -> QueueSettings:
        with _migrated(conn, self.schema):
            return await change_settings(conn, self.sql, queue, changes)

    async def claim_limited(
        self, conn: Conn, queue: str, *, owner: str, limit: int, lease: dt.timedelta
    ) -> LimitedClaim:
        """`claim` for a queue with settings: within its limits, nothing while paused, and
        why it took fewer than ``limit``. (`claim` takes nothing from such a queue.)"""
        return await claim_limited(conn, self.sql, queue, owner=owner, limit=limit, lease=lease)

    # -- dead letters --------------------------------------------------------------------------

    async def dead_list(
        self, conn: Conn, where: DeadFilter | None = None, *, limit: int = 100
    ) -> list[DeadJob]:
        return await list_dead(conn, self.sql, where or DeadFilter(), limit=limit)

    async def dead_retry(self, conn: Conn, where: DeadFilter | None = None) -> list[int]:
        return await retry_dead(conn, self.sql, where or DeadFilter())

    async def dead_purge(
        self,
        conn: Conn,
        where: DeadFilter | None = None,
        *,
        before: dt.datetime | None = None,
        older_than: dt.timedelta | None = None,
    ) -> list[int]:
        """Delete matching dead jobs; with ``before``, only those that died before it; with
        ``older_than``, only those that died longer ago than that by the database's clock."""
        return await purge_dead(
            conn, self.sql, where or DeadFilter(), before=before, older_than=older_than
        )


def _swept(rows: Sequence[tuple[Any, ...]]) -> SweepResult:
    by_kind: dict[str, set[int]] = {"dead": set(), "cancelled": set(), "available": set()}
    for job_id, kind, _queue in rows:
        by_kind[kind].add(job_id)
    return SweepResult(
        returned=frozenset(by_kind["available"]),
        dead=frozenset(by_kind["dead"]),
        cancelled=frozenset(by_kind["cancelled"]),
        queues=frozenset(queue for _id, kind, queue in rows if kind == "available"),
    )


#: The counted states of `QueueStatus`, in its order (the names `QueueStatus.at_cap` uses).
STATUS_STATES = ("available", "scheduled", "running", "dead", "waiting")
#: The largest cap `Queue.status` takes (above it a capped count costs what an exact one does).
MAX_STATUS_CAP = 1_000_000


def _check_cap(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"cap must be an int or None, got {value!r}")
    if not 1 <= value <= MAX_STATUS_CAP:
        raise ValueError(f"cap must be between 1 and {MAX_STATUS_CAP:,}, got {value}")
    return value


def _claim_order(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """priority, run_at, id of a claimed row (`Job.COLUMNS`)."""
    return (row[4], row[5], row[0])


def _fence(leases: Sequence[Lease]) -> dict[str, list[int]]:
    return {
        "ids": [lease.job_id for lease in leases],
        "attempts": [lease.attempt for lease in leases],
    }


def _only_args_differ(specs: Sequence[JobSpec]) -> bool:
    """Whether all ``specs`` share the first one's fields but args (one bulk statement fits)."""
    f = specs[0]
    return all(
        s.task == f.task
        and s.queue == f.queue
        and s.priority == f.priority
        and s.run_at == f.run_at
        and s.delay == f.delay
        and s.max_attempts == f.max_attempts
        for s in specs
    )


def _args_runs(specs: Sequence[JobSpec]) -> list[tuple[int, str]]:
    """The specs' (already encoded) args as runs, like `encode_args_runs` returns them: up to
    `ENCODE_CHUNK` jobs per run, or one per run where that would make a run too long for one
    statement (``max_payload_bytes`` allows 1 MiB per job)."""
    runs: list[tuple[int, str]] = []
    for start in range(0, len(specs), ENCODE_CHUNK):
        texts = [spec.args_json for spec in specs[start : start + ENCODE_CHUNK]]
        if sum(map(len, texts)) <= _BULK_STATEMENT_CHARS:
            runs.append((len(texts), ",".join(texts)))
        else:
            runs.extend((1, text) for text in texts)
    return runs


def _bulk_statements(runs: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
    """Runs of comma-separated JSON args grouped into statements: (jobs, JSON array text)."""
    statements: list[tuple[int, str]] = []
    parts: list[str] = []
    jobs = chars = 0
    for n, text in runs:
        if parts and (jobs + n > _BULK_STATEMENT_JOBS or chars + len(text) > _BULK_STATEMENT_CHARS):
            statements.append((jobs, f"[{','.join(parts)}]"))
            parts, jobs, chars = [], 0, 0
        parts.append(text)
        jobs += n
        chars += len(text)
    if parts:
        statements.append((jobs, f"[{','.join(parts)}]"))
    return statements


def _copy_escape(text: str) -> str:
    """Escape for COPY text format. JSON text has no raw control characters."""
    return text.replace("\\", "\\\\")


@contextlib.contextmanager
def _migrated(conn: Conn, schema: str) -> Iterator[None]:
    """Say what to run when trioq's tables are missing, not 'relation does not exist'
    (the same words as `check_schema`)."""
    try:
        yield
    except psycopg.errors.UndefinedTable as ex:
        raise SchemaMissingError(
            f"schema {schema!r} in database {conn.info.dbname!r} has no trioq tables: "
            "run `trioq migrate`"
        ) from ex
