"""A connection goes back to the app pool as clean as it came out (issue 22).

What a handler's session can carry (settings, ``trioq.now``, advisory locks, LISTEN,
temporary tables, a role) must not reach the next job that gets the connection, nor the
enqueues made on it; and a DSN's ``options=-c trioq.now=...`` moves no worker's clock.
``app_pool_size=1`` makes every job get the same connection.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import Any

import psycopg
import pytest
from helpers import Counter, rows, scalar, serving, wait_until

import trioq

EPOCH_2000 = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


def leaky_registry(seen: list[dict[str, Any]], done: Counter) -> trioq.Registry:
    tasks = trioq.Registry()

    @tasks.task(name="leak")
    async def leak(job: trioq.JobContext, via: str) -> None:
        statements = [
            "SELECT set_config('statement_timeout', '1500', false), pg_advisory_lock(42)",
            "SELECT set_config('trioq.now', '2000-01-01T00:00:00Z', false)",
            "LISTEN somewhere",
            "CREATE TEMP TABLE leftover (n int)",
        ]
        if via == "connection":
            async with job.connection() as conn:
                for statement in statements:
                    await conn.execute(statement)
        else:  # complete_with's first-word check lets a SELECT of set_config through
            await job.complete_with(statements[0] + ", " + statements[1][len("SELECT "):])
            return
        done.hit()

    @tasks.task(name="look")
    async def look(job: trioq.JobContext, stumble: str = "") -> None:
        async with job.connection() as conn:
            # a first statement that fails, in the round trip of the reset: with parameters
            # (trioq's pipeline), without (a simple query), in psycopg's pipeline mode
            with contextlib.suppress(psycopg.errors.DivisionByZero):
                if stumble == "params":
                    await conn.execute("SELECT 1 / %s", [0])
                elif stumble == "plain":
                    await conn.execute("SELECT 1 / 0")
                elif stumble == "pipeline":
                    async with conn.pipeline():
                        await conn.execute("SELECT 1 / %s", [0])
            found = await rows(
                conn,
                "SELECT current_setting('statement_timeout'),"
                " coalesce(nullif(current_setting('trioq.now', true), ''), 'unset'),"
                " (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                "   AND pid = pg_backend_pid()),"
                " (SELECT count(*) FROM pg_listening_channels()),"
                " to_regclass('pg_temp.leftover') IS NOT NULL",
            )
        (timeout, clock, locks, listening, temp) = found[0]
        # on noop's queue, which this worker does not serve: the rows stay for the test to
        # read (by name, the enqueue would put it on "default", where it could run first)
        enqueued = await job.enqueue("noop", queue="elsewhere")
        seen.append({"timeout": timeout, "clock": clock, "locks": locks, "listening": listening,
                     "temp": temp, "enqueued": enqueued.job_id})  # fmt: skip
        done.hit()

    @tasks.task(name="noop", queue="elsewhere")
    async def noop(job: trioq.JobContext) -> None:
        pass

    return tasks


async def _run(dsn: str, via: str, *, stumble: str = "") -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    done = Counter()
    one_slot = {"default": trioq.QueueConfig(concurrency=1)}
    async with serving(dsn, leaky_registry(seen, done), app_pool_size=1,
                       queues=one_slot) as (conn, _):  # fmt: skip
        await trioq.enqueue(conn, "leak", {"via": via})
        if via == "connection":
            await done.wait_for(1)
        else:
            await wait_until(lambda: _no_leak_left(conn))
        for _ in range(3):
            await trioq.enqueue(conn, "look", {"stumble": stumble})
        await done.wait_for(3 if via != "connection" else 4)
        run_ats = await rows(conn, "SELECT run_at FROM trioq.jobs WHERE task = 'noop'")
        assert len(run_ats) == 3
        assert all(run_at > EPOCH_2000 + dt.timedelta(days=365) for (run_at,) in run_ats)
    return seen


async def _no_leak_left(conn: Any) -> bool:
    return not await scalar(conn, "SELECT count(*) FROM trioq.jobs WHERE task = 'leak'")


async def test_what_a_handler_sets_on_its_connection_stays_with_it(dsn: str) -> None:
    """Before: the next jobs on the connection ran with a 1 ms statement timeout, its
    enqueues were stamped 2000-01-01, lock 42 stayed held."""
    for look in await _run(dsn, "connection"):
        assert look["timeout"] != "1500ms" and look["clock"] == "unset"
        assert (look["locks"], look["listening"], look["temp"]) == (0, 0, False)


@pytest.mark.parametrize("stumble", ["params", "plain", "pipeline"])
async def test_a_first_statement_that_fails_does_not_undo_the_reset(
    dsn: str, stumble: str
) -> None:
    """The reset is its own transaction: sent in one with the next user's first statement,
    that statement's error rolled it back (RESET ALL, set_config, UNLISTEN, DISCARD TEMP
    are transactional), and the user went on with its predecessor's timeout and clock."""
    for look in await _run(dsn, "connection", stumble=stumble):
        assert look["timeout"] != "1500ms" and look["clock"] == "unset"
        assert (look["locks"], look["listening"], look["temp"]) == (0, 0, False)


async def test_what_a_complete_with_statement_sets_stays_with_it(dsn: str) -> None:
    for look in await _run(dsn, "complete_with"):
        assert look["timeout"] != "1500ms" and look["clock"] == "unset" and look["locks"] == 0


async def test_a_dsn_that_sets_the_clock_moves_no_enqueue(dsn: str) -> None:
    """``options=-c trioq.now=...`` in the worker's DSN: its jobs' enqueues and its claims
    keep the database's clock."""
    seen: list[dict[str, Any]] = []
    done = Counter()
    moved = f"{dsn} options='-c trioq.now=2000-01-01T00:00:00Z'"
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
    # "elsewhere" is not served: the noop job stays to be read (served, it could finish
    # and leave the table before the read: the race CI once lost)
    only_default = {"default": trioq.QueueConfig()}
    async with serving(moved, leaky_registry(seen, done), queues=only_default) as (conn, _):
        await trioq.enqueue(conn, "look")  # on the test's connection: the clock it was given
        await done.wait_for(1)
        (run_at,) = (await rows(conn, "SELECT run_at FROM trioq.jobs WHERE task = 'noop'"))[0]
    assert run_at > EPOCH_2000 + dt.timedelta(days=365)
    assert seen[0]["clock"] == "unset"
