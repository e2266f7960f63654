"""`Conn`, the type every library call takes, in a module that does not import trio (so
that `trioq.producer` can be imported by code that never runs trio), and `first_row`."""

from __future__ import annotations

from typing import Any

import psycopg

__all__ = ["Conn", "first_row"]

#: Any async psycopg connection: what every call of the library takes. trioq's own
#: (`TrioConnection`) or one the caller made, in autocommit or inside its transaction.
Conn = psycopg.AsyncConnection[Any]


async def first_row(conn: Conn, query: Any, params: Any = None) -> tuple[Any, ...] | None:
    """The first row of one of trioq's own statements on ``conn``, as a tuple (None if it
    returned none): `TrioConnection.first_row` (its lean path, whatever the connection's
    row factory), else ``execute`` and ``fetchone`` (the producers' adapters, whose
    cursors make tuples)."""
    lean = getattr(conn, "first_row", None)
    if lean is not None:
        row: tuple[Any, ...] | None = await lean(query, params)
        return row
    cur = await conn.execute(query, params)
    found = await cur.fetchone()
    return None if found is None else tuple(found)
