"""The pruner: retention for finished rows (``docs/results.md#retention``).

Kept ``done`` rows, ``cancelled`` rows and dead jobs are deleted once they are older
than ``Config.retain_done``, ``retain_cancelled`` and ``retain_dead`` (by ``finished_at``
and ``died_at``; None keeps that kind forever). Each kind is one statement per round
that deletes at most ``Config.prune_batch`` rows, oldest first, in a transaction of its
own: no lock is held for long, and a big backlog goes in many small steps (with a pause
between them) rather than one delete that leaves millions of dead tuples for vacuum at
once. Rows are taken with SKIP LOCKED, so every process can run a pruner.
"""

from __future__ import annotations

import datetime as dt
import logging

import attrs
import trio

from ..._db.statements import Statements
from ..._pg.conn import Conn
from ..._pg.pool import Pool
from .loop import every

__all__ = ["FULL_BATCH_PAUSE", "PruneRound", "Pruner", "prune"]

logger = logging.getLogger("trioq.runtime")

#: Pause between batches while a round keeps finding full batches (a backlog).
FULL_BATCH_PAUSE = 0.1


@attrs.frozen(kw_only=True)
class PruneRound:
    """What one round deleted, and whether any kind filled its batch (more may be due)."""

    done: int = 0
    cancelled: int = 0
    dead: int = 0
    #: Rows of batches that ended (their callback enqueued) longer ago than ``retain_done``.
    batches: int = 0
    full: bool = False

    @property
    def deleted(self) -> int:
        return self.done + self.cancelled + self.dead


async def prune(
    conn: Conn,
    sql: Statements,
    *,
    retain_done: float | None,
    retain_cancelled: float | None,
    retain_dead: float | None,
    limit: int,
) -> PruneRound:
    """One round: at most ``limit`` rows of each kind older than its retention (seconds)."""
    counts: dict[str, int] = {}
    for kind, statement, age in (
        ("done", sql.prune_done, retain_done),
        ("cancelled", sql.prune_cancelled, retain_cancelled),
        ("dead", sql.prune_dead, retain_dead),
        ("batches", sql.prune_batches, retain_done),
    ):
        if age is None:
            continue
        cur = await conn.execute(statement, {"age": dt.timedelta(seconds=age), "limit": limit})
        counts[kind] = max(cur.rowcount, 0)
    return PruneRound(**counts, full=any(n >= limit for n in counts.values()))


class Pruner:
    def __init__(
        self, pool: Pool, sql: Statements, *, interval: float, batch: int,
        retain_done: float | None, retain_cancelled: float | None, retain_dead: float | None,
    ) -> None:  # fmt: skip
        self._pool = pool
        self._sql = sql
        self.interval = interval
        self._batch = batch
        self._retain = {
            "retain_done": retain_done,
            "retain_cancelled": retain_cancelled,
            "retain_dead": retain_dead,
        }

    async def run(self) -> None:
        """Every ``interval``, rounds until one is not full; errors are logged, and the
        next interval tries again."""
        await every(self.interval, self.run_until_done, failed="pruning failed", wait_first=True)

    async def run_until_done(self) -> PruneRound:
        """Rounds until one is not full (a backlog goes in batches, with a pause between
        them); what they deleted in all is logged, also when one fails."""
        total = PruneRound()
        try:
            while (round_ := await self.run_once()).full:
                total = _add(total, round_)
                await trio.sleep(FULL_BATCH_PAUSE)
            total = _add(total, round_)
        finally:
            if total.deleted:
                logger.info("pruned %d done, %d cancelled and %d dead jobs",
                            total.done, total.cancelled, total.dead)  # fmt: skip
        return total

    async def run_once(self) -> PruneRound:
        async with self._pool.connection() as conn:
            return await prune(conn, self._sql, limit=self._batch, **self._retain)


def _add(a: PruneRound, b: PruneRound) -> PruneRound:
    return PruneRound(done=a.done + b.done, cancelled=a.cancelled + b.cancelled,
                      dead=a.dead + b.dead, batches=a.batches + b.batches,
                      full=b.full)  # fmt: skip
