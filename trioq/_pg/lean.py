"""One of trioq's own statements, one round trip, no cursor: the first row as a tuple.

`TrioConnection.first_row` runs the statements that run once per call of a hot path (the
single enqueue's insert) the way ``execute()`` would, prepared after the same number of
executions and in the same cache of prepared statements, but without what a caller's
``execute()`` needs and trioq's own statement does not:

- a new cursor and a new `Transformer` each call (the connection keeps one cursor whose
  adapters are kept, `TrioConnection.kept_cursor`);
- the connection's row factory: the row is always a tuple, so a caller's connection with
  ``row_factory=dict_row`` serves trioq as well as one with tuples;
- psycopg's generator of an execute and its bookkeeping of the cursor's results.

A single enqueue cost the client 230-245 µs of CPU through ``execute()`` and ``fetchone()``
and 172-180 µs through this path (docs/benchmarks.md, round 9); the floor, libpq's own
calls driven by trio with nothing of psycopg's Python, is 96-115 µs.

Where the shortcut would change what the caller's connection does, it takes ``execute()``
instead: commands or statements waiting to go first (`TrioConnection.defer`, the prelude),
psycopg's pipeline mode, a connection not in autocommit whose transaction has not begun
(psycopg opens it first), and the execution that prepares the statement (psycopg's own
two round trips, once per statement and session).

It uses these psycopg internals, which ``tests/test_pg_pipeline.py`` checks with
`trioq._pg.pipeline`'s: a cursor's ``_reset``, ``_tx`` and ``_convert_query``, the
connection's ``_prepared`` (``get``, ``maybe_add_to_cache``, ``validate``, ``maintain_gen``),
``_check_connection_ok`` and ``_pipeline``, and ``psycopg.generators.execute``.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import errors as e
from psycopg import pq
from psycopg._preparing import Prepare

#: A `trioq.pg.TrioConnection` (``_pg.connection`` imports this module, so not imported back).
TrioConnection = Any

__all__ = ["first_row"]

_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_COMMAND_OK = pq.ExecStatus.COMMAND_OK
_FATAL = pq.ExecStatus.FATAL_ERROR
_IDLE = pq.TransactionStatus.IDLE


def _takes_execute(conn: TrioConnection) -> bool:
    """True where the lean path would change what the caller's connection does."""
    return bool(
        conn._deferred or conn._prelude or conn._deferred_statements
        or conn._pipeline is not None
        or (not conn.autocommit and conn.pgconn.transaction_status == _IDLE)
    )  # fmt: skip


async def first_row(
    conn: TrioConnection, query: Any, params: Any = None
) -> tuple[Any, ...] | None:
    """The first row of ``query`` with ``params`` (None if it returned none), as a tuple;
    any other rows dropped. Errors are raised as ``execute()`` raises them."""
    if _takes_execute(conn):
        return await _by_execute(conn, query, params)
    async with conn.lock:
        conn._check_connection_ok()
        if _takes_execute(conn):  # changed while the lock was awaited
            return await _by_execute_locked(conn, query, params)
        cursor = conn.kept_cursor()
        cursor._reset()
        pgq = cursor._convert_query(query, params)  # a bad parameter raises, nothing sent
        prep, name = conn._prepared.get(pgq, None)
        if prep is Prepare.SHOULD:  # psycopg prepares it: once per statement and session
            return await _by_execute_locked(conn, query, params)
        pgconn = conn.pgconn
        if prep is Prepare.NO:
            pgconn.send_query_params(pgq.query, pgq.params, param_formats=pgq.formats,
                                     param_types=pgq.types)  # fmt: skip
        else:
            pgconn.send_query_prepared(name, pgq.params, param_formats=pgq.formats)
        results = await conn._wait(psycopg.generators.execute(pgconn), None)
        key = conn._prepared.maybe_add_to_cache(pgq, prep, name)
        if key is not None:
            conn._prepared.validate(key, prep, name, results)
        if conn._prepared._to_flush:  # statements psycopg evicts from its cache
            await conn._wait(conn._prepared.maintain_gen(conn), None)
        return _row(cursor, results, pgconn._encoding)


def _row(
    cursor: psycopg.AsyncCursor[Any], results: list[pq.abc.PGresult], encoding: str
) -> tuple[Any, ...] | None:
    for result in results:
        if result.status == _FATAL:
            raise e.error_from_result(result, encoding=encoding)
    result = results[0]
    if result.status not in (_COMMAND_OK, _TUPLES_OK):
        raise e.InternalError(f"unexpected result from trioq's statement: {result.status!r}")
    return _first(cursor, result)


async def _by_execute(conn: TrioConnection, query: Any, params: Any) -> tuple[Any, ...] | None:
    cur = await conn.execute(query, params)
    return _first(cur, cur.pgresult)


async def _by_execute_locked(
    conn: TrioConnection, query: Any, params: Any
) -> tuple[Any, ...] | None:
    """``execute()`` by a caller that holds the connection's lock (a cursor's execute takes
    it again: trioq's `ConnectionLock` is not reentrant), so through the cursor's generator."""
    cur = conn.kept_cursor()
    await conn.wait(cur._execute_gen(query, params))
    return _first(cur, cur.pgresult)


def _first(cursor: psycopg.AsyncCursor[Any], result: Any) -> tuple[Any, ...] | None:
    """The first row of ``result`` loaded by ``cursor``'s adapters, as a tuple; None if it
    has no rows (or none at all: a command)."""
    if result is None or result.status != _TUPLES_OK or not result.ntuples:
        return None
    cursor._tx.set_pgresult(result)
    row: tuple[Any, ...] = cursor._tx.load_row(0, tuple)
    return row
