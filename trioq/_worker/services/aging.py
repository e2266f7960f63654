"""Aging: waiting jobs climb in priority, so a busy queue cannot starve its low-priority jobs
(``docs/flow-control.md``, "Aging").

Every `AGING_INTERVAL`, one statement per served queue (`trioq._flow.age_queue`) moves the
jobs that have waited long enough to the priority their wait has earned: one level per the
queue's ``aging`` setting (stored with its other settings, so every process ages alike),
never past the best priority waiting in the queue. The claim is untouched: it still takes
jobs by (priority, run_at, id) from its index, and an aged job is simply a job of a better
priority with an old run_at, first in its new class.

A round skips a queue in which the process's last poll found no job a claim could take
(`Governor.has_work`): nothing waits there to age, and an idle worker sends nothing (a job
that arrives meanwhile waits at most a poll longer for its first step, against an aging
step of minutes).

Every process may age every queue it serves at once: each round locks the rows it moves
with SKIP LOCKED and re-checks what they have earned, so a job never climbs twice for one
wait, and a claim never waits for a round (nor a round for a claim).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import attrs

from ..._flow import AGE_BATCH, age_queue
from ..._pg.pool import Pool
from ..._queue import Queue
from .loop import every

__all__ = ["AGING_INTERVAL", "Aging", "AgingRound"]

logger = logging.getLogger("trioq.runtime")

#: Seconds between rounds. A round moves a job as many levels as its wait has earned, so a
#: queue whose ``aging`` is shorter than this still climbs at its own pace, in steps.
AGING_INTERVAL = 5.0


@attrs.frozen(kw_only=True)
class AgingRound:
    """How many jobs of each served queue climbed in one round (queues with none omitted)."""

    aged: dict[str, int] = attrs.field(factory=dict)


class Aging:
    """The service: `run_once` ages every served queue; `run` does it every `AGING_INTERVAL`."""

    def __init__(
        self, pool: Pool, queue: Queue, queues: Sequence[str], *,
        interval: float = AGING_INTERVAL, batch: int = AGE_BATCH,
        has_work: Callable[[str], bool] = lambda _name: True,
    ) -> None:  # fmt: skip
        self._pool = pool
        self._has_work = has_work  # the last poll found work in the queue
        self._queue = queue
        self._queues = tuple(queues)
        self.interval = interval
        self._batch = batch

    async def run(self) -> None:
        await every(self.interval, self.run_once, failed="aging waiting jobs failed",
                    wait_first=True)  # fmt: skip

    async def run_once(self) -> AgingRound:
        aged: dict[str, int] = {}
        queues = [name for name in self._queues if self._has_work(name)]
        if not queues:
            return AgingRound()
        async with self._pool.connection() as conn:
            for name in queues:
                n = await age_queue(conn, self._queue.sql, name, limit=self._batch)
                if n:
                    aged[name] = n
        if aged:
            logger.debug("aged waiting jobs: %s", aged)
        return AgingRound(aged=aged)
