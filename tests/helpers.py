"""What the tests share: a migrated database, a running worker, queries, waiting without
sleeping for luck (bounded polls of what nobody can tell us about), and requirements of the
machine that fail a test unless the developer asked to skip it."""

from __future__ import annotations

import datetime as dt
import os
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, NoReturn

import pytest
import trio
from psycopg import pq, sql
from psycopg.abc import Query

import trioq
from trioq.testing import set_clock

#: Short leases and intervals, so recoveries happen within a test.
FAST: dict[str, Any] = {
    "lease": 1.5,
    "heartbeat_interval": 0.3,
    "poll_interval": 0.2,
    "sweep_interval": 0.3,
}


@asynccontextmanager
async def migrated(dsn: str, clock: dt.datetime | None = None) -> AsyncIterator[Any]:
    """An autocommit connection to the migrated database ``dsn``; with ``clock``, its SQL
    clock (``trioq.now``) frozen there."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        if clock is not None:
            await set_clock(conn, clock)
        yield conn


@asynccontextmanager
async def serving(
    dsn: str, registry: trioq.Registry, *, graceful: bool = True, **options: Any
) -> AsyncIterator[tuple[Any, trioq.Runtime]]:
    """A migrated database, a connection to it, and a running runtime. On exit a graceful
    ``stop()`` that must finish within 20 s (or, ``graceful=False``, one without grace)."""
    config = trioq.Config(dsn=dsn, registry=registry, **{**FAST, **options})
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                runtime: trioq.Runtime = await nursery.start(trioq.serve, config)
                try:
                    yield conn, runtime
                finally:
                    runtime.stop(grace=graceful)


async def rows(conn: Any, query: Query, *params: Any) -> list[tuple[Any, ...]]:
    cur = await conn.execute(query, params)
    result: list[tuple[Any, ...]] = await cur.fetchall()
    return result


async def scalar(conn: Any, query: Query, *params: Any) -> Any:
    found = await rows(conn, query, *params)
    return found[0][0] if found else None


async def wait_until(predicate: Callable[[], Awaitable[Any]], timeout: float = 10) -> None:
    """Poll state a test cannot be told about (the database), bounded by ``timeout``."""
    with trio.fail_after(timeout):
        while not await predicate():  # noqa: ASYNC110 - the database cannot tell us
            await trio.sleep(0.02)


async def wait_until_blocked(observer: Any, blocked: Any) -> None:
    """Until ``blocked``'s backend waits for a lock (bounded, ``observer`` polling the
    database)."""
    pid = blocked.info.backend_pid
    with trio.fail_after(10):
        while True:
            cur = await observer.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
            )
            if (await cur.fetchone()) == ("Lock",):
                return
            await trio.sleep(0.01)


def poll_until(predicate: Callable[[], object], *, timeout: float, what: str) -> None:
    """`wait_until` for sync tests (a subprocess, a log, another server): poll until
    ``predicate()`` is true, failing with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.02)


def poll_query(conn: Any, query: str, timeout: float = 60) -> None:
    """Poll (a sync connection) until ``query``'s first row has a true first value: a count
    above 0, or ``SELECT 1 ... WHERE`` what is awaited."""

    def found() -> bool:
        row = conn.execute(query).fetchone()
        return row is not None and bool(row[0])

    poll_until(found, timeout=timeout, what=query)


async def drained(conn: Any, schema: str = "trioq") -> bool:
    """No job of ``schema`` is scheduled, available or running."""
    query = sql.SQL(
        "SELECT count(*) FROM {} WHERE state IN ('scheduled', 'available', 'running')"
    ).format(sql.Identifier(schema, "jobs"))
    cur = await conn.execute(query)
    row = await cur.fetchone()
    return bool(row[0] == 0)


class Counter:
    """Counts calls and lets a test wait for a number of them, without sleeping."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self._changed = trio.Event()

    def hit(self, value: Any = None) -> None:
        self.calls.append(value)
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, n: int, timeout: float = 10) -> None:
        with trio.fail_after(timeout):
            while len(self.calls) < n:
                await self._changed.wait()


def missing(reason: str, *, skip_var: str, needs: str) -> NoReturn:
    """A requirement of the machine is missing (``reason``): the test fails, saying what
    ``needs`` it and how to get it, unless ``skip_var`` is 1 (a developer's machine; a
    skipped test is not a passing one)."""
    if os.environ.get(skip_var) == "1":
        pytest.skip(f"{reason} and {skip_var}=1")
    pytest.fail(f"{reason}: {needs}. {skip_var}=1 skips them.")


def installed(path: Path, *, skip_var: str, needs: str) -> str:
    """The program at ``path``, or `missing` (saying how to get it, in ``needs``)."""
    if not path.is_file():
        missing(f"{path} is missing", skip_var=skip_var, needs=needs)
    return str(path)


def assert_missing_fails(
    monkeypatch: pytest.MonkeyPatch, require: Callable[[], object], *, skip_var: str, match: str
) -> None:
    """``require()``, with its requirement made missing by the caller, fails (the message
    matching ``match``), and skips once ``skip_var`` is 1."""
    monkeypatch.delenv(skip_var, raising=False)
    with pytest.raises(pytest.fail.Exception, match=match):
        require()
    monkeypatch.setenv(skip_var, "1")
    with pytest.raises(pytest.skip.Exception):
        require()


@contextmanager
def traced(conn: Any) -> Iterator[list[str]]:
    """The frontend messages ``conn`` sends in the block (libpq's trace), by type."""
    sent: list[str] = []
    with tempfile.TemporaryFile() as log:
        conn.pgconn.trace(log.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield sent
        finally:
            conn.pgconn.untrace()
            log.seek(0)
            for line in log.read().decode().splitlines():
                direction, _length, message, *_ = [*line.split("\t"), "", ""]
                if direction == "F":
                    sent.append(message.strip())
