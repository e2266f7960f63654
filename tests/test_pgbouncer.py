"""trioq through a real PgBouncer 1.18 in transaction mode (docs/pooling.md).

First what breaks through the pooler, reproduced (so the docs' claims are facts): LISTEN
hears nothing and leaks, a session advisory lock outlives its client, psycopg's named
prepared statements collide. Then the runtime with its pools through the pooler and its
session-level work (LISTEN, the liveness lock) on the direct DSN, a runtime without a
session DSN (it drains by polling), and `trioq stress` through the pooler, verified.
"""

from __future__ import annotations

import json
import pathlib
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio
from clitool import TESTS, cli_env, trioq_cli
from helpers import FAST, assert_missing_fails, poll_until, rows, scalar, wait_until
from pgbouncer import Bouncer, pgbouncer_binary, running_pgbouncer
from psycopg.conninfo import make_conninfo

import trioq
from trioq._db.migrate import latest_version
from trioq._worker.pooling import (
    PSYCOPG_PREPARE_THRESHOLD,
    SESSION_DSN_VAR,
    prepare_threshold,
    session_dsn,
)
from trioq._worker.services import liveness as liveness_service

DIRECT_APP, POOLED_APP = "trioq-test-direct", "trioq-test-pooled"


@pytest.fixture
def bouncer(pg_admin_dsn: str) -> Iterator[Bouncer]:
    """Every client shares one server connection: what one session leaves, the next sees."""
    with running_pgbouncer(pg_admin_dsn, pool_size=1) as running:
        yield running


@pytest.fixture
def wide_bouncer(pg_admin_dsn: str) -> Iterator[Bouncer]:
    """Four server connections for the runtime's eighteen clients (as in production: fewer
    server connections than clients, each client's transactions on any of them)."""
    with running_pgbouncer(pg_admin_dsn, pool_size=4) as running:
        yield running


def test_without_pgbouncer_the_tests_fail_and_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing pooler is a failure (a skipped test is not a passing one), unless asked."""
    monkeypatch.setattr(sys.modules["pgbouncer"], "PGBOUNCER", pathlib.Path("/nonexistent/x"))
    assert_missing_fails(monkeypatch, pgbouncer_binary, skip_var="TRIOQ_SKIP_PGBOUNCER_TESTS",
                         match=r"apt-get install -y pgbouncer")  # fmt: skip


# -- what breaks through a transaction-mode pooler -----------------------------------------------


def _sync(dsn: str, **kwargs: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True, **kwargs)


def test_listen_through_the_pooler_hears_nothing_and_leaks(dsn: str, bouncer: Bouncer) -> None:
    heard: list[psycopg.Notify] = []
    with _sync(bouncer.dsn(dsn)) as listener, _sync(bouncer.dsn(dsn)) as other, _sync(
        dsn
    ) as direct:
        listener.add_notify_handler(heard.append)
        listener.execute("LISTEN trioq_pool_test")
        # The LISTEN stayed on the server connection, which the next client gets.
        found = other.execute("SELECT array(SELECT pg_listening_channels())").fetchone()
        assert found == (["trioq_pool_test"],)
        direct.execute("NOTIFY trioq_pool_test, 'hello'")
        # It reached the server connection while no client was linked to it: dropped.
        log = bouncer.log

        def dropped() -> bool:
            return "when not linked" in log.read_text(errors="replace")

        poll_until(dropped, timeout=10, what="PgBouncer to drop the notification")
        listener.execute("SELECT 1")
        assert heard == []
    # The same, direct: heard (so the test above can tell the difference).
    with _sync(dsn) as listener, _sync(dsn) as direct:
        listener.add_notify_handler(heard.append)
        listener.execute("LISTEN trioq_pool_test")
        direct.execute("NOTIFY trioq_pool_test, 'hello'")
        listener.execute("SELECT 1")
        assert [n.payload for n in heard] == ["hello"]


def test_a_session_lock_through_the_pooler_outlives_its_client(
    dsn: str, bouncer: Bouncer
) -> None:
    """The liveness lock's failure: a worker that died through the pooler stays 'alive'."""
    with _sync(bouncer.dsn(dsn)) as worker:
        worker.execute("SELECT pg_advisory_lock(4242, 7)")
    with _sync(dsn) as sweeper:  # the 'worker' is gone; its lock is not
        assert sweeper.execute("SELECT pg_try_advisory_lock(4242, 7)").fetchone() == (False,)
    with _sync(dsn) as worker:  # direct: the lock goes with the connection
        worker.execute("SELECT pg_advisory_lock(4242, 8)")
    with _sync(dsn) as sweeper:
        assert sweeper.execute("SELECT pg_try_advisory_lock(4242, 8)").fetchone() == (True,)


