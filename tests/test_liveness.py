"""A live worker is never taken for dead (issue 22).

Death needs two pieces of evidence that one flaky connection cannot fake: the worker's row
has not been pinged for longer than ``liveness_grace`` through *any* channel (its liveness
connection, or its pool), and no session at all holds its liveness lock. Each test below
breaks one channel and shows the worker keeps its jobs; ``docs/guarantees.md`` has the
argument, and what a database cannot tell apart (a SIGSTOPped worker whose connection is
cut looks dead: its jobs are taken, and the worker that wakes writes nothing for them).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from helpers import rows, scalar, serving, wait_until
from psycopg import sql

import trioq


async def liveness_pids(conn: Any, schema: str = "trioq") -> list[int]:
    """The backends that hold a worker's liveness lock in this database."""
    found = await rows(
        conn,
        "SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted"
        "   AND l.classid = hashtext(%s)::oid"
        "   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        f"trioq.worker:{schema}",
    )
    return [pid for (pid,) in found]


def holding_registry(started: list[int], release: trio.Event) -> trioq.Registry:
    """A task whose handler records its run, then waits for ``release``; one attempt."""
    tasks = trioq.Registry()

    @tasks.task(name="hold", max_attempts=1)
    async def hold(job: trioq.JobContext) -> None:
        started.append(job.id)
        await release.wait()

    return tasks


async def test_a_worker_whose_liveness_connection_is_cut_while_connections_are_refused(
    dsn: str, pg_admin_dsn: str
) -> None:
    """Its liveness connection is terminated and no new connection is accepted for 5 s: its
    lock is free and it cannot reconnect to ping, but its pool works. Before: its own sweeper
    took it for dead 0.55 s in and its one-attempt jobs went to dead_jobs."""
    started: list[int] = []
    release = trio.Event()
    async with serving(dsn, holding_registry(started, release), lease=30,
                       heartbeat_interval=5) as (conn, runtime):  # fmt: skip
        ids = [(await trioq.enqueue(conn, "hold")).job_id for _ in range(3)]
        await wait_until(lambda: _true(len(started) == 3))
        (pid,) = await liveness_pids(conn)
        async with refused(pg_admin_dsn, await scalar(conn, "SELECT current_database()")):
            await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            await trio.sleep(5)  # the fault: 5 s without new connections
            assert await rows(conn, "SELECT id, state FROM trioq.jobs ORDER BY id") == [
                (job_id, "running") for job_id in ids
            ]
            assert await scalar(conn, "SELECT count(*) FROM trioq.dead_jobs") == 0
        await wait_until(lambda: _locked(conn))  # the liveness connection is back
        release.set()
        await wait_until(lambda: _done(conn))
    assert sorted(started) == ids  # each ran once: none was returned and run again
    assert runtime.statistics().outcomes_written == 3


@asynccontextmanager
async def refused(admin_dsn: str, database: str) -> AsyncIterator[None]:
    """No new connection to ``database`` for the block (existing ones go on)."""
    name = sql.Identifier(database)
    async with await trioq.connect(admin_dsn, autocommit=True) as admin:
        await admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(name))
        try:
            yield
        finally:
            with trio.move_on_after(10, shield=True):
                await admin.execute(
                    sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(name)
                )


async def _true(value: bool) -> bool:
    await trio.lowlevel.checkpoint()
    return value


async def _locked(conn: Any) -> bool:
    return len(await liveness_pids(conn)) == 1


async def _done(conn: Any) -> bool:
    return bool(await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0)
