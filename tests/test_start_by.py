"""Deadlines to start (``start_by``), on real Postgres: the claims never start a job past its
deadline, the sweeper dead-letters it with the reason (and its dependants and batch follow),
a job that started is never judged by it again (retries, snoozes), a claim and the sweeper
racing for one job, and the deadline on every enqueue path. Time moves through ``trioq.now``
(no sleeping); the maintenance round is the sweeper's ``run_once()``."""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio
from clitool import trioq_cli
from helpers import rows, scalar, serving, wait_until

import trioq
from trioq import Failure, Lease, producer
from trioq._db.driver import START_BY_REASON
from trioq._job import START_BY_BEFORE_RUN_AT
from trioq._worker.services.sweeper import Sweeper

UTC = dt.UTC
T0 = dt.datetime(2030, 1, 1, tzinfo=UTC)
SEC = dt.timedelta(seconds=1)
LEASE = dt.timedelta(seconds=30)
Q = trioq.Queue()


@asynccontextmanager
async def database(dsn: str) -> AsyncIterator[tuple[Any, trioq.pg.Pool, Sweeper]]:
    """A migrated database at ``T0``, a connection, a one-connection pool, and a sweeper on
    it (the services' statements and the test's share the clock: `at`)."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        async with trioq.pg.Pool(dsn, max_size=1, connect_kwargs={"autocommit": True}) as pool:
            sweeper = Sweeper(pool, Q.driver, interval=60, reclaim_interval=60, grace=2,
                              on_returned=lambda: None)  # fmt: skip
            await at(conn, pool, T0)
            yield conn, pool, sweeper


async def at(conn: Any, pool: trioq.pg.Pool, when: dt.datetime) -> None:
    query = "SELECT set_config('trioq.now', %s, false)"
    await conn.execute(query, (when.isoformat(),))
    async with pool.connection() as service_conn:
        await service_conn.execute(query, (when.isoformat(),))


async def claim(conn: Any, queue: str = "default", limit: int = 10) -> list[trioq.Job]:
    return await Q.claim(conn, queue, owner="w", limit=limit, lease=LEASE)


async def expired(sweeper: Sweeper) -> frozenset[int]:
    return (await sweeper.run_once()).expired.dead


# -- the claim ----------------------------------------------------------------------------------


async def test_the_claim_starts_a_job_up_to_its_deadline_and_never_after(dsn: str) -> None:
    async with database(dsn) as (conn, pool, _):
        late = await trioq.enqueue(conn, "t", start_by=T0 + 10 * SEC)
        on_time = await trioq.enqueue(conn, "t", start_by=T0 + 20 * SEC)
        free = await trioq.enqueue(conn, "t")
        status = await trioq.job_status(conn, late.job_id)
        assert status.start_by == T0 + 10 * SEC and status.state == "available"
        await at(conn, pool, T0 + 10 * SEC + dt.timedelta(microseconds=1))
        got = await claim(conn)
        assert {j.id for j in got} == {on_time.job_id, free.job_id}
        assert (await trioq.job_status(conn, late.job_id)).state == "available"
        # the claim cleared the deadline it met: nothing after the start is judged by it
        assert (await trioq.job_status(conn, on_time.job_id)).start_by is None
        await at(conn, pool, T0 + 20 * SEC)  # exactly at the deadline: started in time
        edge = await trioq.enqueue(conn, "t", start_by=T0 + 20 * SEC)
        assert [j.id for j in await claim(conn)] == [edge.job_id]


async def test_the_limited_claim_skips_a_job_past_its_deadline(dsn: str) -> None:
    async with database(dsn) as (conn, pool, _):
        await Q.set_limits(conn, "q", global_concurrency=5, key_concurrency=1)
        late = await trioq.enqueue(conn, "t", queue="q", start_by=T0 + SEC,
                                   concurrency_key="k")  # fmt: skip
        other = await trioq.enqueue(conn, "t", queue="q", concurrency_key="k")
        plain = await trioq.enqueue(conn, "t", queue="q", start_by=T0 + SEC)
        await at(conn, pool, T0 + 2 * SEC)
        got = await Q.claim_limited(conn, "q", owner="w", limit=5, lease=LEASE)
        # the expired job of key k took no slot of k: the other one ran
        assert [j.id for j in got.jobs] == [other.job_id]
        assert {late.job_id, plain.job_id} == {
            r[0] for r in await rows(conn, "SELECT id FROM trioq.jobs WHERE state = 'available'")
        }
        await Q.set_limits(conn, "q", key_concurrency=None)  # the unkeyed branch too
        got = await Q.claim_limited(conn, "q", owner="w", limit=5, lease=LEASE)
        assert got.jobs == []


# -- the sweeper --------------------------------------------------------------------------------


async def test_the_sweeper_dead_letters_expired_jobs_with_the_reason(dsn: str) -> None:
    async with database(dsn) as (conn, pool, sweeper):
        available = await trioq.enqueue(conn, "t", {"a": 1}, start_by=T0 + 5 * SEC)
        scheduled = await trioq.enqueue(conn, "t", delay=3, start_by=dt.timedelta(seconds=5))
        later = await trioq.enqueue(conn, "t", start_by=T0 + 60 * SEC)
        assert await expired(sweeper) == frozenset()
        await at(conn, pool, T0 + 6 * SEC)
        assert await expired(sweeper) == {available.job_id, scheduled.job_id}
        status = await trioq.job_status(conn, scheduled.job_id)
        assert (status.state, status.reason, status.attempt) == ("dead", START_BY_REASON, 0)
        assert status.start_by == T0 + 5 * SEC
        assert status.last_error == (
            "start_by 2030-01-01T00:00:05.000000+00:00 passed before the job (scheduled) "
            "was started"
        )
        assert (await trioq.job_status(conn, available.job_id)).args == {"a": 1}
        assert (await trioq.job_status(conn, later.job_id)).state == "available"
        assert sweeper.dead == 2
        assert await expired(sweeper) == frozenset()  # once


async def test_the_sweeper_works_in_bounded_batches(dsn: str) -> None:
    async with database(dsn) as (conn, pool, _):
        await trioq.enqueue_bulk(conn, "t", [{}] * 5, start_by=T0 + SEC)
        await at(conn, pool, T0 + 2 * SEC)
        assert len((await Q.driver.expire_start_by(conn, limit=2)).dead) == 2
        assert len((await Q.driver.expire_start_by(conn, limit=2)).dead) == 2
        assert len((await Q.driver.expire_start_by(conn, limit=2)).dead) == 1
        assert await scalar(conn, "SELECT count(*) FROM trioq.dead_jobs") == 5


async def test_a_started_job_is_never_judged_by_its_deadline(dsn: str) -> None:
    """Retries, snoozes (the attempt refunded: attempt is 0 again) and lease expiries all
    move a started job's run_at past its deadline; none of them kills it."""
    async with database(dsn) as (conn, pool, sweeper):
        retried = await trioq.enqueue(conn, "t", start_by=T0 + 5 * SEC, max_attempts=3)
        snoozed = await trioq.enqueue(conn, "t", start_by=T0 + 5 * SEC)
        lost = await trioq.enqueue(conn, "t", start_by=T0 + 5 * SEC, max_attempts=3)
        jobs = {j.id: j for j in await claim(conn)}
        assert set(jobs) == {retried.job_id, snoozed.job_id, lost.job_id}
        await Q.fail_many(conn, owner="w", failures=[
            Failure(lease=Lease(retried.job_id, 1), error="boom", delay=60 * SEC)])  # fmt: skip
        await Q.release_many(conn, owner="w", leases=[Lease(snoozed.job_id, 1)],
                             delays=[60 * SEC])  # fmt: skip
        assert await scalar(conn, "SELECT attempt FROM trioq.jobs WHERE id = %s",
                            snoozed.job_id) == 0  # fmt: skip
        await at(conn, pool, T0 + 100 * SEC)  # the lease of `lost` expired too
        round_ = await sweeper.run_once()
        assert round_.expired.dead == frozenset()
        assert round_.swept.returned == {lost.job_id}
        assert await Q.promote_due(conn) == ["default"]
        got = {j.id: j.attempt for j in await claim(conn)}
        assert got == {retried.job_id: 2, snoozed.job_id: 1, lost.job_id: 2}


