"""The vacuumer: a process that works vacuums the jobs table once its dead tuples pass the
threshold; an idle one never looks; a pinned horizon backs it off; a role that may not vacuum
is told once. Against real Postgres, one round at a time (``run_once``), and in ``serve``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from helpers import scalar, serving, wait_until
from psycopg import sql
from psycopg.conninfo import make_conninfo

import trioq
from trioq import Queue
from trioq._worker.services import vacuumer as vacuumer_module
from trioq._worker.services.vacuumer import Vacuumer

Q = Queue()
INSERT = ("INSERT INTO trioq.jobs (queue, task, args) "
          "SELECT 'default', %s, '{}' FROM generate_series(1, %s)")  # fmt: skip


@asynccontextmanager
async def database(dsn: str) -> AsyncIterator[tuple[Any, trioq.pg.Pool]]:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        async with trioq.pg.Pool(dsn, max_size=1, connect_kwargs={"autocommit": True}) as pool:
            yield conn, pool


async def dead_tuples(conn: Any) -> int:
    return int(await scalar(conn, "SELECT pg_stat_get_dead_tuples('trioq.jobs'::regclass)"))


async def churn(dsn: str, conn: Any, n: int) -> None:
    """``n`` jobs inserted and deleted (n dead tuples), by a session that then ends, so its
    statistics are flushed; until the statistics show them."""
    before = await dead_tuples(conn)
    async with await trioq.connect(dsn, autocommit=True) as other:
        await other.execute(INSERT, ("t", n))
        await other.execute("DELETE FROM trioq.jobs")
    await wait_until(lambda: _at_least(conn, before + n))


async def _at_least(conn: Any, n: int) -> bool:
    return await dead_tuples(conn) >= n


@pytest.fixture
def clock() -> list[float]:
    """The vacuumers' monotonic clock (`vacuumer`), moved by the test."""
    return [1000.0]


def vacuumer(
    pool: Any, clock: list[float], work: Counter, *, threshold: int, sql: Any = None
) -> Vacuumer:
    return Vacuumer(pool, sql or Q.sql, interval=1.0, threshold=threshold, churn=work,
                    clock=lambda: clock[0])  # fmt: skip


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        return self.n


async def test_a_process_that_finished_jobs_vacuums_past_the_threshold(
    dsn: str, clock: list[float]
) -> None:
    async with database(dsn) as (conn, pool):
        work = Counter()
        vac = vacuumer(pool, clock, work, threshold=1000)
        await churn(dsn, conn, 500)
        assert (await vac.run_once()).looked is False  # no job finished here: no look
        work.n = 1
        below = await vac.run_once()
        assert below.looked and not below.vacuumed and below.dead is not None
        assert below.dead >= 500
        clock[0] += vacuumer_module.STATS_LAG  # nothing finished since, but the statistics lag
        assert (await vac.run_once()).looked
        clock[0] += 0.1
        assert (await vac.run_once()).looked is False  # nothing finished for STATS_LAG
        await churn(dsn, conn, 1000)
        work.n = 2
        done = await vac.run_once()
        assert done.vacuumed and done.dead is not None and done.dead >= 1500
        assert done.left is not None and done.left < 100
        assert await dead_tuples(conn) < 100
        assert await scalar(conn, "SELECT vacuum_count FROM pg_stat_user_tables "
                                  "WHERE relid = 'trioq.jobs'::regclass") == 1  # fmt: skip


async def test_the_threshold_grows_with_the_live_tuples(dsn: str, clock: list[float]) -> None:
    async with database(dsn) as (conn, pool):
        await conn.execute(INSERT, ("t", 20000))
        await conn.execute("ANALYZE trioq.jobs")
        await churn_some(dsn, conn, 1500)
        work = Counter()
        work.n = 1
        vac = vacuumer(pool, clock, work, threshold=1000)
        look = await vac.run_once()  # 1,500 dead < 1,000 + 0.1 x 20,000
        assert look.looked and not look.vacuumed and look.live == 20000
        await churn_some(dsn, conn, 1600)
        work.n = 2
        assert (await vac.run_once()).vacuumed  # 3,100 dead > 3,000


async def churn_some(dsn: str, conn: Any, n: int) -> None:
    """``n`` dead tuples among live ones: new jobs of another task, then deleted."""
    before = await dead_tuples(conn)
    async with await trioq.connect(dsn, autocommit=True) as other:
        await other.execute(INSERT, ("gone", n))
        await other.execute("DELETE FROM trioq.jobs WHERE task = 'gone'")
    await wait_until(lambda: _at_least(conn, before + n))