def test_prepared_statements_of_two_clients_collide_through_the_pooler(
    dsn: str, bouncer: Bouncer
) -> None:
    """psycopg names its statements _pg3_0, _pg3_1, ... per connection; through one shared
    server connection the second client's _pg3_0 already exists. Unprepared: fine."""
    runs = PSYCOPG_PREPARE_THRESHOLD + 1
    with _sync(bouncer.dsn(dsn)) as first, _sync(bouncer.dsn(dsn)) as second:
        for _ in range(runs):
            first.execute("SELECT %s::int", (1,))
        with pytest.raises(psycopg.errors.DuplicatePreparedStatement, match="_pg3_0"):
            for _ in range(runs):
                second.execute("SELECT %s::text", ("x",))
    threshold: dict[str, Any] = {"prepare_threshold": None}
    with _sync(bouncer.dsn(dsn), **threshold) as first, _sync(
        bouncer.dsn(dsn), **threshold
    ) as second:
        for _ in range(runs):
            first.execute("SELECT %s::int", (1,))
            second.execute("SELECT %s::text", ("x",))


async def test_migrate_through_the_pooler(dsn: str, bouncer: Bouncer) -> None:
    """The migration lock is a transaction lock: it works through the pooler too."""
    async with await trioq.connect(bouncer.dsn(dsn), autocommit=True,
                                   prepare_threshold=None) as conn:  # fmt: skip
        result = await trioq.migrate(conn)
        assert result.version == latest_version()
        assert (await trioq.migrate(conn)).version == latest_version()


# -- the runtime through the pooler --------------------------------------------------------------


def _named(dsn: str, app: str) -> str:
    return make_conninfo(dsn, application_name=app)


@asynccontextmanager
async def _serving(
    dsn: str, pooled: str, registry: trioq.Registry, **options: Any
) -> AsyncIterator[tuple[Any, Any, trioq.Runtime]]:
    """Migrated (direct), a runtime whose pools go through ``pooled``, a pooled connection
    (unprepared, for enqueues) and a direct one (for looking)."""
    config = trioq.Config(dsn=_named(pooled, POOLED_APP), registry=registry,
                          **{**FAST, **options})  # fmt: skip
    async with await trioq.connect(dsn, autocommit=True) as direct:
        await trioq.migrate(direct)
        async with await trioq.connect(
            pooled, autocommit=True, prepare_threshold=None
        ) as conn:
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    runtime: trioq.Runtime = await nursery.start(trioq.serve, config)
                    try:
                        yield conn, direct, runtime
                    finally:
                        runtime.stop()


