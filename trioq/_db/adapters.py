"""The caller's connections, seen through the part of ``psycopg.AsyncConnection`` that the
enqueue path uses: one implementation of the rules for every kind of producer.

`trioq.Queue`'s enqueue, signal, workflow and batch calls are coroutines that await only
their connection (``execute`` and its cursor's ``fetchone``/``fetchall``, ``transaction()``,
``cursor()`` and COPY's ``write``, and read ``autocommit`` and ``info``). So the same code
serves:

- `AsyncAdapter`: an asyncio ``psycopg.AsyncConnection`` (FastAPI, Litestar, SQLAlchemy's
  async engine), or trioq's own `trioq.TrioConnection`: the coroutine runs in the caller's
  event loop.
- `SyncAdapter`: a sync ``psycopg.Connection`` (Django, Flask, SQLAlchemy's engine, a
  script). Its methods are coroutines that call psycopg's blocking API and never suspend,
  so `run_sync` completes the whole enqueue coroutine in one ``send(None)``; a coroutine
  that would suspend is a bug of trioq's, reported as such.

Both make their cursors themselves (``psycopg.Cursor(conn)``), not through the connection's
``cursor_factory`` (Django's is a client-side binding cursor, and a caller's may be a raw
cursor with ``$1`` placeholders), with tuples for rows whatever the connection's
``row_factory`` (trioq reads its rows by position: with ``dict_row`` every enqueue
failed), and load with psycopg's own adapters plus trioq's
tolerant ``timestamptz`` (`trioq._pg.times.TOLERANT`), not the connection's: Django loads
``jsonb`` as text. What the caller's transaction holds is unchanged: the statements run on
the caller's connection, in its transaction if one is open (an autocommit connection gets
a transaction of trioq's own where the call needs more than one statement, as on trio).
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

import psycopg
from psycopg.adapt import AdaptersMap
from psycopg.rows import tuple_row

from .._pg.times import TOLERANT

__all__ = ["AsyncAdapter", "SyncAdapter", "adapter_cache", "run_sync", "tuple_rows"]

R = TypeVar("R")
C = TypeVar("C", psycopg.Connection[Any], psycopg.AsyncConnection[Any])


def _own_adapters(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    """Dump and load with psycopg's defaults (and trioq's timestamptz), whatever the
    caller registered on its connection."""
    cur._adapters = AdaptersMap(TOLERANT)


class _SyncCursor:
    """A sync cursor behind the async cursor API (fetch, COPY)."""

    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self._cur = cur

    async def fetchone(self) -> Any:
        return self._cur.fetchone()

    async def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    @asynccontextmanager
    async def copy(self, statement: Any) -> AsyncIterator[_SyncCopy]:
        with self._cur.copy(statement) as copy:
            yield _SyncCopy(copy)


class _SyncCopy:
    def __init__(self, copy: psycopg.Copy) -> None:
        self._copy = copy

    async def write(self, data: bytes) -> None:
        self._copy.write(data)

    async def write_row(self, row: Sequence[Any]) -> None:
        self._copy.write_row(row)


class _Adapter(Generic[C]):
    def __init__(self, conn: C) -> None:
        # Weakly: the adapter is cached per connection (`adapter_cache`), and must not
        # keep it alive.
        self._ref: weakref.ref[C] = weakref.ref(conn)

    @property
    def raw(self) -> C:
        conn = self._ref()
        if conn is None:  # pragma: no cover - only reachable through a leaked adapter
            raise RuntimeError("the connection behind this trioq adapter was closed and freed")
        return conn

    @property
    def autocommit(self) -> bool:
        return self.raw.autocommit

    @property
    def info(self) -> psycopg.ConnectionInfo:
        return self.raw.info


class SyncAdapter(_Adapter[psycopg.Connection[Any]]):
    """A sync ``psycopg.Connection`` behind the ``AsyncConnection`` calls of the enqueue
    path; every call completes without suspending (`run_sync`)."""

    def _cursor(self) -> psycopg.Cursor[Any]:
        cur: psycopg.Cursor[Any] = psycopg.Cursor(self.raw, row_factory=tuple_row)
        _own_adapters(cur)
        return cur

    async def execute(self, query: Any, params: Any = None) -> _SyncCursor:
        cur = self._cursor()
        cur.execute(query, params)
        return _SyncCursor(cur)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        with self.raw.transaction():
            yield

    @asynccontextmanager
    async def cursor(self) -> AsyncIterator[_SyncCursor]:
        with self._cursor() as cur:
            yield _SyncCursor(cur)


class AsyncAdapter(_Adapter[psycopg.AsyncConnection[Any]]):
    """An async ``psycopg.AsyncConnection`` (asyncio's or trio's) with cursors of trioq's
    own making."""

    def _cursor(self) -> psycopg.AsyncCursor[Any]:
        cur: psycopg.AsyncCursor[Any] = psycopg.AsyncCursor(self.raw, row_factory=tuple_row)
        _own_adapters(cur)
        return cur

    async def execute(self, query: Any, params: Any = None) -> psycopg.AsyncCursor[Any]:
        cur = self._cursor()
        await cur.execute(query, params)
        return cur

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        async with self.raw.transaction():
            yield

    @asynccontextmanager
    async def cursor(self) -> AsyncIterator[psycopg.AsyncCursor[Any]]:
        async with self._cursor() as cur:
            yield cur


A = TypeVar("A", bound=_Adapter[Any])


class adapter_cache(Generic[A]):
    """One adapter per connection, for as long as the connection lives, so that what
    `trioq.Queue` remembers per connection (its schema version was checked) holds across
    calls."""

    def __init__(self, kind: type[A]) -> None:
        self._kind: type[A] = kind
        self._adapters: weakref.WeakKeyDictionary[Any, A] = weakref.WeakKeyDictionary()

    def __call__(self, conn: Any) -> A:
        found = self._adapters.get(conn)
        if found is None:
            found = self._adapters[conn] = self._kind(conn)
        return found


class TupleRows(AsyncAdapter):
    """A caller's async connection whose ``row_factory`` does not make tuples, as trioq's
    calls see it (`tuple_rows`): its cursors make tuples and load with trioq's adapters;
    everything else (``wait``, ``lock``, ``pgconn``, ``first_row``, ...) is the
    connection's own."""

    def cursor(self) -> psycopg.AsyncCursor[Any]:  # type: ignore[override]
        """A cursor as the connection's ``cursor()`` makes one (``async with`` takes it
        too), with tuples for rows and trioq's adapters."""
        return self._cursor()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


_TUPLE_ROWS: adapter_cache[TupleRows] = adapter_cache(TupleRows)


def tuple_rows(conn: Any) -> Any:
    """``conn`` as trioq's calls need it: itself if its rows are tuples (or it is an adapter
    already), else its `TupleRows` view (one per connection). trioq reads its rows by
    position; on a connection made with ``row_factory=dict_row`` every call failed with
    ``KeyError: 0``."""
    if isinstance(conn, _Adapter) or getattr(conn, "row_factory", tuple_row) is tuple_row:
        return conn
    return _TUPLE_ROWS(conn)


def run_sync(coro: Coroutine[Any, Any, R]) -> R:
    """Run a coroutine that awaits only `SyncAdapter` calls, to its end, here."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: R = done.value
        return result
    coro.close()
    raise RuntimeError(
        "trioq.producer: the enqueue path suspended on a sync connection, which it never "
        "should: a bug in trioq, please report it"
    )
