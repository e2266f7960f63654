"""`trioq.producer` (issue 25): enqueue from sync psycopg, asyncio psycopg, SQLAlchemy (sync
and async) and Django, in the caller's own transaction, with the trio path's rules.

Each kind of producer runs one script of calls (every call: enqueue with dedup, a unique
window, ``after=``, enqueue_many by each of its three statements, enqueue_bulk, a workflow,
a batch, signals by id and by key) against a database of its own, and the rows it leaves
must be the rows the trio path (`trioq.enqueue` on a `trioq.TrioConnection`) leaves: one
implementation of the rules. The same bad inputs fail with the same exception and the same
words. Rollback leaves nothing; commit makes the job and its notification visible; two kinds
racing for one dedup key make one job.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import queue as queue_module
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, cast

import psycopg
import pytest
import sqlalchemy as sa
import trio
from helpers import poll_query
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row, namedtuple_row
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import trioq
from trioq import JobSpec, producer
from trioq.testing._postgres import create_database, drop_database

UTC = dt.UTC


def migrate(dsn: str) -> None:
    async def run() -> None:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            await trioq.migrate(conn)

    trio.run(run)


# -- the kinds of producer ------------------------------------------------------------------


class Producing(Protocol):
    """One open connection of a kind, in a transaction the test commits or rolls back."""

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...


class SyncProducing:
    """Sync calls (`trioq.producer.enqueue`, ...) on a connection-like object."""

    def __init__(self, conn: Any, commit: Callable[[], None], rollback: Callable[[], None]):
        self.conn, self.commit, self.rollback = conn, commit, rollback

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(producer, name)(self.conn, *args, **kwargs)


class AsyncProducing:
    """Async calls (`trioq.producer.aenqueue`, ...) in one asyncio loop, kept open."""

    def __init__(self, runner: asyncio.Runner, conn: Any) -> None:
        self.runner, self.conn = runner, conn

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.runner.run(getattr(producer, f"a{name}")(self.conn, *args, **kwargs))

    def commit(self) -> None:
        self.runner.run(self.conn.commit())

    def rollback(self) -> None:
        self.runner.run(self.conn.rollback())


class TrioProducing:
    """The reference: `trioq.enqueue` and friends on a `trioq.TrioConnection`, in a trio run
    of its own on another thread."""

    def __init__(self, dsn: str) -> None:
        self._token: Any = None
        self._conn: Any = None
        self._stop: Any = None
        ready = threading.Event()

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            async with await trioq.connect(dsn) as conn:
                self._conn = conn
                ready.set()
                await self._stop.wait()

        self._thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
        self._thread.start()
        assert ready.wait(30)

    def _run(self, fn: Callable[[], Any]) -> Any:
        return trio.from_thread.run(fn, trio_token=self._token)

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "enqueue_workflow":
            return self._run(lambda: args[0].enqueue(self._conn, **kwargs))
        if name == "enqueue_batch":
            return self._run(lambda: args[0].enqueue(self._conn, **kwargs))
        return self._run(lambda: getattr(trioq, name)(self._conn, *args, **kwargs))

    def commit(self) -> None:
        self._run(self._conn.commit)

    def rollback(self) -> None:
        self._run(self._conn.rollback)

    def close(self) -> None:
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(30)


@contextmanager
def trio_kind(dsn: str) -> Iterator[Producing]:
    p = TrioProducing(dsn)
    try:
        yield p
    finally:
        p.close()


@contextmanager
def psycopg_kind(dsn: str) -> Iterator[Producing]:
    with psycopg.connect(dsn) as conn:
        yield SyncProducing(conn, conn.commit, conn.rollback)


@contextmanager
def asyncio_kind(dsn: str) -> Iterator[Producing]:
    with asyncio.Runner() as runner:
        conn = runner.run(psycopg.AsyncConnection.connect(dsn))
        try:
            yield AsyncProducing(runner, conn)
        finally:
            runner.run(conn.close())


def _engine(dsn: str) -> sa.Engine:
    return sa.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn),
                            poolclass=sa.NullPool)  # fmt: skip


def _async_engine(dsn: str) -> AsyncEngine:
    async def connect() -> Any:
        return await psycopg.AsyncConnection.connect(dsn)

    return create_async_engine("postgresql+psycopg://", async_creator=connect,
                               poolclass=sa.NullPool)  # fmt: skip


@contextmanager
def sqlalchemy_session_kind(dsn: str) -> Iterator[Producing]:
    engine = _engine(dsn)
    with Session(engine) as session:
        yield SyncProducing(session, session.commit, session.rollback)
    engine.dispose()


@contextmanager
def sqlalchemy_connection_kind(dsn: str) -> Iterator[Producing]:
    engine = _engine(dsn)
    with engine.connect() as conn:
        yield SyncProducing(conn, conn.commit, conn.rollback)
    engine.dispose()


@contextmanager
def sqlalchemy_async_session_kind(dsn: str) -> Iterator[Producing]:
    engine = _async_engine(dsn)
    with asyncio.Runner() as runner:
        session = AsyncSession(engine)
        try:
            yield AsyncProducing(runner, session)
        finally:
            runner.run(session.close())
            runner.run(engine.dispose())


@contextmanager
def sqlalchemy_async_connection_kind(dsn: str) -> Iterator[Producing]:
    engine = _async_engine(dsn)
    with asyncio.Runner() as runner:
        conn = runner.run(engine.connect().start())
        try:
            yield AsyncProducing(runner, conn)
        finally:
            runner.run(conn.close())
            runner.run(engine.dispose())


def _django_connection(dsn: str) -> Any:
    """Django's default connection, pointed at ``dsn`` (configured once per process)."""
    import django
    from django.conf import settings
    from django.db import connection

    info = conninfo_to_dict(dsn)
    database = {"ENGINE": "django.db.backends.postgresql", "NAME": info["dbname"],
                "USER": info.get("user", ""), "HOST": info.get("host", ""),
                "PORT": info.get("port", "")}  # fmt: skip
    if not settings.configured:
        settings.configure(DATABASES={"default": database}, USE_TZ=True)
        django.setup()
    connection.close()
    connection.settings_dict.update(database)
    return connection


