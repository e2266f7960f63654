"""Worker liveness: every worker visible in the database, so a dead one is noticed at once.

Leases alone make a crashed worker's jobs wait for their expiry (30 s by default).
Instead each worker keeps a row in ``workers`` and holds, on a connection of its own, a
session-level advisory lock keyed by its row's id: Postgres drops the lock the moment the
process (or that connection) dies. While the worker holds a job (running, buffered, or its
outcome not yet written), every ``Config.liveness_interval``, on the clock, it proves that
connection alive with a round trip that writes nothing (a protocol ``Sync``: the lock lives
as long as the session answers); it pings its row (a write: ``seen_at``, and how many
handlers run) only every `ROW_EVERY` seconds, or when that count changed. Whenever the
liveness connection's round trip is late (`LATE`: the connection is cut, reconnecting, or
stuck), the worker pings its row through its pool instead, every interval until the
liveness connection answers again. An idle worker thus writes its row every 10 s, not
twice a second (docs/benchmarks.md, "An idle fleet").

**An idle worker watches instead of asking.** With no job held, nothing of the worker's can
be taken from it, and its liveness connection sends nothing between its row's pings: the
worker waits for the socket to become readable (a session that ends says so: the server's
``FATAL`` and the close arrive at once, and a round trip then tells, and reconnects), with
TCP keepalives of `KEEPALIVES` on it so that the kernel, not the backend, notices a peer
that went silent (a dropped route, a host lost) within seconds, long before a server
frees the session's lock on its own keepalives. From the moment a claim is sent the worker
counts as holding (`claiming`): the liveness connection proves itself at once and every
interval while jobs are held, and the pool pings if that proof is late by `LATE` intervals
from the claim's sending; the claim itself clears the worker's suspicion in the same
statement (`trioq._db.sql.leases`). So idle workers cost the server a row write every 10 s each
instead of two round trips a second (docs/benchmarks.md, round 10). While the liveness
connection is down (reconnecting), the pool pings on, idle or not.

The sweepers of every process (`Driver.reclaim_dead_workers`) take a worker for dead only
on evidence that one flaky connection cannot fake: no session at all holding its lock (read
from ``pg_locks``: a try-lock would succeed on a pooler's session that holds the lock
itself) and no ping through either channel for ``Config.liveness_grace``, found twice, a
grace apart: the first check only suspects the worker (and every ping clears that). So a
worker whose liveness connection is cut has the grace from the moment its lock was seen
free to ping through its pool (it does within `LATE` intervals and a round trip), however
long ago it last wrote its row. A sweeper's session suspects nobody until a couple of
seconds after its first check, so that after a server restart (every lock free, every
session new) every worker has the time to reconnect. Then the dead worker's running and
prefetched jobs are returned at once.

So a worker whose liveness connection is cut, and that cannot reconnect for a while
(``max_connections`` full, the database refusing connections), keeps pinging through its
pool and keeps its jobs; one whose pool cannot reach the database either keeps its lock on
the server (the backend does not know yet) and its jobs until their leases expire. What
the database cannot tell from a crash (the process stopped, SIGSTOP or a VM stall, *and*
its connection cut) is taken for one: its jobs are returned, and the worker that wakes
finds its row gone, runs a heartbeat at once (`on_taken_for_dead`), which cancels the
handlers whose leases are lost before they write (every write of theirs is fenced by the
lease anyway), and registers again under a new id. ``docs/guarantees.md`` has the argument.

The connection reconnects with backoff; the row is removed at a graceful stop (after the
last outcome is written), unless the worker still holds running jobs (outcomes it could
not write): then the row stays, the lock drops, and the sweepers return those jobs.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
import trio
from psycopg.conninfo import conninfo_to_dict

from ..._db.driver import Driver
from ..._exceptions import PoolClosedError
from ..._pg.connection import Conn, TrioConnection, connect
from ..._pg.errors import connection_fault
from ..._pg.pool import Pool
from ..wakeup import Wakeup

__all__ = ["Liveness"]

logger = logging.getLogger("trioq.runtime")

RECONNECT_MIN, RECONNECT_MAX = 0.05, 0.5
#: The pool pings once no ping went through for this many intervals. The liveness
#: connection pings every interval on the clock (its round trip does not add up), so one
#: that is merely slow (by under a quarter of an interval) does not trigger it; and a cut
#: connection leaves the row unpinged for at most this many intervals and a round trip,
#: inside the grace (at least two intervals, `Config`): 0.625 s and a round trip of the
#: default 1 s.
LATE = 1.25
#: An idle worker pings its row (a write) at least this often, in seconds (or every
#: interval, if that is longer); between those pings its liveness connection's round trips
#: write nothing. The row's ``seen_at`` is what an operator sees (`trioq status`, the
#: dashboard); the sweepers never judge on its age alone (they suspect first).
ROW_EVERY = 10.0
#: Bound on removing the worker's row at shutdown.
REMOVE_TIMEOUT = 5.0
#: TCP settings of the liveness connection (libpq's parameters; a DSN that sets one keeps
#: its own): an idle connection's peer that stopped answering is noticed by the kernel
#: within about 6 s (keepalives: 1 s idle, then probes 1 s apart until 5 s pass without an
#: answer: on Linux ``tcp_user_timeout`` bounds the probing too), a round trip whose bytes
#: the peer never acknowledges ends after 5 s (not the kernel's 15 minutes of retries),
#: and the connection ends either way, so the worker reconnects. A probe and its answer
#: are the kernels' alone: no backend wakes for them. (Nothing for a Unix socket, which
#: has no silent peer.)
KEEPALIVES = {"keepalives": "1", "keepalives_idle": "1", "keepalives_interval": "1",
              "keepalives_count": "3", "tcp_user_timeout": "5000"}  # fmt: skip


class Liveness:
    def __init__(
        self, dsn: str, pool: Pool, driver: Driver, *, name: str, queues: Mapping[str, int],
        interval: float, running: Callable[[], int],
        holding: Callable[[], bool] = lambda: True,
        on_taken_for_dead: Callable[[], None] | None = None,
        connect_kwargs: Mapping[str, Any] | None = None,
    ) -> None:  # fmt: skip
        self._dsn = dsn
        given = conninfo_to_dict(dsn)
        keepalives = {k: v for k, v in KEEPALIVES.items() if k not in given}
        self._connect_kwargs = {**keepalives, **(connect_kwargs or {}), "autocommit": True}
        #: Whether this worker holds any job (running, buffered, outcome not yet written).
        self._held = holding
        #: When each claim on its way was sent (trio's clock; `claiming`): their jobs may be
        #: committed and held already, so the worker counts as holding from the moment one
        #: is sent, and has from the first sending to prove itself.
        self._in_flight: list[float] = []
        #: A claim ends the idleness: the liveness connection proves itself at once, and
        #: the pool's channel watches the time again (one flag for each).
        self._claimed_probe = Wakeup()
        self._claimed_pool = Wakeup()
        #: Whether the liveness connection is up (registered, its lock held).
        self._connected = False
        self._pool = pool
        self._on_taken_for_dead = on_taken_for_dead  # a ping found the row gone
        self._sql = driver.sql
        self._name = name
        self._queues = json.dumps(dict(queues))
        self.interval = interval
        self._running = running  # how many handlers run now, for the ping
        self.worker: int | None = None  # this worker's row id, once registered
        self._gone: int | None = None  # the row id last found gone (reported once)
        #: When the last ping that went through was sent (trio's clock), by either channel.
        self._pinged_at = -float("inf")
        #: Pings that went through the pool (the fallback channel), for tests.
        self.pool_pings = 0
        #: Round trips of the liveness connection that wrote nothing, for tests.
        self.probes = 0
        #: Idle waits on the liveness connection's socket (no round trip), for tests.
        self.watches = 0
        #: The count of running handlers the row was last written with.
        self._written_running: int | None = None
        self.row_every = max(ROW_EVERY, interval)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the lock and ping until cancelled; ``task_status.started()`` once the lock is
        held (a failure before that is raised: ``serve`` refuses to start)."""
        try:
            async with trio.open_nursery() as nursery:
                self._pinged_at = trio.current_time()  # the first ping follows the lock
                await nursery.start(self._hold_lock)
                nursery.start_soon(self._ping_through_pool)
                task_status.started()
        finally:
            await self._remove()

    async def _hold_lock(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Register, lock, ping on the connection of its own; reconnect with backoff."""
        backoff = RECONNECT_MIN
        started = False
        while True:
            try:
                async with await connect(self._dsn, **self._connect_kwargs) as conn:
                    await self._register_and_lock(conn)
                    if not started:
                        task_status.started()
                        started = True
                    backoff = RECONNECT_MIN
                    self._connected = True
                    try:
                        await self._ping_until_gone(conn)
                    finally:
                        self._connected = False
                        self._claimed_pool.set()  # the pool pings now, idle or not
            except psycopg.Error as ex:
                # The connection broke, or the server is read-only (a standby, the old
                # primary after a failover: the next connection may reach the new one).
                fault = connection_fault(ex)
                if not started or not (isinstance(ex, psycopg.OperationalError) or fault):
                    raise
                if fault is not None and fault.sqlstate == "25006":
                    logger.warning("liveness: the database is read-only, reconnecting until it "
                                   "takes writes: %s", ex)  # fmt: skip
                else:
                    logger.warning("liveness connection lost, reconnecting: %s", ex)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX)

    async def _ping_through_pool(self) -> None:
        """The second channel: a ping through the pool whenever none went through for
        `LATE` intervals (the liveness connection is cut, reconnecting, or stuck), so that
        a cut liveness connection alone never looks like death; every interval until the
        liveness connection pings again."""
        while True:
            since = min(self._in_flight, default=-float("inf"))
            due = max(self._pinged_at, since) + self.interval * LATE
            if trio.current_time() < due:
                await trio.sleep_until(due)
                continue
            if self._connected and not self._holding():
                # Idle, and the liveness connection is up and watched: nothing to prove
                # until a claim is sent (`claiming`) or the connection is lost.
                await self._claimed_pool.wait()
                continue
            try:
                async with self._pool.connection() as conn:
                    if await self.run_once(conn):
                        self.pool_pings += 1
                        continue
            except (psycopg.Error, OSError, PoolClosedError) as ex:
                logger.info("liveness ping through the pool failed: %s", ex)
            await trio.sleep(self.interval)  # failed, or the row is gone: an interval later

    async def _register_and_lock(self, conn: Conn) -> None:
        """Register (the row it had, if the sweepers left it) and take the lock. A new row
        means the old one was deleted: this worker was taken for dead meanwhile."""
        st = self._sql
        params = {"name": self._name, "host": socket.gethostname(), "pid": os.getpid(),
                  "queues": self._queues}  # fmt: skip
        cur = await conn.execute(st.worker_register, params)
        row = await cur.fetchone()
        assert row is not None
        before, self.worker = self.worker, int(row[0])
        if before is not None and before != self.worker:
            self._taken_for_dead(before)
        await conn.execute(st.worker_lock, {"space": st.lock_space, "id": self.worker})

    async def _ping_until_gone(self, conn: TrioConnection[Any]) -> None:
        """Every interval, on the clock (a slow round trip does not push the next one back,
        which would wake the pool's fallback, `LATE`): a ping of the row when it is due
        (`ROW_EVERY`, or the count of running handlers changed), else, while a job is held,
        a round trip that writes nothing; while none is, a watch of the socket until the
        row's ping is due or a claim ends the idleness (`_watch`)."""
        self._written_running = None  # a new session: its first round trip pings the row
        row_due = -float("inf")
        while True:
            started = trio.current_time()
            if started >= row_due or self._running() != self._written_running:
                if not await self.run_once(conn):
                    return  # registering again
                row_due = started + self.row_every
            elif self._holding():
                await conn.sync()
                self._pinged_at = max(self._pinged_at, started)
                self.probes += 1
            else:
                self.watches += 1
                await self._watch(conn, row_due)
                continue
            if self._holding():  # else idle: the next turn watches
                await trio.sleep_until(started + self.interval)

    async def _watch(self, conn: TrioConnection[Any], until: float) -> None:
        """Idle: wait until ``until``, a claim sent (`claiming`), or something arriving on the
        liveness connection's socket; then a round trip tells whether the session lives
        (it raises if not: the caller reconnects)."""
        arrived = False

        fileno = conn.pgconn.socket  # here: an error is raised as itself, not in a group

        async def socket(cancel: trio.CancelScope) -> None:
            nonlocal arrived
            await trio.lowlevel.wait_readable(fileno)
            arrived = True
            cancel.cancel()

        async def claim(cancel: trio.CancelScope) -> None:
            await self._claimed_probe.wait()
            cancel.cancel()

        with trio.move_on_at(until):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(socket, nursery.cancel_scope)
                nursery.start_soon(claim, nursery.cancel_scope)
        if arrived:
            await conn.sync()  # reads what came: a FATAL and the close raise here

    def _holding(self) -> bool:
        """Whether a job of this worker's may be running in the database: one is held, or
        a claim is on its way."""
        return bool(self._in_flight) or self._held()

    @contextmanager
    def claiming(self) -> Iterator[None]:
        """Around a claim (entered just before it is sent): the worker holds what it may
        claim from that moment, so the liveness connection proves itself at once (and
        every interval while jobs are held), and the pool pings if that proof is late by
        `LATE` intervals from the claim's sending, however long the claim takes. Should
        the liveness session be gone, a suspicion the claim's snapshot saw is cleared by
        the claim itself (`trioq._db.sql.leases`), and one raised after that snapshot can
        give a verdict no earlier than a grace after the sending: the pool's ping, due
        1.25 intervals after it, comes first. (Counting from when the claim returned
        instead, a claim slow to take its queue's lock left the suspicion its grace.)

        A claim that returns has cleared the suspicions its snapshot saw: a ping, as of its
        sending. One that fails (or is cut short) proves nothing: a busy worker whose
        claims keep failing still pings through its pool."""
        sent = trio.current_time()
        self._in_flight.append(sent)
        self._claimed_probe.set()
        self._claimed_pool.set()
        try:
            yield
            self._pinged_at = max(self._pinged_at, sent)  # returned: a ping
        finally:
            self._in_flight.remove(sent)

    async def run_once(self, conn: Conn) -> bool:
        """One ping of the row on ``conn`` (it clears a sweeper's suspicion); False if this
        worker's row is gone (it was taken for dead: then `on_taken_for_dead` is called, once
        per row)."""
        worker = self.worker
        running = self._running()
        params = {"id": worker, "running": running}
        sent = trio.current_time()  # the row's seen_at is no later than this
        cur = await conn.execute(self._sql.worker_ping, params)
        if await cur.fetchone() is not None:
            self._pinged_at = max(self._pinged_at, sent)
            self._written_running = running
            return True
        if worker is not None:
            self._taken_for_dead(worker)
        return False

    def _taken_for_dead(self, worker: int) -> None:
        """Row ``worker`` is gone: the sweepers took this worker for dead (unreachable for
        longer than the grace) and returned its jobs. Said once per row."""
        if self._gone == worker:
            return
        self._gone = worker
        logger.error("worker %s was taken for dead (unreachable for longer than the liveness "
                     "grace): its jobs were returned; stopping their handlers, registering "
                     "again", self._name)  # fmt: skip
        if self._on_taken_for_dead is not None:
            self._on_taken_for_dead()

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
