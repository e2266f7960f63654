"""The history writer: upserts a worker's per-minute aggregates, prunes old ones.

Every ``interval`` (`Config.history_interval`, default 5 s) one round takes what the
runtime's `History` gathered since the last round and writes it with one statement
(``INSERT ... ON CONFLICT DO UPDATE`` adding counts and sums, keeping maxima, merging the
histograms element-wise), then, once every `PRUNE_EVERY` seconds (every round while the
last prune found a full batch), deletes at most `PRUNE_BATCH` rows older than
``retention`` (`Config.history_retention`, default 7 days): an idle worker's round sends
nothing most of the time, where every process of a fleet pruned every 5 s. A failed write
puts the aggregates back for the next round, so a database outage delays history but loses none
of it (unless the process dies first: history is a chart, not a ledger). The runtime runs
a last round at shutdown, after the completer's final flush.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

import attrs
import trio

from ..._db.params import columns
from ..._db.statements import statements
from ..._obs.history import BUCKETS, Cell, CellKey, History
from ..._pg.pool import Pool
from .loop import every

__all__ = [
    "PRUNE_BATCH",
    "PRUNE_EVERY",
    "HistoryRound",
    "HistoryWriter",
]  # fmt: skip

logger = logging.getLogger("trioq.runtime")

#: Rows pruned per round at most: a week of one queue and task is 10,080 rows.
PRUNE_BATCH = 5000
#: Seconds between two prunes of a process, unless the last one deleted a full batch.
#: History is kept per minute for days: a minute late is nothing.
PRUNE_EVERY = 60.0


@attrs.frozen(kw_only=True)
class HistoryRound:
    """What one round did."""

    written: int  # (minute, queue, task) rows upserted
    pruned: int  # rows older than the retention deleted


class HistoryWriter:
    def __init__(
        self, pool: Pool, schema: str, history: History, *, interval: float,
        retention: dt.timedelta, clock: Callable[[], float] = trio.current_time,
    ) -> None:  # fmt: skip
        self._pool = pool
        self._clock = clock
        #: When the next prune is due (``clock``): the first round prunes.
        self.prune_at = -float("inf")
        self._sql = statements(schema)
        self._history = history
        self.interval = interval
        self.retention = retention

    async def run(self) -> None:
        """A round every ``interval``; a failed round is logged and the next one retries."""
        await every(self.interval, self.run_once, failed="writing job history failed",
                    wait_first=True)  # fmt: skip

    async def run_once(self) -> HistoryRound:
        """Write what was gathered since the last round, then prune one batch if a prune is
        due; a round with nothing to do sends nothing."""
        cells = self._history.take()
        prune = self._clock() >= self.prune_at
        if not cells and not prune:
            return HistoryRound(written=0, pruned=0)
        pruned = 0
        async with self._pool.connection() as conn:
            if cells:
                try:
                    await conn.execute(self._sql.history_upsert, upsert_params(cells))
                except BaseException:
                    self._history.restore(cells)
                    raise
            if prune:
                cur = await conn.execute(
                    self._sql.history_prune, {"retention": self.retention, "limit": PRUNE_BATCH}
                )
                row = await cur.fetchone()
                pruned = int(row[0]) if row else 0
                self.prune_at = self._clock() + (0.0 if pruned >= PRUNE_BATCH else PRUNE_EVERY)
        return HistoryRound(written=len(cells), pruned=pruned)


#: The upsert's array parameters taken from each `Cell`, by the field of the cell.
_SUMS = ("completed", "retried", "dead", "cancelled", "runs", "exec_us_sum", "exec_us_max",
         "wait_us_sum", "wait_us_max")  # fmt: skip


def upsert_params(cells: dict[CellKey, Cell]) -> dict[str, Any]:
    """The upsert's parameters: one array per column, rows sorted by key (lock order)."""
    keys = sorted(cells)
    rows = [cells[key] for key in keys]
    minutes, queues, tasks = ([key[i] for key in keys] for i in range(3))
    return {
        "buckets": BUCKETS, "minutes": minutes, "queues": queues, "tasks": tasks,
        **columns(rows, **{name: name for name in _SUMS}),
        "exec_hists": [n for c in rows for n in c.exec_hist],
        "wait_hists": [n for c in rows for n in c.wait_hist],
    }  # fmt: skip
