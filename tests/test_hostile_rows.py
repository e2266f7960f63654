"""Rows written by hand (issue #22, "one row stops its queue"): the schema refuses what trioq
cannot serve (migration 12, which moves such rows already there to dead_jobs), and what gets
in anyway (a check dropped by hand) stops neither a queue nor a reader; waiting rows that can
never be freed are found and dead-lettered (the stranded sweep). docs/bad-input.md, "Rows
written by hand", is the table of these cases."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import logging
from typing import Any

import psycopg
import pytest
import trio
from asgi import call
from clitool import trioq_cli
from helpers import Counter, migrated, rows, scalar, serving, wait_until
from hypothesis import given, settings
from hypothesis import strategies as st

import trioq
import trioq.web
from trioq._db.statements import statements
from trioq._pg.pool import Pool
from trioq._pg.times import EARLIEST, LATEST
from trioq._worker.services.stranded import Stranded, cycles

UTC = dt.UTC
LEASE = "2030-01-01 00:00:00+00"

#: (the check that refuses it, what its dead row's last_error names, its columns): one
#: hand-written jobs row of each kind trioq cannot serve.
BAD_JOBS: list[tuple[str, str, dict[str, Any]]] = [
    ("jobs_run_at_check", "run_at -infinity", {"run_at": "-infinity"}),
    ("jobs_run_at_check", "run_at infinity", {"run_at": "infinity", "state": "scheduled"}),
    ("jobs_run_at_check", "run_at 20000-01-01", {"run_at": "20000-01-01 00:00:00+00"}),
    ("jobs_run_at_check", "BC", {"run_at": "0044-03-15 00:00:00+00 BC"}),
    ("jobs_enqueued_at_check", "enqueued_at infinity", {"enqueued_at": "infinity"}),
    ("jobs_lease_expires_at_check", "lease_expires_at infinity",
     {"state": "running", "attempt": 1, "lease_owner": "w", "lease_expires_at": "infinity"}),
    ("jobs_finished_at_check", "finished_at infinity",
     {"state": "cancelled", "finished_at": "infinity"}),
    ("jobs_unknown_since_check", "unknown_since -infinity", {"unknown_since": "-infinity"}),
    ("jobs_attempts_left_check", "attempt 3 of max_attempts 3 while available",
     {"attempt": 3, "max_attempts": 3}),
    ("jobs_attempts_left_check", "attempt 4 of max_attempts 3 while running",
     {"state": "running", "attempt": 4, "max_attempts": 3, "lease_owner": "w",
      "lease_expires_at": LEASE}),
    ("jobs_dependencies_check", "dependencies_left NULL",
     {"state": "waiting", "dependencies_left": None, "dependency_policy": "run"}),
    ("jobs_dependencies_check", "dependencies_left -1",
     {"state": "waiting", "dependencies_left": -1, "dependency_policy": "run"}),
    ("jobs_dependencies_check", "dependencies_left 0",
     {"state": "waiting", "dependencies_left": 0, "dependency_policy": "cancel"}),
    ("jobs_dependencies_check", "dependency_policy NULL",
     {"state": "waiting", "dependencies_left": 1, "dependency_policy": None}),
]  # fmt: skip

#: Rows at the very ends of what the checks allow: each is servable, and let in.
EDGE_JOBS: list[dict[str, Any]] = [
    {"run_at": "0001-01-01 00:00:00+00"},
    {"run_at": "9999-12-31 23:59:59.999999+00", "state": "scheduled"},
    {"state": "running", "attempt": 3, "max_attempts": 3, "lease_owner": "w",
     "lease_expires_at": LEASE},
    {"state": "done", "attempt": 3, "max_attempts": 3, "finished_at": "2020-01-01 00:00:00+00"},
    {"state": "waiting", "dependencies_left": 1, "dependency_policy": "run"},
]  # fmt: skip

BAD_DEAD: list[tuple[str, dict[str, Any]]] = [
    ("dead_jobs_enqueued_at_check", {"enqueued_at": "infinity"}),
    ("dead_jobs_died_at_check", {"died_at": "-infinity"}),
]

#: The checks of migration 12, which a hostile operator drops to let such rows in anyway.
CHECKS = sorted({check for check, _, _ in BAD_JOBS})
QUEUES = {"q": trioq.QueueConfig(concurrency=4)}


async def row(conn: Any, query: str, *params: Any) -> tuple[Any, ...]:
    [found] = await rows(conn, query, *params)
    return found


def pool_of(dsn: str) -> Pool:
    return Pool(dsn, max_size=2, connect_kwargs={"autocommit": True})


async def insert_job(conn: Any, columns: dict[str, Any], *, queue: str = "q") -> int:
    names = ["queue", "task", *columns]
    query = psycopg.sql.SQL("INSERT INTO trioq.jobs ({}) VALUES ({}) RETURNING id").format(
        psycopg.sql.SQL(", ").join(map(psycopg.sql.Identifier, names)),
        psycopg.sql.SQL(", ").join(psycopg.sql.Placeholder() * len(names)),
    )
    return int(await scalar(conn, query, queue, "t", *columns.values()))


async def insert_dead(conn: Any, job_id: int, columns: dict[str, Any]) -> None:
    values = {"id": job_id, "queue": "q", "task": "t", "args": "{}", "priority": 0,
              "attempt": 1, "max_attempts": 1, "reason": "boom", "enqueued_at": "now",
              **columns}  # fmt: skip
    query = psycopg.sql.SQL("INSERT INTO trioq.dead_jobs ({}) VALUES ({})").format(
        psycopg.sql.SQL(", ").join(map(psycopg.sql.Identifier, values)),
        psycopg.sql.SQL(", ").join(psycopg.sql.Placeholder() * len(values)),
    )
    await conn.execute(query, tuple(values.values()))


async def drop_checks(conn: Any) -> None:
    """What a hostile operator does: drop migration 12's checks on jobs."""
    for check in CHECKS:
        await conn.execute(psycopg.sql.SQL("ALTER TABLE trioq.jobs DROP CONSTRAINT {}").format(
            psycopg.sql.Identifier(check)))  # fmt: skip


