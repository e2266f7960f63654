"""Worker liveness: every worker visible in the database, so a dead one is noticed at once.

Leases alone make a crashed worker's jobs wait for their expiry (30 s by default).
Instead each worker keeps a row in ``workers`` and, on a connection of its own, holds a
session-level advisory lock keyed by its row's id, and pings the row every
``Config.liveness_interval``. Postgres drops the lock the moment the process (or that
connection) dies. The sweepers of every process (`Driver.reclaim_dead_workers`) take a
worker for dead only when both are true: its lock is free, and it has not pinged for
``Config.liveness_grace``; and a sweeper judges nobody on a connection younger than a
couple of seconds, so that after a server restart (every lock free, every connection
new) every worker has the time to reconnect. Then its running and prefetched jobs are
returned at once. A worker whose liveness connection was cut but that is alive
reconnects, locks and pings again within the grace, so it is never taken for dead; a
network partition keeps its lock held on the server (the backend does not know yet),
and lease expiry stays the fallback.

The connection reconnects with backoff; the row is removed at a graceful stop (after the
last outcome is written), unless the worker still holds running jobs (outcomes it could
not write): then the row stays, the lock drops, and the sweepers return those jobs. A
worker that finds its row gone (the sweepers took it for dead: it was unreachable longer
than the grace) registers again under a new id: the jobs it held were returned, and their
fenced outcomes are refused.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable, Mapping

import psycopg
import trio

from ..._db.driver import Driver
from ..._exceptions import PoolClosedError
from ..._pg.connection import Conn, connect
from ..._pg.pool import Pool

__all__ = ["Liveness"]

logger = logging.getLogger("trioq.runtime")

RECONNECT_MIN, RECONNECT_MAX = 0.05, 0.5
#: Bound on removing the worker's row at shutdown.
REMOVE_TIMEOUT = 5.0


class Liveness:
    def __init__(
        self, dsn: str, pool: Pool, driver: Driver, *, name: str, queues: Mapping[str, int],
        interval: float, running: Callable[[], int],
    ) -> None:  # fmt: skip
        self._dsn = dsn
        self._pool = pool
        self._sql = driver.sql
        self._name = name
        self._queues = json.dumps(dict(queues))
        self.interval = interval
        self._running = running  # how many handlers run now, for the ping
        self.worker: int | None = None  # this worker's row id, once registered

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the lock and ping until cancelled; ``task_status.started()`` once the lock is
        held (a failure before that is raised: ``serve`` refuses to start)."""
        backoff = RECONNECT_MIN
        started = False
        try:
            while True:
                try:
                    async with await connect(self._dsn, autocommit=True) as conn:
                        await self._register_and_lock(conn)
                        if not started:
                            task_status.started()
                            started = True
                        backoff = RECONNECT_MIN
                        await self._ping_until_gone(conn)
                        logger.error(
                            "worker %s was taken for dead (unreachable for longer "
                            "than the liveness grace): registering again",
                            self._name,
                        )
                except psycopg.OperationalError as ex:
                    if not started:
                        raise
                    logger.warning("liveness connection lost, reconnecting: %s", ex)
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, RECONNECT_MAX)
        finally:
            await self._remove()

    async def _register_and_lock(self, conn: Conn) -> None:
        st = self._sql
        params = {"name": self._name, "host": socket.gethostname(), "pid": os.getpid(),
                  "queues": self._queues}  # fmt: skip
        cur = await conn.execute(st.worker_register, params)
        row = await cur.fetchone()
        assert row is not None
        self.worker = int(row[0])
        await conn.execute(st.worker_lock, {"space": st.lock_space, "id": self.worker})

    async def _ping_until_gone(self, conn: Conn) -> None:
        while True:
            if not await self.run_once(conn):
                return
            await trio.sleep(self.interval)

    async def run_once(self, conn: Conn) -> bool:
        """One ping; False if this worker's row is gone (it was taken for dead)."""
        params = {"id": self.worker, "running": self._running()}
        cur = await conn.execute(self._sql.worker_ping, params)
        return await cur.fetchone() is not None

    async def _remove(self) -> None:
        """At a graceful stop: no row left for the sweepers to find (shielded, bounded)."""
        if self.worker is None:
            return
        with trio.move_on_after(REMOVE_TIMEOUT, shield=True):
            try:
                async with self._pool.connection() as conn:
                    cur = await conn.execute(self._sql.worker_remove, {"id": self.worker})
                    if await cur.fetchone() is None:
                        logger.warning(
                            "this worker still holds running jobs at its stop: "
                            "the sweepers will return them"
                        )
            except (psycopg.Error, OSError, PoolClosedError) as ex:
                logger.info("could not remove this worker's row (%s): the sweepers will", ex)
