"""The scheduler: promotes scheduled jobs when they fall due, and fires cron ticks.

It sleeps until the earliest scheduled job or cron tick (at most `MAX_SLEEP`), or
until woken: by a notification that a job was enqueued for later, or by the
completer after a retry or snooze.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import attrs
import psycopg
import trio

from ..._cron import CronEntry, Fired, fire_due, next_fire_time
from ..._pg.pool import Pool
from ..._queue import Queue
from ..wakeup import Wakeup

__all__ = ["MAX_SLEEP", "ScheduleRound", "Scheduler"]

logger = logging.getLogger("trioq.runtime")

#: Longest the scheduler sleeps without a reason to wake.
MAX_SLEEP = 5.0


@attrs.frozen(kw_only=True)
class ScheduleRound:
    """What one round did, and how long the scheduler may sleep after it."""

    promoted: tuple[str, ...]  # the queues that got due jobs
    fired: tuple[Fired, ...]  # cron ticks this process enqueued
    sleep: float  # seconds until the next due job or tick, at most MAX_SLEEP


class Scheduler:
    def __init__(
        self, pool: Pool, queue: Queue, cron: Sequence[CronEntry], *, poll_interval: float,
        on_due: Callable[[str], None],
    ) -> None:  # fmt: skip
        self._pool = pool
        self._queue = queue
        self._cron = tuple(cron)
        self._poll_interval = poll_interval
        self._on_due = on_due  # a queue got due jobs: wake its fetcher
        self._wakeup = Wakeup()

    def wake(self) -> None:
        """Run a round now: a job may have become due sooner than the scheduler thought."""
        self._wakeup.set()

    async def run(self) -> None:
        """Rounds until cancelled; a failed round is logged, the next one follows a poll
        interval later. A bad cron entry must not stop the workers."""
        while True:
            try:
                sleep = (await self.run_once()).sleep
            except psycopg.OperationalError as ex:
                logger.warning("scheduler failed: %s", ex)
                sleep = self._poll_interval
            except Exception:
                logger.exception("scheduler failed")
                sleep = self._poll_interval
            with trio.move_on_after(sleep):
                await self._wakeup.wait()

    async def run_once(self) -> ScheduleRound:
        """Promote due jobs, fire due cron ticks."""
        fired: list[Fired] = []
        async with self._pool.connection() as conn:
            promoted = await self._queue.promote_due(conn)
            for queue in promoted:
                self._on_due(queue)
            due_in = await self._queue.next_due(conn)
            sleep = MAX_SLEEP
            if due_in is not None:
                sleep = min(sleep, max(due_in.total_seconds(), 0.0))
            if self._cron:
                now = await self._queue.clock(conn)
                fired = await fire_due(conn, self._queue, self._cron, now=now)
                upcoming = next_fire_time(self._cron, now)
                if upcoming is not None:
                    sleep = min(sleep, max((upcoming - now).total_seconds(), 0.0))
        return ScheduleRound(promoted=tuple(promoted), fired=tuple(fired), sleep=sleep)