async def test_a_claim_holding_the_job_fences_the_sweeper_out(dsn: str) -> None:
    """The claim locks the row before the sweeper: skipped; once the claim committed the
    job is running and no longer matches. And the other way: the sweeper's lock first, the
    claim skips the row."""
    async with database(dsn) as (conn, pool, sweeper), \
            await trioq.connect(dsn) as worker:  # fmt: skip
        job = await trioq.enqueue(conn, "t", start_by=T0 + 5 * SEC)
        async with worker.transaction():
            await worker.execute("SELECT set_config('trioq.now', %s, true)",
                                 ((T0 + 4 * SEC).isoformat(),))  # fmt: skip
            assert [j.id for j in await claim(worker)] == [job.job_id]
            await at(conn, pool, T0 + 6 * SEC)
            with trio.fail_after(10):  # never waits for the claim's lock
                assert await expired(sweeper) == frozenset()  # locked by the claim: skipped
        assert await expired(sweeper) == frozenset()  # running now: not pending
        assert (await trioq.job_status(conn, job.job_id)).state == "running"

        other = await trioq.enqueue(conn, "t", run_at=T0, start_by=T0 + 7 * SEC)
        async with worker.transaction():
            await worker.execute("SELECT 1 FROM trioq.jobs WHERE id = %s FOR UPDATE",
                                 (other.job_id,))  # fmt: skip (the sweeper's lock)
            with trio.fail_after(10):
                assert await claim(conn) == []  # SKIP LOCKED
        await at(conn, pool, T0 + 8 * SEC)
        assert await expired(sweeper) == {other.job_id}


