"""What a handler gets besides its args: the job's identity and a few powers."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, NoReturn

from ._exceptions import LeaseLostError, Snooze
from ._job import EnqueueResult, Job, JSONValue
from ._queue import Lease

if TYPE_CHECKING:
    from ._pg import TrioConnection
    from ._runtime import Runtime

__all__ = ["JobContext"]


class JobContext:
    """The running job: ``job.id``, ``job.attempt``, ``job.queue``, ... and helpers."""

    def __init__(self, job: Job, runtime: Runtime) -> None:
        self.job = job
        self._runtime = runtime
        self.completed_in_transaction = False

    @property
    def id(self) -> int:
        return self.job.id

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def max_attempts(self) -> int:
        return self.job.max_attempts

    @property
    def queue(self) -> str:
        return self.job.queue

    @property
    def task(self) -> str:
        return self.job.task

    @property
    def enqueued_at(self) -> dt.datetime:
        return self.job.enqueued_at

    @property
    def lease(self) -> Lease:
        return Lease(self.job.id, self.job.attempt)

    def snooze(self, delay: dt.timedelta | float) -> NoReturn:
        """Stop now and run again after ``delay``; this attempt does not count."""
        seconds = delay if isinstance(delay, dt.timedelta) else dt.timedelta(seconds=delay)
        if seconds < dt.timedelta(0):
            raise ValueError(f"snooze delay must not be negative, got {delay}")
        raise Snooze(seconds)

    async def enqueue(self, task: str, args: JSONValue = None, **options: Any) -> EnqueueResult:
        """Enqueue another job (committed at once, independently of this job)."""
        async with self._runtime.app_pool.connection() as conn:
            return await self._runtime.queue.enqueue(conn, task, args, **options)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[TrioConnection[Any]]:
        """A pooled connection (autocommit) for work that is not the job's outcome."""
        async with self._runtime.app_pool.connection() as conn:
            yield conn

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[TrioConnection[Any]]:
        """A transaction that also completes this job: exactly-once effects.

        Do the job's database writes on the yielded connection; when the block
        ends without error, the job is completed (fenced by its lease) in the
        same transaction. If the lease was lost meanwhile, the transaction rolls
        back and `LeaseLostError` is raised, so the writes happen once even when
        the job runs twice.
        """
        runtime = self._runtime
        async with runtime.app_pool.connection() as conn, conn.transaction():
            yield conn
            done = await runtime.queue.complete_many(
                conn, owner=runtime.config.worker_id, leases=[self.lease]
            )
            if self.lease.job_id not in done:
                raise LeaseLostError(f"job {self.id} attempt {self.attempt}: lease lost")
            # Stop heartbeating before COMMIT: a heartbeat racing the commit would find
            # the row gone and take the lease for lost. (If COMMIT fails, the lease
            # simply expires and the sweeper returns the job.)
            runtime.forget(self.lease)
        self.completed_in_transaction = True
