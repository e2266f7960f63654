"""Bad input (issue #6): each case fails with an error naming the problem, and nothing is
lost or half-written. ``docs/bad-input.md`` is the table of every case; cases covered
elsewhere are referenced there, not repeated here.

"Nothing hits the database" is proven with a real connection that is already closed:
any statement on it would raise ``OperationalError``, so a ``ValueError`` naming the field
means validation ran first. "Nothing half-written" is checked by counting rows afterwards.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from clitool import trioq_cli as cli
from helpers import migrated, scalar, wait_until
from psycopg import sql

import trioq
import trioq._db.migrate
from trioq import CronEntry, DatabaseReadOnlyError, InvalidDSNError, JobSpec
from trioq._cli import main as cli_main
from trioq._cron import next_fire_time
from trioq._db.migrate import Migration, latest_version
from trioq._db.statements import statements
from trioq._pg.dsn import configured_dsn
from trioq._worker.services.scheduler import fire_due

UTC = dt.UTC
FAST: dict[str, Any] = {
    "lease": 30,
    "heartbeat_interval": 1,
    "poll_interval": 0.2,
    "sweep_interval": 1,
}
TESTS = Path(__file__).parent
PASSWORD = "SeCrEt-b4d-1nput"

INJECTION_QUEUES = [
    "x'; DROP TABLE jobs;--",
    '"x"',
    "a\x00b",
    "q" * 200,
    "",
    "a b",
    "@scheduled",
    "trioq_trioq; LISTEN x",
]


# -- helpers ------------------------------------------------------------------------------------


async def closed_connection(dsn: str) -> Any:
    """A real connection, closed: any SQL on it raises OperationalError."""
    conn = await trioq.connect(dsn, autocommit=True)
    await conn.close()
    return conn


@asynccontextmanager
async def serving(dsn: str, registry: trioq.Registry, **options: Any) -> AsyncIterator[Any]:
    config = trioq.Config(dsn=dsn, registry=registry, **{**FAST, **options})
    async with trio.open_nursery() as nursery:
        runtime = await nursery.start(trioq.serve, config)
        try:
            yield runtime
        finally:
            runtime.stop(grace=False)


@asynccontextmanager
async def jobs_locked(dsn: str) -> AsyncIterator[None]:
    """Hold ACCESS EXCLUSIVE on trioq.jobs: every statement touching it waits."""
    async with await trioq.connect(dsn) as locker:
        await locker.execute("SET statement_timeout = 0")
        await locker.execute("LOCK TABLE trioq.jobs IN ACCESS EXCLUSIVE MODE")
        yield
        await locker.rollback()


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``trioq ARGS`` in this process (fast); its exit code, stdout and stderr."""
    code = cli_main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


# -- args that are not JSON, payloads over the limit --------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"x": object()}, "args must be JSON"),
        ({"x": float("nan")}, "args must be JSON"),
        ({"x": float("inf")}, "args must be JSON"),
        ({"x": b"bytes"}, "args must be JSON"),
        ({"x": {1, 2}}, "args must be JSON"),
        ({"x": "a\x00b"}, "NUL"),
    ],
)
async def test_args_that_are_not_json_fail_before_any_sql(
    dsn: str, args: Any, message: str
) -> None:
    conn = await closed_connection(dsn)
    with pytest.raises(ValueError, match=message):
        await trioq.enqueue(conn, "t", args)
    with pytest.raises(ValueError, match=message):
        await trioq.enqueue_many(conn, [JobSpec(task="t"), JobSpec(task="t", args=args)])


async def test_args_with_a_lone_surrogate_name_args(dsn: str) -> None:
    conn = await closed_connection(dsn)
    with pytest.raises(ValueError, match="args"):
        await trioq.enqueue(conn, "t", {"x": "\ud800"})


