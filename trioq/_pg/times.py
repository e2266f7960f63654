"""Times Python's datetime cannot hold, read without an error.

Postgres keeps times from 4713 BC to the year 294276 and two infinities; Python's datetime
holds the years 1 to 9999. psycopg raises ``DataError`` ("timestamp too large (after year
10K)") for the others, so one such row made every list that showed it fail. Since migration
12 the schema refuses them in trioq's tables; a row that gets in anyway (a check dropped by
hand) is read through `TOLERANT`, whose ``timestamptz`` loader turns a time after the year
9999 (``infinity`` too) into `LATEST` and one before the year 1 into `EARLIEST`: the ends of
the range, in UTC, which every page and command can show and sort.

trioq's own connections (its pools, the command line's) take `TOLERANT` as their adapters;
a reader given the caller's connection reads through `tolerant` (a cursor of its own): a
caller's connection keeps psycopg's behaviour for the caller's own queries.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
from psycopg.adapt import AdaptersMap
from psycopg.types.datetime import TimestamptzLoader

from .conn import Conn

__all__ = ["EARLIEST", "LATEST", "TOLERANT", "tolerant"]

#: What a time after the year 9999 (or ``infinity``) reads as.
LATEST = dt.datetime.max.replace(tzinfo=dt.UTC)
#: What a time before the year 1 (or ``-infinity``) reads as.
EARLIEST = dt.datetime.min.replace(tzinfo=dt.UTC)


class _TolerantTimestamptz(TimestamptzLoader):
    """psycopg's text ``timestamptz`` loader, with the ends of the range for what it cannot
    hold (psycopg's C loader is not subclassed: its C row loop would call the C code)."""

    def load(self, data: Any) -> dt.datetime:
        try:
            return super().load(data)
        except psycopg.DataError:
            text = bytes(data)
            return EARLIEST if text.startswith(b"-") or text.endswith(b" BC") else LATEST


#: Adapters whose ``timestamptz`` loader reads every time Postgres can hold.
TOLERANT = AdaptersMap(psycopg.adapters)
TOLERANT.register_loader("timestamptz", _TolerantTimestamptz)


def tolerant(conn: Conn) -> psycopg.AsyncCursor[Any]:
    """A cursor of ``conn`` that reads times through `TOLERANT`'s loader."""
    cur = conn.cursor()
    cur.adapters.register_loader("timestamptz", _TolerantTimestamptz)
    return cur
