"""A fault of the database under a job's own transaction (issue #22): the job is given back at
once with its attempt refunded (no backoff), its effects commit once, and a handler that
breaks its own connection every time cannot loop (`FAULT_RELEASES`).

The retry policy here is the default (Sidekiq: the first retry waits 15 s or more), so a job
that runs again within the test's bound was given back, not retried; and the attempt each
run sees says which (a refund keeps it at 1).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio
from helpers import Counter, rows, scalar, serving, wait_until
from pgproxy import CommitCut, dsn_through
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

import trioq
from trioq._pg.errors import connection_fault
from trioq._worker.execute import FAULT_RELEASES

LEDGER = "CREATE TABLE IF NOT EXISTS ledger (job_id bigint, attempt int, run int)"
CUT_THE_OTHERS = """
SELECT pg_terminate_backend(pid) FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid()
"""


def _registry(ran: Counter, body: Any) -> trioq.Registry:
    registry = trioq.Registry()

    @registry.task(name="pay")
    async def pay(job: trioq.JobContext) -> None:
        run = len(ran.calls) + 1
        async with job.transaction() as tx:
            await tx.execute("INSERT INTO ledger VALUES (%s, %s, %s)", (job.id, job.attempt, run))
            ran.hit((job.attempt, tx.info.backend_pid))
            await body(job, tx, run)

    return registry


async def test_a_transaction_cut_by_the_server_runs_again_at_once_its_attempt_refunded(
    dsn: str,
) -> None:
    cut = trio.Event()
    ran = Counter()

    async def body(job: trioq.JobContext, tx: Any, run: int) -> None:
        if run == 1:
            await cut.wait()  # its backend is terminated meanwhile
            await tx.execute("SELECT 1")

    async with serving(dsn, _registry(ran, body)) as (conn, _runtime):
        await conn.execute(LEDGER)
        job_id = (await trioq.enqueue(conn, "pay")).job_id
        await ran.wait_for(1)
        await conn.execute("SELECT pg_terminate_backend(%s)", (ran.calls[0][1],))
        cut.set()
        await ran.wait_for(2, timeout=10)  # a retry would wait 15 s or more
        assert [attempt for attempt, _ in ran.calls] == [1, 1]
        await wait_until(lambda: scalar(conn, "SELECT count(*) = 0 FROM trioq.jobs"))
        assert await rows(conn, "SELECT job_id, attempt, run FROM ledger") == [(job_id, 1, 2)]


async def _nothing(job: trioq.JobContext, tx: Any, run: int) -> None:
    return None


@asynccontextmanager
async def _through_a_commit_cut(
    dsn: str, ran: Counter, *, after_commit: bool
) -> AsyncIterator[tuple[Any, int, CommitCut]]:
    """A worker whose connections go through a `CommitCut` proxy (armed once it serves), and
    one job enqueued: the connection, the job's id and the proxy."""
    params = conninfo_to_dict(dsn)
    socket = os.path.join(str(params["host"]), f".s.PGSQL.{params.get('port', 5432)}")
    proxy = CommitCut(socket, after_commit=after_commit)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(proxy.serve)
        async with await trioq.connect(dsn, autocommit=True) as setup:
            await trioq.migrate(setup)
            await setup.execute(LEDGER)
        async with serving(dsn_through(dsn, port), _registry(ran, _nothing)) as (conn, _):
            proxy.armed = True
            yield conn, (await trioq.enqueue(conn, "pay")).job_id, proxy
        nursery.cancel_scope.cancel()


async def test_a_commit_whose_answer_is_lost_is_not_run_again(dsn: str) -> None:
    """The server committed; the worker saw its connection break. The job is given back
    fenced by its lease: its row is gone with the commit, so nothing is given back and
    nothing runs again."""
    ran = Counter()
    async with _through_a_commit_cut(dsn, ran, after_commit=True) as (conn, job_id, proxy):
        with trio.fail_after(10):
            await proxy.cut.wait()
        # Committed: the job's row went with the commit, so nothing can claim it again.
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0
        assert await rows(conn, "SELECT job_id, run FROM ledger") == [(job_id, 1)]
    assert len(ran.calls) == 1  # and the worker, stopped, wrote nothing for it
    async with await trioq.connect(dsn, autocommit=True) as conn:
        assert not await rows(conn, "SELECT 1 FROM trioq.dead_jobs")
        assert not await rows(conn, "SELECT 1 FROM trioq.jobs")