# -- the schema refuses what trioq cannot serve ---------------------------------------------------


@pytest.mark.parametrize(("check", "columns"), [(c, v) for c, _, v in BAD_JOBS],
                         ids=[w for _, w, _ in BAD_JOBS])  # fmt: skip
async def test_the_schema_refuses_a_jobs_row_trioq_cannot_serve(
    dsn: str, check: str, columns: dict[str, Any]
) -> None:
    async with migrated(dsn) as conn:
        with pytest.raises(psycopg.errors.CheckViolation, match=check):
            await insert_job(conn, columns)


@pytest.mark.parametrize(("check", "columns"), BAD_DEAD, ids=[c for c, _ in BAD_DEAD])
async def test_the_schema_refuses_a_dead_row_readers_cannot_read(
    dsn: str, check: str, columns: dict[str, Any]
) -> None:
    async with migrated(dsn) as conn:
        with pytest.raises(psycopg.errors.CheckViolation, match=check):
            await insert_dead(conn, 1, columns)


async def test_the_schema_lets_in_what_is_at_the_ends_of_the_range(dsn: str) -> None:
    async with migrated(dsn) as conn:
        for columns in EDGE_JOBS:
            await insert_job(conn, columns)
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == len(EDGE_JOBS)


def test_enqueue_refuses_a_run_at_outside_the_years_python_holds_in_utc() -> None:
    west = dt.timezone(dt.timedelta(hours=-5))
    with pytest.raises(ValueError, match="outside the years 1 to 9999 in UTC"):
        trioq.JobSpec(task="t", run_at=dt.datetime(9999, 12, 31, 23, tzinfo=west))
    assert trioq.JobSpec(task="t", run_at=dt.datetime(9999, 12, 31, 23, tzinfo=UTC)).run_at


# -- migration 12 moves what it refuses to dead_jobs ---------------------------------------------


