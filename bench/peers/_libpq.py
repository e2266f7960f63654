"""The floor under trioq's calls (no dependencies beyond trioq's): libpq's own calls driven by
trio, with trioq's own statements prepared once and their parameters adapted once, and
nothing of psycopg's Python per call (no cursor, no adaptation, no result objects) nor of
trioq's. What trioq pays above this is its own Python and psycopg's; what this pays above
pgbench is Python and trio themselves (`bench/bench_round_trip.py`)."""

from __future__ import annotations

from typing import Any

import trio
from psycopg import adapt, pq
from psycopg._queries import PostgresQuery

import trioq

__all__ = ["Prepared"]


class Prepared:
    """One statement prepared on one connection, its parameters adapted once."""

    def __init__(self, conn: trioq.TrioConnection, name: bytes, query: Any, params: Any):
        converted = PostgresQuery(adapt.Transformer(conn))
        converted.convert(query, params)
        found = conn.pgconn.prepare(name, converted.query, param_types=converted.types)
        if found.status != pq.ExecStatus.COMMAND_OK:
            raise RuntimeError(found.get_error_message())
        self.pgconn = conn.pgconn
        self.pgconn.nonblocking = 1
        self.name = name
        self.params = converted.params
        self.formats = converted.formats

    async def run(self) -> pq.abc.PGresult:
        """Send it, wait on trio for the answer, return its result."""
        pgconn = self.pgconn
        fileno = pgconn.socket
        pgconn.send_query_prepared(self.name, self.params, param_formats=self.formats)
        while pgconn.flush():
            await trio.lowlevel.wait_writable(fileno)
        while True:
            pgconn.consume_input()
            if not pgconn.is_busy():
                break
            await trio.lowlevel.wait_readable(fileno)
        result = pgconn.get_result()
        assert result is not None
        if result.status != pq.ExecStatus.TUPLES_OK:
            raise RuntimeError(result.get_error_message())
        while pgconn.get_result() is not None:
            pass
        return result
