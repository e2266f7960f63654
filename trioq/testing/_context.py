"""`job_context` and `call`: a handler called directly in a unit test, no worker running.

The context is a real `trioq.JobContext` around a `trioq.Job` built from the given
fields (args go through JSON, as a worker would decode them). Without ``conn`` it has no
database: ``job.connection()``, ``job.transaction()`` and ``job.enqueue()`` raise
`RuntimeError` saying so. With ``conn`` they use that connection: ``job.enqueue()``
inserts real jobs, ``job.connection()`` yields ``conn``, and ``job.transaction()`` runs
a real transaction on it (a savepoint if one is open) whose completion of the job is
pretended, since no job row exists: the block commits, and
``context.completed_in_transaction`` is then True. (`trioq.testing.drain` runs the real
completion.)
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import attrs
import trio

from .._context import JobContext, JobServices
from .._job import (
    DEFAULT_MAX_ATTEMPTS,
    Job,
    JSONValue,
    Lease,
    args_or_empty,
    check_job_id,
    check_max_attempts,
    check_priority,
    check_queue_name,
    check_task_name,
    encode_args,
)
from .._pg.connection import TrioConnection
from .._pg.pool import Pool
from .._queue import Queue
from .._registry import Task
from ._drain import SharedConnection

__all__ = ["call", "job_context"]

OWNER = "trioq.testing.job_context"


def job_context(
    task: str | Task = "task",
    args: JSONValue = None,
    *,
    id: int = 1,
    attempt: int = 1,
    max_attempts: int | None = None,
    queue: str | None = None,
    priority: int = 0,
    run_at: dt.datetime | None = None,
    enqueued_at: dt.datetime | None = None,
    conn: TrioConnection[Any] | None = None,
    schema: str = "trioq",
) -> JobContext:
    """A `trioq.JobContext` for calling a handler directly; see the module docs.

    ``task`` is a name or a registered `trioq.Task` (whose queue and max_attempts are the
    defaults). Times default to now (UTC).
    """
    name = task.name if isinstance(task, Task) else check_task_name(task)
    maximum = max_attempts if max_attempts is not None else (
        task.max_attempts if isinstance(task, Task) else DEFAULT_MAX_ATTEMPTS
    )  # fmt: skip
    check_max_attempts(maximum)
    if not 1 <= check_job_id(attempt, "attempt") <= maximum:
        raise ValueError(f"attempt must be between 1 and max_attempts ({maximum}), got {attempt}")
    now = dt.datetime.now(dt.UTC)
    job = Job(
        id=check_job_id(id, "id"),
        queue=check_queue_name(queue if queue is not None else getattr(task, "queue", "default")),
        task=name,
        args=json.loads(encode_args(args_or_empty(args))),
        priority=check_priority(priority),
        run_at=run_at or now,
        attempt=attempt,
        max_attempts=maximum,
        enqueued_at=enqueued_at or now,
        lease_expires_at=now + dt.timedelta(minutes=5),
    )
    pool: Pool = _NoDatabase() if conn is None else SharedConnection(conn)
    services = JobServices(
        app_pool=pool, queue=_PretendCompletion(schema=schema), owner=OWNER,
        committing=_nothing
    )
    return JobContext(job, services)


async def call(task: Task, args: JSONValue = None, **context: Any) -> Any:
    """Call ``task``'s handler with a `job_context` (``context`` are its keyword arguments)
    and the args, as a worker would, and return what it returns. Its exceptions propagate;
    a sync handler runs in a thread."""
    ctx = job_context(task, args, **context)
    kwargs = ctx.job.args
    if isinstance(kwargs, dict):
        bound = functools.partial(task.fn, ctx, **kwargs)
    else:
        bound = functools.partial(task.fn, ctx, kwargs)
    if task.is_async:
        return await bound()
    return await trio.to_thread.run_sync(bound)


def _nothing(lease: Lease) -> AbstractContextManager[None]:
    """No heartbeat to stop."""
    return contextlib.nullcontext()


class _NoDatabase(Pool):
    def __init__(self) -> None:
        super().__init__("", max_size=1)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[TrioConnection[Any]]:
        raise RuntimeError(
            "this JobContext has no database: pass conn= to trioq.testing.job_context "
            "(or run the job with trioq.testing.drain)"
        )
        yield  # pragma: no cover - makes this a generator


@attrs.frozen(kw_only=True)
class _PretendCompletion(Queue):
    """The queue of a unit context: enqueues for real; "completes" the job, which has no row."""

    async def complete_many(
        self,
        conn: Any,
        *,
        owner: str,
        leases: Sequence[Lease],
        results: Sequence[JSONValue] | None = None,
    ) -> frozenset[int]:
        return frozenset(lease.job_id for lease in leases)