@contextmanager
def django_kind(dsn: str) -> Iterator[Producing]:
    """Django's ``connection`` inside ``transaction.atomic()``; commit leaves the block,
    rollback marks it and leaves it."""
    from django.db import transaction

    connection = _django_connection(dsn)
    blocks: list[Any] = []

    def begin() -> None:
        block = transaction.atomic()
        block.__enter__()
        blocks.append(block)

    def commit() -> None:
        blocks.pop().__exit__(None, None, None)
        begin()

    def rollback() -> None:
        transaction.set_rollback(True)
        commit()

    begin()
    try:
        yield SyncProducing(connection, commit, rollback)
    finally:
        transaction.set_rollback(True)
        blocks.pop().__exit__(None, None, None)
        connection.close()


KINDS: dict[str, Callable[[str], Any]] = {
    "psycopg": psycopg_kind,
    "asyncio": asyncio_kind,
    "sqlalchemy-session": sqlalchemy_session_kind,
    "sqlalchemy-connection": sqlalchemy_connection_kind,
    "sqlalchemy-async-session": sqlalchemy_async_session_kind,
    "sqlalchemy-async-connection": sqlalchemy_async_connection_kind,
    "django": django_kind,
}


@pytest.fixture
def migrated_dsn(dsn: str) -> str:
    migrate(dsn)
    return dsn


@pytest.fixture
def reference_dsn(pg_admin_dsn: str) -> Iterator[str]:
    name = f"trioq_reference_{os.getpid()}_{threading.get_ident()}"
    dsn = create_database(pg_admin_dsn, name)
    migrate(dsn)
    yield dsn
    drop_database(pg_admin_dsn, name)


