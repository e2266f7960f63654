"""The load of `trioq stress`: a prefilled backlog, or a producer at a fixed rate.

Every id the queue hands back is kept in `IdRanges` (runs of consecutive ids: a few
integers per batch, whatever the job count), which the verification expands in SQL.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

import attrs
import psycopg
import trio
from psycopg import sql

from .._db.statements import qualified
from .._job import JobSpec
from .._queue import Queue

__all__ = ["MAX_ATTEMPTS", "QUEUE", "TASK", "IdRanges", "Producer", "Workload", "enqueue_backlog"]

logger = logging.getLogger("trioq.stress")

#: The workload's one task and queue (the workers serve it: `trioq._stress.app`).
QUEUE = "stress"
TASK = "trioq.stress"
#: Chaos spends attempts (a killed worker's jobs); the workload itself never fails.
MAX_ATTEMPTS = 1000
#: A run cut off by chaos (its connection terminated) is retried soon.
RETRY_DELAY = 0.1
#: Jobs per `Queue.enqueue_many` call (and the most a steady tick enqueues at once).
CHUNK = 5000
#: How often the steady producer wakes to enqueue what it owes.
TICK = 0.02
ERROR_BACKOFF = 0.2


@attrs.frozen(kw_only=True)
class Workload:
    """What each job looks like."""

    work_ms: float = 0.0
    payload_bytes: int = 0

    def specs(self, first_seq: int, n: int) -> Iterator[JobSpec]:
        pad = "x" * self.payload_bytes
        for seq in range(first_seq, first_seq + n):
            args: dict[str, Any] = {"seq": seq, "work_ms": self.work_ms}
            if pad:
                args["pad"] = pad
            yield JobSpec(task=TASK, args=args, queue=QUEUE, max_attempts=MAX_ATTEMPTS)


@attrs.define
class IdRanges:
    """A set of job ids as sorted-on-arrival runs ``[lo, hi]``; bounded by runs, not ids."""

    los: list[int] = attrs.field(factory=list)
    his: list[int] = attrs.field(factory=list)
    count: int = 0

    def add(self, ids: Iterable[int]) -> None:
        for job_id in ids:
            if self.his and job_id == self.his[-1] + 1:
                self.his[-1] = job_id
            else:
                self.los.append(job_id)
                self.his.append(job_id)
            self.count += 1


async def enqueue_backlog(
    conn: Any, queue: Queue, workload: Workload, jobs: int, ids: IdRanges
) -> float:
    """Enqueue ``jobs`` jobs in one transaction (visible at once); the seconds it took.

    ``ANALYZE`` runs in the same transaction after the clock stops, so the workers plan
    their claims with statistics of the backlog (a long-lived queue table has them).
    """
    async with conn.transaction():
        start = trio.current_time()
        for first in range(0, jobs, CHUNK):
            results = await queue.enqueue_many(
                conn, workload.specs(first, min(CHUNK, jobs - first))
            )
            ids.add(r.job_id for r in results)
        elapsed = trio.current_time() - start
        await conn.execute(sql.SQL("ANALYZE {}").format(qualified(queue.schema, "jobs")))
    return elapsed


@attrs.define
class Producer:
    """Enqueues ``rate`` jobs/s for ``duration`` s, credited on elapsed time, not on ticks.

    Each tick enqueues what is owed by then (``floor(rate * elapsed) - produced``) in one
    transaction, so a slow enqueue is made up at the next tick instead of lowering the rate.
    """

    queue: Queue
    workload: Workload
    rate: float
    duration: float
    ids: IdRanges
    produced: int = 0
    errors: int = 0
    max_lag: float = 0.0  # seconds' worth of jobs owed at the worst tick
    started_at: float | None = None
    finished_at: float | None = None
    done: trio.Event = attrs.field(factory=trio.Event)
    _conn: Any = None

    @property
    def elapsed(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at

    @property
    def target(self) -> int:
        return math.floor(self.rate * self.duration)

    async def run(self, connect: Callable[[], Awaitable[Any]]) -> None:
        """Produce until the target is met; ``connect()`` opens a connection (autocommit)."""
        self.started_at = start = trio.current_time()
        try:
            while self.produced < self.target:
                elapsed = min(trio.current_time() - start, self.duration)
                owed = min(math.floor(self.rate * elapsed), self.target) - self.produced
                self.max_lag = max(self.max_lag, owed / self.rate)
                if owed > 0:
                    await self._enqueue(connect, min(owed, CHUNK))
                ticks = math.floor((trio.current_time() - start) / TICK) + 1
                await trio.sleep_until(start + ticks * TICK)
        finally:
            await self._close()
        self.finished_at = trio.current_time()
        self.done.set()

    async def _enqueue(self, connect: Callable[[], Awaitable[Any]], n: int) -> None:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = await connect()
            async with self._conn.transaction():
                results = await self.queue.enqueue_many(
                    self._conn, self.workload.specs(self.produced, n)
                )
        except psycopg.OperationalError as ex:
            # The commit may or may not have happened: those ids are unknown to the
            # verification, which reports jobs it saw executed but never enqueued.
            self.errors += 1
            logger.warning("enqueue of %d jobs failed: %s", n, ex)
            await self._close()
            await trio.sleep(ERROR_BACKOFF)
            return
        self.ids.add(r.job_id for r in results)
        self.produced += n

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with trio.move_on_after(1, shield=True):
                await conn.close()
