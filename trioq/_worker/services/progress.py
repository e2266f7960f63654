"""The progress writer: one statement per interval writes the latest progress of every job of
this process that reported some since the last round (docs/progress.md).

``job.progress()`` only records the value in memory (`trioq._progress.ProgressBuffer`), so a
handler that reports in a tight loop costs the database one write per job per
``Config.progress_interval``, the latest value winning. The statement is fenced by the lease
like every write after the claim: a job whose lease was lost writes nothing, and its value
is dropped. A round that fails (the database) leaves every value pending: the next round
writes the latest of them; nothing is raised to the handler. A value the schema refuses
(`trioq._progress.REFUSED`: it cannot happen to a value `job.progress()` took, but the
schema is the last word) is dropped alone, after the others are written one by one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import attrs
import trio

from ..._db.driver import Driver
from ..._job import Lease
from ..._pg.conn import Conn
from ..._pg.pool import Pool
from ..._progress import REFUSED, ProgressBuffer
from .loop import every

__all__ = ["ProgressRound", "ProgressWriter"]

logger = logging.getLogger("trioq.runtime")


@attrs.frozen(kw_only=True)
class ProgressRound:
    """What one round did."""

    written: int  # jobs whose progress was written
    fenced: int  # values dropped: the job's lease was no longer this process's


class ProgressWriter:
    def __init__(
        self, pool: Pool, driver: Driver, buffer: ProgressBuffer, *, owner: str, interval: float,
        committing: Callable[[Lease], bool] | None = None,
    ) -> None:  # fmt: skip
        self._pool = pool
        #: Whether a job's own transaction commits its completion now (`trioq._worker.leases.
        #: HeldJobs.is_committing`): its row is locked until then, and the write would wait.
        self._committing = committing
        self._driver = driver
        self._buffer = buffer
        self._owner = owner
        self.interval = interval
        self.written = 0  # values written, for the metrics and tests
        self.rounds = 0  # rounds that wrote something

    async def run(self) -> None:
        """Every ``interval``, one round; a failed round is logged and the next one tries."""
        await every(self.interval, self.run_once, failed="writing job progress failed",
                    wait_first=True)  # fmt: skip

    async def run_once(self) -> ProgressRound:
        """Write every pending value in one fenced statement."""
        pending = self._buffer.snapshot()
        if self._committing is not None:  # their rows are locked by their own commit: later
            pending = [(lease, text) for lease, text in pending if not self._committing(lease)]
        if not pending:
            await trio.lowlevel.checkpoint()
            return ProgressRound(written=0, fenced=0)
        async with self._pool.connection() as conn:
            try:
                written = await self._write(conn, pending)
            except REFUSED:  # one value the schema refuses must not hold the others back
                written = set()
                for one in pending:
                    try:
                        written |= await self._write(conn, [one])
                    except REFUSED as ex:
                        logger.warning("job %d: its progress cannot be stored (%s): dropped",
                                       one[0].job_id, ex)  # fmt: skip
        self._buffer.written(pending)
        for lease, _ in pending:
            if lease.job_id not in written:  # not ours any more (lost, or its outcome written)
                self._buffer.forget(lease)
        self.written += len(written)
        self.rounds += 1
        return ProgressRound(written=len(written), fenced=len(pending) - len(written))

    async def _write(self, conn: Conn, pending: Sequence[tuple[Lease, str]]) -> set[int]:
        ids = await self._driver.progress_many(
            conn, owner=self._owner, leases=[lease for lease, _ in pending],
            values=[text for _, text in pending],
        )  # fmt: skip
        return set(ids)