async def test_migration_12_moves_the_rows_it_refuses_to_dead_jobs(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn, target=11)
        bad = {await insert_job(conn, columns): why for _, why, columns in BAD_JOBS}
        good = [await insert_job(conn, columns) for columns in EDGE_JOBS]
        # A job waiting for a refused one (a dependency that dies: its policy cancels it).
        [waits_for] = [i for i, why in bad.items() if why == "dependencies_left 0"]
        await conn.execute("UPDATE trioq.jobs SET has_dependants = true WHERE id = %s",
                           (waits_for,))  # fmt: skip
        dependant = await insert_job(
            conn, {"state": "waiting", "dependencies_left": 1, "dependency_policy": "cancel"}
        )
        await conn.execute("INSERT INTO trioq.job_dependencies VALUES (%s, %s)",
                           (dependant, waits_for))  # fmt: skip
        await insert_dead(conn, 10**9, {"enqueued_at": "-infinity", "died_at": "infinity"})

        await trioq.migrate(conn)

        dead = {r[0]: r[1:] for r in await rows(
            conn, "SELECT id, reason, last_error FROM trioq.dead_jobs WHERE id = ANY(%s)",
            list(bad),
        )}  # fmt: skip
        assert set(dead) == set(bad)
        for job_id, why in bad.items():
            reason, error = dead[job_id]
            assert reason == "refused by the schema" and why in error, (why, error)
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs WHERE id = ANY(%s)",
                            good) == len(good)  # fmt: skip
        state, error = await row(conn, "SELECT state, last_error FROM trioq.jobs WHERE id = %s",
                                 dependant)  # fmt: skip
        assert state == "cancelled" and f"dependency {waits_for}" in error and "is dead" in error
        assert not await rows(conn, "SELECT 1 FROM trioq.job_dependencies WHERE job_id = ANY(%s)",
                              list(bad))  # fmt: skip
        reason, enqueued, died = await row(
            conn, "SELECT reason, enqueued_at, died_at FROM trioq.dead_jobs WHERE id = 1e9")
        assert "enqueued_at was -infinity" in reason and "died_at was infinity" in reason
        assert enqueued.year == died.year == dt.datetime.now(UTC).year
        # The checks hold from now on.
        for check, _, columns in BAD_JOBS:
            with pytest.raises(psycopg.errors.CheckViolation, match=check):
                await insert_job(conn, columns)


# -- what gets in anyway stops neither a queue nor a reader ------------------------------------


