"""Operator inputs that used to destroy data or hang, each refused or made safe (issue #10).

Cut-offs that matched everything, the demo running an application's jobs, arguments
silently taken as options, deadlocked batches, a schema whose tables are gone, a schema
newer than this trioq, and a ``search_path`` that shadows ``now()``.
"""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import psycopg
import pytest
import trio
from clitool import trioq_cli
from helpers import rows, scalar

import trioq
from trioq._db.migrate import latest_version

UTC = dt.UTC


async def migrated(dsn: str) -> Any:
    conn = await trioq.connect(dsn, autocommit=True)
    await trioq.migrate(conn)
    return conn


async def bury(conn: Any, job_id: int, died_at: str) -> None:
    """A dead job that died at ``died_at`` (an SQL timestamptz literal)."""
    await conn.execute(
        "INSERT INTO trioq.dead_jobs (id, queue, task, args, priority, attempt, max_attempts,"
        " reason, enqueued_at, died_at) VALUES (%s, 'q', 't', '{}', 0, 1, 1, 'fatal error',"
        " %s::timestamptz, %s::timestamptz)",
        (job_id, died_at, died_at),
    )


# -- dead purge cut-offs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cutoff", ["", "-7d", "0", "0s", "abc", "7w", "nan", "inf", "1e400d", "٣d"]
)
async def test_purge_refuses_a_cutoff_that_would_match_everything(dsn: str, cutoff: str) -> None:
    async with await migrated(dsn) as conn:
        await bury(conn, 1, "2020-01-01")
        out = trioq_cli("dead", "purge", f"--older-than={cutoff}", "--dsn", dsn)
        assert out.returncode == 2, out.stdout
        assert f"trioq dead purge: error: argument --older-than: {cutoff!r}" in out.stderr
        assert await scalar(conn, "SELECT count(*) FROM trioq.dead_jobs") == 1


async def test_purge_cutoffs_use_the_databases_clock(dsn: str, pg_admin_dsn: str) -> None:
    """The database's clock says 2030; the CLI's machine says today. Only the job that died
    more than an hour before the database's now goes."""
    async with await migrated(dsn) as conn:
        await bury(conn, 1, "2030-01-01 10:00Z")  # 2 h before the database's now
        await bury(conn, 2, "2030-01-01 11:30Z")  # 30 min before it
        name = conn.info.dbname
        async with await trioq.connect(pg_admin_dsn, autocommit=True) as admin:
            await admin.execute(
                psycopg.sql.SQL("ALTER DATABASE {} SET trioq.now = '2030-01-01 12:00Z'").format(
                    psycopg.sql.Identifier(name)
                )
            )
        out = trioq_cli("dead", "purge", "--older-than", "1h", "--dsn", dsn)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "purged 1 dead jobs: 1"
        assert await rows(conn, "SELECT id FROM trioq.dead_jobs") == [(2,)]


async def test_purge_older_than_in_python(dsn: str) -> None:
    async with await migrated(dsn) as conn:
        await bury(conn, 1, "2000-01-01")
        with pytest.raises(ValueError, match="older_than must be a timedelta, not negative"):
            await trioq.Queue().dead_purge(conn, older_than=dt.timedelta(days=-1))
        assert await trioq.Queue().dead_purge(conn, older_than=dt.timedelta(days=1)) == [1]


# -- the demo on an application's database -----------------------------------------------------


async def test_demo_touches_none_of_the_applications_jobs(dsn: str) -> None:
    """Even told to use the application's schema, the demo runs only its own queue."""
    async with await migrated(dsn) as conn:
        app_jobs = [await trioq.enqueue(conn, name) for name in ("greet", "flaky", "crunch")]
        out = await trio.to_thread.run_sync(
            lambda: trioq_cli("demo", "--json", "--schema", "trioq", "--dsn", dsn)
        )
        assert out.returncode == 0, out.stderr
        found = await rows(
            conn, "SELECT id, state, attempt, queue FROM trioq.jobs WHERE id = ANY(%s)"
            " ORDER BY id", [j.job_id for j in app_jobs],
        )  # fmt: skip
        assert found == [(j.job_id, "available", 0, "default") for j in app_jobs]
        assert await scalar(conn, "SELECT count(*) FROM trioq.dead_jobs") == 0
    default = trioq_cli("demo", "--json", "--dsn", dsn)
    assert default.returncode == 0 and '"schema": "trioq_demo"' in default.stdout


# -- arguments that would be taken as options ----------------------------------------------------


@pytest.mark.parametrize(
    "name", ["delay", "priority", "run_at", "dedup_key", "unique", "args", "concurrency_key"]
)
def test_a_handler_parameter_named_like_an_enqueue_option_is_refused(name: str) -> None:
    namespace: dict[str, Any] = {}
    exec(f"async def handler(job, user_id, {name}=None): ...", namespace)
    with pytest.raises(ValueError, match=f"handler parameter '{name}' has the name of an option"):
        trioq.Registry().task(name="send")(namespace["handler"])


def test_handlers_with_other_parameters_register() -> None:
    tasks = trioq.Registry()

    @tasks.task
    async def send(job: trioq.JobContext, user_id: int, *, delay_seconds: int = 0) -> None: ...

    @tasks.task
    def anything(job: trioq.JobContext, **kwargs: Any) -> None: ...

    @tasks.task
    async def star(*args: Any) -> None: ...

    assert len(tasks) == 3


@pytest.mark.parametrize("signature", ["", "*, job", "**kwargs"])
def test_a_handler_that_cannot_take_the_job_context_is_refused(signature: str) -> None:
    """Every run of such a handler would fail with a TypeError: refuse it at import instead."""
    namespace: dict[str, Any] = {}
    exec(f"async def noop({signature}): ...", namespace)
    refused = (r"task 'noop': the handler must take the job context as its first positional"
               r" parameter, e.g. `async def noop\(job, \*\*args\)`")  # fmt: skip
    with pytest.raises(TypeError, match=refused):
        trioq.Registry().task(name="noop")(namespace["noop"])