async def test_jobs_run_through_the_pooler_with_session_work_direct(
    dsn: str, wide_bouncer: Bouncer
) -> None:
    """Enqueue, claim, complete, fail (retried, then dead), heartbeats: all through PgBouncer,
    unprepared; the LISTEN and the liveness lock on the direct DSN."""
    tasks = trioq.Registry()
    release = trio.Event()

    @tasks.task
    async def add(job: trioq.JobContext, a: int) -> int:
        await job.enqueue("echo", {"a": a})  # a handler's enqueue: through the pooler too
        return a + 1

    @tasks.task
    async def echo(job: trioq.JobContext, a: int) -> None:
        pass

    @tasks.task(max_attempts=2, retry=trioq.retry.Constant(seconds=0))
    async def broken(job: trioq.JobContext) -> None:
        raise RuntimeError(f"attempt {job.attempt}")

    @tasks.task
    async def long(job: trioq.JobContext) -> None:
        await release.wait()

    pooled = wide_bouncer.dsn(dsn)
    session = _named(dsn, DIRECT_APP)
    async with _serving(dsn, pooled, tasks, session_dsn=session) as (conn, direct, runtime):
        assert runtime.pool.statistics().max_size == 8
        async with runtime.pool.connection() as pooled_conn:
            assert pooled_conn.prepare_threshold is None
            # no session setting through the pooler (it would reach its other clients)
            assert await rows(pooled_conn, "SHOW plan_cache_mode") == [("auto",)]
        held = await long.enqueue(conn)
        for i in range(60):
            await add.enqueue(conn, a=i)
        await broken.enqueue(conn)

        async def heartbeats() -> bool:  # the lease was extended twice while it runs
            first = await scalar(direct, "SELECT lease_expires_at FROM trioq.jobs WHERE id = %s",
                                 held.job_id)  # fmt: skip
            if first is None:
                return False
            await wait_until(lambda: _extended(direct, held.job_id, first))
            return True

        await wait_until(heartbeats)
        release.set()
        await wait_until(lambda: _settled(direct), timeout=30)
        done = await rows(direct, "SELECT task, count(*) FROM trioq.jobs WHERE state = 'done'"
                                  " GROUP BY task ORDER BY task")  # fmt: skip
        assert done in ([], [("add", 60), ("echo", 60), ("long", 1)])  # kept or pruned
        dead = await rows(direct, "SELECT task, attempt, last_error FROM trioq.dead_jobs")
        assert dead == [("broken", 2, "RuntimeError: attempt 2")]
        # Session-level work is on the direct connections, never the pooler's.
        apps = await rows(direct, _SESSION_WORK, runtime.queue.sql.lock_space)
        assert apps == [(DIRECT_APP, DIRECT_APP)]


_SESSION_WORK = """
SELECT (SELECT a.application_name FROM pg_stat_activity a
         WHERE a.datname = current_database() AND a.query LIKE 'LISTEN %%'),
       (SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'advisory' AND l.granted
           AND l.classid::int = hashtext(%s) AND l.objsubid = 2)
"""


async def _extended(conn: Any, job_id: int, first: Any) -> bool:
    now = await scalar(conn, "SELECT lease_expires_at FROM trioq.jobs WHERE id = %s", job_id)
    return bool(now is not None and (now - first).total_seconds() >= 2 * FAST["heartbeat_interval"])


async def _settled(conn: Any) -> bool:
    left = await scalar(conn, "SELECT count(*) FROM trioq.jobs WHERE state <> 'done'")
    return bool(left == 0)


async def test_without_a_session_dsn_a_worker_still_drains_by_polling(
    dsn: str, wide_bouncer: Bouncer
) -> None:
    """Everything through the pooler: its LISTEN hears nothing, so it drains by polling
    (``poll_interval``); the decision in docs/pooling.md."""
    tasks = trioq.Registry()

    @tasks.task
    async def noop(job: trioq.JobContext, i: int) -> None:
        pass

    options: dict[str, Any] = {"prepared_statements": False, "poll_interval": 0.2}
    async with _serving(dsn, wide_bouncer.dsn(dsn), tasks, **options) as (conn, direct, _):
        for i in range(20):
            await noop.enqueue(conn, i=i)
        await wait_until(lambda: _settled(direct), timeout=30)
        left = await scalar(direct, "SELECT count(*) FROM trioq.jobs WHERE state <> 'done'")
        assert left == 0