async def test_a_pinned_horizon_backs_the_vacuum_off(dsn: str, clock: list[float]) -> None:
    """A snapshot older than the dead tuples: the vacuum removes none; the next look does
    not vacuum again before the backoff, which doubles; once the pin is gone and the backoff
    passed, the vacuum removes them."""
    async with database(dsn) as (conn, pool):
        work = Counter()
        vac = vacuumer(pool, clock, work, threshold=100)
        pin = await trioq.connect(dsn, autocommit=True)
        async with pin, pin.transaction():
            await pin.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            await pin.execute("SELECT txid_current()")
            await churn(dsn, conn, 500)
            work.n = 1
            first = await vac.run_once()
            assert first.vacuumed and first.left is not None and first.left >= 500
            work.n = 2
            held = await vac.run_once()
            assert held.looked and not held.vacuumed  # backed off (1 s)
            clock[0] += 1.5
            work.n = 3
            again = await vac.run_once()
            assert again.vacuumed and again.left is not None and again.left >= 500
            clock[0] += 1.5  # the backoff is 2 s now
            work.n = 4
            assert not (await vac.run_once()).vacuumed
        clock[0] += 1.0
        work.n = 5
        freed = await vac.run_once()
        assert freed.vacuumed and freed.left is not None and freed.left < 100
        work.n = 6
        await churn(dsn, conn, 200)
        assert (await vac.run_once()).vacuumed  # no backoff after a vacuum that removed


async def test_a_role_that_may_not_vacuum_is_told_once(
    dsn: str, caplog: pytest.LogCaptureFixture, clock: list[float]
) -> None:
    async with database(dsn) as (conn, _pool):
        await conn.execute("DROP ROLE IF EXISTS trioq_novac")
        await conn.execute("CREATE ROLE trioq_novac LOGIN")
        try:
            await conn.execute("GRANT USAGE ON SCHEMA trioq TO trioq_novac")
            await conn.execute("GRANT SELECT ON trioq.jobs TO trioq_novac")
            await churn(dsn, conn, 500)
            other = make_conninfo(dsn, user="trioq_novac")
            async with trioq.pg.Pool(other, max_size=1,
                                     connect_kwargs={"autocommit": True}) as pool:  # fmt: skip
                work = Counter()
                vac = vacuumer(pool, clock, work, threshold=100)
                work.n = 1
                with caplog.at_level(logging.INFO, logger="trioq.runtime"):
                    look = await vac.run_once()
                    work.n = 2
                    assert (await vac.run_once()).looked is False
            assert look.looked and not look.vacuumed and not vac.allowed
            told = [r.getMessage() for r in caplog.records if "may not vacuum" in r.getMessage()]
            assert len(told) == 1
            assert await dead_tuples(conn) >= 500
        finally:
            await conn.execute("DROP OWNED BY trioq_novac")
            await conn.execute("DROP ROLE trioq_novac")


async def test_serve_vacuums_while_it_works_and_not_when_off(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task()
    async def noop(job: trioq.JobContext, n: int) -> None:
        pass

    async def vacuums(conn: Any) -> int:
        return int(await scalar(conn, "SELECT vacuum_count FROM pg_stat_user_tables "
                                      "WHERE relid = 'trioq.jobs'::regclass"))  # fmt: skip

    async def drained(conn: Any) -> bool:
        return bool(await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0)

    async with serving(dsn, tasks, vacuum_interval=0.05, vacuum_threshold=200) as (conn, rt):
        assert rt._services.vacuumer is not None
        async with conn.transaction():
            await Q.enqueue_bulk(conn, "noop", [{"n": i} for i in range(1000)])
        await wait_until(lambda: drained(conn), timeout=30)
        await wait_until(lambda: _positive(vacuums(conn)), timeout=10)
    async with serving(dsn, tasks, vacuum_interval=None) as (conn, rt):
        assert rt._services.vacuumer is None  # not started: autovacuum alone


async def _positive(value: Any) -> bool:
    return bool(await value)


async def test_a_vacuum_that_skips_the_table_for_its_lock_does_not_back_off(
    dsn: str, clock: list[float]
) -> None:
    async with database(dsn) as (conn, pool):
        await churn(dsn, conn, 500)
        work = Counter()
        vac = vacuumer(pool, clock, work, threshold=100)
        holder = await trioq.connect(dsn, autocommit=True)
        async with holder, holder.transaction():
            await holder.execute("LOCK TABLE trioq.jobs IN SHARE UPDATE EXCLUSIVE MODE")
            work.n = 1
            skipped = await vac.run_once()
            assert skipped.skipped and not skipped.vacuumed
        work.n = 2
        done = await vac.run_once()  # at once: a skip is no reason to wait
        assert done.vacuumed and done.left is not None and done.left < 100


async def test_a_vacuum_that_fails_backs_off(dsn: str, clock: list[float]) -> None:
    """A VACUUM that errors (here: on a table that is gone, as a statement_timeout would
    cut it) is not run again at the next look, but after the backoff."""

    class Failing:
        vacuum_look = Q.sql.vacuum_look
        vacuum_jobs = sql.SQL("VACUUM (SKIP_LOCKED) trioq.no_such_table")

    async with database(dsn) as (conn, pool):
        await churn(dsn, conn, 500)
        work = Counter()
        failing = vacuumer(pool, clock, work, threshold=100, sql=Failing())
        work.n = 1
        with pytest.raises(psycopg.errors.UndefinedTable):
            await failing.run_once()
        failing._sql = Q.sql  # the cause is gone
        work.n = 2
        assert not (await failing.run_once()).vacuumed  # backed off
        clock[0] += 1.5
        work.n = 3
        assert (await failing.run_once()).vacuumed