# -- concurrent batches with overlapping dedup keys ----------------------------------------------


async def enqueue_in_order(dsn: str, keys: list[str], inserted: list[int]) -> None:
    async with await trioq.connect(dsn) as conn, conn.transaction():
        results = await trioq.enqueue_many(
            conn, [trioq.JobSpec(task="t", dedup_key=key) for key in keys]
        )
        inserted.extend(r.job_id for r in results if not r.duplicate)


async def test_overlapping_dedup_batches_never_deadlock(dsn: str) -> None:
    """Six transactions insert the same 1,000 keys, each in its own (shuffled) order, twenty
    times over. Without one lock order, a deadlock killed some of them in 3 of 4 runs here:
    a test that can miss the bug, never one that fails with the fix."""
    async with await migrated(dsn) as setup:
        for round_ in range(20):
            keys = [f"k{i}-{round_}" for i in range(1000)]
            shuffle = random.Random(round_).shuffle
            inserted: list[int] = []

            async with trio.open_nursery() as nursery:
                for _ in range(6):
                    order = keys[:]
                    shuffle(order)
                    nursery.start_soon(enqueue_in_order, dsn, order, inserted)
            assert len(inserted) == len(keys)
        assert await scalar(setup, "SELECT count(*) FROM trioq.jobs") == 20 * 1000


# -- a schema whose tables are gone, or that is newer than this trioq ------------------------------


async def test_a_schema_missing_its_tables_is_refused_everywhere(dsn: str) -> None:
    async with await migrated(dsn) as conn:
        await conn.execute("DROP TABLE trioq.jobs")
        with pytest.raises(trioq.MigrationError, match="its tables jobs are missing"):
            await trioq.migrate(conn)
        config = trioq.Config(dsn=dsn, registry=trioq.Registry())
        with pytest.raises(trioq.SchemaMissingError, match="its tables jobs are missing"):
            await trioq.serve(config)
    for command in (["migrate"], ["status"], ["enqueue", "t"]):
        out = trioq_cli(*command, "--dsn", dsn)
        assert out.returncode == 1, (command, out.stdout)
        assert "its tables jobs are missing" in out.stderr, command


async def test_a_newer_schema_is_refused_by_enqueue_and_status(dsn: str) -> None:
    async with await migrated(dsn) as conn:
        await conn.execute(
            "INSERT INTO trioq.migrations (version, name) VALUES (%s, 'from_the_future')",
            (latest_version() + 1,),
        )
        with pytest.raises(trioq.SchemaTooNewError, match="upgrade trioq"):
            await trioq.enqueue(conn, "t")
        with pytest.raises(trioq.SchemaTooNewError):
            await trioq.enqueue_many(conn, [trioq.JobSpec(task="t")])
        with pytest.raises(trioq.SchemaTooNewError):
            await trioq.enqueue_bulk(conn, "t", [{}])
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0
    for command in (["status"], ["enqueue", "t"], ["dead", "list"]):
        out = trioq_cli(*command, "--dsn", dsn)
        assert out.returncode == 1 and "upgrade trioq" in out.stderr, command


# -- a search_path that shadows pg_catalog's functions -------------------------------------------

EVIL = """
CREATE SCHEMA evil;
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql
    AS $$ SELECT '2000-01-01'::timestamptz $$;
CREATE FUNCTION evil.current_setting(text, boolean) RETURNS text LANGUAGE sql
    AS $$ SELECT '2000-01-01' $$;
CREATE FUNCTION evil.pg_notify(text, text) RETURNS void LANGUAGE sql AS $$ SELECT NULL::void $$;
CREATE FUNCTION evil.unnest(anyarray) RETURNS SETOF anyelement LANGUAGE sql
    AS $$ SELECT NULL::int8 WHERE false $$;
CREATE FUNCTION evil.count(anyelement) RETURNS int8 LANGUAGE sql AS $$ SELECT 0::int8 $$;
"""


async def test_a_search_path_that_shadows_now_changes_nothing(dsn: str) -> None:
    async with await migrated(dsn) as conn:
        await conn.execute(EVIL)
        await conn.execute("SET search_path = evil, pg_catalog, public")
        assert await scalar(conn, "SELECT now()::date") == dt.date(2000, 1, 1)  # shadowed
        before = await scalar(conn, "SELECT pg_catalog.now()")
        job = await trioq.enqueue(conn, "t", delay=60)
        run_at = await scalar(conn, "SELECT run_at FROM trioq.jobs WHERE id = %s", job.job_id)
        assert run_at >= before + dt.timedelta(seconds=60)
        now_job = await trioq.enqueue(conn, "t")
        ids = await trioq.enqueue_bulk(conn, "t", [{"i": 1}, {"i": 2}])
        many = await trioq.enqueue_many(conn, [trioq.JobSpec(task="t", dedup_key="d")])
        queue = trioq.Queue()
        claimed = await queue.claim(conn, "default", owner="w", limit=10,
                                    lease=dt.timedelta(seconds=30))  # fmt: skip
        assert {j.id for j in claimed} == {now_job.job_id, *ids, many[0].job_id}
        assert all(j.run_at.year > 2000 and j.lease_expires_at.year > 2000 for j in claimed)
        leases = [trioq.Lease(j.id, j.attempt) for j in claimed]
        assert await queue.complete_many(conn, owner="w", leases=leases) == {j.id for j in claimed}
        assert (await queue.sweep(conn)).returned == frozenset()
        assert await queue.promote_due(conn) == []