# -- dependants and batches ---------------------------------------------------------------------


async def test_a_waiting_job_past_its_deadline_dies_and_its_dependants_follow(dsn: str) -> None:
    async with database(dsn) as (conn, pool, sweeper):
        first = await trioq.enqueue(conn, "slow")
        (started,) = await claim(conn)  # runs longer than the deadline of the job after it
        waiting = await trioq.enqueue(conn, "t", after=[first.job_id], start_by=T0 + 5 * SEC)
        cancelled = await trioq.enqueue(conn, "t", after=[waiting.job_id])
        runs = await trioq.enqueue(conn, "t", after=[waiting.job_id],
                                   on_dependency_failure="run")  # fmt: skip
        batch = await trioq.Batch(
            jobs=[trioq.JobSpec(task="t", start_by=T0 + 5 * SEC)],
            callback=trioq.JobSpec(task="report"),
        ).enqueue(conn)
        assert (await trioq.job_status(conn, waiting.job_id)).state == "waiting"
        await at(conn, pool, T0 + 6 * SEC)
        assert await expired(sweeper) == {waiting.job_id, batch.job_ids[0]}
        assert (await trioq.job_status(conn, cancelled.job_id)).state == "cancelled"
        assert (await trioq.job_status(conn, cancelled.job_id)).last_error == (
            f"dependency {waiting.job_id} (task 't') is dead: {START_BY_REASON}: start_by "
            "2030-01-01T00:00:05.000000+00:00 passed before the job (waiting) was started"
        )
        assert (await trioq.job_status(conn, runs.job_id)).state == "available"
        status = await trioq.batch_status(conn, batch.batch_id)
        assert status is not None
        assert (status.failed, status.pending, status.callback_job_id is not None) == (1, 0, True)
        assert started.id == first.job_id


# -- the enqueue paths --------------------------------------------------------------------------


