"""`trioq._pg.lean`: `TrioConnection.first_row`, one of trioq's own statements in one round
trip with less of psycopg's Python (the single enqueue's path). It must behave as
``execute()`` and ``fetchone()`` would: the row, prepared statements, errors, a transaction
left as psycopg would leave it, a connection usable after an error or a cancellation; and it
must not depend on the connection's row factory."""

from __future__ import annotations

import inspect
from typing import Any

import psycopg
import pytest
import trio
from helpers import traced
from psycopg import pq
from psycopg.rows import dict_row, namedtuple_row

import trioq
import trioq.testing
from trioq import JobSpec
from trioq._db.migrate import latest_version
from trioq._pg import lean

_IDLE = pq.TransactionStatus.IDLE
_INTRANS = pq.TransactionStatus.INTRANS
_INERROR = pq.TransactionStatus.INERROR
INSERT = b"INSERT INTO t (id, v) VALUES (%(id)s, %(v)s) RETURNING id, v"


async def _conn(dsn: str, **kwargs: Any) -> trioq.pg.TrioConnection[Any]:
    conn = await trioq.connect(dsn, autocommit=True, **kwargs)
    await conn.execute("CREATE TABLE IF NOT EXISTS t (id int PRIMARY KEY, v text)")
    return conn


async def _count(conn: trioq.pg.TrioConnection[Any], query: str) -> int:
    cur = await psycopg.AsyncCursor(conn).execute(query)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_the_first_row_is_a_tuple_whatever_the_row_factory(dsn: str) -> None:
    async with await _conn(dsn, row_factory=dict_row) as conn:
        assert await conn.first_row(INSERT, {"id": 1, "v": "a"}) == (1, "a")
        assert await conn.first_row(b"SELECT id FROM t WHERE id = %(id)s", {"id": 2}) is None
        assert await conn.first_row(b"DELETE FROM t WHERE id = %(id)s", {"id": 1}) is None
        assert await conn.first_row(b"SELECT generate_series(5, 7)") == (5,)  # the rest dropped
        cur = await conn.execute("SELECT 1 AS one")  # the caller's own statements: its rows
        assert await cur.fetchone() == {"one": 1}


async def test_a_statement_run_often_is_prepared_once_and_then_sent_as_bound(
    dsn: str,
) -> None:
    async with await _conn(dsn) as conn:
        threshold = conn.prepare_threshold
        assert threshold is not None
        for i in range(threshold + 3):
            assert await conn.first_row(INSERT, {"id": i, "v": f"v{i}"}) == (i, f"v{i}")
        assert await _count(conn, "SELECT count(*) FROM pg_prepared_statements "
                                  "WHERE statement LIKE 'INSERT INTO t%'") == 1  # fmt: skip
        with traced(conn) as sent:
            assert await conn.first_row(INSERT, {"id": 100, "v": "x"}) == (100, "x")
        assert sent == ["Bind", "Describe", "Execute", "Sync"]  # libpq's prepared execute: no Parse
        assert await _count(conn, "SELECT count(*) FROM t") == threshold + 4


async def test_without_prepared_statements_nothing_is_prepared(dsn: str) -> None:
    """A connection through a transaction pooler (``prepare_threshold=None``)."""
    async with await _conn(dsn, prepare_threshold=None) as conn:
        for i in range(12):
            await conn.first_row(INSERT, {"id": i, "v": "a"})
        assert await _count(conn, "SELECT count(*) FROM pg_prepared_statements") == 0


