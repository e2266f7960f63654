"""trioq.pg.Pool against a real Postgres."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import trio
from psycopg.pq import TransactionStatus

import trioq
from trioq.pg import Pool, PoolClosedError


async def _terminate_others(admin: Any, dsn_dbname: str) -> list[int]:
    cur = await admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
        (dsn_dbname,),
    )
    pids = [row[0] for row in await cur.fetchall()]
    for pid in pids:
        await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    await _wait_gone(admin, pids)
    return pids


async def _wait_gone(admin: Any, pids: list[int]) -> None:
    with trio.fail_after(10):
        while True:
            cur = await admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
            )
            if await cur.fetchone() == (0,):
                return
            await trio.sleep(0.01)


async def test_checkout_reuses_and_bounds(dsn: str) -> None:
    async with Pool(dsn, max_size=2) as pool:
        async with pool.connection() as c1:
            pid1 = c1.info.backend_pid
        async with pool.connection() as c2:
            assert c2.info.backend_pid == pid1
        peak = 0

        async def worker() -> None:
            nonlocal peak
            async with pool.connection() as conn:
                peak = max(peak, pool.statistics().in_use)
                await conn.execute("SELECT pg_sleep(0.01)")

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(worker)
        stats = pool.statistics()
        assert peak == 2
        assert stats.opened == 2
        assert stats.size == stats.idle == 2
        assert stats.in_use == 0
        assert stats.checkouts == 12


async def test_returned_inside_transaction_is_rolled_back(dsn: str) -> None:
    async with Pool(dsn, max_size=1) as pool:
        async with pool.connection() as conn:
            await conn.execute("CREATE TABLE t (v int)")
            await conn.commit()
            await conn.execute("INSERT INTO t VALUES (1)")
            assert conn.info.transaction_status == TransactionStatus.INTRANS
        async with pool.connection() as conn:
            assert conn.info.transaction_status == TransactionStatus.IDLE
            cur = await conn.execute("SELECT count(*) FROM t")
            assert await cur.fetchone() == (0,)


async def test_returned_after_cancel_mid_query_is_clean(dsn: str) -> None:
    async with Pool(dsn, max_size=1) as pool:
        with trio.move_on_after(0.05):
            async with pool.connection() as conn:
                await conn.execute("SELECT pg_sleep(5)")
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT 1")
            assert await cur.fetchone() == (1,)
        assert pool.statistics().opened == 1


async def test_idle_connection_killed_is_replaced(dsn: str) -> None:
    async with (
        Pool(dsn, max_size=2) as pool,
        await trioq.connect(dsn, autocommit=True) as admin,
    ):
        async with pool.connection() as a, pool.connection() as b:
            old = {a.info.backend_pid, b.info.backend_pid}
        killed = await _terminate_others(admin, a.info.dbname)
        assert old <= set(killed)
        # The very first query after the kill works: the dead ones were noticed.
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT pg_backend_pid()")
            row = await cur.fetchone()
            assert row is not None and row[0] not in old
        assert pool.statistics().discarded == 2


async def test_fifty_tasks_pool_of_four_backends_terminated_halfway(dsn: str) -> None:
    tasks, rounds = 50, 20
    done = [0] * tasks
    errors = 0
    half = trio.Event()
    async with (
        Pool(dsn, max_size=4) as pool,
        await trioq.connect(dsn, autocommit=True) as admin,
    ):

        async def worker(i: int) -> None:
            nonlocal errors
            while done[i] < rounds:
                try:
                    async with pool.connection() as conn:
                        cur = await conn.execute("SELECT %s::int, pg_sleep(0.001)", (i,))
                        assert (await cur.fetchone() or [None])[0] == i
                except psycopg.OperationalError:
                    errors += 1  # the kill hit a statement in flight: retry
                    continue
                done[i] += 1
                if sum(done) >= tasks * rounds // 2:
                    half.set()

        async with trio.open_nursery() as nursery:
            for i in range(tasks):
                nursery.start_soon(worker, i)
            await half.wait()
            killed = await _terminate_others(admin, admin.info.dbname)
            assert killed
        stats = pool.statistics()
        assert done == [rounds] * tasks
        assert stats.opened > 4  # the killed connections were replaced
        assert stats.discarded == stats.opened - stats.size
        assert stats.size <= 4
        assert stats.in_use == 0
        assert stats.checkouts == tasks * rounds + errors


async def test_closed_pool_refuses() -> None:
    pool = Pool("host=/nonexistent", max_size=1)
    await pool.aclose()
    with pytest.raises(PoolClosedError):
        await pool.getconn()


def test_pool_validates_size() -> None:
    with pytest.raises(ValueError, match="max_size"):
        Pool("", max_size=0)
