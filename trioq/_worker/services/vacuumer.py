"""The vacuumer: the jobs table's dead tuples kept bounded under load (docs/scaling.md, "Bloat").

Every job leaves two dead row versions (its claim's update, its completion's delete). Autovacuum
looks at a database once a minute (``autovacuum_naptime``, a server setting no table can
lower), so at 5,000 jobs/s the jobs table carried up to 440,000 dead tuples between two
autovacuums (bench/bench_bloat.py), and each claim stepped over their index entries.

Every ``Config.vacuum_interval`` (1 s), a process that finished jobs in the last `STATS_LAG`
seconds reads the table's dead and live tuples from the statistics (`VACUUM_LOOK`: no table read),
and once the dead pass ``Config.vacuum_threshold`` plus `SCALE_FACTOR` of the live, runs
``VACUUM (SKIP_LOCKED)`` on it: a vacuum already running elsewhere (autovacuum's, another
process's) makes it return at once. An idle process never looks.

A vacuum that could remove little (a snapshot pins the xmin horizon: a long transaction, an
idle-in-transaction session, a replication slot) is not run again at once: the wait doubles
after each such vacuum, up to `MAX_BACKOFF`, so a pinned table is not scanned every second,
and the first vacuum after the pin ends comes within `MAX_BACKOFF`; a vacuum that failed (a
``statement_timeout``) backs off alike. A role that may not vacuum
the table (not its owner) is told once in the log, and the process stops looking.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import attrs
import psycopg

from ..._db.statements import Statements
from ..._pg.conn import Conn
from ..._pg.pool import Pool
from .loop import every

__all__ = ["MAX_BACKOFF", "SCALE_FACTOR", "STATS_LAG", "VacuumRound", "Vacuumer"]

logger = logging.getLogger("trioq.runtime")

#: The part of the live tuples added to the threshold: a big backlog is vacuumed less often
#: (each vacuum reads its indexes whole).
SCALE_FACTOR = 0.1
#: The longest wait after vacuums that removed less than half of the dead tuples.
MAX_BACKOFF = 30.0
#: How long a process keeps looking after its last finished job: a session's statistics
#: reach the server up to a second after its transactions (``PGSTAT_MIN_INTERVAL``).
STATS_LAG = 2.0


@attrs.frozen(kw_only=True)
class VacuumRound:
    """One look: whether it read the statistics, the dead and live tuples then, whether it
    vacuumed, and the dead tuples the vacuum left (those it could not remove yet)."""

    looked: bool = False
    dead: int | None = None
    live: int | None = None
    vacuumed: bool = False
    #: It ran VACUUM, which skipped the table: another vacuum held it.
    skipped: bool = False
    left: int | None = None
    seconds: float | None = None


class Vacuumer:
    def __init__(
        self, pool: Pool, sql: Statements, *, interval: float, threshold: int,
        churn: Callable[[], int], clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self._pool = pool
        self._sql = sql
        self.interval = interval
        self.threshold = threshold
        self._churn = churn  # the jobs this process has finished so far
        self._clock = clock
        self._seen = 0
        self._changed_at: float | None = None  # when the churn last moved (None: never)
        self._backoff = 0.0  # seconds to wait before the next vacuum (0: none)
        self._not_before = 0.0
        #: False once the role turned out not to be allowed to vacuum the table.
        self.allowed = True
        self.vacuums = 0

    async def run(self) -> None:
        await every(self.interval, self.run_once, failed="vacuuming the jobs table failed",
                    wait_first=True)  # fmt: skip

    async def run_once(self) -> VacuumRound:
        churn, now = self._churn(), self._clock()
        if churn != self._seen:
            self._seen, self._changed_at = churn, now
        if not self.allowed or self._changed_at is None or now - self._changed_at > STATS_LAG:
            return VacuumRound()
        async with self._pool.connection() as conn:
            dead, live, allowed, count = await self._look(conn)
            if not allowed:
                self.allowed = False
                logger.info("the jobs table's dead tuples are left to autovacuum: this role "
                            "may not vacuum it (not its owner)")  # fmt: skip
                return VacuumRound(looked=True, dead=dead, live=live)
            if dead < self.threshold + SCALE_FACTOR * live or now < self._not_before:
                return VacuumRound(looked=True, dead=dead, live=live)
            try:
                await conn.execute(self._sql.vacuum_jobs, prepare=False)
            except psycopg.Error:
                self._back_off()  # a statement_timeout, say: not again at once
                raise
            took = self._clock() - now
            left, _live, _allowed, after = await self._look(conn)
        if after == count:  # skipped: another vacuum held the table (autovacuum's, say)
            return VacuumRound(looked=True, dead=dead, live=live, skipped=True)
        self.vacuums += 1
        if left * 2 > dead:  # little removed: something pins the horizon
            self._back_off()
            logger.info("vacuum of the jobs table removed %d of %d dead tuples: the next one "
                        "in %.0f s or later (a snapshot may pin the xmin horizon)",
                        max(0, dead - left), dead, self._backoff)  # fmt: skip
        else:
            self._backoff = 0.0
            self._not_before = 0.0
        return VacuumRound(looked=True, dead=dead, live=live, vacuumed=True, left=left,
                           seconds=took)  # fmt: skip

    async def _look(self, conn: Conn) -> tuple[int, int, bool, int]:
        cur = await conn.execute(self._sql.vacuum_look, prepare=False)
        row = await cur.fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), bool(row[2]), int(row[3])

    def _back_off(self) -> None:
        self._backoff = min(MAX_BACKOFF, max(self.interval, self._backoff * 2))
        self._not_before = self._clock() + self._backoff
