"""A bounded connection pool on trio primitives.

At most ``max_size`` connections exist; checkouts beyond that wait (FIFO, via
``trio.Semaphore``). Connections are opened lazily by the task that needs one,
so the pool owns no background task. Idle connections are health-checked at
checkout, which also catches a backend killed by ``pg_terminate_backend``
while idle (see `_looks_alive`). A connection returned inside a transaction is
rolled back; one returned in an unknown state is closed, never handed on.

A pool may be given ``reset`` commands (the worker's app pool: `trioq._db.statements.
session_reset`): each connection is reset with them before each user, its first included,
so what a session can carry (settings, advisory locks, LISTEN, temporary tables, open
cursors, a role, a DSN's ``options``) does not reach that user. They are its prelude
(`TrioConnection.prelude`): they travel with the user's first statement, in its round
trip, in a transaction of their own, so that statement failing (or its transaction rolled
back) does not undo them. ``setup`` commands follow them the same way.
"""

from __future__ import annotations

import logging
import select
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Self

import attrs
import psycopg
import trio
from psycopg.pq import ConnStatus, TransactionStatus

from .._exceptions import PoolClosedError
from .connection import TrioConnection

__all__ = ["Pool", "PoolStatistics"]

logger = logging.getLogger("trioq.pg")

#: Bound on the shielded cleanup (rollback, health round trip) of one connection.
RESET_TIMEOUT = 5.0

_IDLE = TransactionStatus.IDLE
_IN_TX = (TransactionStatus.INTRANS, TransactionStatus.INERROR)


@attrs.frozen(kw_only=True)
class PoolStatistics:
    """A snapshot of a `Pool`."""

    max_size: int
    size: int  # connections open: idle + in use
    idle: int
    in_use: int
    tasks_waiting: int
    opened: int  # connections opened since the pool was created
    discarded: int  # connections closed because they were broken or dirty
    checkouts: int
    waits: int = 0  # checkouts that had to wait for a connection (all were in use)
    wait_seconds: float = 0.0  # the time they waited, in total


