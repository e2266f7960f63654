"""Deferred commands and statements in one round trip, on libpq's pipeline mode directly.

`TrioConnection.execute_together` sends what `TrioConnection.defer` holds (``BEGIN``,
``SAVEPOINT``, ``RELEASE``) and then its statements, with parameters, in one write and one
``Sync``. psycopg's own pipeline (``conn.pipeline()``) does the same, but its general
machinery (a pipeline object, command and result queues, a flush per command) cost 40-60 µs
of client CPU per call more than this path, on a one-row ``job.transaction()`` of about
300 µs (docs/transactions.md). This module drives libpq's pipeline mode for
exactly this shape and hands each statement's results to a psycopg cursor, so the caller
gets the same cursor (rows, ``rowcount``, errors) as from ``execute()``.

It uses these psycopg internals, which ``tests/test_pg_pipeline.py`` checks: a cursor's
``_reset``, ``_tx``, ``_convert_query``, ``_check_results``, ``_set_results``,
``_last_query`` and ``format``, and the connection's ``_prepared`` (``get``,
``maybe_add_to_cache``, ``validate``, ``maintain_gen``), so prepared statements work as in
``execute()``; and `TrioConnection.execute_together` takes the ``BEGIN`` of a connection
that is not autocommit from ``_get_tx_start_command``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import psycopg
from psycopg import errors as e
from psycopg import pq
from psycopg._preparing import Prepare
from psycopg.abc import PQGen
from psycopg.waiting import Ready, Wait

#: A `trioq.pg.TrioConnection` (``_pg`` imports this module, so not imported back here).
TrioConnection = Any

__all__ = ["execute_pipelined", "send_pipelined"]

_SYNC = pq.ExecStatus.PIPELINE_SYNC
_FATAL = pq.ExecStatus.FATAL_ERROR
_COMMAND_OK = pq.ExecStatus.COMMAND_OK
_COPY = frozenset({pq.ExecStatus.COPY_IN, pq.ExecStatus.COPY_OUT, pq.ExecStatus.COPY_BOTH})
_BINARY = pq.Format.BINARY
_PIPELINE_OFF = pq.PipelineStatus.OFF


def _results(pgconn: pq.abc.PGconn) -> PQGen[list[list[pq.abc.PGresult]]]:
    """Flush what is queued, then collect the results up to the ``Sync``: one list per
    command, in order (libpq ends each command's results with a None)."""
    while pgconn.flush():
        ready = yield Wait.RW
        if ready & Ready.R:
            pgconn.consume_input()
    groups: list[list[pq.abc.PGresult]] = []
    group: list[pq.abc.PGresult] = []
    while True:
        while pgconn.is_busy():
            yield Wait.R
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:
            groups.append(group)
            group = []
        elif result.status == _SYNC:
            return groups
        elif result.status in _COPY:  # libpq would hand out this result forever
            raise _CopyStarted
        else:
            group.append(result)


class _CopyStarted(Exception):
    """A statement of the pipeline started a COPY, which needs a protocol of its own."""


def _raise_first_error(groups: list[list[pq.abc.PGresult]], encoding: str) -> None:
    for group in groups:
        for result in group:
            if result.status == _FATAL:
                raise e.error_from_result(result, encoding=encoding)


async def execute_pipelined(
    conn: TrioConnection,
    statements: Sequence[tuple[Any, Any]],
    *,
    prepare: bool | None = None,
    binary: bool = False,
    then: Sequence[bytes] = (),
) -> list[psycopg.AsyncCursor[Any]]:
    """The prelude (`TrioConnection.prelude`, in a transaction of its own), the
    deferred commands, then ``statements`` (query, params), then the commands ``then`` (SQL
    without parameters, e.g. ``COMMIT``: no cursor for them), in one round trip; a cursor
    for each statement. The first error is raised once every result is in: what follows a
    failing command does not run (a failing prelude also closes the connection).
    Holds the connection's lock."""
    async with conn.lock:
        conn._check_connection_ok()
        return await send_pipelined(conn, statements, prepare=prepare, binary=binary, then=then)


async def send_pipelined(
    conn: TrioConnection,
    statements: Sequence[tuple[Any, Any]],
    *,
    prepare: bool | None = None,
    binary: bool = False,
    then: Sequence[bytes] = (),
) -> list[psycopg.AsyncCursor[Any]]:
    """`execute_pipelined` by a caller that holds the connection's lock already."""
    pgconn = conn.pgconn
    # Parameters are adapted first: one that cannot be (NUL in a string, an unknown type)
    # raises here, with nothing sent and the deferred commands still deferred.
    early = conn.deferred_statements  # `TrioConnection.defer_statement`: rows dropped
    converted = [_convert_dropped(conn, query, params) for query, params in early]
    converted += [_convert(conn, query, params) for query, params in statements]
    prelude = conn.take_prelude()
    commands = conn.discard_deferred()
    ahead = len(prelude) + len(commands)  # the results ahead of the statements'
    pgconn.enter_pipeline_mode()
    try:
        for command in prelude:  # BEGIN ... COMMIT (`TrioConnection.take_prelude`)
            pgconn.send_query_params(command, None)
        for command in commands:
            pgconn.send_query_params(command, None)
        sent = [_send(conn, cursor, pgq, prepare, binary, dropped=i < len(early))
                for i, (cursor, pgq) in enumerate(converted)]  # fmt: skip
        for command in then:
            pgconn.send_query_params(command, None)
        pgconn.pipeline_sync()
        try:
            groups = await conn._wait(_results(pgconn), None)
        except _CopyStarted:
            conn._close_now()  # mid-COPY: the server rolls back what it has not committed
            raise e.ProgrammingError(
                "COPY cannot be used in a pipelined statement (job.complete_with(), "
                "execute_together()): the connection was closed"
            ) from None
        except BaseException:  # cancelled, or the connection broke: which Parse ran is unknown
            _forget_failed_parses(conn, ahead, sent, None)
            conn.prelude = prelude[1:-1]  # whether it ran is unknown; running it again is harmless
            raise
    finally:
        _leave_pipeline(conn)
    if prelude:
        _check_prelude(conn, groups[: len(prelude)])
    try:
        cursors = _cursors(conn, ahead, sent, groups)
    except BaseException:
        _forget_failed_parses(conn, ahead, sent, groups)
        raise
    await conn._wait(conn._prepared.maintain_gen(conn), None)
    return cursors


def _check_prelude(conn: TrioConnection, groups: list[list[pq.abc.PGresult]]) -> None:
    """A prelude that failed closes the connection (`TrioConnection.prelude`)."""
    try:
        _raise_first_error(groups, conn.pgconn._encoding)
    except e.Error:
        conn._close_now()
        raise


def _cursors(
    conn: TrioConnection, commands: int, sent: list[_Sent], groups: list[list[pq.abc.PGresult]]
) -> list[psycopg.AsyncCursor[Any]]:
    """Each statement's results on its cursor (none for a deferred statement: its rows are
    dropped); raises the first error (in pipeline order)."""
    encoding = conn.pgconn._encoding
    _raise_first_error(groups[:commands], encoding)
    position = commands
    cursors = []
    for one in sent:
        if one.parsed:  # the Parse of a statement prepared now: a result of its own
            _raise_first_error(groups[position : position + 1], encoding)
            position += 1
        mine = groups[position]
        position += 1
        if one.key is not None:
            conn._prepared.validate(one.key, one.prep, one.name, mine)
        one.cursor._check_results(mine)
        if not one.dropped:
            one.cursor._set_results(mine)
            cursors.append(one.cursor)
    _raise_first_error(groups[position:], encoding)
    return cursors


def _forget_failed_parses(
    conn: TrioConnection,
    commands: int,
    sent: list[_Sent],
    groups: list[list[pq.abc.PGresult]] | None,
) -> None:
    """After an error: statements whose Parse went out in this pipeline but did not run
    (a command before it failed, and the server skipped the rest; ``groups`` None: the
    results never came, so any of them) are taken out of psycopg's cache of prepared
    statements, which already counted them as prepared; else their next execute would name
    a statement the server does not have."""
    position = commands
    for one in sent:
        if one.parsed:
            parse = groups[position] if groups is not None and position < len(groups) else []
            if not parse or parse[-1].status != _COMMAND_OK:
                key = (one.query.query, one.query.types)
                conn._prepared._names.pop(key, None)
                conn._prepared._counts.pop(key, None)
            position += 1
        position += 1


@attrs.frozen
class _Sent:
    cursor: psycopg.AsyncCursor[Any]
    key: Any  # the prepared-statement cache's key, or None
    prep: Prepare
    name: bytes
    parsed: bool  # a Parse went out ahead of it (prepared now)
    query: Any  # the adapted statement (psycopg's PostgresQuery)
    dropped: bool  # a deferred statement (`TrioConnection.defer_statement`): no cursor


def _convert(
    conn: TrioConnection, query: Any, params: Any
) -> tuple[psycopg.AsyncCursor[Any], Any]:
    """A fresh cursor for one statement, and the statement with its parameters adapted."""
    cursor = conn.cursor()
    cursor._reset()
    cursor._tx = psycopg.adapt.Transformer(cursor)
    pgq = cursor._convert_query(query, params)
    cursor._query = pgq
    cursor._last_query = query
    return cursor, pgq


def _convert_dropped(conn: TrioConnection, query: Any, params: Any) -> tuple[Any, Any]:
    """`_convert` for a statement whose rows are dropped: the connection's one cursor for
    them, whose adapters (``_tx``) are kept from one statement to the next, instead of a new
    cursor and a new `Transformer` each time (a shared transaction's fence, once a job)."""
    cursor = conn.kept_cursor()
    cursor._reset()
    pgq = cursor._convert_query(query, params)
    return cursor, pgq


def _send(
    conn: TrioConnection,
    cursor: psycopg.AsyncCursor[Any],
    pgq: Any,
    prepare: bool | None,
    binary: bool,
    *,
    dropped: bool = False,
) -> _Sent:
    """Queue one statement, prepared as ``execute()`` would."""
    pgconn = conn.pgconn
    fmt = _BINARY if binary else cursor.format
    prep, name = conn._prepared.get(pgq, prepare)
    parsed = False
    if prep is Prepare.NO:
        pgconn.send_query_params(
            pgq.query, pgq.params, param_formats=pgq.formats, param_types=pgq.types,
            result_format=fmt,
        )  # fmt: skip
    else:
        if prep is Prepare.SHOULD:
            pgconn.send_prepare(name, pgq.query, param_types=pgq.types)
            parsed = True
        pgconn.send_query_prepared(name, pgq.params, param_formats=pgq.formats, result_format=fmt)
    key = conn._prepared.maybe_add_to_cache(pgq, prep, name)
    return _Sent(cursor, key, prep, name, parsed, pgq, dropped)


def _leave_pipeline(conn: TrioConnection) -> None:
    """Back to normal mode; a connection left with results pending (a cancellation that
    could not drain them) is closed rather than handed on half-read."""
    pgconn = conn.pgconn
    if conn.closed or pgconn.pipeline_status == _PIPELINE_OFF:
        return
    try:
        pgconn.exit_pipeline_mode()
    except e.OperationalError:
        conn._close_now()