async def test_every_enqueue_path_stores_the_deadline(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task()
    async def noted(job: trioq.JobContext) -> None: ...

    async with database(dsn) as (conn, _pool, _):
        deadline = T0 + 60 * SEC
        window = trioq.Unique(key="w", period=3600)
        unnest = [trioq.JobSpec(task="t", start_by=deadline),  # unnest (a deadline)
                  trioq.JobSpec(task="t", args={"x": 1}, start_by=60 * SEC, delay=30)]
        alike = [trioq.JobSpec(task="t", start_by=deadline)] * 2  # one statement
        ids = [
            (await trioq.enqueue(conn, "t", start_by=deadline)).job_id,
            (await trioq.enqueue(conn, "t", start_by=60)).job_id,
            (await trioq.enqueue(conn, "t", dedup_key="k", start_by=60 * SEC)).job_id,
            (await trioq.enqueue(conn, "t", unique=window, start_by=deadline)).job_id,
            (await noted.enqueue(conn, start_by=deadline)).job_id,
            *(await trioq.enqueue_bulk(conn, "t", [{}, {}], start_by=deadline)),
            *(r.job_id for r in await trioq.enqueue_many(conn, unnest)),
            *(r.job_id for r in await trioq.enqueue_many(conn, alike)),
        ]  # fmt: skip
        stored = await rows(conn, "SELECT id, start_by FROM trioq.jobs ORDER BY id")
        assert [r[0] for r in stored] == ids
        assert {r[1] for r in stored} == {deadline}
        no_deadline = await trioq.enqueue(conn, "t")
        assert (await trioq.job_status(conn, no_deadline.job_id)).start_by is None


async def test_the_database_clock_makes_a_relative_deadline(dsn: str) -> None:
    async with database(dsn) as (conn, pool, _):
        await at(conn, pool, T0 + 1000 * SEC)
        job = await trioq.enqueue(conn, "t", start_by=dt.timedelta(minutes=1))
        assert (await trioq.job_status(conn, job.job_id)).start_by == T0 + 1060 * SEC


_KINDS = "start_by must be a datetime, a timedelta or seconds, got"
BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"start_by": "soon"}, TypeError, f"{_KINDS} 'soon'"),
    ({"start_by": True}, TypeError, f"{_KINDS} True"),
    ({"start_by": "\x00"}, TypeError, f"{_KINDS} '\\x00'"),
    ({"start_by": "\udcff"}, TypeError, f"{_KINDS} '\\udcff'"),
    ({"start_by": dt.datetime(2030, 1, 1)}, ValueError,
     "start_by 2030-01-01T00:00:00 is a naive datetime: give it a timezone "
     "(e.g. datetime.now(timezone.utc))"),
    ({"start_by": -1}, ValueError, "start_by must not be negative, got -1 s"),
    ({"start_by": float("nan")}, ValueError,
     "start_by must be a finite number of seconds, got nan"),
    ({"start_by": 10**12}, ValueError, "start_by must be at most 36500 days, got 1e+12 s"),
    ({"start_by": dt.datetime(9999, 12, 31, 23, tzinfo=dt.timezone(-dt.timedelta(hours=5)))},
     ValueError, "start_by 9999-12-31T23:00:00-05:00 is outside the years 1 to 9999 in UTC "
     "(the times the schema holds)"),
    ({"start_by": T0, "run_at": T0 + SEC}, ValueError, START_BY_BEFORE_RUN_AT),
    ({"start_by": 5, "delay": 6}, ValueError, START_BY_BEFORE_RUN_AT),
]  # fmt: skip


@pytest.mark.parametrize(("options", "kind", "words"), BAD)
async def test_bad_deadlines_are_refused_with_the_same_words_on_every_path(
    dsn: str, options: dict[str, Any], kind: type[Exception], words: str
) -> None:
    tasks = trioq.Registry()

    @tasks.task()
    async def noted(job: trioq.JobContext) -> None: ...

    async with database(dsn) as (conn, _pool, _):
        calls: list[Callable[[], Awaitable[Any]]] = [
            functools.partial(trioq.enqueue, conn, "t", **options),
            functools.partial(trioq.enqueue_bulk, conn, "t", [{}], **options),
            functools.partial(noted.enqueue, conn, **options),
            lambda: trioq.enqueue_many(conn, [trioq.JobSpec(task="t", **options)]),
        ]
        for call in calls:
            with pytest.raises(kind) as caught:
                await call()
            assert str(caught.value) == words
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0


