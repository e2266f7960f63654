"""What the runtime tests share: a running worker, waiting without sleeping for luck."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
from psycopg import sql

import trioq

#: Short leases and intervals, so recoveries happen within a test.
FAST: dict[str, Any] = {
    "lease": 1.5,
    "heartbeat_interval": 0.3,
    "poll_interval": 0.2,
    "sweep_interval": 0.3,
}


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


async def rows(conn: Any, query: str, *params: Any) -> list[tuple[Any, ...]]:
    cur = await conn.execute(query, params)
    result: list[tuple[Any, ...]] = await cur.fetchall()
    return result


async def scalar(conn: Any, query: str, *params: Any) -> Any:
    found = await rows(conn, query, *params)
    return found[0][0] if found else None


async def wait_until(predicate: Callable[[], Awaitable[Any]], timeout: float = 10) -> None:
    """Poll state a test cannot be told about (the database), bounded by ``timeout``."""
    with trio.fail_after(timeout):
        while not await predicate():  # noqa: ASYNC110 - the database cannot tell us
            await trio.sleep(0.02)


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
