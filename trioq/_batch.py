"""`trioq.Batch`: jobs enqueued together, and one callback job once every one has ended.

::

    batch = trioq.Batch(jobs=[resize.spec(image_id=i) for i in ids],
                        callback=report.spec(album=7))
    enqueued = await batch.enqueue(conn)      # one transaction: the batch row and its jobs

When the last job of the batch ends (done, dead or cancelled), the transaction that ends
it also enqueues the callback, its args extended with the counts::

    {"album": 7, "batch": {"id": 3, "total": 10, "succeeded": 8, "failed": 1, "cancelled": 1}}

Exactly once: each member counts itself down in the ``batches`` row under its row lock, in
the transaction of the write that ends it (``batch_members_ended`` in
``migrations/0008_workflows.sql``), so the last two ending at once in two workers take it
to 1 and to 0, and only the one at 0 enqueues. A member is counted once: a job ends once
(one brought back from dead_jobs by ``dead retry`` is a new job, outside the batch).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterable
from typing import Any

import attrs
from psycopg.pq import TransactionStatus

from ._db.adapters import tuple_rows
from ._db.insert import GraphJob
from ._enqueue import DEFAULT_QUEUE
from ._exceptions import WorkflowError
from ._job import JobSpec, check_job_id
from ._pg.conn import Conn
from ._queue import Queue

__all__ = ["MAX_BATCH_JOBS", "Batch", "BatchStatus", "EnqueuedBatch", "batch_status"]

#: Most jobs one batch may have (all enqueued in one transaction).
MAX_BATCH_JOBS = 100_000


def _jobs(value: Iterable[JobSpec]) -> tuple[JobSpec, ...]:
    if isinstance(value, str | bytes | JobSpec):
        raise TypeError(f"jobs must be a list of JobSpec, got {value!r}")
    jobs = tuple(value)
    if len(jobs) > MAX_BATCH_JOBS:
        raise WorkflowError(f"a batch may have at most {MAX_BATCH_JOBS} jobs, got {len(jobs)}")
    for i, job in enumerate(jobs):
        if not isinstance(job, JobSpec):
            raise TypeError(f"jobs[{i}] must be a JobSpec, got {job!r}")
        if job.uniqueness() is not None:
            raise WorkflowError(f"jobs[{i}] has a dedup_key or is unique: jobs of a batch "
                                "cannot be (each must be inserted to be counted)")  # fmt: skip
    return jobs


def _check_callback(_inst: object, _attr: attrs.Attribute[Any], spec: JobSpec) -> None:
    if not isinstance(spec, JobSpec):
        raise TypeError(f"callback must be a JobSpec, got {spec!r}")
    if not isinstance(spec.args, dict):
        raise TypeError(f"callback args must be an object (the counts are added to it), got "
                        f"{spec.args!r}")  # fmt: skip
    if "batch" in spec.args:
        raise ValueError("callback args must not have a 'batch' key: the counts go there")
    unsupported = {
        "after": bool(spec.after), "run_at": spec.run_at is not None, "delay": bool(spec.delay),
        "dedup_key/unique": spec.uniqueness() is not None,
    }  # fmt: skip
    given = [name for name, is_set in unsupported.items() if is_set]
    if given:
        raise ValueError(f"callback: {', '.join(given)} cannot be set on a batch's callback "
                         "(it is enqueued when the batch ends)")  # fmt: skip


@attrs.frozen(kw_only=True)
class EnqueuedBatch:
    batch_id: int
    job_ids: tuple[int, ...]
    #: Set at once for an empty batch (its callback is enqueued with it); otherwise None
    #: until the batch ends (`batch_status` reads it).
    callback_job_id: int | None = None


@attrs.frozen(kw_only=True)
class BatchStatus:
    """A batch as `trioq.batch_status` read it: its counts so far, and its callback's job
    once enqueued (``finished_at`` is when the last member ended)."""

    id: int
    total: int
    pending: int
    succeeded: int
    failed: int
    cancelled: int
    callback_task: str
    callback_job_id: int | None
    created_at: dt.datetime
    finished_at: dt.datetime | None

    @property
    def finished(self) -> bool:
        return self.pending == 0


@attrs.frozen(kw_only=True)
class Batch:
    """Jobs enqueued together, and a callback enqueued once they have all ended (see the
    module docs). The callback's args must be an object without a ``batch`` key."""

    jobs: tuple[JobSpec, ...] = attrs.field(converter=_jobs)
    callback: JobSpec = attrs.field(validator=_check_callback)

    async def enqueue(
        self, conn: Conn, *, queue: Queue | None = None, notify: bool = True
    ) -> EnqueuedBatch:
        """Insert the batch and its jobs on ``conn`` in one transaction (the caller's if one
        is open). An empty batch enqueues its callback at once, with counts of 0."""
        q = queue if queue is not None else DEFAULT_QUEUE
        conn = tuple_rows(conn)
        own = conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE
        async with conn.transaction() if own else contextlib.nullcontext():
            cur = await conn.execute(q.sql.insert_batch, self._row(len(self.jobs)))
            row = await cur.fetchone()
            assert row is not None
            batch_id = int(row[0])
            if not self.jobs:
                return await self._empty(conn, q, batch_id, notify)
            ids = await q.enqueue_graph(
                conn, [GraphJob(spec=spec, batch_id=batch_id) for spec in self.jobs],
                notify=notify,
            )  # fmt: skip
        return EnqueuedBatch(batch_id=batch_id, job_ids=tuple(ids))

    def _row(self, total: int) -> dict[str, Any]:
        cb = self.callback
        return {"total": total, "queue": cb.queue, "task": cb.task, "args": cb.args_json,
                "priority": cb.priority, "max_attempts": cb.max_attempts,
                "concurrency_key": cb.concurrency_key}  # fmt: skip

    async def _empty(self, conn: Conn, q: Queue, batch_id: int, notify: bool) -> EnqueuedBatch:
        counts = {"id": batch_id, "total": 0, "succeeded": 0, "failed": 0, "cancelled": 0}
        cb = self.callback
        result = await q.enqueue(
            conn, cb.task, {**cb.args, "batch": counts}, queue=cb.queue, priority=cb.priority,
            max_attempts=cb.max_attempts, concurrency_key=cb.concurrency_key, notify=notify,
        )  # fmt: skip
        await conn.execute(q.sql.finish_empty_batch, {"id": batch_id, "job_id": result.job_id})
        return EnqueuedBatch(batch_id=batch_id, job_ids=(), callback_job_id=result.job_id)


async def batch_status(
    conn: Conn, batch_id: int, *, queue: Queue | None = None
) -> BatchStatus | None:
    """The batch's counts and callback, or None if there is no such batch (or it was pruned,
    ``Config.retain_done`` after it ended)."""
    check_job_id(batch_id, "batch_id")
    q = queue if queue is not None else DEFAULT_QUEUE
    cur = await tuple_rows(conn).execute(q.sql.batch_status, {"id": batch_id})
    row = await cur.fetchone()
    if row is None:
        return None
    names = [f.name for f in attrs.fields(BatchStatus)]
    return BatchStatus(**dict(zip(names, row, strict=True)))