async def test_a_deadline_before_the_run_time_only_the_database_can_see_is_refused(
    dsn: str,
) -> None:
    """A time against an offset from now: the insert compares them on the database's
    clock, and the words are the same (on every path, in a transaction too)."""
    async with database(dsn) as (conn, _pool, _):
        mixed: list[dict[str, Any]] = [{"run_at": T0 + 60 * SEC, "start_by": 30 * SEC},
                                       {"delay": 60, "start_by": T0 + 30 * SEC}]  # fmt: skip
        for options in mixed:
            calls = [
                trioq.enqueue(conn, "t", **options),
                trioq.enqueue(conn, "t", dedup_key="d", **options),
                trioq.enqueue(conn, "t", unique=trioq.Unique(key="u", period=60), **options),
                trioq.enqueue_bulk(conn, "t", [{}, {}], **options),
                trioq.enqueue_many(conn, [trioq.JobSpec(task="t", **options),
                                          trioq.JobSpec(task="t", args=1, **options)]),
                trioq.enqueue(conn, "t", after=[], **options),
            ]  # fmt: skip
            for call in calls:
                with pytest.raises(ValueError) as caught:
                    await call
                assert str(caught.value) == START_BY_BEFORE_RUN_AT
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0
        # and the same deadlines later than the run time go in
        await trioq.enqueue(conn, "t", run_at=T0 + 60 * SEC, start_by=90 * SEC)
        await trioq.enqueue(conn, "t", delay=60, start_by=T0 + 90 * SEC)


async def test_the_schema_refuses_a_deadline_written_by_hand_before_the_run_time(
    dsn: str,
) -> None:
    async with database(dsn) as (conn, _pool, _):
        job = await trioq.enqueue(conn, "t", run_at=T0)
        with pytest.raises(psycopg.errors.CheckViolation, match="jobs_start_by_after_run_at"):
            await conn.execute("UPDATE trioq.jobs SET start_by = run_at - interval '1 s'")
        with pytest.raises(psycopg.errors.CheckViolation, match="jobs_start_by_check"):
            await conn.execute("UPDATE trioq.jobs SET start_by = 'infinity'")
        assert (await trioq.job_status(conn, job.job_id)).start_by is None


async def test_finding_expired_jobs_reads_the_partial_index(dsn: str) -> None:
    async with database(dsn) as (conn, _pool, _):
        await trioq.enqueue_bulk(conn, "t", [{}] * 20_000)
        await trioq.enqueue_bulk(conn, "t", [{}] * 50, start_by=T0 + SEC)
        await conn.execute("ANALYZE trioq.jobs")
        query = Q.sql.expire_start_by.as_string(conn).replace(
            "%(limit)s", "1000").replace("%(reason)s", "'r'")  # fmt: skip
        async with conn.transaction(force_rollback=True):
            plan = "\n".join(r[0] for r in await rows(conn, f"EXPLAIN {query}"))
        assert "jobs_start_by_idx" in plan, plan
        assert "Seq Scan on jobs" not in plan, plan


# -- the command line ---------------------------------------------------------------------------


