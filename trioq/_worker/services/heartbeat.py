"""The heartbeat: one statement per interval extends every lease this process holds.

A lease the statement could not extend was reclaimed (it expired and another worker
took the job): its handler is cancelled at once, its outcome is not ours to write.
A job whose cancellation was requested has its handler stopped.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

import attrs
import trio

from ..._db.driver import Driver
from ..._hooks import fields
from ..._job import Lease
from ..._pg.pool import Pool
from ..leases import HeldJob, HeldJobs
from ..wakeup import Wakeup
from .loop import every

__all__ = ["Heartbeat", "HeartbeatRound"]

logger = logging.getLogger("trioq.runtime")


@attrs.frozen(kw_only=True)
class HeartbeatRound:
    """What one round did."""

    extended: int  # leases extended
    lost: tuple[Lease, ...]  # reclaimed by another worker: their handlers were cancelled
    cancelled: tuple[Lease, ...]  # a cancel was requested: their handlers were stopped


class Heartbeat:
    def __init__(
        self, pool: Pool, driver: Driver, held: HeldJobs, *, owner: str, lease: float,
        interval: float, on_lost: Callable[[HeldJob], None] | None = None,
    ) -> None:  # fmt: skip
        self._pool = pool
        self._on_lost = on_lost  # a lease was found taken (after its handler was cancelled)
        self._driver = driver
        self._held = held
        self._owner = owner
        self._lease = dt.timedelta(seconds=lease)
        self.interval = interval
        self._wakeup = Wakeup()

    def wake(self) -> None:
        """Run a round now (the worker was taken for dead: which of its leases are lost?)."""
        self._wakeup.set()

    async def run(self) -> None:
        """Every ``interval`` (or when woken), one round; a failed round is logged and the
        next one tries."""
        await every(self.interval, self.run_once, failed="heartbeat failed",
                    wakeup=self._wakeup, wait_first=True)  # fmt: skip

    async def run_once(self) -> HeartbeatRound:
        """Extend every held lease; cancel the handlers of those lost or asked to stop."""
        leases = self._held.leases()
        if not leases:
            await trio.lowlevel.checkpoint()
            return HeartbeatRound(extended=0, lost=(), cancelled=())
        async with self._pool.connection() as conn:
            beat = await self._driver.heartbeat(
                conn, owner=self._owner, leases=leases, lease=self._lease
            )
        lost = []
        for lease in sorted(beat.lost, key=lambda le: le.job_id):
            if (held := self._held.lose(lease)) is not None:
                claimed = held.job
                logger.warning("job %d (%s) attempt %d lost its lease: cancelling its handler",
                               claimed.id, claimed.task, lease.attempt,
                               extra=fields(claimed.id, claimed.task, claimed.queue,
                                            lease.attempt))  # fmt: skip
                lost.append(lease)
                if self._on_lost is not None:
                    self._on_lost(held)
        cancelled = []
        for lease in sorted(beat.cancel_requested, key=lambda le: le.job_id):
            if (job := self._held.get(lease)) is not None:
                job.abort("cancel")
                cancelled.append(lease)
        extended = len(beat.extended)
        return HeartbeatRound(extended=extended, lost=tuple(lost), cancelled=tuple(cancelled))