async def test_an_error_is_raised_and_the_connection_recovers(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        for i in range(8):  # prepared by now: the error of a prepared statement too
            await conn.first_row(INSERT, {"id": i, "v": "a"})
        with pytest.raises(psycopg.errors.UniqueViolation):
            await conn.first_row(INSERT, {"id": 3, "v": "b"})
        assert conn.pgconn.transaction_status == _IDLE
        assert await conn.first_row(INSERT, {"id": 9, "v": "c"}) == (9, "c")


async def test_in_the_callers_transaction_an_error_leaves_it_failed(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        async with conn.transaction():
            await conn.first_row(INSERT, {"id": 1, "v": "a"})
            assert conn.pgconn.transaction_status == _INTRANS
            with pytest.raises(psycopg.errors.UniqueViolation):
                await conn.first_row(INSERT, {"id": 1, "v": "b"})
            assert conn.pgconn.transaction_status == _INERROR
            with pytest.raises(psycopg.errors.InFailedSqlTransaction):
                await conn.first_row(INSERT, {"id": 2, "v": "b"})
            raise psycopg.Rollback
        assert await _count(conn, "SELECT count(*) FROM t") == 0


async def test_on_a_connection_that_is_not_autocommit_it_opens_psycopgs_transaction(
    dsn: str,
) -> None:
    async with await _conn(dsn) as conn:
        await conn.set_autocommit(False)
        assert await conn.first_row(INSERT, {"id": 1, "v": "a"}) == (1, "a")
        assert conn.pgconn.transaction_status == _INTRANS  # psycopg's BEGIN went first
        await conn.rollback()
        assert await _count(conn, "SELECT count(*) FROM t") == 0


async def test_deferred_commands_go_ahead_of_it_in_its_round_trip(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        conn.defer(b"BEGIN")
        with traced(conn) as sent:
            assert await conn.first_row(INSERT, {"id": 1, "v": "a"}) == (1, "a")
        assert sent.count("Sync") == 1  # BEGIN and the insert in one round trip
        assert conn.pgconn.transaction_status == _INTRANS
        await conn.execute("ROLLBACK")
        assert await _count(conn, "SELECT count(*) FROM t") == 0


async def test_a_parameter_that_cannot_be_sent_raises_before_anything_goes_out(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        with traced(conn) as sent, pytest.raises(psycopg.DataError):
            await conn.first_row(INSERT, {"id": 1, "v": "nul\x00inside"})
        assert sent == []
        assert await conn.first_row(INSERT, {"id": 1, "v": "a"}) == (1, "a")


async def test_a_cancelled_statement_leaves_the_connection_usable(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        with trio.move_on_after(0.3) as scope:
            await conn.first_row(b"SELECT pg_sleep(%(s)s)", {"s": 30})
        assert scope.cancelled_caught
        assert not conn.closed
        assert conn.pgconn.transaction_status == _IDLE
        assert await conn.first_row(b"SELECT %(n)s::int", {"n": 7}) == (7,)


async def test_a_read_only_session_is_remembered(dsn: str) -> None:
    """As ``execute()``: a pool closes a connection that met a read-only server."""
    async with await _conn(dsn) as conn:
        await conn.execute("SET default_transaction_read_only = on")
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            await conn.first_row(INSERT, {"id": 1, "v": "a"})
        assert conn.read_only_seen


async def test_a_closed_connection_says_so(dsn: str) -> None:
    conn = await _conn(dsn)
    await conn.close()
    with pytest.raises(psycopg.OperationalError):
        await conn.first_row(b"SELECT 1")


@pytest.mark.parametrize("row_factory", [dict_row, namedtuple_row])
async def test_every_call_serves_a_connection_whose_rows_are_not_tuples(
    dsn: str, row_factory: Any
) -> None:
    """trioq reads its rows by position: on a ``dict_row`` connection every call failed
    (``KeyError: 0``), the version check of the first enqueue first."""
    async with await trioq.connect(dsn, autocommit=True, row_factory=row_factory) as conn:
        await trioq.migrate(conn)
        assert await trioq.check_schema(conn, "trioq", latest_version()) == latest_version()
        first = await trioq.enqueue(conn, "t", {"n": 1})
        keyed = await trioq.enqueue(conn, "t", {"n": 2}, dedup_key="k")
        again = await trioq.enqueue(conn, "t", {"n": 3}, dedup_key="k")
        assert first.job_id < keyed.job_id == again.job_id and again.duplicate
        windowed = await trioq.enqueue(conn, "t", unique=trioq.Unique(period=60))
        assert (await trioq.enqueue(conn, "t", unique=trioq.Unique(period=60))).duplicate
        await trioq.enqueue(conn, "t", dedup_key="d", debounce=5)
        waiting = await trioq.enqueue(conn, "t", after=[first.job_id])
        assert len(await trioq.enqueue_many(conn, [JobSpec(task="m", dedup_key=f"m{i}")
                                                   for i in range(3)])) == 3  # fmt: skip
        assert len(await trioq.enqueue_bulk(conn, "b", [{"i": i} for i in range(3)])) == 3
        wf = trioq.Workflow()
        wf.add("b", JobSpec(task="b")).after(wf.add("a", JobSpec(task="a")))
        jobs = await wf.enqueue(conn)
        assert [d.job_id for d in await trioq.dependencies(conn, jobs["b"])] == [jobs["a"]]
        batch = await trioq.Batch(jobs=[JobSpec(task="c")], callback=JobSpec(task="cb")).enqueue(
            conn
        )
        status = await trioq.batch_status(conn, batch.batch_id)
        assert status is not None and status.total == 1
        assert (await trioq.job_status(conn, windowed.job_id)).state == "available"
        assert [d.job_id for d in await trioq.dependencies(conn, waiting.job_id)] == [first.job_id]
        queue = trioq.Queue()
        assert (await queue.cancel(conn, keyed.job_id)).status == "cancelled"
        assert (await queue.pause(conn, "default")).paused
        assert not (await queue.resume(conn, "default")).paused
        queues, _ = await queue.status(conn)
        assert any(q.queue == "default" and q.available > 0 for q in queues)
        assert await queue.dead_list(conn) == []
        await queue.add_cron(conn, trioq.CronEntry(name="c", schedule="* * * * *", task="t"))
        assert [e.name for e in await queue.cron_entries(conn)] == ["c"]
        cur = await conn.execute("SELECT 1 AS one")  # the caller's own statements: its rows
        assert (await cur.fetchone()) is not None and cur.description is not None


@pytest.mark.parametrize("row_factory", [dict_row, namedtuple_row])
async def test_the_test_kit_drains_on_a_connection_whose_rows_are_not_tuples(
    dsn: str, row_factory: Any
) -> None:
    tasks = trioq.Registry()
    seen: list[int] = []

    @tasks.task(name="later")
    async def later(job: trioq.JobContext, n: int) -> None:
        async with job.transaction() as tx:
            cur = await tx.execute("SELECT %s::int AS n", (n,))
            row = await cur.fetchone()  # the handler's statements: the caller's rows
            assert row is not None
            seen.append(row["n"] if row_factory is dict_row else row.n)

    async with await trioq.connect(dsn, autocommit=True, row_factory=row_factory) as conn:
        await trioq.migrate(conn)
        await trioq.enqueue(conn, "later", {"n": 7}, delay=3600)
        result = await trioq.testing.drain(conn, tasks, advance=True)
    assert result.completed == 1 and seen == [7]


def test_the_psycopg_internals_this_path_uses_are_still_there() -> None:
    """A psycopg release that renames one fails here, not in production."""
    for name in ("_reset", "_convert_query", "_execute_gen"):
        assert callable(getattr(psycopg.AsyncCursor, name)), name
    assert callable(psycopg.AsyncConnection._check_connection_ok)
    assert callable(psycopg.generators.execute)
    assert list(inspect.signature(psycopg.adapt.Transformer.load_row).parameters)[1:] == [
        "row", "make_row"
    ]  # fmt: skip
    assert lean.__all__ == ["first_row"]