def test_the_command_line_takes_a_deadline_and_shows_it(dsn: str) -> None:
    def cli(*args: str) -> Any:
        return trioq_cli(*args, "--dsn", dsn)

    assert cli("migrate").returncode == 0
    at_time = cli("enqueue", "t", "--start-by", "2099-01-01T09:00+00:00", "--json")
    assert at_time.returncode == 0, at_time.stderr
    in_a_while = cli("enqueue", "t", "--start-by", "30m", "--delay", "60", "--json")
    assert in_a_while.returncode == 0, in_a_while.stderr
    shown = cli("jobs", "show", str(json.loads(at_time.stdout)["job_id"]))
    assert "  start by:  2099-01-01 09:00:00+00:00" in shown.stdout, shown.stdout
    shown = cli("jobs", "show", str(json.loads(in_a_while.stdout)["job_id"]), "--json")
    assert json.loads(shown.stdout)["start_by"] is not None
    for value, words in [
        ("2099-01-01T09:00", "start_by 2099-01-01T09:00:00 is a naive datetime"),
        ("soon", "--start-by 'soon': use a duration from now (90s, 30m, 7d) or a time"),
        ("", "--start-by '': use a duration from now"),
        ("-5", "--start-by '-5': use a duration from now"),
        ("\udcff", "--start-by '\\udcff': use a duration from now"),
        ("9" * 5000, "--start-by '99999"),
        ("200y", "--start-by '200y': use a duration"),
        ("99999999999", "must be at least 0 and less than 100 years"),
        ("2001-01-01T00:00+00:00", START_BY_BEFORE_RUN_AT),
    ]:
        out = trioq_cli("enqueue", "t", "--start-by", value, "--dsn", dsn,
                        env={"PYTHONUTF8": "1"})  # fmt: skip
        assert out.returncode in (1, 2), (value, out.stdout)
        assert words in out.stderr and "Traceback" not in out.stderr, (value, out.stderr)
        assert len(out.stderr) < 300, out.stderr


# -- the SQL API and the migration --------------------------------------------------------------


async def test_the_sql_api_takes_a_deadline_and_version_1_calls_still_work(dsn: str) -> None:
    async with database(dsn) as (conn, pool, sweeper):
        old_style = await scalar(conn, "SELECT trioq.enqueue('t', '{}', 'default', 0, NULL, NULL,"
                                 " NULL, NULL, NULL, true)")  # fmt: skip (positional, version 1)
        named = await scalar(conn, "SELECT trioq.enqueue('t', start_by => %s)", T0 + 5 * SEC)
        assert await scalar(conn, "SELECT trioq.api_version()") == 1
        assert (await trioq.job_status(conn, old_style)).start_by is None
        assert (await trioq.job_status(conn, named)).start_by == T0 + 5 * SEC
        await at(conn, pool, T0 + 6 * SEC)
        assert await expired(sweeper) == {named}