async def test_payload_over_the_limit_writes_nothing(dsn: str) -> None:
    """(``tests/test_queue.py::test_payload_limit_and_nothing_written`` covers the default
    Queue; this is the runtime's limit, seen by ``job.enqueue`` inside a handler.)"""
    tasks = trioq.Registry()
    outcome: list[BaseException] = []
    done = trio.Event()

    @tasks.task(max_attempts=1)
    async def parent(job: trioq.JobContext) -> None:
        try:
            await job.enqueue("child", {"blob": "x" * 200})
        except trioq.PayloadTooLargeError as ex:
            outcome.append(ex)
        done.set()

    async with migrated(dsn) as conn, serving(dsn, tasks, max_payload_bytes=100):
        await parent.enqueue(conn)
        with trio.fail_after(20):
            await done.wait()
        assert "over the limit of 100" in str(outcome[0])
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs WHERE task = 'child'") == 0


# -- queue names: injection attempts, and the LISTEN channel ------------------------------------


@pytest.mark.parametrize("name", INJECTION_QUEUES)
async def test_injected_queue_names_are_refused_before_any_sql(dsn: str, name: str) -> None:
    conn = await closed_connection(dsn)
    with pytest.raises(ValueError, match="queue"):
        await trioq.enqueue(conn, "t", queue=name)
    with pytest.raises(ValueError, match="queue"):
        JobSpec(task="t", queue=name)
    with pytest.raises(ValueError, match="queue"):
        trioq.Config(registry=trioq.Registry(), queues=[name])
    with pytest.raises(ValueError, match="queue"):
        trioq.Registry().task(name="t", queue=name)(lambda job: None)
    with pytest.raises(ValueError, match="queue"):
        CronEntry(name="c", schedule="@daily", task="t", queue=name)


@pytest.mark.parametrize("name", ["x'; DROP TABLE jobs;--", '"x"', "q" * 200])
def test_injected_queue_names_on_the_command_line(
    dsn: str, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    assert run_cli(capsys, "migrate", "--dsn", dsn)[0] == 0
    code, out, err = run_cli(capsys, "enqueue", "t", "--queue", name, "--dsn", dsn)
    assert (code, out) == (1, "")
    assert err.startswith("trioq: error: queue ") and "is invalid" in err
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM trioq.jobs").fetchone() == (0,)


def test_injected_queue_name_for_serve_is_refused_before_it_connects() -> None:
    """``trioq serve --queues``: the DSN points nowhere, so reaching the database would be
    a connection error; the queue error comes first."""
    out = cli("serve", "--app", "serve_app:config", "--queues", "ok,x'; DROP TABLE jobs;--",
              "--dsn", "postgresql://nobody@127.0.0.1:1/nothing")  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        'trioq: error: --queues: queue "x\'; DROP TABLE jobs;--" is invalid: use 1-64 '
        "letters, digits, '_', '.', ':' or '-', not starting with a punctuation mark"
    )


