"""Watching a stress run from the database: queue depth and completions, twice a second.

One cheap statement per snapshot (the live rows of the stress schema's job table, the dead
jobs, the ledger's rows). When a snapshot is slow (a huge backlog), the monitor polls less
often, so that watching never costs more than a tenth of one core. A lost connection
(chaos, a Postgres restart) is reopened, with backoff, and counted.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import psycopg
import trio
from psycopg import sql

from .._db.statements import qualified
from .ledger import LEDGER_TABLE

__all__ = ["Monitor", "Snapshot"]

logger = logging.getLogger("trioq.stress")

INTERVAL = 0.5
#: At most this share of the time is spent taking snapshots.
DUTY = 0.1
BACKOFF_MAX = 2.0

_SNAPSHOT = """
SELECT count(*) FILTER (WHERE state = 'available'),
       count(*) FILTER (WHERE state = 'running'),
       count(*) FILTER (WHERE state = 'scheduled'),
       (SELECT count(*) FROM {dead}),
       (SELECT count(*) FROM {ledger})
  FROM {jobs}
 WHERE state IN ('scheduled', 'available', 'running')
"""


@functools.cache
def _snapshot_sql(schema: str) -> sql.Composed:
    return sql.SQL(_SNAPSHOT.strip()).format(
        jobs=qualified(schema, "jobs"),
        dead=qualified(schema, "dead_jobs"),
        ledger=qualified(schema, LEDGER_TABLE),
    )


@attrs.frozen(kw_only=True)
class Snapshot:
    taken_at: float  # trio.current_time() when the statement was sent
    available: int
    running: int
    scheduled: int
    dead: int
    completed: int  # ledger rows

    @property
    def live(self) -> int:
        return self.available + self.running + self.scheduled


class Monitor:
    """Takes snapshots until cancelled; `latest` is the newest one."""

    def __init__(self, connect: Callable[[], Awaitable[Any]], schema: str) -> None:
        self._connect = connect
        self._schema = schema
        self._conn: Any = None
        self.latest: Snapshot | None = None
        self.previous: Snapshot | None = None
        self.db_errors = 0
        self.db_down = False
        self._new = trio.Event()

    async def run(self, on_snapshot: Callable[[], None] = lambda: None) -> None:
        backoff = INTERVAL
        try:
            while True:
                begun = trio.current_time()
                try:
                    snapshot = await self.take()
                except psycopg.OperationalError as ex:
                    await self._failed(ex)
                    on_snapshot()
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX)
                    continue
                backoff = INTERVAL
                self.previous, self.latest, self.db_down = self.latest, snapshot, False
                self._new.set()
                self._new = trio.Event()
                on_snapshot()
                took = trio.current_time() - begun
                await trio.sleep_until(begun + max(INTERVAL, took / DUTY))
        finally:
            await self._close()

    async def take(self) -> Snapshot:
        if self._conn is None:
            self._conn = await self._connect()
        taken_at = trio.current_time()
        cur = await self._conn.execute(_snapshot_sql(self._schema))
        row = await cur.fetchone()
        assert row is not None
        available, running, scheduled, dead, completed = (int(x) for x in row)
        return Snapshot(
            taken_at=taken_at, available=available, running=running, scheduled=scheduled,
            dead=dead, completed=completed,
        )  # fmt: skip

    async def wait_newer_than(self, moment: float) -> Snapshot:
        """The first snapshot whose statement was sent after ``moment``."""
        while self.latest is None or self.latest.taken_at <= moment:
            await self._new.wait()
        return self.latest

    def rate(self) -> float:
        """Completions per second between the last two snapshots."""
        now, before = self.latest, self.previous
        if now is None or before is None or now.taken_at <= before.taken_at:
            return math.nan
        return (now.completed - before.completed) / (now.taken_at - before.taken_at)

    async def _failed(self, ex: psycopg.OperationalError) -> None:
        self.db_errors += 1
        self.db_down = True
        logger.debug("monitor: %s", ex)
        await self._close()

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with trio.move_on_after(1, shield=True):
                await conn.close()