async def test_a_commit_that_never_reached_the_server_runs_again_at_once(dsn: str) -> None:
    ran = Counter()
    async with _through_a_commit_cut(dsn, ran, after_commit=False) as (conn, job_id, _proxy):
        await ran.wait_for(2, timeout=10)
        assert [attempt for attempt, _ in ran.calls] == [1, 1]
        await wait_until(lambda: scalar(conn, "SELECT count(*) = 0 FROM trioq.jobs"))
        assert await rows(conn, "SELECT job_id, run FROM ledger") == [(job_id, 2)]


async def test_a_handler_that_breaks_its_own_connection_every_time_does_not_loop(
    dsn: str,
) -> None:
    ran = Counter()

    async def body(job: trioq.JobContext, tx: Any, run: int) -> None:
        await tx.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    async with serving(dsn, _registry(ran, body)) as (conn, _runtime):
        await conn.execute(LEDGER)
        job_id = (await trioq.enqueue(conn, "pay")).job_id
        await ran.wait_for(FAULT_RELEASES + 1, timeout=10)
        query = "SELECT state, attempt, last_error FROM trioq.jobs WHERE id = %s"

        async def failed() -> bool:
            return bool((await rows(conn, query, job_id))[0][0] == "scheduled")

        await wait_until(failed)
        [(state, attempt, error)] = await rows(conn, query, job_id)
        assert (state, attempt) == ("scheduled", 1)  # an ordinary failure: backoff
        assert "terminating connection" in error
        assert [a for a, _ in ran.calls] == [1] * (FAULT_RELEASES + 1)
        assert await scalar(conn, "SELECT count(*) FROM ledger") == 0


@pytest.mark.parametrize(
    ("error", "fault"),
    [
        (psycopg.errors.AdminShutdown("terminating connection"), True),
        (psycopg.errors.CannotConnectNow("the database system is starting up"), True),
        (psycopg.errors.ReadOnlySqlTransaction("read-only transaction"), True),
        (psycopg.errors.ConnectionFailure("connection failure"), True),
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),
        (trioq.ConnectError("cannot connect"), True),
        (psycopg.errors.QueryCanceled("statement timeout"), False),
        (psycopg.errors.UniqueViolation("duplicate key"), False),
        (psycopg.errors.DeadlockDetected("deadlock"), False),
        (RuntimeError("not the database"), False),
    ],
)
def test_what_counts_as_a_fault_of_the_database(error: Exception, fault: bool) -> None:
    assert (connection_fault(error) is error) is fault
    try:
        try:
            raise error
        except Exception as inner:
            raise RuntimeError("the handler's own error") from inner
    except RuntimeError as outer:
        assert (connection_fault(outer) is error) is fault  # found through the chain


async def test_a_worker_on_a_read_only_server_says_so_waits_and_fails_no_job(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Its connections are cut and every new one is read-only for 3 s (as on a standby, or
    the old primary after a failover): it says so, waits, and fails no job; once the server
    takes writes, the connections that saw it read-only are replaced and every job runs once
    (its attempt not spent by the wait)."""
    ran = Counter()

    async def body(job: trioq.JobContext, tx: Any, run: int) -> None:
        return None

    async with serving(dsn, _registry(ran, body), lease=30) as (conn, _runtime):
        await conn.execute(LEDGER)
        database = sql.Identifier(await scalar(conn, "SELECT current_database()"))
        await conn.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on")
                           .format(database))  # fmt: skip
        try:
            await conn.execute(CUT_THE_OTHERS)
            ids = [(await trioq.enqueue(conn, "pay")).job_id for _ in range(10)]  # read-write
            await trio.sleep(3)  # the fault: 3 s of a read-only server
            assert await rows(conn, "SELECT state, attempt FROM trioq.jobs ORDER BY id") == [
                ("available", 0)
            ] * 10
            assert not await rows(conn, "SELECT 1 FROM trioq.dead_jobs")
            assert any("the database is read-only" in r.getMessage() for r in caplog.records)
        finally:
            await conn.execute(sql.SQL("ALTER DATABASE {} RESET default_transaction_read_only")
                               .format(database))  # fmt: skip
        await wait_until(lambda: scalar(conn, "SELECT count(*) = 0 FROM trioq.jobs"), timeout=20)
        assert sorted(job_id for job_id, in await rows(conn, "SELECT job_id FROM ledger")) == ids
        assert [attempt for attempt, _ in ran.calls] == [1] * 10