async def test_a_handler_holding_the_only_server_connection_does_not_make_its_worker_dead(
    dsn: str, bouncer: Bouncer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Everything through a pooler with one server connection, no session DSN: the liveness
    lock sits on that server session, and a handler's transaction holds it for 10 s, so no
    ping gets through. Before: the sweeper's try-lock could land on the lock's own session
    (advisory locks are re-entrant), take the worker for dead and return its job
    (``tests/test_services.py`` shows that one directly). Now its job completes once and
    the worker goes on serving."""
    tasks = trioq.Registry()

    @tasks.task(max_attempts=1)
    async def hog(job: trioq.JobContext) -> None:
        async with job.transaction() as tx:
            await tx.execute("SELECT pg_sleep(10)")
            await tx.execute("INSERT INTO effects VALUES (%s)", (job.id,))

    @tasks.task
    async def quick(job: trioq.JobContext, i: int) -> None:
        async with job.transaction() as tx:
            await tx.execute("INSERT INTO effects VALUES (%s)", (job.id,))

    options: dict[str, Any] = {"prepared_statements": False, "lease": 30,
                               "heartbeat_interval": 5}  # fmt: skip
    # The liveness connection pings its row every interval here (an idle worker's writes it
    # every 10 s), so that it executes its ping often enough for psycopg to prepare it.
    monkeypatch.setattr(liveness_service, "ROW_EVERY", 0.0)
    async with await trioq.connect(dsn, autocommit=True) as direct:
        await direct.execute("CREATE TABLE effects (job_id bigint)")
    async with _serving(dsn, bouncer.dsn(dsn), tasks, **options) as (conn, direct, runtime):
        # One server session serves every client: nothing may prepare statements on it (the
        # liveness connection did, ignoring prepared_statements=False: once its client
        # reconnected, its ping hit DuplicatePreparedStatement and the worker exited).
        await trio.sleep(3)  # six liveness pings: psycopg prepares a statement at its fifth
        assert await scalar(conn, "SELECT count(*) FROM pg_prepared_statements") == 0
        hogged = await hog.enqueue(conn)
        await wait_until(lambda: _sleeping(direct), timeout=20)
        await trio.sleep(10)  # the handler holds the only server connection meanwhile
        quick_ids = [(await quick.enqueue(conn, i=i)).job_id for i in range(5)]
        await wait_until(lambda: _settled(direct), timeout=30)
        assert await scalar(direct, "SELECT count(*) FROM trioq.dead_jobs") == 0
        effects = await rows(direct, "SELECT job_id FROM effects ORDER BY job_id")
        assert effects == [(job_id,) for job_id in sorted([hogged.job_id, *quick_ids])]
        assert runtime.statistics().stopping is False


async def _sleeping(conn: Any) -> bool:
    found = await scalar(
        conn, "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(10)'"
    )
    return bool(found)


@pytest.mark.parametrize("transactions", ["own", "one-shared"])
def test_stress_through_the_pooler_loses_nothing(
    dsn: str, pg_admin_dsn: str, tmp_path: pathlib.Path, transactions: str
) -> None:
    """`trioq stress`: 2 worker processes whose pools go through PgBouncer (10 server
    connections for their 36 clients), LISTEN and liveness direct; verified. ``one-shared``:
    the ledger rows through ``job.complete_with(..., shared=True)``, batches of jobs in one
    pipelined transaction each."""
    path = tmp_path / "report.json"
    with running_pgbouncer(pg_admin_dsn, pool_size=10) as bouncer:
        out = trioq_cli(
            "stress", "--dsn", dsn, "--pooler-dsn", bouncer.dsn(dsn), "--jobs", "3000",
            "--processes", "2", "--transactions", transactions, "--quiet", "--json",
            str(path), timeout=120,
        )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(path.read_text())
    v = report["verification"]
    assert v["passed"] is True, v
    assert (v["enqueued"], v["completed"]) == (3000, 3000)
    assert (v["lost"], v["duplicate_completions"], v["dead"], v["phantoms"]) == (0, 0, 0, 0)
    assert f"127.0.0.1:{bouncer.port}" in report["database"]["pooler"]
    assert "pooler:" in out.stdout or report["database"]["pooler"]


def test_stress_pooler_dsn_needs_a_dsn() -> None:
    out = trioq_cli("stress", "--pooler-dsn", "postgresql://x@127.0.0.1:1/x", "--jobs", "1")
    assert out.returncode == 1
    assert "--pooler-dsn needs --dsn" in out.stderr


def test_serve_processes_keep_session_work_on_the_session_dsn(
    dsn: str, wide_bouncer: Bouncer
) -> None:
    """``trioq serve --processes 2 --dsn POOLER --session-dsn DIRECT --migrate``: the
    supervisor hands both DSNs to its workers; each one's LISTEN and liveness lock are
    direct; SIGTERM stops them cleanly."""
    pooled, session = _named(wide_bouncer.dsn(dsn), POOLED_APP), _named(dsn, DIRECT_APP)
    argv = [sys.executable, "-m", "trioq._cli", "serve", "--app", "serve_app:config",
            "--migrate", "--processes", "2", "--dsn", pooled, "--session-dsn", session]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=TESTS, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        with _sync(dsn) as direct:

            def listening_directly() -> bool:
                found = direct.execute(_DIRECT_SESSIONS, {"app": DIRECT_APP}).fetchone()
                return found == (2, 2)

            poll_until(listening_directly, timeout=60, what="both workers to listen directly")
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, output
        assert "s3cret" not in output
    finally:  # on a failure: SIGTERM, so the supervisor stops its workers (a SIGKILLed
        if proc.poll() is None:  # supervisor leaves them running, in sessions of their own)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


_DIRECT_SESSIONS = """
SELECT count(*) FILTER (WHERE query LIKE 'LISTEN %%'),
       (SELECT count(*) FROM pg_locks l JOIN pg_stat_activity b ON b.pid = l.pid
         WHERE l.locktype = 'advisory' AND l.granted AND b.application_name = %(app)s)
  FROM pg_stat_activity a
 WHERE a.datname = current_database() AND a.application_name = %(app)s
"""


def test_serve_names_a_bad_session_dsn(dsn: str) -> None:
    out = trioq_cli("serve", "--app", "serve_app:config", "--dsn", dsn,
                    "--session-dsn", "postgresql://u:s3cret@h/db?bogus=1")  # fmt: skip
    assert out.returncode != 0
    assert "--session-dsn is invalid" in out.stderr
    assert "s3cret" not in out.stderr + out.stdout


def test_session_dsn_and_prepared_statements_resolve(dsn: str) -> None:
    registry = trioq.Registry()
    plain = trioq.Config(registry=registry, dsn=dsn)
    assert session_dsn(plain, dsn, {}) == dsn
    assert prepare_threshold(plain, dsn, dsn) == PSYCOPG_PREPARE_THRESHOLD
    assert session_dsn(plain, dsn, {SESSION_DSN_VAR: "postgresql://db/x"}) == "postgresql://db/x"
    embedded = trioq.Config(registry=registry)  # no DSN anywhere: the embedded server's
    assert session_dsn(embedded, "postgresql://e/x", {SESSION_DSN_VAR: "postgresql://db/x"}) \
        == "postgresql://e/x"
    with pytest.raises(ValueError, match=r"\$TRIOQ_SESSION_DSN is invalid"):
        session_dsn(plain, dsn, {SESSION_DSN_VAR: "postgresql://h/x?bogus=1"})
    pooled = trioq.Config(registry=registry, dsn="postgresql://pgb:6432/x", session_dsn=dsn)
    assert session_dsn(pooled, "postgresql://pgb:6432/x", {SESSION_DSN_VAR: "x"}) == dsn
    assert prepare_threshold(pooled, "postgresql://pgb:6432/x", dsn) is None  # a pooler: off
    forced = trioq.Config(registry=registry, dsn=dsn, prepared_statements=True, session_dsn=dsn)
    assert prepare_threshold(forced, "postgresql://pgb:6432/x", dsn) == PSYCOPG_PREPARE_THRESHOLD
    off = trioq.Config(registry=registry, prepared_statements=False)
    assert prepare_threshold(off, dsn, dsn) is None


def test_an_unreachable_session_dsn_is_an_error_without_its_password(dsn: str) -> None:
    """The session DSN is tried when `serve` starts (the listener and liveness must work):
    a wrong one stops it, saying where it could not connect, never with the password."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        trioq_cli("migrate", "--dsn", dsn)
        assert conn.execute("SELECT to_regclass('trioq.jobs') IS NOT NULL").fetchone() == (True,)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = trioq_cli("serve", "--app", "serve_app:config", "--dsn", dsn, "--session-dsn",
                    f"postgresql://u:s3cret@127.0.0.1:{port}/db?connect_timeout=2")  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"cannot connect to postgresql://u@127.0.0.1:{port}/db" in out.stderr
    assert "s3cret" not in out.stderr + out.stdout