def fetch(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def count_jobs(dsn: str) -> int:
    return int(fetch(dsn, "SELECT count(*) FROM trioq.jobs")[0][0])


# -- one script, every kind ---------------------------------------------------------------------


def script(p: Producing) -> list[Any]:
    """Every call of `trioq.producer`, with what each returned (ids included: a fresh
    database gives the same ids to the same calls)."""
    out: list[Any] = []
    first = p.call("enqueue", "mail", {"to": "a@example.com", "n": [1, None]}, queue="mail",
                   priority=3, max_attempts=4, concurrency_key="tenant-1")  # fmt: skip
    out.append(first)
    out.append(p.call("enqueue", "mail", {"to": "b"}, dedup_key="k1"))
    out.append(p.call("enqueue", "mail", {"to": "c"}, dedup_key="k1"))  # the twin's id
    out.append(p.call("enqueue", "report", {"d": 1}, unique=trioq.Unique(period=3600)))
    out.append(p.call("enqueue", "report", {"d": 1}, unique=trioq.Unique(period=3600)))
    out.append(p.call("enqueue", "later", None, delay=dt.timedelta(hours=1)))
    out.append(p.call("enqueue", "after", [1], after=[first.job_id]))
    # enqueue_many, by each of its statements: args only (bulk), COPY, unnest with keys.
    out.append(p.call("enqueue_many", [JobSpec(task="m", args=i) for i in range(3)]))
    out.append(p.call("enqueue_many", [JobSpec(task="m", args=i, queue=f"q{i}")
                                       for i in range(3)]))  # fmt: skip
    out.append(p.call("enqueue_many", [JobSpec(task="m", args=i, dedup_key=f"m{i % 2}")
                                       for i in range(3)]))  # fmt: skip
    out.append(p.call("enqueue_bulk", "bulk", [{"i": i} for i in range(5)], queue="b"))
    wf = trioq.Workflow()
    wf.add("fetch", JobSpec(task="fetch"))
    wf.add("parse", JobSpec(task="parse"), after=["fetch"])
    out.append(sorted(p.call("enqueue_workflow", wf).ids.items()))
    batch = trioq.Batch(jobs=[JobSpec(task="part", args=i) for i in range(2)],
                        callback=JobSpec(task="done"))  # fmt: skip
    out.append(p.call("enqueue_batch", batch).batch_id)
    out.append(p.call("signal", first.job_id, "approval", {"ok": True}))
    out.append(p.call("signal", first.job_id, "approval", {"ok": False}))  # duplicate
    out.append(p.call("signal", None, "poke", 7, task="mail", key="k1"))
    p.commit()
    return out


STATE = [
    "SELECT to_jsonb(j) FROM trioq.jobs j ORDER BY id",
    "SELECT to_jsonb(d) FROM trioq.job_dependencies d ORDER BY 1",
    "SELECT to_jsonb(b) FROM trioq.batches b ORDER BY 1",
    "SELECT to_jsonb(s) FROM trioq.job_signals s ORDER BY 1",
    "SELECT to_jsonb(u) - 'expires_at' FROM trioq.unique_keys u ORDER BY 1",
]


def state(dsn: str) -> list[Any]:
    """Every row the script can touch, less the times (they differ run to run)."""
    timeless = []
    for query in STATE:
        for (row,) in fetch(dsn, query):
            timeless.append({k: v for k, v in row.items()
                             if not k.endswith(("_at", "_since")) and k != "lease_expires"})
    return timeless


@pytest.mark.parametrize("kind", KINDS)
def test_every_call_leaves_the_rows_the_trio_path_leaves(
    kind: str, migrated_dsn: str, reference_dsn: str
) -> None:
    with trio_kind(reference_dsn) as reference:
        expected = script(reference)
    with KINDS[kind](migrated_dsn) as p:
        got = script(p)
    assert got == expected
    assert state(migrated_dsn) == state(reference_dsn)
    assert count_jobs(migrated_dsn) == 22  # the script is not vacuous


@pytest.mark.parametrize("kind", KINDS)
def test_rollback_enqueues_nothing_and_commit_enqueues(kind: str, migrated_dsn: str) -> None:
    with psycopg.connect(migrated_dsn, autocommit=True) as setup:
        setup.execute("CREATE TABLE orders (id int)")
    with KINDS[kind](migrated_dsn) as p:
        p.call("enqueue", "receipt", {"order": 1})
        p.call("enqueue_many", [JobSpec(task="m", args=i, queue=f"q{i}") for i in range(3)])
        p.call("enqueue_bulk", "b", [1, 2])
        p.rollback()
        assert count_jobs(migrated_dsn) == 0
        p.call("enqueue", "receipt", {"order": 2})
        assert count_jobs(migrated_dsn) == 0  # not before the commit
        p.commit()
    assert fetch(migrated_dsn, "SELECT task, args FROM trioq.jobs") == [("receipt", {"order": 2})]


# -- bad input: the trio path's errors, word for word -------------------------------------------

BAD: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("enqueue", ("",), {}),
    ("enqueue", ("t\x00",), {}),
    ("enqueue", ("t" * 300,), {}),
    ("enqueue", (7,), {}),
    ("enqueue", ("t", {"s": "\ud800"}), {}),
    ("enqueue", ("t", {"s": "a\x00b"}), {}),
    ("enqueue", ("t", float("nan")), {}),
    ("enqueue", ("t", {1, 2}), {}),
    ("enqueue", ("t", "x" * (1 << 20 + 1)), {}),
    ("enqueue", ("t",), {"queue": ""}),
    ("enqueue", ("t",), {"queue": "a b"}),
    ("enqueue", ("t",), {"priority": 2**40}),
    ("enqueue", ("t",), {"priority": "1"}),
    ("enqueue", ("t",), {"max_attempts": 0}),
    ("enqueue", ("t",), {"delay": -1}),
    ("enqueue", ("t",), {"delay": 1, "run_at": dt.datetime(2030, 1, 1, tzinfo=UTC)}),
    ("enqueue", ("t",), {"run_at": dt.datetime(2030, 1, 1)}),
    ("enqueue", ("t",), {"dedup_key": ""}),
    ("enqueue", ("t",), {"after": [0]}),
    ("enqueue", ("t",), {"after": [2**63]}),
    ("enqueue", ("t",), {"on_dependency_failure": "explode"}),
    ("enqueue", ("t",), {"bogus": 1}),
    ("enqueue_many", (["not a spec"],), {}),
    ("enqueue_bulk", ("t", "not a list"), {}),
    ("enqueue_bulk", ("t", [1, {"s": "\ud800"}]), {}),
    ("signal", (0, "n"), {}),
    ("signal", (1, ""), {}),
    ("signal", (None, "n"), {}),
    ("signal", (1, "n"), {"task": "t", "key": "k"}),
    ("signal", (1, "n", "x" * (1 << 21)), {}),
]


