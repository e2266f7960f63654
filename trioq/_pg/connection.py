"""psycopg 3 connections driven by trio.

`TrioConnection` is a `psycopg.AsyncConnection` whose every wait goes through
trio (``trio.lowlevel.wait_readable`` / ``wait_writable`` on the libpq socket),
so users get all of psycopg (parameters, row factories, transactions and
savepoints, ``executemany``, COPY, pipeline mode, server-side cursors, type
registration) with no asyncio loop, no trio-asyncio and no thread per query.

The asyncio touch points of ``AsyncConnection`` replaced here (see
``tests/test_pg_audit.py``, which fails if psycopg moves them):

* ``self.lock``: an ``asyncio.Lock``; replaced by `ConnectionLock`.
* ``connect()``: asyncio name resolution and ``wait_conn_async``.
* ``wait()``: ``waiting.wait_async`` and cancel-on-``CancelledError``.
* ``cancel_safe()``: ``wait_conn_async``.
* ``notifies()``: holds the lock across ``yield``; replaced by a version that
  takes the lock per batch so a consumer can leave early.

Deferred commands (`TrioConnection.defer`): SQL without parameters (``BEGIN``,
``SAVEPOINT``, ``RELEASE``) that the connection sends ahead of its next statement, in the
same round trip when that statement is an ``execute()`` with parameters (pipeline mode),
else as one simple query just before it. `wait()` sends them, so every operation (a
cursor, COPY, a nested ``transaction()``) finds them done; ``job.transaction()`` uses them
so that its ``BEGIN`` costs no round trip of its own.

A prelude (`TrioConnection.prelude`): commands a pool sets up a session with for its next
user (`trioq._pg.pool`'s reset). They go out ahead of the deferred commands in the same
write, but in a transaction of their own (``BEGIN`` ... ``COMMIT``): sent in the implicit
transaction of the next statement, a failing statement or a rolled-back transaction would
undo what they set (``RESET ALL`` and ``set_config`` are transactional), and the user
would go on in its predecessor's session. (Not a pipeline ``Sync`` of their own: a
transaction pooler such as PgBouncer 1.18 may hand the server connection to another
client at a ``Sync``, with the rest of the round trip still in flight.)
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
from collections.abc import Sequence
from functools import partial
from types import TracebackType
from typing import Any, Self, TypeVar

import psycopg
import trio
from psycopg import errors as e
from psycopg.abc import AdaptContext, PQGen
from psycopg.adapt import AdaptersMap
from psycopg.conninfo import conninfo_attempts, make_conninfo
from psycopg.pq import ExecStatus, PipelineStatus, TransactionStatus
from psycopg.rows import AsyncRowFactory, Row

from .._exceptions import ConnectError
from .conn import Conn
from .errors import check_dsn, describe_target
from .lean import first_row
from .pipeline import execute_pipelined, send_pipelined
from .wait import readable_now as _readable_now
from .wait import wait_conn_gen, wait_gen

__all__ = ["Conn", "ConnectionLock", "Notifications", "TrioConnection", "connect"]

logger = logging.getLogger("trioq.pg")

RV = TypeVar("RV")


#: How long a cancelled query may take to acknowledge a server-side cancel
#: before the connection is given up and closed.
#: Seconds a connection attempt may take when the DSN does not say (``connect_timeout``).
DEFAULT_CONNECT_TIMEOUT = 10.0
CANCEL_DRAIN_TIMEOUT = 5.0

#: How long close() keeps asking the server to cancel a running statement.
CLOSE_CANCEL_TIMEOUT = 1.0

_ACTIVE = TransactionStatus.ACTIVE
_IDLE = TransactionStatus.IDLE
_PIPELINE_OFF = PipelineStatus.OFF
_FATAL_ERROR = ExecStatus.FATAL_ERROR


#: The prelude's own transaction (`TrioConnection.take_prelude`).
_BEGIN, _COMMIT = b"BEGIN", b"COMMIT"

class ConnectionLock:
    """The connection's lock: a `trio.Lock` that does not checkpoint when free.

    ``trio.Lock.acquire()`` is a checkpoint even when the lock is free, so in a
    cancelled scope ``AsyncTransaction.__aexit__`` would raise before sending
    ROLLBACK and leave the connection INERROR. Taking a free lock with
    ``acquire_nowait()`` avoids that; a contended lock still waits (and can be
    cancelled) as usual.
    """

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = trio.Lock()

    async def __aenter__(self) -> None:
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            await self._lock.acquire()

    async def __aexit__(self, *exc_info: object) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()


class TrioConnection(psycopg.AsyncConnection[Row]):
    """A psycopg ``AsyncConnection`` for trio. Create it with `connect`."""

    __module__ = "trioq.pg"

    def __init__(self, pgconn: Any, row_factory: Any = None) -> None:
        if row_factory is None:
            super().__init__(pgconn)
        else:
            super().__init__(pgconn, row_factory)
        self.lock = ConnectionLock()  # type: ignore[assignment]
        #: Commands to send before the next statement (`defer`).
        self._deferred: list[bytes] = []
        #: Statements with parameters to send after those (`defer_statement`).
        self._deferred_statements: list[tuple[Any, Any]] = []
        #: The cursor of trioq's own statements, its adapters kept (`kept_cursor`).
        self._kept_cursor: psycopg.AsyncCursor[Any] | None = None
        #: Commands to send before those, in a transaction of their own (`prelude`).
        self._prelude: tuple[bytes, ...] = ()
        #: Set while the connection is lent out inside a transaction that someone else
        #: commits (``job.transaction()``): commit(), rollback() and set_autocommit() refuse.
        self._owned_by: str | None = None
        #: A statement on it failed because the server is read-only (SQLSTATE 25006: a
        #: standby, the old primary after a failover): a pool closes it rather than keep it,
        #: so the next connection is a new one, to wherever the DSN leads now.
        self.read_only_seen = False

    @classmethod
    async def connect(
        cls,
        conninfo: str = "",
        *,
        autocommit: bool = False,
        prepare_threshold: int | None = 5,
        row_factory: AsyncRowFactory[Row] | None = None,
        context: AdaptContext | None = None,
        **kwargs: Any,
    ) -> Self:
        """Connect, honouring ``connect_timeout`` and any enclosing trio deadline;
        ``context``: the adapters to start from (as psycopg's ``connect``)."""
        check_dsn(conninfo)  # libpq's own parse error would quote the DSN, password included
        params = await cls._get_connection_params(conninfo, **kwargs)
        timeout = connect_timeout(params)
        try:
            attempts = await _resolve(params)
        except e.OperationalError as ex:  # no host name resolved
            raise ConnectError(
                f"cannot connect to {describe_target(params)}: {_first_line(str(ex))}"
            ) from None
        errors: list[str] = []
        for attempt in attempts:
            with trio.move_on_after(timeout) as scope:
                try:
                    conn: Self = await wait_conn_gen(cls._connect_gen(make_conninfo("", **attempt)))
                except e.Error as ex:
                    errors.append(_first_line(str(ex)))
                    continue
            if scope.cancelled_caught:
                errors.append(f"connection timeout expired after {timeout} s")
                continue
            conn._autocommit = bool(autocommit)
            if row_factory is not None:
                conn.row_factory = row_factory
            conn.prepare_threshold = prepare_threshold
            if context is not None:
                conn._adapters = AdaptersMap(context.adapters)
            return conn
        raise ConnectError(f"cannot connect to {describe_target(params)}: {'; '.join(errors)}")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        """Commit (or roll back on error), then close, even if cancelled meanwhile.

        psycopg's own ``__aexit__`` skips the close when the rollback raises
        ``trio.Cancelled`` (not an ``Exception``), leaking the connection.
        """
        if self.closed:
            return
        try:
            if exc_type is None:
                await self.commit()
            else:
                try:
                    await self.rollback()
                except Exception as ex:
                    logger.warning("error ignored in rollback on %s: %s", self, ex)
        finally:
            if not getattr(self, "_pool", None):
                self._close_now()

    def defer(self, *commands: bytes) -> None:
        """Send ``commands`` (SQL without parameters) before this connection's next statement.

        When that statement is an `execute` with parameters, they travel in its round
        trip (pipeline mode); before any other operation they go first, as one simple
        query. An error in one of them is raised by that operation.
        """
        self._deferred.extend(commands)

    def defer_statement(self, query: Any, params: Any) -> None:
        """Send ``query`` with ``params`` after the deferred commands (`defer`), before this
        connection's next statement, in its round trip (pipeline mode; before an operation
        that cannot be pipelined, in a round trip of their own). Its rows are dropped; its
        error is raised by that operation, and what follows it does not run."""
        self._deferred_statements.append((query, params))

    def kept_cursor(self) -> psycopg.AsyncCursor[Any]:
        """The one cursor of this connection for trioq's own statements whose results no
        caller reads as a cursor: it adapts the parameters of deferred statements
        (`defer_statement`) and runs `first_row`. Made once, so its adapters are too; used
        only under the connection's lock. Not for callers' statements."""
        if self._kept_cursor is None:
            cursor = psycopg.AsyncCursor(self)
            cursor._tx = psycopg.adapt.Transformer(cursor)
            self._kept_cursor = cursor
        return self._kept_cursor

    def discard_deferred(self) -> list[bytes]:
        """Forget the commands and statements not sent yet; returns the commands."""
        deferred, self._deferred = self._deferred, []
        self._deferred_statements = []
        return deferred

    @property
    def deferred(self) -> tuple[bytes, ...]:
        """The commands `defer` holds, not sent yet."""
        return tuple(self._deferred)

    @property
    def deferred_statements(self) -> tuple[tuple[Any, Any], ...]:
        """The statements `defer_statement` holds, not sent yet."""
        return tuple(self._deferred_statements)

    @property
    def prelude(self) -> tuple[bytes, ...]:
        """Commands (SQL without parameters) sent before the next operation, ahead of the
        deferred ones (`defer`) and in the same round trip, but in an implicit transaction
        of their own (``BEGIN`` ... ``COMMIT``), so that nothing after them can undo what
        they set; sent once. Setting it replaces what was not sent yet. If one of them
        fails, nothing after it in that round trip runs (the server skips to the ``Sync``),
        the connection is closed, and the error raised: nothing more runs on a session whose
        setup failed."""
        return self._prelude

    @prelude.setter
    def prelude(self, commands: Sequence[bytes]) -> None:
        self._prelude = tuple(commands)

    def take_prelude(self) -> tuple[bytes, ...]:
        """The prelude as it is sent (in ``BEGIN`` ... ``COMMIT``), forgotten; () if none."""
        prelude, self._prelude = self._prelude, ()
        return (_BEGIN, *prelude, _COMMIT) if prelude else ()

    async def execute(
        self, query: Any, params: Any = None, *, prepare: bool | None = None,
        binary: bool = False,
    ) -> psycopg.AsyncCursor[Row]:  # fmt: skip
        """psycopg's ``execute``; deferred commands (`defer`) travel in its round trip."""
        try:
            ahead = self._deferred or self._prelude or self._deferred_statements
            if params and ahead and self._pipeline is None:
                (cur,) = await self.execute_together([(query, params)], prepare=prepare,
                                                     binary=binary)  # fmt: skip
                return cur
            return await super().execute(query, params, prepare=prepare, binary=binary)
        except e.ReadOnlySqlTransaction:
            self.read_only_seen = True
            raise

    async def execute_together(
        self, statements: Sequence[tuple[Any, Any]], *, prepare: bool | None = None,
        binary: bool = False,
    ) -> list[psycopg.AsyncCursor[Row]]:  # fmt: skip
        """Execute ``(query, params)`` pairs in one round trip and one write (pipeline
        mode), after any deferred commands; a cursor for each. The first error is raised
        once all have been sent: statements after a failing one do not run. On a
        connection that is not autocommit, the transaction psycopg would open first opens
        in the same round trip (its ``BEGIN`` goes ahead of the deferred commands)."""
        if not self.autocommit and self.pgconn.transaction_status == _IDLE:
            self._deferred.insert(0, self._get_tx_start_command())
        try:
            return await execute_pipelined(self, statements, prepare=prepare, binary=binary)
        except e.ReadOnlySqlTransaction:
            self.read_only_seen = True
            raise

    async def first_row(self, query: Any, params: Any = None) -> tuple[Any, ...] | None:
        """The first row of one of trioq's own statements (rendered to bytes), as a tuple
        whatever the connection's row factory; None if it returned none. One round trip
        with less of psycopg's Python than ``execute()`` (`trioq._pg.lean`): the single
        enqueue's path."""
        try:
            return await first_row(self, query, params)
        except e.ReadOnlySqlTransaction:
            self.read_only_seen = True
            raise

    async def sync(self) -> None:
        """One round trip that runs nothing: a protocol ``Sync``, which the server answers
        with ``ReadyForQuery``, after any deferred commands. It proves the session alive
        (and what it holds, such as a session's advisory lock) for about half the server
        CPU of a ``SELECT 1`` (docs/benchmarks.md, round 8)."""
        await execute_pipelined(self, ())

    async def commit(self) -> None:
        self._check_not_owned("commit()")
        await super().commit()

    async def rollback(self) -> None:
        self._check_not_owned("rollback()")
        await super().rollback()

    async def set_autocommit(self, value: bool) -> None:
        self._check_not_owned("set_autocommit()")
        await super().set_autocommit(value)

    def guard_transaction(self, owner: str | None) -> None:
        """While ``owner`` (e.g. ``"job.transaction()"``) is set, commit(), rollback() and
        set_autocommit() refuse: the transaction the connection is lent out in is ended by
        its owner."""
        self._owned_by = owner

    def _check_not_owned(self, what: str) -> None:
        if self._owned_by is not None:
            raise e.ProgrammingError(
                f"{what} is not allowed inside {self._owned_by}: its transaction commits "
                "(or rolls back) when the block ends"
            )

    async def wait(self, gen: PQGen[RV], interval: float = 0.0, timeout: float | None = None) -> RV:
        """Run ``gen`` on this connection's socket (after any deferred commands).

        If the calling task is cancelled while the server is executing a
        statement, a server-side cancel is sent and the generator drained (in a
        shielded scope bounded by `CANCEL_DRAIN_TIMEOUT`), so the connection
        is left usable; if the drain does not finish, the connection is closed.
        The cancellation is always re-raised.
        """
        if self._deferred or self._prelude or self._deferred_statements:
            await self._send_deferred()
        return await self._wait(gen, timeout)

    async def _wait(self, gen: PQGen[RV], timeout: float | None) -> RV:
        fileno = self.pgconn.socket
        try:
            if timeout is None:
                return await wait_gen(gen, fileno)
            with trio.move_on_after(timeout):
                return await wait_gen(gen, fileno)
            raise e._WaitTimeout("wait timeout expired")
        except trio.Cancelled:
            if self.pgconn.transaction_status == _ACTIVE:
                await self._cancel_and_drain(gen, fileno)
            raise

    async def _send_deferred(self) -> None:
        """The prelude and the deferred commands: queued ahead in pipeline mode, else sent
        now."""
        pipeline = self._pipeline
        if pipeline is not None:
            if self.pgconn.pipeline_status == _PIPELINE_OFF:
                if self._deferred_statements:  # entering pipeline mode: send them all first
                    await send_pipelined(self, ())
                return  # entering pipeline mode: the next operation queues them
            if self._deferred_statements:  # no cursor would take their results
                raise e.ProgrammingError("a statement was deferred into an open pipeline")
            send = self.pgconn.send_query_params
            for command in (*self.take_prelude(), *self.discard_deferred()):
                pipeline.command_queue.append(partial(send, command, None))
                pipeline.result_queue.append(None)
            return
        self._check_connection_ok()
        if self._prelude or self._deferred_statements:
            await send_pipelined(self, ())  # the lock is held already
            return
        self.pgconn.send_query(b"; ".join(self.discard_deferred()))
        for result in await self._wait(psycopg.generators.execute(self.pgconn), None):
            if result.status == _FATAL_ERROR:
                raise e.error_from_result(result, encoding=self.pgconn._encoding)

    async def _cancel_and_drain(self, gen: PQGen[Any], fileno: int) -> None:
        with trio.move_on_after(CANCEL_DRAIN_TIMEOUT, shield=True) as scope:
            try:
                await self.cancel_safe(timeout=CANCEL_DRAIN_TIMEOUT)
                await wait_gen(gen, fileno)
            except e.Error:
                pass  # QueryCanceled as expected, or the statement's own error
        if scope.cancelled_caught or self.pgconn.transaction_status == _ACTIVE:
            logger.warning("query not terminated after cancellation: closing connection")
            self._close_now()

    async def cancel_safe(self, *, timeout: float = 30.0) -> None:
        """Ask the server to cancel the running statement; wait for the request to land."""
        if not self._should_cancel():
            return
        with trio.move_on_after(timeout) as scope:
            await wait_conn_gen(self._cancel_gen())
        if scope.cancelled_caught:
            raise e.CancellationTimeout("cancellation timeout expired")

    async def close(self) -> None:
        """Close the connection; a statement still running is cancelled first.

        Safe to call from another task while a query waits: that task gets
        ``QueryCanceled`` or ``trio.ClosedResourceError``, and the server stops
        the statement.
        """
        if self.closed:
            return
        if self.pgconn.transaction_status == _ACTIVE:
            await self._cancel_before_close()
        self._close_now()
        await trio.lowlevel.checkpoint()

    async def _cancel_before_close(self) -> None:
        """Cancel until the server answers (shielded, bounded by `CLOSE_CANCEL_TIMEOUT`).

        A cancel that reaches the backend before it has read the statement is
        ignored by the server, so one request is not always enough.
        """
        with trio.move_on_after(CLOSE_CANCEL_TIMEOUT, shield=True):
            while self.pgconn.transaction_status == _ACTIVE:
                try:
                    await self.cancel_safe(timeout=CLOSE_CANCEL_TIMEOUT)
                except e.Error as ex:
                    logger.debug("cancel before close failed: %s", ex)
                    return
                with trio.move_on_after(0.1):
                    # Another task owns the socket's reads: we can only look, not wait.
                    while not _readable_now(self.pgconn.socket):  # noqa: ASYNC110
                        await trio.sleep(0.005)
                    return

    def _close_now(self) -> None:
        if self._closed:
            return
        self._closed = True
        fileno = self.pgconn.socket if self.pgconn.status == psycopg.pq.ConnStatus.OK else -1
        if fileno >= 0:
            trio.lowlevel.notify_closing(fileno)
        self.pgconn.finish()

    def notifies(  # type: ignore[override]
        self, *, timeout: float | None = None, stop_after: int | None = None
    ) -> Notifications:
        """Notifications as they arrive: ``async for note in conn.notifies(): ...``.

        Unlike psycopg's own, this is a plain async iterator that holds the
        connection lock only while waiting for a batch, never between items:
        a consumer may ``break`` out of the loop at any time and go on using
        the connection. ``timeout`` ends the iteration after that many seconds,
        ``stop_after`` after that many notifications.
        """
        deadline = math.inf if timeout is None else trio.current_time() + timeout
        return Notifications(self, deadline, stop_after)


class Notifications:
    """Async iterator over a connection's notifications; see `TrioConnection.notifies`.

    Notifications are taken one at a time from the connection's backlog (where
    psycopg puts every notification it reads, during queries too), never copied
    into the iterator: leaving the loop early loses none of them.
    """

    def __init__(self, conn: TrioConnection[Any], deadline: float, stop_after: int | None):
        self._conn = conn
        self._deadline = deadline
        self._left = math.inf if stop_after is None else stop_after

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> psycopg.Notify:
        if self._left <= 0:
            raise StopAsyncIteration
        backlog = self._conn._notifies_backlog
        assert backlog is not None  # psycopg's own notifies() (which unsets it) is overridden
        while not backlog:
            if not await self._wait():
                raise StopAsyncIteration
        self._left -= 1
        return backlog.popleft()

    async def _wait(self) -> bool:
        """Wait for the server to send something; False once the deadline has passed."""
        conn = self._conn
        async with conn.lock:
            with trio.move_on_at(self._deadline):
                if not conn._notifies_backlog:
                    await conn.wait(psycopg.generators.notifies(conn.pgconn))
                else:
                    await trio.lowlevel.checkpoint()
                return True
        return False


def connect_timeout(params: dict[str, Any]) -> float:
    """Seconds each connection attempt may take: ``connect_timeout`` from the DSN, the
    keywords or ``PGCONNECT_TIMEOUT``, else `DEFAULT_CONNECT_TIMEOUT` (libpq's and psycopg's
    own default waits 130 s, or forever, for a server that accepts TCP and never answers)."""
    if params.get("connect_timeout") is None and not os.environ.get("PGCONNECT_TIMEOUT"):
        return DEFAULT_CONNECT_TIMEOUT
    return psycopg.conninfo.timeout_from_conninfo(params)


async def _resolve(params: dict[str, Any]) -> list[dict[str, Any]]:
    """Split ``params`` into connection attempts; name lookup runs off the loop."""
    if _needs_lookup(params):
        return await trio.to_thread.run_sync(conninfo_attempts, params, abandon_on_cancel=True)
    await trio.lowlevel.checkpoint()
    return conninfo_attempts(params)


def _needs_lookup(params: dict[str, Any]) -> bool:
    if params.get("hostaddr"):
        return False
    for host in str(params.get("host") or "").split(","):
        if host and not host.startswith("/") and not _is_ip(host):
            return True
    return False


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


async def connect(conninfo: str = "", **kwargs: Any) -> TrioConnection[Any]:
    """Open a `TrioConnection`: ``async with await trioq.connect(dsn) as conn: ...``.

    Keyword arguments are those of ``psycopg.AsyncConnection.connect``
    (``autocommit``, ``row_factory``, ``prepare_threshold``) and libpq
    parameters (``connect_timeout``, ``application_name``, ...). Raises
    `ConnectError` (a ``psycopg.OperationalError``) naming the target, never
    the password.
    """
    return await TrioConnection.connect(conninfo, **kwargs)
