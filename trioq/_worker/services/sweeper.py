"""The sweeper: jobs whose worker died or stalled.

Two checks, both safe in every process at once (rows are taken with SKIP LOCKED):

- dead workers: workers whose liveness lock is free and whose pings stopped
  (`trioq._worker.services.liveness`) are first suspected, and taken for dead by a check
  a grace later that finds them so still; their running and prefetched jobs are then
  returned at once, without waiting for the leases. A process that suspected a worker
  checks again as soon as the grace is over (`VERDICT_MARGIN` after it). The fleet checks
  about `CHECKS` times every ``Config.liveness_interval``, whatever its size: each
  process every interval while the fleet has at most that many workers, else every
  ``workers / CHECKS`` intervals, at a random point in that span (`fleet_gap`), so 200
  idle workers do not send 400 checks a second and a death is still suspected within a
  fraction of an interval;
- expired leases (every ``Config.sweep_interval`` in a fleet of up to `CHECKS` workers,
  `fleet_gap` in a bigger one): the fallback, for workers that are unreachable rather than
  dead (a network partition) or that never registered. The fleet sweeps about `CHECKS`
  times an interval in all, as it checks for dead workers.

Either way a job goes back to ``available`` (the attempt stays spent), or to dead_jobs on
its last attempt, or is cancelled if a cancel was requested. The queues that got jobs
back are notified, so every worker's fetcher claims them at once.

With the expired leases, the sweeper also dead-letters the jobs whose deadline to start
(``start_by``) passed before any claim took them: a death like the others it reports (the
claim never starts such a job, so only how soon it shows as dead depends on the interval).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

import attrs
import trio

from ..._db.driver import Driver, SweepResult
from ..._pg.pool import Pool
from .loop import CHECKS, every, fleet_gap

__all__ = ["CHECKS", "SweepRound", "Sweeper", "fleet_gap"]

logger = logging.getLogger("trioq.runtime")

_NOTHING = SweepResult(returned=frozenset(), dead=frozenset(), cancelled=frozenset())
#: A process that suspected a worker checks again this long after the grace is over (the
#: verdict compares the database's clock with the suspicion's: a little slack, so the
#: check does not come a moment early and wait a whole gap more).
VERDICT_MARGIN = 0.02


@attrs.frozen(kw_only=True)
class SweepRound:
    """What one round did: jobs of dead workers, jobs whose lease expired, and jobs whose
    deadline to start passed."""

    reclaimed: SweepResult
    swept: SweepResult
    expired: SweepResult = _NOTHING


class Sweeper:
    def __init__(
        self, pool: Pool, driver: Driver, *, interval: float, reclaim_interval: float,
        grace: float, on_returned: Callable[[], None],
        on_swept: Callable[[SweepRound], None] | None = None,
    ) -> None:  # fmt: skip
        self._pool = pool
        self._driver = driver
        self.interval = interval
        self.reclaim_interval = reclaim_interval
        self._grace = dt.timedelta(seconds=grace)
        self._on_returned = on_returned  # jobs are available again: wake the fetchers
        self._on_swept = on_swept  # what every round did (the lifecycle reports deaths)
        #: Jobs returned, killed, cancelled so far (the metrics).
        self.returned = self.dead = self.cancelled = 0
        #: The fleet's size, as the last dead-worker check counted it (`fleet_gap`).
        self.workers = 1
        #: How many workers the last dead-worker check suspected.
        self.suspected = 0
        #: When the next expired-lease sweep and dead-worker check are due (trio's clock).
        self.next_sweep = self.next_reclaim = -float("inf")

    async def run(self) -> None:
        """Dead workers and expired leases, each at its `schedule`; a failed round is
        logged."""
        self.next_sweep = self.next_reclaim = trio.current_time()

        async def round_() -> SweepRound:
            now = trio.current_time()
            sweep, reclaim = now >= self.next_sweep, now >= self.next_reclaim
            try:
                return await self.run_once(sweep=sweep, reclaim=reclaim)
            finally:
                self.schedule(trio.current_time(), swept=sweep, reclaimed=reclaim)

        def wait(_round: SweepRound | None) -> float:
            return max(0.0, min(self.next_sweep, self.next_reclaim) - trio.current_time())

        await every(wait, round_, failed="sweep failed")

    def schedule(self, now: float, *, swept: bool, reclaimed: bool) -> None:
        """After a round at ``now`` (trio's clock): when the next sweep and the next check
        are due. Each comes a `fleet_gap` later (the fleet's size as the last check
        counted it); a check that suspected a worker comes again as soon as the grace is
        over (`VERDICT_MARGIN` after it)."""
        if swept:
            self.next_sweep = now + fleet_gap(self.interval, self.workers)
        if reclaimed:
            self.next_reclaim = now + fleet_gap(self.reclaim_interval, self.workers)
            if self.suspected:  # its verdict is due a grace from now
                verdict = now + self._grace.total_seconds() + VERDICT_MARGIN
                self.next_reclaim = min(self.next_reclaim, verdict)

    async def run_once(self, *, sweep: bool = True, reclaim: bool = True) -> SweepRound:
        async with self._pool.connection() as conn:
            reclaimed = _NOTHING
            if reclaim:
                reclaimed = await self._driver.reclaim_dead_workers(conn, grace=self._grace)
                self.workers = max(1, reclaimed.workers or 1)
                self.suspected = reclaimed.suspected
            swept = await self._driver.sweep(conn) if sweep else _NOTHING
            expired = await self._driver.expire_start_by(conn) if sweep else _NOTHING
            queues = reclaimed.queues | swept.queues
            if queues:
                await self._driver.notify_queues(conn, queues)
        if reclaimed.returned or reclaimed.dead or reclaimed.cancelled:
            logger.warning("returned %d jobs of dead workers (%d more went to dead_jobs on "
                           "their last attempt)", len(reclaimed.returned),
                           len(reclaimed.dead))  # fmt: skip
        if queues:
            self._on_returned()
        if expired.dead:
            logger.info("%d jobs went to dead_jobs: not started by their start_by deadline",
                        len(expired.dead))  # fmt: skip
        done = SweepRound(reclaimed=reclaimed, swept=swept, expired=expired)
        for result in (reclaimed, swept, expired):
            self.returned += len(result.returned)
            self.dead += len(result.dead)
            self.cancelled += len(result.cancelled)
        if self._on_swept is not None:
            self._on_swept(done)
        return done