async def test_a_row_that_gets_in_anyway_does_not_stop_its_queue(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Claimed, run and scheduled past, with no service's round failing on it (the scheduler
    reads the next due time of a scheduled 'infinity')."""
    ran = Counter()
    registry = trioq.Registry()

    @registry.task(queue="q", name="t")
    async def t(job: trioq.JobContext) -> None:
        ran.hit((job.id, job.job.run_at, job.enqueued_at))

    async with migrated(dsn) as conn:
        await drop_checks(conn)
        past = await insert_job(conn, {"run_at": "-infinity"})
        future = await insert_job(conn, {"enqueued_at": "infinity"})
        never = await insert_job(conn, {"run_at": "infinity", "state": "scheduled"})
        spent = await insert_job(conn, {"attempt": 5, "max_attempts": 3})
        due = await insert_job(conn, {"state": "scheduled", "run_at": "2000-01-01 00:00:00+00"})
        ordinary = [(await trioq.enqueue(conn, "t", queue="q")).job_id for _ in range(20)]
    async with serving(dsn, registry, queues=QUEUES) as (conn, _runtime):
        await ran.wait_for(23)
        busy = "SELECT count(*) = 0 FROM trioq.jobs WHERE state IN ('available', 'running')"
        await wait_until(lambda: scalar(conn, busy))
        seen = {job_id: (run_at, enqueued_at) for job_id, run_at, enqueued_at in ran.calls}
        assert set(seen) == {past, future, due, *ordinary}  # the spent one never ran
        assert seen[past][0] == dt.datetime(1, 1, 1, 0, 0, 1, tzinfo=UTC)
        assert seen[future][1] == dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
        reason, error = await row(conn, "SELECT reason, last_error FROM trioq.dead_jobs"
                                        " WHERE id = %s", spent)  # fmt: skip
        assert reason == "attempts exhausted" and "the handler did not run" in error
        assert await scalar(conn, "SELECT state FROM trioq.jobs WHERE id = %s", never) == (
            "scheduled"
        )
        # What the scheduler sleeps for: a day, not an 'infinity' psycopg reads as 0 (the
        # scheduler would spin) or that Postgres before 17 cannot subtract.
        assert await trioq.Queue().next_due(conn) == dt.timedelta(days=1)
    failed = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [m for m in failed if "(attempts exhausted)" not in m] == []


async def test_every_reader_survives_a_row_that_gets_in_anyway(dsn: str) -> None:
    async with migrated(dsn) as conn:
        await drop_checks(conn)
        await conn.execute("ALTER TABLE trioq.dead_jobs DROP CONSTRAINT dead_jobs_died_at_check")
        by_state = {
            "available": await insert_job(conn, {"run_at": "-infinity"}),
            "scheduled": await insert_job(conn, {"run_at": "infinity", "state": "scheduled"}),
            "running": await insert_job(conn, {"state": "running", "attempt": 1,
                                               "lease_owner": "w", "lease_expires_at": "infinity",
                                               "enqueued_at": "20000-01-01 00:00:00+00"}),
            "cancelled": await insert_job(conn, {"state": "cancelled", "finished_at": "infinity"}),
            "done": await insert_job(conn, {"state": "done", "finished_at": "-infinity",
                                            "result": "[1]"}),
        }  # fmt: skip
        await insert_dead(conn, 10**9, {"died_at": "infinity"})
        by_state["dead"] = 10**9
        queue = trioq.Queue()
        for state, job_id in by_state.items():
            status = await queue.job_status(conn, job_id)
            assert status.state == state
        [dead] = await queue.dead_list(conn)
        assert dead.died_at == LATEST
        assert (await queue.job_status(conn, by_state["done"])).finished_at == EARLIEST

    env = {"TRIOQ_DSN": dsn}
    for state, job_id in by_state.items():
        listed = trioq_cli("jobs", "list", "--state", state, env=env)
        assert listed.returncode == 0 and str(job_id) in listed.stdout, listed.stderr
        shown = trioq_cli("jobs", "show", str(job_id), env=env)
        assert shown.returncode == 0 and state in shown.stdout, shown.stderr
        as_json = trioq_cli("jobs", "--json", "show", str(job_id), env=env)
        assert as_json.returncode == 0 and json.loads(as_json.stdout)["state"] == state
    for args in (["dead", "list"], ["dead", "--json", "list"], ["status"], ["status", "--json"]):
        done = trioq_cli(*args, env=env)
        assert done.returncode == 0, (args, done.stderr)

    app = trioq.web.app(dsn)
    try:
        for path in ["/", "/live/overview", "/api/history", "/cron",
                     *(f"/jobs?state={s}" for s in by_state),
                     *(f"/jobs/{i}" for i in by_state.values())]:  # fmt: skip
            reply = await call(app, "GET", path)
            assert reply.status == 200, (path, reply.text[-500:])
    finally:
        await app.aclose()


async def test_args_that_are_not_an_object_and_do_not_fit_the_handler_die_at_once(
    dsn: str,
) -> None:
    """Args that are not a JSON object are the handler's one positional argument
    (docs/getting-started.md); a handler that cannot take one is never going to: dead at
    once, not retried 25 times with a TypeError. Object args that do not fit are retried
    (a deploy may bring the parameter)."""
    ran = Counter()
    registry = trioq.Registry()

    @registry.task(queue="q")
    async def keywords(job: trioq.JobContext, *, user_id: int) -> None:
        ran.hit(user_id)

    @registry.task(queue="q")
    async def positional(job: trioq.JobContext, items: list[int]) -> None:
        ran.hit(items)

    async with serving(dsn, registry, queues=QUEUES) as (conn, _runtime):
        misfit = (await trioq.enqueue(conn, "keywords", [1, 2], queue="q")).job_id
        fits = (await trioq.enqueue(conn, "positional", [1, 2], queue="q")).job_id
        retried = (await trioq.enqueue(conn, "keywords", {"user": 7}, queue="q")).job_id
        await ran.wait_for(1)
        assert ran.calls == [[1, 2]]
        await wait_until(lambda: scalar(conn, "SELECT count(*) = 1 FROM trioq.dead_jobs"))
        query = "SELECT reason, attempt, last_error FROM trioq.dead_jobs WHERE id = %s"
        reason, attempt, error = await row(conn, query, misfit)
        assert (reason, attempt) == ("args do not fit the handler", 1)
        assert "a JSON array cannot be its one positional argument" in error and "user_id" in error
        await wait_until(lambda: scalar(conn, "SELECT state = 'scheduled' FROM trioq.jobs"
                                              " WHERE id = %s", retried))  # fmt: skip
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs WHERE id = %s", fits) == 0


# -- waiting rows that can never be freed -------------------------------------------------------


async def test_waiting_jobs_that_can_never_be_freed_go_to_dead_jobs(dsn: str) -> None:
    async with migrated(dsn) as conn, pool_of(dsn) as pool:
        live = (await trioq.enqueue(conn, "t")).job_id
        kept = await insert_job(conn, {"state": "done", "finished_at": "2020-01-01 00:00+00",
                                       "has_dependants": True})  # fmt: skip
        fine = (await trioq.enqueue(conn, "t", after=[live])).job_id

        async def waiting(left: int, *on: int, policy: str = "run") -> int:
            job_id = await insert_job(conn, {"state": "waiting", "dependencies_left": left,
                                             "dependency_policy": policy})  # fmt: skip
            for dependency in on:
                await conn.execute("INSERT INTO trioq.job_dependencies VALUES (%s, %s)",
                                   (job_id, dependency))  # fmt: skip
            return job_id

        nowhere = await waiting(1, 10**12)
        too_many = await waiting(2, live)
        ended = await waiting(1, kept)
        c1 = await waiting(1)
        c2 = await waiting(1, c1)
        c3 = await waiting(1, c2)
        await conn.execute("INSERT INTO trioq.job_dependencies VALUES (%s, %s)", (c1, c3))
        await conn.execute("UPDATE trioq.jobs SET has_dependants = true WHERE id = ANY(%s)",
                           ([c1, c2, c3],))  # fmt: skip
        runs_anyway = await waiting(1, c1, policy="run")
        cancelled = await waiting(1, c2, policy="cancel")

        sweep = Stranded(pool, statements("trioq"), interval=60)
        done = await sweep.run_once()

        stranded = {nowhere, too_many, ended, c1, c2, c3}
        assert set(done.moved) == stranded
        assert "job 1000000000000, which does not exist" in done.moved[nowhere]
        assert "waits for 2 dependencies but only 1 are pending" in done.moved[too_many]
        assert f"job {kept}, which has ended (done)" in done.moved[ended]
        assert f"a cycle of dependencies among jobs {c1}, {c2}, {c3}" in done.moved[c1]
        dead = dict(await rows(conn, "SELECT id, reason FROM trioq.dead_jobs"))
        assert dead == dict.fromkeys(stranded, "stranded")
        states = dict(await rows(conn, "SELECT id, state FROM trioq.jobs"))
        assert states == {live: "available", kept: "done", fine: "waiting",
                          runs_anyway: "available", cancelled: "cancelled"}  # fmt: skip
        assert (await sweep.run_once()).moved == {}

        # One sweep at a time: a round that finds the turn taken does nothing.
        await waiting(1, 10**12)
        async with await trioq.connect(dsn) as other:
            await other.execute("SELECT pg_advisory_xact_lock(hashtext('trioq.stranded:trioq'), 0)")
            assert await sweep.run_once() == type(done)(turn=False)
        assert len((await sweep.run_once()).moved) == 1


async def test_a_job_freed_while_the_sweep_looks_is_not_moved(dsn: str) -> None:
    """The sweep checks again under the jobs' locks: one whose dependency ends meanwhile
    (here: its count is repaired by hand between the find and the lock) stays."""
    async with migrated(dsn) as conn, pool_of(dsn) as pool:
        live = (await trioq.enqueue(conn, "t")).job_id
        job_id = await insert_job(conn, {"state": "waiting", "dependencies_left": 2,
                                         "dependency_policy": "run"})  # fmt: skip
        await conn.execute("INSERT INTO trioq.job_dependencies VALUES (%s, %s)", (job_id, live))
        sql = statements("trioq")
        repaired = trio.Event()

        class Racing(Stranded):
            async def _find(self, conn: Any, ids: list[int] | None) -> dict[int, str]:
                found = await super()._find(conn, ids)
                if ids is None:  # found, not locked yet: repaired before the lock is taken
                    async with await trioq.connect(dsn, autocommit=True) as fixer:
                        await fixer.execute("UPDATE trioq.jobs SET dependencies_left = 1"
                                            " WHERE id = %s", (job_id,))  # fmt: skip
                    assert job_id in found
                    repaired.set()
                return found

        sweep = Racing(pool, sql, interval=60)
        done = await sweep.run_once()
        assert repaired.is_set() and done.moved == {}
        assert await scalar(conn, "SELECT state FROM trioq.jobs WHERE id = %s", job_id) == "waiting"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=20))
def test_cycles_are_exactly_the_jobs_that_reach_themselves(edges: list[tuple[int, int]]) -> None:
    reach: dict[int, set[int]] = {}
    for a, b in edges:
        reach.setdefault(a, set()).add(b)
    for _ in range(8):  # transitive closure, by brute force
        for targets in reach.values():
            targets |= set(itertools.chain.from_iterable(reach.get(b, ()) for b in targets))
    expected = {a for a, targets in reach.items() if a in targets}
    found = cycles(edges)
    assert set(itertools.chain.from_iterable(found)) == expected
    for component in found:  # each component: jobs that reach one another
        assert all(b in reach[a] for a in component for b in component)