async def test_the_migration_keeps_the_grants_of_the_sql_enqueue(dsn: str) -> None:
    """enqueue() is dropped and created again with start_by (21), debounce (22) and
    sequence_key (27): a producer role that was granted it keeps it, and PUBLIC, revoked,
    stays revoked."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn, target=20)
        old = ("trioq.enqueue(text, jsonb, text, numeric, timestamptz, interval, numeric, text,"
               " text, boolean)")  # fmt: skip
        await conn.execute("DROP ROLE IF EXISTS start_by_producer")
        await conn.execute("CREATE ROLE start_by_producer")
        try:
            await conn.execute(f"REVOKE ALL ON FUNCTION {old} FROM PUBLIC")
            await conn.execute(f"GRANT EXECUTE ON FUNCTION {old} TO start_by_producer")
            for target in (21, 22, 27):  # each drops and creates it again (start_by, debounce, seq)
                await trioq.migrate(conn, target=target)
                new = await scalar(conn, "SELECT oid::regprocedure::text FROM pg_proc"
                                         " WHERE proname = 'enqueue'"
                                         " AND pronamespace = 'trioq'::regnamespace")  # fmt: skip
                assert new.count(",") == {21: 10, 22: 12, 27: 13}[target], new
                query = "SELECT has_function_privilege(%s, %s, 'EXECUTE')"
                assert await scalar(conn, query, "start_by_producer", new) is True
                acl = await scalar(
                    conn, "SELECT proacl::text FROM pg_proc WHERE oid = %s::regprocedure", new
                )
                assert not acl.startswith("{=X") and ",=X" not in acl, acl  # PUBLIC: none
        finally:
            await conn.execute("DROP OWNED BY start_by_producer")
            await conn.execute("DROP ROLE start_by_producer")


# -- a real worker ------------------------------------------------------------------------------


async def test_a_serving_worker_never_runs_a_late_job_and_reports_its_death(dsn: str) -> None:
    """Across the runtime: a job held back (its queue paused) past its deadline is never run
    once the queue resumes; the worker's sweeper dead-letters it, and the death is an event
    with the reason, after the row moved."""
    tasks = trioq.Registry()
    ran: list[int] = []
    events: list[tuple[str, int, str | None, str]] = []

    @tasks.task(queue="q")
    async def t(job: trioq.JobContext) -> None:
        ran.append(job.id)

    @tasks.on("dead")
    async def record(event: trioq.JobEvent) -> None:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            status = await trioq.job_status(conn, event.job_id)
        events.append((event.kind, event.job_id, event.reason, status.state))

    async with serving(dsn, tasks) as (conn, _runtime):
        await Q.pause(conn, "q")
        late = await trioq.enqueue(conn, "t", queue="q", start_by=0.2)
        on_time = await trioq.enqueue(conn, "t", queue="q", start_by=3600)

        async def dead() -> bool:
            return (await trioq.job_status(conn, late.job_id)).state == "dead"

        await wait_until(dead)
        await Q.resume(conn, "q")

        async def done() -> bool:
            return bool(ran) and bool(events)

        await wait_until(done)
        assert ran == [on_time.job_id]
        assert events == [("dead", late.job_id, START_BY_REASON, "dead")]


# -- producers, and rows written by hand --------------------------------------------------------


def test_the_producers_take_a_deadline_with_the_same_words(dsn: str) -> None:
    """`trioq.producer` runs `Queue`'s own coroutines: the parameter and its refusals come
    with them (a sync psycopg connection here)."""
    trio.run(_migrate, dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        job = producer.enqueue(conn, "t", start_by=dt.timedelta(minutes=5))
        (many,) = producer.enqueue_many(conn, [trioq.JobSpec(task="t", start_by=300)])
        stored = conn.execute("SELECT start_by - now() FROM trioq.jobs WHERE id = ANY(%s)",
                              ([job.job_id, many.job_id],)).fetchall()  # fmt: skip
        assert all(dt.timedelta(minutes=4) < r[0] <= dt.timedelta(minutes=5) for r in stored)
        bad: list[dict[str, Any]] = [{"start_by": T0, "run_at": T0 + SEC},
                                     {"start_by": dt.datetime(2001, 1, 1, tzinfo=UTC)}]
        for options in bad:
            with pytest.raises(ValueError) as caught:
                producer.enqueue(conn, "t", **options)
            assert str(caught.value) == START_BY_BEFORE_RUN_AT


async def _migrate(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)


async def test_deadlines_out_of_range_written_by_hand_are_survived(dsn: str) -> None:
    """With the range check dropped by hand: 'infinity' is never expired, '-infinity' is
    expired and its dead row says so; the readers and the claim survive both."""
    async with database(dsn) as (conn, _pool, sweeper):
        await conn.execute("ALTER TABLE trioq.jobs DROP CONSTRAINT jobs_start_by_check,"
                           " DROP CONSTRAINT jobs_start_by_after_run_at")  # fmt: skip
        never = await trioq.enqueue(conn, "t")
        gone = await trioq.enqueue(conn, "t")
        await conn.execute("UPDATE trioq.jobs SET start_by = 'infinity' WHERE id = %s",
                           (never.job_id,))  # fmt: skip
        await conn.execute("UPDATE trioq.jobs SET start_by = '-infinity' WHERE id = %s",
                           (gone.job_id,))  # fmt: skip
        for job_id in (never.job_id, gone.job_id):
            assert (await trioq.job_status(conn, job_id)).state == "available"
        assert await expired(sweeper) == {gone.job_id}
        status = await trioq.job_status(conn, gone.job_id)
        assert status.state == "dead" and status.reason == START_BY_REASON
        assert status.last_error == (
            "start_by -infinity passed before the job (available) was started"
        )
        assert [j.id for j in await claim(conn)] == [never.job_id]