def _error(p: Producing, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    with pytest.raises(Exception) as info:
        p.call(name, *args, **kwargs)
    return f"{type(info.value).__name__}: {info.value}"


@pytest.mark.parametrize("kind", KINDS)
def test_bad_input_fails_with_the_trio_paths_words(
    kind: str, migrated_dsn: str, reference_dsn: str
) -> None:
    with trio_kind(reference_dsn) as reference:
        expected = [_error(reference, *case) for case in BAD]
    with KINDS[kind](migrated_dsn) as p:
        got = [_error(p, *case) for case in BAD]
    for case, want, have in zip(BAD, expected, got, strict=True):
        assert have == want, case
    assert len(set(expected)) > 20  # distinct errors, not one generic failure
    assert count_jobs(migrated_dsn) == 0


def test_a_signal_to_an_unknown_job_is_the_trio_paths_error(migrated_dsn: str) -> None:
    with psycopg.connect(migrated_dsn) as conn, pytest.raises(trioq.JobNotFoundError,
                                                              match="job 999"):
        producer.signal(conn, 999, "approval")


# -- the connection itself ----------------------------------------------------------------------


def test_the_wrong_kind_of_connection_says_what_is_taken(migrated_dsn: str) -> None:
    with psycopg.connect(migrated_dsn) as conn, pytest.raises(TypeError,
                                                              match="is a sync connection"):
        asyncio.run(cast(Any, producer.aenqueue(conn, "t")))
    with pytest.raises(TypeError, match=r"conn must be a psycopg\.Connection, a SQLAlchemy"):
        producer.enqueue(object(), "t")
    with pytest.raises(TypeError, match=r"conn must be a psycopg\.AsyncConnection"):
        asyncio.run(cast(Any, producer.aenqueue("dbname=x", "t")))

    async def async_on_sync() -> None:
        async with await psycopg.AsyncConnection.connect(migrated_dsn) as aconn:
            with pytest.raises(TypeError, match="is an async connection: await"):
                producer.enqueue(aconn, "t")

    asyncio.run(async_on_sync())
    engine = _async_engine(migrated_dsn)

    async def sqlalchemy_async_on_sync() -> None:
        async with AsyncSession(engine) as session:
            with pytest.raises(TypeError, match="is an async connection: await"):
                producer.enqueue(session, "t")
        await engine.dispose()

    asyncio.run(sqlalchemy_async_on_sync())
    assert count_jobs(migrated_dsn) == 0


def test_the_callers_cursor_factory_and_loaders_do_not_matter(migrated_dsn: str) -> None:
    """A client-side binding cursor (Django's), a raw cursor (``$1`` placeholders) and a
    ``jsonb`` loader that returns text change nothing."""
    from psycopg.types.string import TextLoader

    with psycopg.connect(migrated_dsn, cursor_factory=psycopg.RawCursor) as conn:
        conn.adapters.register_loader("jsonb", TextLoader)
        conn.adapters.register_loader("int8", TextLoader)
        first = producer.enqueue(conn, "t", {"a": 1}, dedup_key="x")
        assert producer.enqueue(conn, "t", {"a": 2}, dedup_key="x") == trioq.EnqueueResult(
            first.job_id, duplicate=True
        )
        assert producer.enqueue_many(conn, [JobSpec(task="m", queue=f"q{i}") for i in range(2)])
        conn.commit()
    with psycopg.connect(migrated_dsn, cursor_factory=psycopg.ClientCursor) as conn:
        assert producer.signal(conn, first.job_id, "n", {"deep": [[["x"]]]}) == "stored"
        conn.commit()
    assert count_jobs(migrated_dsn) == 3


@pytest.mark.parametrize("row_factory", [dict_row, namedtuple_row])
def test_the_callers_row_factory_does_not_matter(migrated_dsn: str, row_factory: Any) -> None:
    """trioq reads its rows by position: with ``dict_row`` every call failed (``KeyError``)."""
    with psycopg.connect(migrated_dsn, row_factory=row_factory) as conn:
        first = producer.enqueue(conn, "t", {"a": 1}, dedup_key="x")
        assert producer.enqueue(conn, "t", {"a": 2}, dedup_key="x").duplicate
        assert len(producer.enqueue_many(conn, [JobSpec(task="m") for _ in range(2)])) == 2
        assert len(producer.enqueue_bulk(conn, "b", [{}, {}])) == 2
        conn.commit()

    async def on_asyncio() -> trioq.EnqueueResult:
        async with await psycopg.AsyncConnection.connect(
            migrated_dsn, row_factory=row_factory, autocommit=True
        ) as conn:
            return await producer.aenqueue(conn, "t", after=[first.job_id])

    assert asyncio.run(on_asyncio()).job_id > first.job_id
    assert count_jobs(migrated_dsn) == 6


def test_an_autocommit_connection_gets_one_transaction_per_call(migrated_dsn: str) -> None:
    """A workflow on an autocommit connection is all or nothing: its jobs go in, then its
    edges fail (a trigger refuses them), and the jobs are gone too."""
    with psycopg.connect(migrated_dsn, autocommit=True) as conn:
        conn.execute("""
            CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS
            $$ BEGIN RAISE EXCEPTION 'no edges today'; END $$;
            CREATE TRIGGER refuse BEFORE INSERT ON trioq.job_dependencies
            FOR EACH ROW EXECUTE FUNCTION refuse();
        """)
        wf = trioq.Workflow()
        wf.add("a", JobSpec(task="a"))
        wf.add("b", JobSpec(task="b"), after=["a"])
        with pytest.raises(psycopg.errors.RaiseException, match="no edges today"):
            producer.enqueue_workflow(conn, wf)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert producer.enqueue(conn, "alone").job_id > 0
    assert [t for (t,) in fetch(migrated_dsn, "SELECT task FROM trioq.jobs")] == ["alone"]


def test_the_schema_version_is_checked_once_per_connection(migrated_dsn: str) -> None:
    with psycopg.connect(migrated_dsn) as conn:
        producer.enqueue(conn, "t")
        conn.execute("INSERT INTO trioq.migrations VALUES (999, 'from the future')")
        producer.enqueue(conn, "t")  # still the checked connection
        conn.commit()
    with psycopg.connect(migrated_dsn) as conn, pytest.raises(trioq.SchemaTooNewError):
        producer.enqueue(conn, "t")


def test_a_commit_wakes_listening_workers(migrated_dsn: str) -> None:
    """The wake-up notification goes out with the commit, on the trio path's channel."""
    with psycopg.connect(migrated_dsn, autocommit=True) as listener:
        listener.execute("LISTEN trioq_trioq")
        with psycopg.connect(migrated_dsn) as conn:
            producer.enqueue(conn, "t", queue="mail")
            assert list(listener.notifies(timeout=0.2, stop_after=1)) == []
            conn.commit()
        got = list(listener.notifies(timeout=10, stop_after=1))
    assert [(n.channel, n.payload) for n in got] == [("trioq_trioq", "mail")]


def test_the_callers_span_becomes_the_jobs_parent(migrated_dsn: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("view") as span, psycopg.connect(migrated_dsn) as conn:
        producer.enqueue(conn, "traced")
        conn.commit()
        trace_id = format(span.get_span_context().trace_id, "032x")
    assert trace.get_current_span() is trace.INVALID_SPAN
    [(context,)] = fetch(migrated_dsn, "SELECT trace_context FROM trioq.jobs")
    assert context["traceparent"].split("-")[1] == trace_id


# -- dedup races between kinds -----------------------------------------------------------------


@pytest.mark.parametrize("first_commits", [True, False])
def test_two_kinds_racing_for_a_dedup_key_make_one_job(
    migrated_dsn: str, first_commits: bool
) -> None:
    """A sync producer holds the key in an open transaction; an asyncio producer's enqueue of
    the same key waits for it (seen waiting in pg_stat_activity), then finds the twin (first
    commits) or inserts its own (first rolls back)."""
    results: queue_module.Queue[Any] = queue_module.Queue()

    async def second() -> trioq.EnqueueResult:
        async with await psycopg.AsyncConnection.connect(migrated_dsn) as conn:
            await conn.execute("SET application_name = 'second-producer'")
            got = await producer.aenqueue(conn, "t", "second", dedup_key="race")
            await conn.commit()
            return got

    with psycopg.connect(migrated_dsn) as conn:
        held = producer.enqueue(conn, "t", "first", dedup_key="race")
        thread = threading.Thread(target=lambda: results.put(asyncio.run(second())))
        thread.start()
        with psycopg.connect(migrated_dsn, autocommit=True) as watcher:
            poll_query(watcher, "SELECT 1 FROM pg_stat_activity WHERE application_name = "
                       "'second-producer' AND wait_event_type = 'Lock'")  # fmt: skip
        conn.commit() if first_commits else conn.rollback()
        thread.join(30)
    got = results.get_nowait()
    rows = fetch(migrated_dsn, "SELECT id, args FROM trioq.jobs")
    if first_commits:
        assert got == trioq.EnqueueResult(held.job_id, duplicate=True)
        assert rows == [(held.job_id, "first")]
    else:
        assert not got.duplicate
        assert rows == [(got.job_id, "second")]


# -- run by a worker ------------------------------------------------------------------------


def test_a_job_enqueued_from_sync_code_runs_on_a_trio_worker(migrated_dsn: str) -> None:
    registry = trioq.Registry()
    seen: list[Any] = []

    @registry.task(name="receipt")
    async def receipt(job: trioq.JobContext, order: int) -> int:
        seen.append(order)
        return order * 2

    with psycopg.connect(migrated_dsn) as conn:
        job = producer.enqueue(conn, "receipt", {"order": 7})
        conn.commit()

    async def work() -> None:
        from trioq.testing import drain

        async with await trioq.connect(migrated_dsn, autocommit=True) as tconn:
            result = await drain(tconn, registry)
            assert result.completed == 1

    trio.run(work)
    assert seen == [7]
    assert job.job_id > 0


def test_a_producer_imports_no_trio(migrated_dsn: str) -> None:
    """`import trioq.producer` (a Django or Flask process) imports no trio: the names that
    need it are imported on first use (trioq._trio_api); and enqueueing does not need it."""
    import subprocess
    import sys

    code = (
        "import sys, psycopg\n"
        "from trioq import producer\n"
        "with psycopg.connect(sys.argv[1]) as conn:\n"
        "    print(producer.enqueue(conn, 'no_trio', {'a': 1}).job_id)\n"
        "assert 'trio' not in sys.modules, sorted(m for m in sys.modules if 'trio' in m)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, migrated_dsn],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (job_id,) = fetch(migrated_dsn, "SELECT id FROM trioq.jobs WHERE task = 'no_trio'")[0]
    assert done.stdout.split() == [str(job_id)]