@pytest.mark.parametrize("field", ["queue", "task"])
def test_job_spec_refuses_a_trailing_newline(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        fields: dict[str, Any] = {"task": "t", field: f"{field}\n"}
        JobSpec(**fields)


async def test_listen_channel_never_contains_user_input(dsn: str) -> None:
    """One channel per schema, ``trioq_<schema>``; queue names travel as the payload."""
    assert statements("trioq").channel == "trioq_trioq"
    assert statements("jobs_2").channel == "trioq_jobs_2"
    odd = ["Email.v2:high-prio", "x-1", "_q"]
    tasks = trioq.Registry()
    async with migrated(dsn) as conn:
        async with serving(dsn, tasks, queues=odd):
            listens = await conn.execute(
                "SELECT query FROM pg_stat_activity WHERE datname = current_database()"
                " AND query ILIKE 'LISTEN%%'"
            )
            assert await listens.fetchall() == [('LISTEN "trioq_trioq"',)]
        async with await trioq.connect(dsn, autocommit=True) as listener:
            await listener.execute('LISTEN "trioq_trioq"')
            for queue in odd:
                await trioq.enqueue(conn, "t", queue=queue)
            got = await _notes(listener, len(odd))
        assert got == [("trioq_trioq", q) for q in odd]


async def _notes(listener: Any, n: int) -> list[tuple[str, str]]:
    got: list[tuple[str, str]] = []
    with trio.fail_after(10):
        async for note in listener.notifies():
            got.append((note.channel, note.payload))
            if len(got) == n:
                break
    return got


# -- invalid cron, naive datetimes, negative delays ---------------------------------------------


async def test_naive_datetimes_are_refused_before_any_sql(dsn: str) -> None:
    conn = await closed_connection(dsn)
    naive = dt.datetime(2030, 1, 1, 12)
    with pytest.raises(ValueError, match="run_at 2030-01-01T12:00:00 is a naive datetime"):
        await trioq.enqueue(conn, "t", run_at=naive)
    entry = CronEntry(name="c", schedule="@hourly", task="t")
    with pytest.raises(ValueError, match="after must be an aware datetime"):
        entry.next_tick(naive)
    with pytest.raises(ValueError, match="now must be an aware datetime"):
        next_fire_time([entry], naive)
    with pytest.raises(ValueError, match="now must be an aware datetime"):
        await fire_due(conn, trioq.Queue(), [entry], now=naive)


async def test_dead_purge_refuses_a_naive_cutoff(dsn: str) -> None:
    conn = await closed_connection(dsn)
    with pytest.raises(ValueError, match="before"):
        await trioq.Queue().dead_purge(conn, before=dt.datetime(2030, 1, 1))


@pytest.mark.parametrize("delay", [-1, -0.001, dt.timedelta(seconds=-1)])
async def test_negative_delays_are_refused_before_any_sql(dsn: str, delay: Any) -> None:
    conn = await closed_connection(dsn)
    with pytest.raises(ValueError, match="delay must not be negative"):
        await trioq.enqueue(conn, "t", delay=delay)
    job = trioq.Job(
        id=1, queue="q", task="t", args={}, priority=0, run_at=dt.datetime.now(UTC), attempt=1,
        max_attempts=1, enqueued_at=dt.datetime.now(UTC), lease_expires_at=dt.datetime.now(UTC),
    )  # fmt: skip
    with pytest.raises(ValueError, match="snooze delay must not be negative"):
        trioq.JobContext(job, None).snooze(delay)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seconds must be a finite number, not negative"):
        trioq.retry.Constant(seconds=-1)


# -- bad DSNs (wrong passwords and the CLI: tests/test_security.py) -----------------------------


@pytest.mark.parametrize(
    "bad",
    [
        f"postgresql://app:{PASSWORD}@[::1/app",
        f"mysql://app:{PASSWORD}@127.0.0.1/app",
        f"host=127.0.0.1 password={PASSWORD} dbname='unterminated",
        f"not a dsn {PASSWORD}",
    ],
)
def test_unparseable_dsn_is_refused_without_echoing_it(bad: str) -> None:
    with pytest.raises(InvalidDSNError, match="dsn is invalid") as info:
        trioq.Config(registry=trioq.Registry(), dsn=bad)
    assert PASSWORD not in str(info.value)
    with pytest.raises(InvalidDSNError, match=r"^DSN is invalid: .*may hold a password\)$") as info:
        configured_dsn(bad)
    assert PASSWORD not in str(info.value)
    with pytest.raises(InvalidDSNError, match=r"^\$TRIOQ_DSN is invalid"):
        configured_dsn(None, {"TRIOQ_DSN": bad})
    assert isinstance(info.value, ValueError)


async def test_connect_with_an_unparseable_uri_does_not_echo_it() -> None:
    with pytest.raises(psycopg.Error) as info:
        await trioq.connect(f"postgresql://app:{PASSWORD}@[::1/app")
    assert PASSWORD not in str(info.value)


async def test_unknown_host_names_the_host() -> None:
    with trio.fail_after(60), pytest.raises(psycopg.OperationalError) as info:
        await trioq.connect(f"postgresql://app:{PASSWORD}@no-such-host.invalid/app")
    assert "no-such-host.invalid" in str(info.value)
    assert PASSWORD not in str(info.value)


async def test_unknown_host_is_a_connect_error() -> None:
    with trio.fail_after(60), pytest.raises(trioq.ConnectError, match="cannot connect to"):
        await trioq.connect("postgresql://app@no-such-host.invalid/app")


async def test_serve_on_a_refused_port_is_a_connect_error(unused_port: int) -> None:
    """(``tests/test_pg.py`` and ``tests/test_cli.py`` cover connect() and the CLI.)"""
    dsn = f"postgresql://app:{PASSWORD}@127.0.0.1:{unused_port}/app"
    config = trioq.Config(registry=trioq.Registry(), dsn=dsn)
    with pytest.raises(trioq.ConnectError) as info:
        await trioq.serve(config)
    message = str(info.value)
    assert message.startswith(f"cannot connect to postgresql://app@127.0.0.1:{unused_port}/app")
    assert "Connection refused" in message and PASSWORD not in message


# -- the schema: missing, outdated, newer -------------------------------------------------------


def test_commands_before_migrate_say_run_migrate(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``serve`` is covered for the API by ``tests/test_runtime.py::
    test_unmigrated_database_is_refused``; here every command, and nothing is created."""
    expected = "has no trioq tables: run `trioq migrate`"
    for command in (["enqueue", "t"], ["status"], ["status", "--json"], ["dead", "list"]):
        code, out, err = run_cli(capsys, *command, "--dsn", dsn)
        message = f"schema 'trioq' in database '{_db(dsn)}' {expected}"
        # with --json the error is also one object on stdout (issue #11)
        json_error = {"error": "SchemaMissingError", "message": message}
        assert code == 1, command
        assert (json.loads(out) if "--json" in command else out) == (
            json_error if "--json" in command else ""
        ), command
        assert err == f"trioq: error: {message}\n"
    served = cli("serve", "--app", "serve_app:config", "--dsn", dsn)
    assert served.returncode == 1
    assert served.stderr.strip().splitlines()[-1].endswith(expected)
    assert "Traceback" not in served.stderr
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regnamespace('trioq')").fetchone() == (None,)


async def test_enqueue_before_migrate_says_run_migrate(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        with pytest.raises(trioq.SchemaMissingError, match="trioq migrate"):
            await trioq.enqueue(conn, "t")


async def test_outdated_schema_is_refused_until_migrated(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This trioq ships one migration more than the database has (a simulated upgrade)."""
    shipped = trioq._db.migrate.migrations()
    future = Migration(len(shipped) + 1, "future", "CREATE TABLE future_marker (x int);")
    async with migrated(dsn) as conn:
        monkeypatch.setattr(trioq._db.migrate, "migrations", lambda: (*shipped, future))
        config = trioq.Config(dsn=dsn, registry=trioq.Registry(), **FAST)
        with pytest.raises(trioq.SchemaOutdatedError) as info:
            await trioq.serve(config)
        assert str(info.value) == (
            f"schema 'trioq' in database '{_db(dsn)}' is at version {len(shipped)}, this trioq "
            f"needs {future.version}: run `trioq migrate`"
        )
        assert (await trioq.migrate(conn)).applied == (future.version,)
        async with serving(dsn, trioq.Registry()):
            pass  # starts now
        monkeypatch.undo()  # back to the real trioq: the database is now newer than it
        with pytest.raises(trioq.SchemaTooNewError, match="upgrade trioq"):
            await trioq.serve(config)


def test_newer_schema_is_refused_by_serve_and_migrate(dsn: str) -> None:
    """(The API: ``tests/test_migrate.py::test_newer_schema_is_refused``.)"""
    assert cli("migrate", "--dsn", dsn).returncode == 0
    newer = latest_version() + 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO trioq.migrations VALUES (%s, 'from the future')", (newer,))
    migrated_again = cli("migrate", "--dsn", dsn)
    assert migrated_again.returncode == 1
    assert migrated_again.stderr == (
        f"trioq: error: schema 'trioq' is at version {newer}, but this trioq knows only up to "
        f"version {latest_version()}: it was migrated by a newer trioq; upgrade trioq\n"
    )
    served = cli("serve", "--app", "serve_app:config", "--dsn", dsn)
    assert served.returncode == 1
    assert served.stderr.strip().splitlines()[-1] == (
        f"trioq: error: schema 'trioq' in database '{_db(dsn)}' is at version {newer}, newer "
        f"than this trioq knows ({latest_version()}): upgrade trioq"
    )
    with psycopg.connect(dsn) as conn:
        versions = conn.execute("SELECT version FROM trioq.migrations ORDER BY 1").fetchall()
        assert [v for (v,) in versions] == [*range(1, latest_version() + 1), newer]


def _db(dsn: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


# -- a read-only database -----------------------------------------------------------------------


async def test_read_only_database(dsn: str) -> None:
    """Enqueue raises ReadOnlySqlTransaction; serve refuses at start-up; migrate changes
    nothing (and says the schema is up to date when it is)."""
    async with migrated(dsn) as admin:
        query = sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on")
        await admin.execute(query.format(sql.Identifier(_db(dsn))))
    async with await trioq.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction, match="read-only transaction"):
            await trioq.enqueue(conn, "t")
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            await trioq.enqueue_many(conn, [JobSpec(task="a"), JobSpec(task="b", priority=1)])
        config = trioq.Config(dsn=dsn, registry=trioq.Registry(), **FAST)
        with pytest.raises(DatabaseReadOnlyError) as info:
            await trioq.serve(config)
        assert str(info.value) == (
            f"database '{_db(dsn)}' is read-only, and trioq workers must write (claims, leases, "
            "outcomes): transaction_read_only is on (default_transaction_read_only is set for "
            "this database, role or session): turn it off"
        )
        assert isinstance(info.value, trioq.SchemaError)
        assert (await trioq.migrate(conn)).applied == ()
        with pytest.raises(trioq.MigrationError, match=r"read-only .* nothing was changed"):
            await trioq.migrate(conn, "other")
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0
        assert await scalar(conn, "SELECT to_regnamespace('other')") is None


def test_serve_on_a_read_only_database_exits_with_the_reason(dsn: str) -> None:
    assert cli("migrate", "--dsn", dsn).returncode == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        query = sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on")
        conn.execute(query.format(sql.Identifier(_db(dsn))))
    served = cli("serve", "--app", "serve_app:config", "--dsn", dsn)
    assert served.returncode == 1
    assert (
        served.stderr.strip()
        .splitlines()[-1]
        .startswith(f"trioq: error: database '{_db(dsn)}' is read-only")
    )
    assert "Traceback" not in served.stderr


# -- statement timeouts from the server ---------------------------------------------------------


async def test_statement_timeout_in_enqueue_rolls_back_the_callers_transaction(dsn: str) -> None:
    async with migrated(dsn) as conn:
        await conn.execute("CREATE TABLE users (id int)")
        async with jobs_locked(dsn):
            with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
                async with conn.transaction():
                    await conn.execute("INSERT INTO users VALUES (42)")
                    await conn.execute("SET LOCAL statement_timeout = '100ms'")
                    await trioq.enqueue(conn, "welcome", {"user_id": 42})
        assert await scalar(conn, "SELECT count(*) FROM users") == 0
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0


@pytest.mark.parametrize(
    "specs",
    [
        [JobSpec(task="t", args={"i": i}) for i in range(50)],  # one statement
        [JobSpec(task="t", priority=i % 3, args={"i": i}) for i in range(50)],  # COPY
        [JobSpec(task="t", dedup_key=f"k{i}") for i in range(50)],  # INSERT ... ON CONFLICT
    ],
    ids=["same-fields", "mixed-fields", "dedup-keys"],
)
async def test_enqueue_many_failing_in_the_database_leaves_no_rows(
    dsn: str, specs: list[JobSpec]
) -> None:
    async with migrated(dsn) as conn:
        await conn.execute("SET statement_timeout = '100ms'")
        async with jobs_locked(dsn):
            with pytest.raises(psycopg.errors.QueryCanceled):
                await trioq.enqueue_many(conn, specs)
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0
        assert len(await trioq.enqueue_many(conn, specs)) == len(specs)  # the same batch, later


async def test_statement_timeout_in_a_handlers_transaction_fails_the_job(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task(max_attempts=1)
    async def slow_write(job: trioq.JobContext) -> None:
        async with job.transaction() as conn:
            await conn.execute("INSERT INTO effects VALUES (%s)", (job.id,))
            await conn.execute("SET LOCAL statement_timeout = '50ms'")
            await conn.execute("SELECT pg_sleep(30)")

    async with migrated(dsn) as conn, serving(dsn, tasks):
        await conn.execute("CREATE TABLE effects (job_id bigint)")
        r = await slow_write.enqueue(conn)

        async def dead() -> bool:
            return bool(await scalar(conn, "SELECT 1 FROM trioq.dead_jobs WHERE id = %s", r.job_id))

        await wait_until(dead, timeout=20)
        (job,) = await trioq.Queue().dead_list(conn)
        assert job.last_error == "QueryCanceled: canceling statement due to statement timeout"
        assert job.traceback and "pg_sleep" in job.traceback
        assert await scalar(conn, "SELECT count(*) FROM effects") == 0


async def test_runtime_survives_statement_timeouts_on_its_own_statements(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Claims and outcome writes time out while trioq.jobs is locked: the runtime logs,
    backs off and retries; once the lock is gone everything drains."""
    caplog.set_level(logging.WARNING, logger="trioq")
    tasks = trioq.Registry()
    started, finish = trio.Event(), trio.Event()

    @tasks.task
    async def held(job: trioq.JobContext) -> None:
        started.set()
        await finish.wait()

    @tasks.task
    async def quick(job: trioq.JobContext, i: int) -> None:
        await trio.lowlevel.checkpoint()

    async with migrated(dsn) as conn:
        query = sql.SQL("ALTER DATABASE {} SET statement_timeout = '250ms'")
        await conn.execute(query.format(sql.Identifier(_db(dsn))))
        async with serving(dsn, tasks, queues={"default": trioq.QueueConfig(concurrency=2)}):
            await held.enqueue(conn)
            with trio.fail_after(20):
                await started.wait()
            async with jobs_locked(dsn):
                await _logged(caplog, "claiming from queue 'default' failed: canceling statement")
                finish.set()  # its outcome now waits for the lock too
                await _logged(caplog, "job outcomes failed, retrying: canceling statement")
            await trioq.enqueue_many(
                conn, [JobSpec(task="quick", args={"i": i}) for i in range(20)]
            )

            async def drained() -> bool:
                return bool(await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0)

            await wait_until(drained, timeout=20)
        assert await scalar(conn, "SELECT count(*) FROM trioq.dead_jobs") == 0


async def _logged(caplog: pytest.LogCaptureFixture, text: str) -> None:
    async def seen() -> bool:
        await trio.lowlevel.checkpoint()
        return any(text in record.getMessage() for record in caplog.records)

    await wait_until(seen, timeout=20)


# -- references ---------------------------------------------------------------------------------


def test_the_docs_name_only_tests_that_exist() -> None:
    """docs/bad-input.md and docs/security.md name tests: each must exist (a bare name is in
    the page's own test file, ``tests/test_x.py::name`` in that file)."""
    import re

    docs = TESTS.parent / "docs"
    for page, own in (("bad-input.md", "test_bad_input.py"), ("security.md", "test_security.py")):
        text = (docs / page).read_text()
        for path, name in re.findall(r"(?:tests/(test_\w+\.py)::)?\b(test_\w+)\b(?!\.py)", text):
            source = (TESTS / (path or own)).read_text()
            assert re.search(rf"def {name}\b", source), f"{page}: {path or own}::{name} is gone"
