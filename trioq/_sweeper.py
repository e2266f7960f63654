"""The sweeper: jobs whose lease expired (their worker crashed or stalled).

Each is returned to ``available`` (the attempt stays spent), or moved to dead_jobs
on its last attempt, or cancelled if a cancel was requested. Safe in every process
at once: the rows are taken with SKIP LOCKED.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from ._pool import Pool
from ._queue import Queue, SweepResult

__all__ = ["Sweeper"]

logger = logging.getLogger("trioq.runtime")


class Sweeper:
    def __init__(
        self, pool: Pool, queue: Queue, *, interval: float, on_returned: Callable[[], None]
    ) -> None:
        self._pool = pool
        self._queue = queue
        self.interval = interval
        self._on_returned = on_returned  # jobs are available again: wake the fetchers

    async def run(self) -> None:
        """A round, then one every ``interval``; a failed round is logged."""
        while True:
            try:
                await self.run_once()
            except Exception as ex:  # Cancelled is not an Exception
                logger.warning("sweep failed: %s", ex)
            await trio.sleep(self.interval)

    async def run_once(self) -> SweepResult:
        async with self._pool.connection() as conn:
            swept = await self._queue.sweep(conn)
        if swept.returned:
            self._on_returned()
        return swept
