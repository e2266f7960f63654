"""A timed pause (``Queue.pause(..., until=...)``, migration 20) on real Postgres: both claims
refuse the queue until its time and take it after, on the database's clock (``trioq.now``,
no sleeping), whether or not the row was tidied; the governor's ``run_once`` tidies the row,
tells every worker, and leaves a newer pause alone; every bad ``until`` is refused."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio
from helpers import migrated, traced, wait_until_blocked

import trioq
from trioq import Queue, QueueConfig
from trioq._flow import resume_due
from trioq._worker.services.governor import Governor

UTC = dt.UTC
LEASE = dt.timedelta(seconds=30)
T0 = dt.datetime(2030, 1, 1, tzinfo=UTC)
SEC = dt.timedelta(seconds=1)
Q = Queue()


async def add(conn: Any, n: int, queue: str = "q") -> None:
    await trioq.enqueue_bulk(conn, "t", [{"i": i} for i in range(n)], queue=queue)


async def plain(conn: Any, queue: str = "q") -> list[trioq.Job]:
    return await Q.claim(conn, queue, owner="w", limit=10, lease=LEASE)


async def limited(conn: Any, queue: str = "q") -> trioq.LimitedClaim:
    return await Q.claim_limited(conn, queue, owner="w", limit=10, lease=LEASE)


async def row(conn: Any, queue: str = "q") -> tuple[Any, ...]:
    cur = await conn.execute(
        "SELECT paused, paused_until FROM trioq.queues WHERE name = %s", (queue,)
    )
    found = await cur.fetchone()
    assert found is not None
    return tuple(found)


async def set_clock(conns: list[Any], when: dt.datetime) -> None:
    for conn in conns:
        await conn.execute("SELECT set_config('trioq.now', %s, false)", (when.isoformat(),))


# -- the claims ---------------------------------------------------------------------------------


async def test_both_claims_refuse_until_the_time_and_take_after_without_a_tidy(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        await add(conn, 3)
        settings = await Q.pause(conn, "q", until=T0 + 10 * SEC)
        assert (settings.paused, settings.paused_until) == (True, T0 + 10 * SEC)
        assert await plain(conn) == []
        got = await limited(conn)
        assert (got.jobs, got.reason, got.retry_in) == ([], "paused", 10.0)
        await set_clock([conn], T0 + 10 * SEC - dt.timedelta(microseconds=1))
        assert await plain(conn) == []
        assert (await limited(conn)).reason == "paused"
        await set_clock([conn], T0 + 10 * SEC)  # the end: no pause, the row untouched
        assert await row(conn) == (True, T0 + 10 * SEC)
        [s] = await Q.queue_settings(conn)
        assert (s.paused, s.paused_until, s.controlled) == (False, None, False)
        assert len(await plain(conn)) == 3
        await add(conn, 2)
        got = await limited(conn)
        assert (len(got.jobs), got.reason) == (2, None)


async def test_the_plain_claim_takes_an_ended_pause_only_when_nothing_else_is_set(
    dsn: str,
) -> None:
    async with migrated(dsn, T0) as conn:
        await add(conn, 2)
        await Q.set_limits(conn, "q", global_concurrency=5)
        await Q.pause(conn, "q", until=dt.timedelta(seconds=5))  # from the database's clock
        await set_clock([conn], T0 + 5 * SEC)
        assert await plain(conn) == []  # still limited: the limited claim's
        got = await limited(conn)
        assert (len(got.jobs), got.reason) == (2, None)


async def test_an_indefinite_pause_is_never_taken_by_the_plain_claim(dsn: str) -> None:
    """paused_until NULL must not read as "ended" (a NULL in the claim's NOT EXISTS)."""
    async with migrated(dsn, T0) as conn:
        await add(conn, 1)
        await Q.pause(conn, "q")
        await set_clock([conn], T0 + dt.timedelta(days=3650))
        assert await plain(conn) == []
        assert (await limited(conn)).reason == "paused"
        assert (await limited(conn)).retry_in is None


# -- what a pause, a second pause and a resume write --------------------------------------------


async def test_the_last_pause_wins_and_a_resume_clears_the_time(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        s = await Q.pause(conn, "q", until=T0 + 60 * SEC)
        assert s.paused_until == T0 + 60 * SEC
        s = await Q.pause(conn, "q")  # without until: until resumed
        assert (s.paused, s.paused_until) == (True, None)
        s = await Q.pause(conn, "q", until=dt.timedelta(minutes=2))  # timed again
        assert s.paused_until == T0 + dt.timedelta(minutes=2)
        s = await Q.set_limits(conn, "q", global_concurrency=3)  # a limit keeps the pause
        assert (s.paused, s.paused_until) == (True, T0 + dt.timedelta(minutes=2))
        s = await Q.resume(conn, "q")
        assert (s.paused, s.paused_until) == (False, None)
        assert await row(conn) == (False, None)
        # A time in another zone is the same instant.
        east = dt.timezone(dt.timedelta(hours=5))
        s = await Q.pause(conn, "q", until=(T0 + SEC).astimezone(east))
        assert s.paused_until == T0 + SEC


BAD_UNTIL: list[tuple[object, type[Exception], str]] = [
    (dt.datetime(2030, 1, 2), ValueError, "is a naive datetime"),
    (T0 - SEC, ValueError, "must lie after the database's clock"),
    (T0, ValueError, "must lie after the database's clock"),
    (dt.datetime(9999, 12, 31, tzinfo=UTC), ValueError, "at most 100 years ahead"),
    (dt.datetime(9999, 12, 31, 23, tzinfo=dt.timezone(-dt.timedelta(hours=5))), ValueError,
     "outside the years 1 to 9999"),
    (dt.timedelta(0), ValueError, "more than 0"),
    (-SEC, ValueError, "more than 0"),
    (dt.timedelta(days=36526), ValueError, "at most 100 years"),
    (dt.timedelta.max, ValueError, "at most 100 years"),
    (math.nan, TypeError, "must be an aware datetime.datetime"),
    (math.inf, TypeError, "must be an aware datetime.datetime"),
    (60, TypeError, "must be an aware datetime.datetime"),
    (True, TypeError, "must be an aware datetime.datetime"),
    ("2030-01-02T00:00Z", TypeError, "must be an aware datetime.datetime"),
    ("\x00\ud800", TypeError, "must be an aware datetime.datetime"),
    (dt.date(2031, 1, 1), TypeError, "must be an aware datetime.datetime"),
]  # fmt: skip


@pytest.mark.parametrize(("until", "error", "words"), BAD_UNTIL)
async def test_a_bad_until_is_refused_naming_it_and_writes_nothing(
    dsn: str, until: object, error: type[Exception], words: str
) -> None:
    async with migrated(dsn, T0) as conn:
        await Q.pause(conn, "q")  # the refused pause must not replace this one
        with pytest.raises(error, match="until") as raised:
            await Q.pause(conn, "q", until=until)  # type: ignore[arg-type]
        assert words in str(raised.value)
        assert await row(conn) == (True, None)


async def test_the_schema_refuses_a_time_without_a_pause_or_out_of_range(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        await Q.pause(conn, "q")
        for bad in ("UPDATE trioq.queues SET paused = false, paused_until = '2031-01-01Z'",
                    "UPDATE trioq.queues SET paused_until = 'infinity'",
                    "UPDATE trioq.queues SET paused_until = '-infinity'",
                    "UPDATE trioq.queues SET paused_until = '20000-01-01Z'"):  # fmt: skip
            with pytest.raises(psycopg.errors.CheckViolation):
                await conn.execute(bad)
        # A row past the check (dropped by hand) still reads: the time is clamped.
        await conn.execute("ALTER TABLE trioq.queues DROP CONSTRAINT queues_paused_until_check")
        await conn.execute("UPDATE trioq.queues SET paused_until = 'infinity'")
        [s] = await Q.queue_settings(conn)
        assert s.paused and s.paused_until is not None and s.paused_until.year == 9999
        got = await limited(conn)  # the claim and the governor's tidy survive it too
        assert got.reason == "paused" and got.retry_in is not None and got.retry_in > 1e9
        resumed, ends_in = await resume_due(conn, Q.sql, ["q"])
        assert resumed == [] and ends_in is not None and ends_in > 1e9


# -- the governor -------------------------------------------------------------------------------


@asynccontextmanager
async def governed(dsn: str) -> AsyncIterator[tuple[Any, Any, Governor, list[str]]]:
    """A connection, a listener, and a governor serving q and r; all on the clock T0."""
    changed: list[str] = []

    async def on_paused(name: str) -> None:
        pass

    async with (
        migrated(dsn, T0) as conn,
        await trioq.connect(dsn, autocommit=True) as listener,
        trioq.pg.Pool(dsn, max_size=1, connect_kwargs={"autocommit": True}) as pool,
    ):
        async with pool.connection() as service_conn:
            await set_clock([service_conn], T0)
        configs = {"q": QueueConfig(), "r": QueueConfig()}
        governor = Governor(pool, Q, configs, poll_interval=60, on_change=changed.append,
                            on_paused=on_paused)  # fmt: skip
        await listener.execute("LISTEN trioq_trioq")
        yield conn, listener, governor, changed


async def drain_notes(listener: Any) -> list[str]:
    """The notifications delivered so far (a round trip first, so all have arrived)."""
    await listener.execute("SELECT 1")
    notes = []
    with trio.move_on_after(0.2):
        async for note in listener.notifies():
            notes.append(note.payload)
    return notes


async def governor_clock(governor: Governor, conn: Any, when: dt.datetime) -> None:
    await set_clock([conn], when)
    async with governor._pool.connection() as service_conn:
        await set_clock([service_conn], when)


async def test_without_a_timed_pause_a_governor_round_is_one_statement(dsn: str) -> None:
    """Every idle worker's governor ran its tidy of ended timed pauses every poll, beside its
    read of the settings, though a tidy has nothing to do without a timed pause: a round is
    the read alone now, and read and tidy once a timed pause runs (and the round after it
    ends, which the last round timed)."""
    async with governed(dsn) as (conn, _listener, governor, _):
        service_conn = await governor._pool.getconn()  # the pool's one connection
        await governor._pool.putconn(service_conn)

        async def executes() -> int:
            with traced(service_conn) as sent:
                await governor.run_once()
            return sent.count("Execute")

        assert await executes() == 1
        await Q.pause(conn, "q")  # until resumed: no time to tidy at
        assert await executes() == 1
        await Q.pause(conn, "r", until=T0 + 10 * SEC)
        assert await executes() == 2
        await governor_clock(governor, conn, T0 + 10 * SEC)
        assert await executes() == 2  # the round the last one timed: the tidy resumes r
        assert await row(conn, "r") == (False, None)
        assert await executes() == 1  # q's pause has no end: nothing to time
        await Q.resume(conn, "q")
        assert await executes() == 1


async def test_the_governor_tidies_an_ended_pause_and_tells_every_worker(dsn: str) -> None:
    async with governed(dsn) as (conn, listener, governor, changed):
        await Q.pause(conn, "q", until=T0 + 10 * SEC)
        await Q.pause(conn, "r", until=T0 + 30 * SEC)
        await Q.pause(conn, "other", until=T0 + 5 * SEC)  # not served: not this one's
        first = await governor.run_once()
        assert first.resumed == () and first.pause_ends_in == 10.0
        assert governor.settings("q").paused and governor._interval(first) <= 10.0
        await drain_notes(listener)
        await governor_clock(governor, conn, T0 + 10 * SEC)
        second = await governor.run_once()
        assert (second.resumed, second.pause_ends_in) == (("q",), 20.0)
        assert second.changed == ("q",) and not governor.controlled("q")
        assert await row(conn, "q") == (False, None)
        assert await row(conn, "r") == (True, T0 + 30 * SEC)
        assert await row(conn, "other") == (True, T0 + 5 * SEC)  # reads as ended all the same
        assert await drain_notes(listener) == ["@queues"]
        third = await governor.run_once()  # nothing left to tidy: no notification
        assert third.resumed == () and await drain_notes(listener) == []
        assert "q" in changed


async def test_the_governor_leaves_a_newer_pause_alone(dsn: str) -> None:
    async with governed(dsn) as (conn, _listener, governor, _):
        await Q.pause(conn, "q", until=T0 + 10 * SEC)
        await governor_clock(governor, conn, T0 + 11 * SEC)
        # A newer pause written before the tidy: until later, then until resumed.
        await Q.pause(conn, "q", until=T0 + 20 * SEC)
        assert (await governor.run_once()).resumed == ()
        assert await row(conn, "q") == (True, T0 + 20 * SEC)
        await Q.pause(conn, "q")
        await governor_clock(governor, conn, T0 + 25 * SEC)
        assert (await governor.run_once()).resumed == ()
        assert await row(conn, "q") == (True, None)


async def test_a_newer_pause_committed_while_the_tidy_waits_for_the_row_stays(dsn: str) -> None:
    """The tidy finds the ended pause, waits for the row lock of a transaction that pauses
    the queue again, and then must not resume it (its guard is re-checked on the new row)."""
    async with governed(dsn) as (conn, _listener, governor, _):
        await Q.pause(conn, "q", until=T0 + 10 * SEC)
        await governor.run_once()  # it hears of the pause (a notification) and times its end
        await governor_clock(governor, conn, T0 + 11 * SEC)
        async with await trioq.connect(dsn, autocommit=True) as other:
            await other.execute("BEGIN")
            await Q.pause(other, "q")  # holds q's row lock until it commits
            rounds: list[Any] = []

            async def tidy() -> None:
                rounds.append(await governor.run_once())

            service_conn = await governor._pool.getconn()  # the pool's one connection
            await governor._pool.putconn(service_conn)
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(tidy)
                    await wait_until_blocked(conn, service_conn)  # the tidy waits for the row
                    await other.execute("COMMIT")
            assert rounds[0].resumed == ()
        assert await row(conn, "q") == (True, None)


async def test_on_a_read_only_database_the_governor_still_reads(dsn: str) -> None:
    """The tidy is a write: where writes are refused (a standby) the round still reads the
    settings, and an ended pause reads as ended all the same."""
    async with governed(dsn) as (conn, _listener, governor, _):
        await Q.pause(conn, "q", until=T0 + 10 * SEC)
        await Q.pause(conn, "r")
        await governor_clock(governor, conn, T0 + 10 * SEC)
        async with governor._pool.connection() as service_conn:
            await service_conn.execute("SET default_transaction_read_only = on")
        got = await governor.run_once()
        assert got.resumed == () and not governor.settings("q").paused
        assert governor.settings("r").paused
        assert await row(conn, "q") == (True, T0 + 10 * SEC)  # untidied, and harmless
