"""trioq.pg connections against a real Postgres, with no asyncio loop running."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import psycopg
import pytest
import trio
import trio.testing
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg.types.composite import CompositeInfo, register_composite

import trioq
from trioq.pg import ConnectionLock, TrioConnection


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_connect_query_params_and_row_factory(dsn: str) -> None:
    async with await trioq.connect(dsn, row_factory=dict_row) as conn:
        assert isinstance(conn, TrioConnection)
        assert isinstance(conn.lock, ConnectionLock)
        cur = await conn.execute("SELECT %s::int + 1 AS n, %s::text AS t", (41, "x"))
        assert await cur.fetchone() == {"n": 42, "t": "x"}


async def test_transaction_commit_rollback_and_savepoint(dsn: str) -> None:
    async with await trioq.connect(dsn) as conn:
        await conn.execute("CREATE TABLE t (v int)")
        await conn.commit()
        async with conn.transaction():
            await conn.execute("INSERT INTO t VALUES (1)")
            with pytest.raises(ZeroDivisionError):
                async with conn.transaction():  # savepoint
                    await conn.execute("INSERT INTO t VALUES (2)")
                    raise ZeroDivisionError
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await conn.execute("INSERT INTO t VALUES (3)")
                raise RuntimeError
        cur = await conn.execute("SELECT array_agg(v ORDER BY v) FROM t")
        assert await cur.fetchone() == ([1],)


async def test_executemany_pipeline_and_server_cursor(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE TABLE t (v int)")
        async with conn.cursor() as cur:
            await cur.executemany("INSERT INTO t VALUES (%s)", [(i,) for i in range(500)])
        async with conn.pipeline():
            curs = [await conn.execute("SELECT %s::int", (i,)) for i in range(50)]
        assert [(await c.fetchone()) for c in curs] == [(i,) for i in range(50)]
        async with conn.transaction(), conn.cursor(name="big") as scur:
            await scur.execute("SELECT v FROM t ORDER BY v")
            seen = [row[0] async for row in scur]
        assert seen == list(range(500))


async def test_type_registration(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE TYPE pair AS (a int, b text)")
        info = await CompositeInfo.fetch(conn, "pair")
        assert info is not None
        register_composite(info, conn)
        cur = await conn.execute("SELECT (7, 'seven')::pair")
        row = await cur.fetchone()
        assert row is not None
        assert (row[0].a, row[0].b) == (7, "seven")


async def test_copy_100k_rows(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE TABLE t (id int, payload text)")
        async with conn.cursor() as cur:
            async with cur.copy("COPY t (id, payload) FROM STDIN") as copy:
                for i in range(100_000):
                    await copy.write_row((i, f"row {i}"))
            cur2 = await conn.execute("SELECT count(*), sum(id) FROM t")
            assert await cur2.fetchone() == (100_000, sum(range(100_000)))
            rows = 0
            async with cur.copy("COPY t TO STDOUT") as copy:
                async for _row in copy.rows():
                    rows += 1
            assert rows == 100_000


async def test_cancel_mid_query_keeps_connection(dsn: str) -> None:
    async with await trioq.connect(dsn) as conn:
        pid = conn.info.backend_pid
        start = time.monotonic()
        with trio.move_on_after(0.1) as scope:
            await conn.execute("SELECT pg_sleep(5)")
        elapsed = time.monotonic() - start
        assert scope.cancelled_caught
        assert elapsed < 0.5, f"cancel took {elapsed:.3f} s"
        assert not conn.closed
        assert conn.info.transaction_status == TransactionStatus.INERROR
        await conn.rollback()
        cur = await conn.execute("SELECT pg_backend_pid()")
        assert await cur.fetchone() == (pid,)


async def test_cancel_inside_transaction_rolls_back(dsn: str) -> None:
    async with await trioq.connect(dsn) as conn:
        await conn.execute("CREATE TABLE t (v int)")
        await conn.commit()
        with trio.move_on_after(0.1) as scope:
            async with conn.transaction():
                await conn.execute("INSERT INTO t VALUES (1)")
                await conn.execute("SELECT pg_sleep(5)")
        assert scope.cancelled_caught
        assert conn.info.transaction_status == TransactionStatus.IDLE
        cur = await conn.execute("SELECT count(*) FROM t")
        assert await cur.fetchone() == (0,)


async def test_cancel_while_waiting_for_lock_in_transaction(dsn: str) -> None:
    """Cancelled between statements of a transaction (no query running): still rolled back."""
    async with await trioq.connect(dsn) as conn:
        await conn.execute("CREATE TABLE t (v int)")
        await conn.commit()
        with trio.move_on_after(0.05):
            async with conn.transaction():
                await conn.execute("INSERT INTO t VALUES (1)")
                await trio.sleep_forever()
        assert conn.info.transaction_status == TransactionStatus.IDLE
        cur = await conn.execute("SELECT count(*) FROM t")
        assert await cur.fetchone() == (0,)


async def test_close_from_another_task_cancels_server_statement(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as watcher:
        conn = await trioq.connect(dsn)
        pid = conn.info.backend_pid
        errors: list[BaseException] = []

        async def run_query() -> None:
            try:
                await conn.execute("SELECT pg_sleep(30)")
            except (trio.ClosedResourceError, psycopg.Error) as ex:
                errors.append(ex)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_query)
            await trio.testing.wait_all_tasks_blocked()
            await conn.close()
        # The querying task learns either way (QueryCanceled when the cancel lands
        # first, else ClosedResourceError or a closed-connection error); what matters
        # is that the server stops the statement, checked below.
        assert len(errors) == 1
        assert conn.closed
        with trio.fail_after(5):
            while True:
                cur = await watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND state = 'active'",
                    (pid,),
                )
                if await cur.fetchone() == (0,):
                    break
                await trio.sleep(0.01)


async def test_listen_while_others_work_and_leave_early(dsn: str) -> None:
    async with (
        await trioq.connect(dsn, autocommit=True) as listener,
        await trioq.connect(dsn, autocommit=True) as sender,
    ):
        await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier("chan")))
        got: list[str] = []

        async def send() -> None:
            for i in range(5):
                await sender.execute("SELECT pg_notify('chan', %s)", (str(i),))
                await sender.execute("SELECT count(*) FROM pg_class")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            async for note in listener.notifies():
                got.append(note.payload)
                if len(got) == 3:
                    break  # leave early: the connection must stay usable
        cur = await listener.execute("SELECT 1")
        assert await cur.fetchone() == (1,)
        async for note in listener.notifies(timeout=2.0, stop_after=2):
            got.append(note.payload)
        assert got == ["0", "1", "2", "3", "4"]
        # A timeout with nothing to read ends the iteration.
        with trio.fail_after(2):
            assert [n async for n in listener.notifies(timeout=0.05)] == []


async def test_leaving_notifies_early_loses_none_already_received(dsn: str) -> None:
    """Notifications that arrived together are not dropped with the iterator that left."""
    async with (
        await trioq.connect(dsn, autocommit=True) as listener,
        await trioq.connect(dsn, autocommit=True) as sender,
    ):
        await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier("chan")))
        for i in range(5):
            await sender.execute("SELECT pg_notify('chan', %s)", (str(i),))
        # The listening backend sends committed notifications before it is ready for
        # the next query: after this, all five have been read by the client.
        await listener.execute("SELECT 1")
        got = []
        async for note in listener.notifies():
            got.append(note.payload)
            break
        async for note in listener.notifies(timeout=2.0, stop_after=4):
            got.append(note.payload)
        assert got == ["0", "1", "2", "3", "4"]


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    try:
        yield srv.getsockname()[1]
    finally:
        srv.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_connect_refused_names_target_without_password() -> None:
    port = _free_port()
    before = _open_fds()
    with pytest.raises(trioq.ConnectError) as info:
        await trioq.connect(f"postgresql://alice:s3cret@127.0.0.1:{port}/app")
    msg = str(info.value)
    assert f"alice@127.0.0.1:{port}/app" in msg
    assert "s3cret" not in msg
    assert isinstance(info.value, psycopg.OperationalError)
    assert _open_fds() == before


async def test_connect_timeout_on_silent_server(silent_server: int) -> None:
    before = _open_fds()
    start = time.monotonic()
    with pytest.raises(trioq.ConnectError, match="timeout"):
        await trioq.connect(f"host=127.0.0.1 port={silent_server} user=u connect_timeout=2")
    assert 1.9 < time.monotonic() - start < 3.5
    assert _open_fds() == before


async def test_trio_deadline_around_connect(silent_server: int) -> None:
    before = _open_fds()
    start = time.monotonic()
    with trio.move_on_after(0.3) as scope:
        await trioq.connect(f"host=127.0.0.1 port={silent_server} user=u")
    assert scope.cancelled_caught
    assert time.monotonic() - start < 1.0
    assert _open_fds() == before


async def test_many_tasks_share_one_connection(dsn: str) -> None:
    async with await trioq.connect(dsn) as conn:
        results: list[int] = []

        async def one(i: int) -> None:
            cur = await conn.execute("SELECT %s::int", (i,))
            row = await cur.fetchone()
            assert row is not None
            results.append(row[0])

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(one, i)
        assert sorted(results) == list(range(20))
