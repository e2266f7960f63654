"""trioq.testing, the kit for users' own tests: drain on a controllable clock, assertions on
enqueued jobs, a JobContext without a worker, and the throwaway Postgres. Real Postgres."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio

import trioq
import trioq.testing as tt
from trioq._db.migrate import latest_version
from trioq.retry import Constant

UTC = dt.UTC
T0 = dt.datetime(2030, 1, 1, tzinfo=UTC)


@asynccontextmanager
async def migrated(dsn: str) -> AsyncIterator[Any]:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        await conn.execute("CREATE TABLE ledger (job_id int8, note text)")
        await tt.set_clock(conn, T0)
        yield conn


def app() -> tuple[trioq.Registry, dict[str, list[Any]]]:
    """Tasks of every kind, recording what they saw."""
    tasks = trioq.Registry()
    seen: dict[str, list[Any]] = {"flaky": [], "status": [], "sync": []}

    @tasks.task(keep_result=True)
    async def square(job: trioq.JobContext, n: int) -> int:
        async with job.connection() as conn:  # the row really is running, leased
            seen["status"].append(await trioq.job_status(conn, job.id))
        return n * n

    @tasks.task(max_attempts=3, retry=Constant(seconds=10))
    async def flaky(job: trioq.JobContext) -> str:
        seen["flaky"].append(job.attempt)
        if job.attempt < 3:
            raise OSError(f"attempt {job.attempt} failed")
        return "ok"

    @tasks.task
    async def fatal(job: trioq.JobContext) -> None:
        raise trioq.FatalError("no such user")

    @tasks.task
    async def wait_a_bit(job: trioq.JobContext, until: str) -> None:
        async with job.connection() as conn:
            now = await trioq.Queue().clock(conn)
        if now < dt.datetime.fromisoformat(until):
            job.snooze(60)

    @tasks.task(queue="mail")
    async def signup(job: trioq.JobContext, user: str) -> None:
        async with job.transaction() as tx:  # the write and the completion commit together
            await tx.execute("INSERT INTO ledger VALUES (%s, %s)", (job.id, user))
            await trioq.enqueue(tx, "welcome", {"user": user}, queue="mail")

    @tasks.task(queue="mail")
    def welcome(job: trioq.JobContext, user: str) -> None:  # sync: runs in a thread
        seen["sync"].append((job.id, user))

    return tasks, seen


async def test_drain_runs_each_kind_of_job_through_the_real_states(dsn: str) -> None:
    tasks, seen = app()
    async with migrated(dsn) as conn:
        ids = {
            "square": (await trioq.enqueue(conn, "square", {"n": 7})).job_id,
            "flaky": (await trioq.enqueue(conn, "flaky", max_attempts=3)).job_id,
            "fatal": (await trioq.enqueue(conn, "fatal")).job_id,
            "later": (
                await trioq.enqueue(conn, "wait_a_bit", {"until": "2030-01-01T00:02Z"})
            ).job_id,
            "signup": (await trioq.enqueue(conn, "signup", {"user": "ada"}, queue="mail")).job_id,
        }
        first = await tt.drain(conn, tasks)
        by_job = {run.job_id: run.outcome for run in first.runs}
        assert by_job[ids["square"]] == "completed"
        assert by_job[ids["flaky"]] == "retried"
        assert by_job[ids["fatal"]] == "dead"
        assert by_job[ids["later"]] == "snoozed"
        assert by_job[ids["signup"]] == "completed"
        welcome = [run for run in first.runs if run.task == "welcome"]
        assert [run.outcome for run in welcome] == ["completed"]  # enqueued by a job, drained
        assert seen["sync"] == [(welcome[0].job_id, "ada")]
        (running,) = seen["status"]
        assert (running.state, running.lease_owner, running.attempt) == (
            "running", "trioq.testing.drain", 1,
        )  # fmt: skip
        assert (first.completed, first.retried, first.dead, first.snoozed) == (3, 1, 1, 1)
        assert [r.error for r in first.failures] == [
            "OSError: attempt 1 failed", "FatalError: no such user",
        ]  # fmt: skip
        assert "raise OSError" in (first.failures[0].traceback or "")
        assert await trioq.result(conn, ids["square"]) == 49
        with pytest.raises(trioq.JobDeadError, match="FatalError: no such user"):
            await trioq.result(conn, ids["fatal"])
        cur = await conn.execute("SELECT job_id, note FROM ledger")
        assert await cur.fetchall() == [(ids["signup"], "ada")]

        # Nothing is due now: the retry waits 10 s, the snooze 60 s, on the frozen clock.
        assert (await tt.drain(conn, tasks)).runs == ()
        assert (await trioq.job_status(conn, ids["flaky"])).state == "scheduled"
        assert await tt.advance_clock(conn, 10) == T0 + dt.timedelta(seconds=10)
        again = await tt.drain(conn, tasks)
        assert [(r.job_id, r.attempt, r.outcome) for r in again.runs] == [
            (ids["flaky"], 2, "retried")
        ]
        # advance: the clock jumps to each next due job until nothing is left.
        rest = await tt.drain(conn, tasks, advance=True)
        assert [(r.task, r.outcome) for r in rest.runs] == [
            ("flaky", "completed"), ("wait_a_bit", "snoozed"), ("wait_a_bit", "completed"),
        ]  # fmt: skip
        assert seen["flaky"] == [1, 2, 3]
        assert await trioq.Queue().clock(conn) == T0 + dt.timedelta(seconds=120)
        await tt.assert_enqueued(conn, count=0)
        await tt.reset_clock(conn)
        assert await trioq.Queue().clock(conn) > dt.datetime.now(UTC) - dt.timedelta(minutes=1)


async def test_drain_serves_only_its_queues_and_fails_unknown_tasks(dsn: str) -> None:
    """An unknown task is given back, attempt refunded, as a worker would (issue #10); in a
    test it is a bug, so drain says so."""
    tasks, _ = app()
    async with migrated(dsn) as conn:
        other = await trioq.enqueue(conn, "square", {"n": 1}, queue="elsewhere")
        unknown = await trioq.enqueue(conn, "nobody_knows", max_attempts=2)
        with pytest.raises(LookupError, match="task 'nobody_knows' is not in the registry"):
            await tt.drain(conn, tasks, advance=True)
        status = await trioq.job_status(conn, unknown.job_id)
        assert (status.state, status.attempt) == ("scheduled", 0)
        assert (await trioq.job_status(conn, other.job_id)).state == "available"
        assert (await tt.drain(conn, tasks, queues=["elsewhere"])).completed == 1


async def test_drain_stops_a_job_that_enqueues_itself_forever(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task
    async def forever(job: trioq.JobContext) -> None:
        await job.enqueue("forever")

    async with migrated(dsn) as conn:
        await trioq.enqueue(conn, "forever")
        with pytest.raises(tt.DrainLimitError, match="drain ran max_jobs=5 jobs and job 6"):
            await tt.drain(conn, tasks, max_jobs=5)
        (left,) = await tt.enqueued_jobs(conn)
        assert (left.id, left.state, left.attempt) == (6, "available", 0)  # released


async def test_drain_inside_the_tests_transaction_rolls_back_with_it(dsn: str) -> None:
    """Transaction-per-test: everything, job.transaction() included (a savepoint), goes."""
    tasks, _ = app()
    async with migrated(dsn) as conn:
        async with conn.transaction(force_rollback=True):
            await trioq.enqueue(conn, "signup", {"user": "grace"}, queue="mail")
            result = await tt.drain(conn, tasks)
            assert [r.outcome for r in result.runs] == ["completed", "completed"]
            cur = await conn.execute("SELECT note FROM ledger")
            assert await cur.fetchall() == [("grace",)]
        cur = await conn.execute("SELECT (SELECT count(*) FROM ledger), count(*) FROM trioq.jobs")
        assert await cur.fetchone() == (0, 0)


async def test_assertions_on_enqueued_jobs(dsn: str) -> None:
    tasks, _ = app()
    signup = tasks.get("signup")
    assert signup is not None
    async with migrated(dsn) as conn:
        await trioq.enqueue(conn, "signup", {"user": "ada"}, queue="mail")
        await trioq.enqueue(conn, "signup", {"user": "bob", "lang": "fr"}, queue="mail",
                            delay=60, priority=5)  # fmt: skip
        (bob,) = await tt.assert_enqueued(conn, signup, args={"user": "bob"})
        assert (bob.args, bob.state) == ({"user": "bob", "lang": "fr"}, "scheduled")
        assert len(await tt.assert_enqueued(conn, "signup", queue="mail", count=2)) == 2
        await tt.assert_enqueued(conn, "signup", priority=5, count=1)
        await tt.refute_enqueued(conn, "signup", args={"user": "carol"})
        await tt.refute_enqueued(conn, "square")
        with pytest.raises(AssertionError) as missing:
            await tt.assert_enqueued(conn, "signup", args={"user": "carol"})
        assert str(missing.value).startswith(
            'expected a job of task \'signup\' with args containing {"user": "carol"}, '
            'found 0; enqueued: id 1 signup on mail {"user": "ada"} (available); '
            'id 2 signup on mail {"lang": "fr", "user": "bob"} (scheduled)'
        )
        with pytest.raises(AssertionError, match="expected no job of task 'signup', found 2"):
            await tt.refute_enqueued(conn, "signup")
        with pytest.raises(AssertionError, match="expected 3 jobs of task 'signup', found 2"):
            await tt.assert_enqueued(conn, "signup", count=3)
        await tt.drain(conn, tasks)
        assert [j.args["user"] for j in await tt.enqueued_jobs(conn)] == ["bob"]
        done = await tt.enqueued_jobs(conn, "welcome", states=["done", "available"])
        assert [j.args for j in done] == []  # welcome is not kept: its row is gone
        cases: list[tuple[dict[str, Any], type[Exception]]] = [
            ({"args": {"x": "\0"}}, ValueError), ({"queue": "a b"}, ValueError),
            ({"priority": 500}, ValueError), ({"states": "available"}, TypeError),
        ]  # fmt: skip
        for bad, error in cases:
            with pytest.raises(error):
                await tt.enqueued_jobs(conn, **bad)


async def test_job_context_calls_a_handler_without_a_worker(dsn: str) -> None:
    tasks, _ = app()
    square, signup = tasks.get("square"), tasks.get("signup")
    assert square is not None and signup is not None
    ctx = tt.job_context(square, {"n": 3}, id=42, attempt=2)
    assert (ctx.id, ctx.attempt, ctx.queue, ctx.task, ctx.job.args) == (
        42,
        2,
        "default",
        "square",
        {"n": 3},
    )
    with pytest.raises(RuntimeError, match="this JobContext has no database: pass conn="):
        await square(ctx, n=3)  # it reads the job's status
    async with migrated(dsn) as conn:
        assert await tt.call(square, {"n": 3}, conn=conn) == 9
        ctx = tt.job_context(signup, {"user": "hedy"}, id=7, conn=conn)
        await signup(ctx, user="hedy")
        assert ctx.completed_in_transaction
        cur = await conn.execute("SELECT job_id, note FROM ledger")
        assert await cur.fetchall() == [(7, "hedy")]
        await tt.assert_enqueued(conn, "welcome", args={"user": "hedy"})
        welcome = tasks.get("welcome")
        assert welcome is not None
        await tt.call(welcome, {"user": "x"})  # sync, in a thread
    assert tt.job_context("t", (1, 2)).job.args == [1, 2]  # as a worker would decode it
    cases: list[tuple[dict[str, Any], type[Exception]]] = [
        ({"attempt": 0}, ValueError), ({"attempt": 26}, ValueError),
        ({"id": "1"}, TypeError), ({"queue": "a b"}, ValueError),
    ]  # fmt: skip
    for bad, error in cases:
        with pytest.raises(error):
            tt.job_context("t", **bad)
    with pytest.raises(ValueError, match="args must be JSON"):
        tt.job_context("t", {"x": object()})


async def test_the_clock_refuses_naive_times(dsn: str) -> None:
    async with migrated(dsn) as conn:
        with pytest.raises(ValueError, match="when must be an aware datetime"):
            await tt.set_clock(conn, dt.datetime(2030, 1, 1))
        with pytest.raises(ValueError, match="by must not be negative"):
            await tt.advance_clock(conn, -1)


def test_throwaway_postgres_on_a_server_of_ones_own(pg_admin_dsn: str) -> None:
    made: list[str] = []

    def setup(dsn: str) -> None:
        made.append(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE users (id int PRIMARY KEY)")

    with tt.ThrowawayPostgres(setup=setup, dsn=pg_admin_dsn) as pg:
        first, second = pg.database(), pg.database()
        assert first != second and len(made) == 1
        for dsn in (first, second):
            with psycopg.connect(dsn, autocommit=True) as conn:
                row = conn.execute("SELECT max(version) FROM trioq.migrations").fetchone()
                assert row == (latest_version(),)
                conn.execute("INSERT INTO users VALUES (1)")  # each its own copy
        pg.drop(first)
        with pytest.raises(ValueError, match="was not made by this ThrowawayPostgres"):
            pg.drop(first)
        names = {first, second, made[0]}
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        left = {row[0] for row in conn.execute("SELECT datname FROM pg_database")}
    assert not {psycopg.conninfo.conninfo_to_dict(n)["dbname"] for n in names} & left


def test_throwaway_postgres_starts_and_stops_its_own_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TRIOQ_TEST_DSN", raising=False)
    with tt.ThrowawayPostgres() as pg:
        dsn = pg.database()

        async def check() -> None:
            async with await trioq.connect(dsn, autocommit=True) as conn:
                await trioq.enqueue(conn, "t")
                await tt.assert_enqueued(conn, "t", count=1)

        trio.run(check)
        host = psycopg.conninfo.conninfo_to_dict(dsn)["host"]
    assert not os.path.exists(str(host))  # the scratch dir and its server are gone
    with pytest.raises(RuntimeError, match="not started"):
        pg.database()


@pytest.mark.parametrize("shared", [False, True])
async def test_complete_with_works_in_unit_contexts_and_in_drain(dsn: str, shared: bool) -> None:
    """``job.complete_with()`` under the test kit: with ``job_context(conn=...)`` the
    statement commits and the completion is pretended; under ``drain`` (its connection
    already in the test's transaction) the real completion runs in a savepoint. The kit has
    no shared lanes: ``shared=True`` takes the same path there."""
    tasks = trioq.Registry()

    @tasks.task
    async def credit(job: trioq.JobContext, note: str) -> None:
        await job.complete_with("INSERT INTO ledger VALUES (%s, %s)", (job.id, note), shared=shared)

    task = tasks.get("credit")
    assert task is not None
    async with migrated(dsn) as conn:
        ctx = tt.job_context(task, {"note": "unit"}, id=5, conn=conn)
        await credit(ctx, note="unit")
        assert ctx.completed_in_transaction
        async with conn.transaction(force_rollback=True):
            await trioq.enqueue(conn, "credit", {"note": "drained"})
            result = await tt.drain(conn, tasks)
            assert result.completed == 1
            cur = await conn.execute("SELECT note FROM ledger ORDER BY note")
            assert await cur.fetchall() == [("drained",), ("unit",)]
            cur = await conn.execute("SELECT count(*) FROM trioq.jobs")
            assert await cur.fetchone() == (0,)