class Pool:
    """Bounded pool of `TrioConnection`: ``async with pool.connection() as conn: ...``."""

    def __init__(
        self,
        conninfo: str,
        *,
        max_size: int = 10,
        connect_kwargs: Mapping[str, Any] | None = None,
        reset: Sequence[bytes] = (),
        setup: Sequence[bytes] = (),
    ) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, got {max_size}")
        self._reset_commands = tuple(reset)
        self._setup = tuple(setup)
        self._conninfo = conninfo
        self._max_size = max_size
        self._connect_kwargs = dict(connect_kwargs or {})
        self._autocommit = bool(self._connect_kwargs.get("autocommit", False))
        self._slots = trio.Semaphore(max_size)
        self._idle: deque[TrioConnection[Any]] = deque()
        self._in_use = 0
        self._opened = 0
        self._discarded = 0
        self._checkouts = 0
        self._waits = 0
        self._wait_seconds = 0.0
        self._closed = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[TrioConnection[Any]]:
        """Check a connection out for the duration of the block."""
        conn = await self.getconn()
        try:
            yield conn
        finally:
            await self.putconn(conn)

    async def getconn(self) -> TrioConnection[Any]:
        """Check a connection out; give it back with `putconn`."""
        self._check_open()
        # What Semaphore.acquire does, with the waits counted.
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            await self._wait_for_slot()
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
        try:
            self._check_open()
            conn = await self._take_idle() or await self._open()
        except BaseException:
            self._slots.release()
            raise
        self._in_use += 1
        self._checkouts += 1
        return conn

    async def _wait_for_slot(self) -> None:
        """Every connection is in use: wait for one (counted, and timed, for the metrics)."""
        self._waits += 1
        started = trio.current_time()
        try:
            await self._slots.acquire()
        finally:
            self._wait_seconds += trio.current_time() - started

    async def putconn(self, conn: TrioConnection[Any]) -> None:
        """Return a connection: reset it (shielded, bounded) or close it."""
        self._in_use -= 1
        if self._clean(conn):  # the common case: nothing to reset, no await
            self._keep(conn)
            self._slots.release()
            return
        try:
            with trio.move_on_after(RESET_TIMEOUT, shield=True):
                if await self._reset(conn):
                    self._keep(conn)
                    return
            await self._discard(conn)
        finally:
            self._slots.release()

    async def aclose(self) -> None:
        """Close idle connections now; those in use are closed when returned."""
        self._closed = True
        idle, self._idle = self._idle, deque()
        with trio.move_on_after(RESET_TIMEOUT, shield=True):
            for conn in idle:
                await conn.close()

    def statistics(self) -> PoolStatistics:
        idle = len(self._idle)
        return PoolStatistics(
            max_size=self._max_size,
            size=idle + self._in_use,
            idle=idle,
            in_use=self._in_use,
            tasks_waiting=self._slots.statistics().tasks_waiting,
            opened=self._opened,
            discarded=self._discarded,
            checkouts=self._checkouts,
            waits=self._waits,
            wait_seconds=self._wait_seconds,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError("the pool is closed")

    async def _open(self) -> TrioConnection[Any]:
        conn = await TrioConnection.connect(self._conninfo, **self._connect_kwargs)
        self._opened += 1
        conn.prelude = (*self._reset_commands, *self._setup)
        return conn

    def _keep(self, conn: TrioConnection[Any]) -> None:
        """Back among the idle, its session to be reset for its next user (``reset``)."""
        if self._reset_commands:
            conn.discard_deferred()  # what its last user left unsent is nobody's now
            conn.prelude = (*self._reset_commands, *self._setup)
        self._idle.append(conn)

    async def _take_idle(self) -> TrioConnection[Any] | None:
        """The most recently used idle connection that is still alive."""
        while self._idle:
            conn = self._idle.pop()
            try:
                alive = await _is_alive(conn)
            except BaseException:
                self._idle.append(conn)  # cancelled while checking: it is still ours
                raise
            if alive:
                return conn
            await self._discard(conn)
        return None

    def _clean(self, conn: TrioConnection[Any]) -> bool:
        """Fit for its next user as it is: open, idle, in the pool's autocommit mode."""
        return (
            not self._closed
            and not conn.closed
            and not conn.read_only_seen
            and conn.pgconn.status == ConnStatus.OK
            and conn.pgconn.transaction_status == _IDLE
            and conn.autocommit == self._autocommit
        )

    async def _reset(self, conn: TrioConnection[Any]) -> bool:
        """Make ``conn`` fit for its next user; False if it must be closed (a read-only
        server's too: `TrioConnection.read_only_seen`)."""
        if self._closed or conn.closed or conn.pgconn.status != ConnStatus.OK:
            return False
        if conn.read_only_seen:
            return False
        status = conn.pgconn.transaction_status
        try:
            if status in _IN_TX:
                await conn.rollback()
            elif status != _IDLE:
                return False  # ACTIVE or UNKNOWN: nobody can say what it is doing
            if conn.autocommit != self._autocommit:
                await conn.set_autocommit(self._autocommit)
        except psycopg.Error as ex:
            logger.info("discarding a connection that failed to reset: %s", ex)
            return False
        return conn.pgconn.transaction_status == _IDLE

    async def _discard(self, conn: TrioConnection[Any]) -> None:
        self._discarded += 1
        with trio.move_on_after(RESET_TIMEOUT, shield=True):
            await conn.close()


async def _is_alive(conn: TrioConnection[Any]) -> bool:
    """Health check at checkout: cheap when nothing arrived while idle."""
    if conn.closed or conn.pgconn.status != ConnStatus.OK:
        return False
    verdict = _looks_alive(conn)
    if verdict is not None:
        return verdict  # no checkpoint of its own: getconn has taken one
    # Something arrived while idle: a notification, a parameter change, or the
    # FATAL message of a terminated backend whose EOF is still on its way. Ask.
    with trio.move_on_after(RESET_TIMEOUT, shield=True):
        try:
            await conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False
    return False


def _looks_alive(conn: TrioConnection[Any]) -> bool | None:
    """Read whatever is pending on an idle connection without blocking.

    True: nothing pending, alive. False: the server closed it. None: data
    arrived and was consumed; only a round trip can tell. The first read after
    ``pg_terminate_backend`` can succeed (the FATAL comes as a notice), so a
    connection that received anything is never trusted without asking.
    """
    pgconn = conn.pgconn
    poller = select.poll()
    poller.register(pgconn.socket, select.POLLIN)
    received = False
    while poller.poll(0):
        try:
            pgconn.consume_input()
        except psycopg.OperationalError:
            return False
        if pgconn.status != ConnStatus.OK:
            return False
        while pgconn.notifies() is not None:
            pass
        if received:
            return None
        received = True
    return None if received else True
