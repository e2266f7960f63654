"""`trioq._pg.pipeline`: deferred commands and a statement in one round trip, on libpq's
pipeline mode directly. The cursor must behave as ``execute()``'s: rows, rowcount, errors,
prepared statements, and a connection left usable after an error or a cancellation."""

from __future__ import annotations

import inspect

import psycopg
import pytest
import trio
from psycopg import pq
from psycopg._preparing import PrepareManager

import trioq
from trioq._pg.pipeline import execute_pipelined

_OFF = pq.PipelineStatus.OFF
_IDLE = pq.TransactionStatus.IDLE


async def _conn(dsn: str) -> trioq.pg.TrioConnection:
    conn = await trioq.connect(dsn, autocommit=True)
    await conn.execute("CREATE TABLE IF NOT EXISTS t (id int PRIMARY KEY, v text)")
    return conn


async def test_the_statement_runs_inside_the_deferred_begin_and_returns_its_rows(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        conn.defer(b"BEGIN")
        cur = await conn.execute("INSERT INTO t VALUES (%s, %s) RETURNING id, v", (1, "a"))
        assert await cur.fetchall() == [(1, "a")]
        assert cur.rowcount == 1
        assert conn.pgconn.transaction_status == pq.TransactionStatus.INTRANS
        assert conn.pgconn.pipeline_status == _OFF
        await conn.execute("ROLLBACK")
        cur = await conn.execute("SELECT count(*) FROM t")
        assert await cur.fetchone() == (0,)  # it ran in the transaction that rolled back


async def test_several_deferred_commands_go_ahead_in_order(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        conn.defer(b"BEGIN", b"SAVEPOINT s")
        await conn.execute("INSERT INTO t VALUES (%s, %s)", (1, "a"))
        await conn.execute("ROLLBACK TO SAVEPOINT s")
        await conn.execute("INSERT INTO t VALUES (%s, %s)", (2, "b"))
        await conn.execute("COMMIT")
        cur = await conn.execute("SELECT id FROM t ORDER BY id")
        assert await cur.fetchall() == [(2,)]


@pytest.mark.parametrize("params", [(5,), None])
async def test_the_prelude_holds_when_the_statement_after_it_fails(
    dsn: str, params: tuple[int] | None
) -> None:
    """The prelude is a transaction of its own: the statement's error (and the deferred
    BEGIN's rollback) leaves what it set."""
    async with await _conn(dsn) as conn:
        conn.prelude = (b"SET statement_timeout = '7s'",)
        conn.defer(b"BEGIN")
        with pytest.raises(psycopg.errors.DivisionByZero):
            await conn.execute("SELECT 1 / (%s - 5)" if params else "SELECT 1 / 0", params)
        await conn.execute("ROLLBACK")
        cur = await conn.execute("SHOW statement_timeout")
        assert await cur.fetchone() == ("7s",)
        assert len(conn.prelude) == 0  # sent once


async def test_a_prelude_that_fails_closes_the_connection(dsn: str) -> None:
    """Nothing more runs on a session whose setup failed: not even the statement sent
    after it in the same round trip (the server skips to the Sync)."""
    async with await _conn(dsn) as conn:
        conn.prelude = (b"SELECT 1 / 0",)
        with pytest.raises(psycopg.errors.DivisionByZero):
            await conn.execute("INSERT INTO t VALUES (%s, %s)", (1, "a"))
        assert conn.closed
    async with await _conn(dsn) as conn:
        cur = await conn.execute("SELECT id FROM t")
        assert await cur.fetchall() == []


async def test_an_error_in_the_statement_is_raised_and_the_connection_recovers(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        await conn.execute("INSERT INTO t VALUES (1, 'a')")
        conn.defer(b"BEGIN")
        with pytest.raises(psycopg.errors.UniqueViolation, match="t_pkey"):
            await conn.execute("INSERT INTO t VALUES (%s, %s)", (1, "again"))
        assert conn.pgconn.pipeline_status == _OFF
        assert conn.pgconn.transaction_status == pq.TransactionStatus.INERROR
        await conn.execute("ROLLBACK")
        cur = await conn.execute("SELECT v FROM t WHERE id = %s", (1,))
        assert await cur.fetchone() == ("a",)


async def test_an_error_in_a_deferred_command_is_raised_and_the_statement_does_not_run(
    dsn: str,
) -> None:
    async with await _conn(dsn) as conn:
        conn.defer(b"BEGIN", b"SELECT 1/0")
        with pytest.raises(psycopg.errors.DivisionByZero):
            await conn.execute("INSERT INTO t VALUES (%s, %s)", (1, "a"))
        assert conn.deferred == ()
        await conn.execute("ROLLBACK")
        cur = await conn.execute("SELECT count(*) FROM t")
        assert await cur.fetchone() == (0,)


async def test_a_statement_run_often_is_prepared_and_still_right(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        threshold = conn.prepare_threshold
        assert threshold is not None
        for i in range(threshold + 5):
            conn.defer(b"BEGIN")
            cur = await conn.execute("INSERT INTO t VALUES (%s, %s) RETURNING v", (i, f"v{i}"))
            assert await cur.fetchone() == (f"v{i}",)
            await conn.execute("COMMIT")
        cur = await conn.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE 'INSERT INTO t%%'"
        )
        assert await cur.fetchone() == (1,)  # prepared once, on this path
        cur = await conn.execute("SELECT count(*) FROM t")
        assert await cur.fetchone() == (threshold + 5,)


async def test_a_cancelled_statement_leaves_the_connection_usable(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        conn.defer(b"BEGIN")
        with trio.move_on_after(0.3) as scope:
            await conn.execute("SELECT pg_sleep(%s)", (30,))
        assert scope.cancelled_caught
        assert not conn.closed
        assert conn.pgconn.pipeline_status == _OFF
        await conn.execute("ROLLBACK")
        assert conn.pgconn.transaction_status == _IDLE
        cur = await conn.execute("SELECT %s::int", (7,))
        assert await cur.fetchone() == (7,)


async def test_several_statements_in_one_round_trip_each_get_their_cursor(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        conn.defer(b"BEGIN")
        first, second = await execute_pipelined(
            conn,
            [("INSERT INTO t VALUES (%s, 'a') RETURNING id", (1,)), ("SELECT %s::text", ("x",))],
        )
        assert await first.fetchall() == [(1,)]
        assert await second.fetchall() == [("x",)]
        await conn.execute("COMMIT")


def test_the_psycopg_internals_this_path_uses_are_still_there() -> None:
    """A psycopg release that renames one fails here, not in production."""
    for name in ("_reset", "_convert_query", "_check_results", "_set_results"):
        assert callable(getattr(psycopg.AsyncCursor, name)), name
    for name in ("get", "maybe_add_to_cache", "validate", "maintain_gen"):
        assert callable(getattr(PrepareManager, name)), name
    assert callable(psycopg.AsyncConnection._get_tx_start_command)  # TrioConnection's BEGIN
    assert list(inspect.signature(PrepareManager.validate).parameters) == [
        "self", "key", "prep", "name", "results"
    ]  # fmt: skip


async def test_commands_after_the_statements_run_and_their_errors_are_raised(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        conn.defer(b"BEGIN")
        (cur,) = await execute_pipelined(
            conn, [("INSERT INTO t VALUES (%s, 'a') RETURNING id", (1,))], then=[b"COMMIT"]
        )
        assert await cur.fetchall() == [(1,)]
        assert conn.pgconn.transaction_status == _IDLE  # committed in the same round trip
        conn.defer(b"BEGIN")
        with pytest.raises(psycopg.errors.DivisionByZero):
            await execute_pipelined(
                conn, [("INSERT INTO t VALUES (%s, 'b')", (2,))], then=[b"SELECT 1/0", b"COMMIT"]
            )
        await conn.execute("ROLLBACK")
        cur = await conn.execute("SELECT id FROM t ORDER BY id")
        assert await cur.fetchall() == [(1,)]  # the failed command kept the COMMIT from running


async def test_an_error_in_a_statement_keeps_the_commands_after_it_from_running(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        conn.defer(b"BEGIN")
        with pytest.raises(psycopg.errors.DivisionByZero):
            await execute_pipelined(
                conn,
                [("INSERT INTO t VALUES (%s, 'a')", (1,)), ("SELECT 1/%s", (0,))],
                then=[b"COMMIT"],
            )
        await conn.execute("ROLLBACK")
        cur = await conn.execute("SELECT count(*) FROM t")
        assert await cur.fetchone() == (0,)


@pytest.mark.parametrize(
    "bad", ["nul\x00inside", "\ud800 lone surrogate", object()], ids=["nul", "surrogate", "object"]
)
async def test_a_parameter_that_cannot_be_sent_raises_before_anything_goes_out(
    dsn: str, bad: object
) -> None:
    async with await _conn(dsn) as conn:
        conn.defer(b"BEGIN")
        with pytest.raises((psycopg.Error, UnicodeEncodeError)):  # what execute() raises
            await conn.execute("INSERT INTO t VALUES (%s, %s)", (1, bad))
        assert not conn.closed
        assert conn.pgconn.pipeline_status == _OFF
        assert conn.deferred == (b"BEGIN",)  # nothing was sent: still deferred
        assert conn.pgconn.transaction_status == _IDLE
        cur = await conn.execute("INSERT INTO t VALUES (%s, %s) RETURNING v", (2, "fine"))
        assert await cur.fetchone() == ("fine",)  # the BEGIN went with it
        await conn.execute("COMMIT")


async def test_a_huge_parameter_goes_through(dsn: str) -> None:
    """8 MiB in one parameter: more than libpq's output buffer, so the flush has to wait
    for the socket while the server reads."""
    async with await _conn(dsn) as conn:
        conn.defer(b"BEGIN")
        big = "x" * (8 << 20)
        cur = await conn.execute("INSERT INTO t VALUES (%s, %s) RETURNING length(v)", (1, big))
        assert await cur.fetchone() == (len(big),)
        await conn.execute("COMMIT")


async def test_on_a_connection_that_is_not_autocommit_the_statement_opens_psycopgs_transaction(
    dsn: str,
) -> None:
    async with await _conn(dsn):
        pass  # the table
    async with await trioq.connect(dsn) as conn:  # not autocommit
        conn.defer(b"SAVEPOINT s")
        cur = await conn.execute("INSERT INTO t VALUES (%s, %s) RETURNING id", (1, "a"))
        assert await cur.fetchall() == [(1,)]
        assert conn.pgconn.transaction_status == pq.TransactionStatus.INTRANS
        await conn.execute("ROLLBACK TO SAVEPOINT s")  # the savepoint is inside it
        await conn.rollback()
        cur = await conn.execute("SELECT count(*) FROM t")
        assert await cur.fetchone() == (0,)


@pytest.mark.parametrize("failing", ["a deferred command", "an earlier statement"])
async def test_a_statement_whose_parse_was_skipped_by_an_error_is_prepared_again(
    dsn: str, failing: str
) -> None:
    """A statement prepared in this pipeline (``prepare=True``: its Parse goes out with it)
    behind a command that fails: the server skips the Parse, so psycopg's cache must not
    count it as prepared, or every later execute of it names a statement that is not
    there."""
    async with await _conn(dsn) as conn:
        statement = ("SELECT %s::int + 1", (1,))
        if failing == "a deferred command":
            conn.defer(b"SELECT 1/0")
            first = [statement]
        else:
            first = [("SELECT 1/%s::int", (0,)), statement]
        with pytest.raises(psycopg.errors.DivisionByZero):
            await execute_pipelined(conn, first, prepare=True)
        for n in range(3):
            (cur,) = await execute_pipelined(conn, [("SELECT %s::int + 1", (n,))], prepare=True)
            assert await cur.fetchone() == (n + 1,)
            cur = await conn.execute("SELECT %s::int + 1", (n,))
            assert await cur.fetchone() == (n + 1,)


_COPY_PROBE = """
import sys, trio, trioq, psycopg
from trioq._pg.pipeline import execute_pipelined

async def main(dsn, query):
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS t (id int PRIMARY KEY, v text)")
        try:
            await execute_pipelined(conn, [(query, None)])
        except psycopg.ProgrammingError as ex:
            print("raised:", ex)
        print("closed:", conn.closed)
    async with await trioq.connect(dsn, autocommit=True) as again:
        cur = await again.execute("SELECT count(*) FROM t")
        print("rows:", (await cur.fetchone())[0])

trio.run(main, sys.argv[1], sys.argv[2])
"""


@pytest.mark.parametrize("query", ["COPY t FROM STDIN", "COPY (SELECT 1) TO STDOUT"])
def test_a_copy_in_a_pipeline_raises_instead_of_spinning(dsn: str, query: str) -> None:
    """libpq hands out a COPY's result again and again: the collecting loop must stop, or
    the trio loop spins there for ever (every other task of the process with it). In a
    subprocess, so that a regression fails on the timeout instead of hanging the suite."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _COPY_PROBE, dsn, query],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "raised: COPY cannot be used in a pipelined statement" in out.stdout, out.stdout
    assert "closed: True" in out.stdout and "rows: 0" in out.stdout


async def test_a_cancelled_pipeline_leaves_no_half_prepared_statement(dsn: str) -> None:
    """Cancelled while the server runs the first statement: the second one's Parse may never
    have run. The connection is kept (drained), so psycopg's cache must not list it."""
    async with await _conn(dsn) as conn:
        with trio.move_on_after(0.3) as scope:
            await execute_pipelined(
                conn, [("SELECT pg_sleep(%s)", (5,)), ("SELECT %s::int + 1", (1,))], prepare=True
            )
        assert scope.cancelled_caught and not conn.closed
        (cur,) = await execute_pipelined(conn, [("SELECT %s::int + 1", (1,))])
        assert await cur.fetchone() == (2,)
