"""A live worker is never taken for dead (issue 22).

Death needs two pieces of evidence that one flaky connection cannot fake: the worker's row
has not been pinged for longer than ``liveness_grace`` through *any* channel (its liveness
connection, or its pool), and no session at all holds its liveness lock. Each test below
breaks one channel and shows the worker keeps its jobs; ``docs/guarantees.md`` has the
argument, and what a database cannot tell apart (a SIGSTOPped worker whose connection is
cut looks dead: its jobs are taken, and the worker that wakes writes nothing for them).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio
from clitool import ServeProcess, trioq_cli
from helpers import rows, scalar, serving, wait_until
from psycopg import sql

import trioq
from trioq._worker.services.liveness import Liveness


async def liveness_pids(conn: Any, schema: str = "trioq") -> list[int]:
    """The backends that hold a worker's liveness lock in this database."""
    found = await rows(
        conn,
        "SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted"
        "   AND l.classid = hashtext(%s)::oid"
        "   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        f"trioq.worker:{schema}",
    )
    return [pid for (pid,) in found]


def holding_registry(started: list[int], release: trio.Event) -> trioq.Registry:
    """A task whose handler records its run, then waits for ``release``; one attempt."""
    tasks = trioq.Registry()

    @tasks.task(name="hold", max_attempts=1)
    async def hold(job: trioq.JobContext) -> None:
        started.append(job.id)
        await release.wait()

    return tasks


async def test_a_worker_whose_liveness_connection_is_cut_while_connections_are_refused(
    dsn: str, pg_admin_dsn: str
) -> None:
    """Its liveness connection is terminated and no new connection is accepted for 5 s: its
    lock is free and it cannot reconnect to ping, but its pool works. Before: its own sweeper
    took it for dead 0.55 s in and its one-attempt jobs went to dead_jobs. Its row's last
    write is older than the grace when the connection is cut: a sweeper that judged on the
    spot, without suspecting first, takes it for dead."""
    started: list[int] = []
    release = trio.Event()
    async with serving(dsn, holding_registry(started, release), lease=30,
                       heartbeat_interval=5) as (conn, runtime):  # fmt: skip
        ids = [(await trioq.enqueue(conn, "hold")).job_id for _ in range(3)]
        await wait_until(lambda: _true(len(started) == 3))
        # An idle worker writes its row every few seconds: cut it once the last write is
        # older than the grace, so that only the suspicion's grace can save it.
        await wait_until(lambda: _seen_before(conn, runtime.config.liveness_grace))
        (pid,) = await liveness_pids(conn)
        async with refused(pg_admin_dsn, await scalar(conn, "SELECT current_database()")):
            await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            await trio.sleep(5)  # the fault: 5 s without new connections
            assert await rows(conn, "SELECT id, state FROM trioq.jobs ORDER BY id") == [
                (job_id, "running") for job_id in ids
            ]
            assert await scalar(conn, "SELECT count(*) FROM trioq.dead_jobs") == 0
        await wait_until(lambda: _locked(conn))  # the liveness connection is back
        release.set()
        await wait_until(lambda: _done(conn))
    assert sorted(started) == ids  # each ran once: none was returned and run again
    assert runtime.statistics().outcomes_written == 3


@asynccontextmanager
async def refused(admin_dsn: str, database: str) -> AsyncIterator[None]:
    """No new connection to ``database`` for the block (existing ones go on)."""
    name = sql.Identifier(database)
    async with await trioq.connect(admin_dsn, autocommit=True) as admin:
        await admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(name))
        try:
            yield
        finally:
            with trio.move_on_after(10, shield=True):
                await admin.execute(
                    sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(name)
                )


async def _true(value: bool) -> bool:
    await trio.lowlevel.checkpoint()
    return value


async def _locked(conn: Any) -> bool:
    return len(await liveness_pids(conn)) == 1


async def _seen_before(conn: Any, seconds: float) -> bool:
    age = await scalar(conn, "SELECT extract(epoch FROM now() - max(seen_at))::float"
                       " FROM trioq.workers")  # fmt: skip
    return bool(age > seconds)


async def _done(conn: Any) -> bool:
    return bool(await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0)


def test_a_stopped_worker_whose_connection_is_cut_loses_its_jobs_and_writes_nothing(
    dsn: str,
) -> None:
    """A SIGSTOPped worker (a GC pause, a VM stall) whose connections are cut looks dead to
    the database: another worker takes its jobs after the grace and runs them. When it
    wakes, it finds itself taken for dead and stops those handlers at once: none of them
    runs on to write anything (their heartbeat is 20 s away and they would wake 8 s in),
    and every effect commits once."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE woke (job_id bigint, attempt int, pid int)")
        conn.execute("CREATE TABLE effects (job_id bigint, attempt int, pid int)")
    assert trioq_cli("migrate", "--dsn", dsn).returncode == 0
    first = ServeProcess(["--app", "liveness_app:config", "--dsn", dsn])
    second: ServeProcess | None = None
    try:
        first.read_until("started")
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(3):
                conn.execute("INSERT INTO trioq.jobs (task, queue, args) VALUES ('effect', "
                             "'default', '{\"first_seconds\": 8}')")  # fmt: skip
            conn.execute("SELECT pg_notify('trioq_trioq', 'default')")
            _poll(conn, "SELECT count(*) = 3 FROM trioq.jobs WHERE state = 'running'")
            backends = [pid for (pid,) in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()").fetchall()]  # fmt: skip
            os.kill(first.proc.pid, signal.SIGSTOP)
            try:
                for pid in backends:
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                second = ServeProcess(["--app", "liveness_app:config", "--dsn", dsn])
                _poll(conn, "SELECT count(*) = 3 FROM effects", timeout=30)
            finally:
                os.kill(first.proc.pid, signal.SIGCONT)
            first.read_until("taken for dead", timeout=10)
            first.read_until("lost its lease", timeout=5)
            _poll(conn, "SELECT count(*) = 0 FROM trioq.jobs", timeout=30)
            assert conn.execute("SELECT pid FROM woke WHERE pid = %s",
                                (first.proc.pid,)).fetchall() == []  # fmt: skip
            effects = conn.execute("SELECT job_id, attempt, pid FROM effects").fetchall()
            assert len({job_id for job_id, _, _ in effects}) == 3 and len(effects) == 3
            assert {(attempt, pid) for _, attempt, pid in effects} == {(2, second.proc.pid)}
        assert first.proc.poll() is None  # it goes on serving
    finally:
        first.kill()
        if second is not None:
            second.kill()


def _poll(conn: psycopg.Connection[Any], query: str, timeout: float = 10) -> None:
    """Until ``query`` is true (the processes cannot tell the test), bounded."""
    deadline = time.monotonic() + timeout
    while not conn.execute(query).fetchone()[0]:  # type: ignore[index]
        assert time.monotonic() < deadline, f"{query!r} still false after {timeout} s"
        time.sleep(0.05)


async def test_the_pool_pings_only_while_the_liveness_connection_does_not(
    dsn: str, pg_admin_dsn: str
) -> None:
    """The pool is the fallback channel: while the liveness connection pings on time it
    sends nothing (an idle worker's pings cost half the transactions), and once that
    connection is cut and cannot reconnect, the pool pings every interval: the row stays
    fresh and the worker alive. Both halves fail if the pool pings all along, or never."""
    interval = 0.2
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        async with trioq.pg.Pool(dsn, max_size=1, connect_kwargs={"autocommit": True}) as pool:
            async with pool.connection() as warm:  # open before new connections are refused
                await warm.execute("SELECT 1")
            driver = trioq.Queue().driver
            liveness = Liveness(dsn, pool, driver, name="fallback", queues={"default": 1},
                                interval=interval, running=lambda: 0)  # fmt: skip
            async with trio.open_nursery() as nursery:
                await nursery.start(liveness.run)
                await trio.sleep(10 * interval)  # ten pings through the liveness connection
                assert liveness.pool_pings <= 1  # one late ping at most (a loaded machine)
                quiet = liveness.pool_pings
                (pid,) = await liveness_pids(conn)
                async with refused(pg_admin_dsn, await scalar(conn, "SELECT current_database()")):
                    await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    await wait_until(lambda: _true(liveness.pool_pings >= quiet + 3))
                    age = await scalar(
                        conn, "SELECT extract(epoch FROM now() - seen_at)::float"
                        " FROM trioq.workers WHERE id = %s", liveness.worker,
                    )  # fmt: skip
                    assert age < 2 * interval  # kept fresh through the pool
                await wait_until(lambda: _locked(conn))  # the liveness connection is back
                nursery.cancel_scope.cancel()


async def test_an_idle_worker_proves_its_connection_alive_without_writing_its_row(
    dsn: str,
) -> None:
    """Between two pings of its row (`ROW_EVERY`, here a minute) an idle worker's liveness
    connection makes a round trip every interval that writes nothing: the row's version
    (``xmin``) does not change over ten of them. A change in the count of running handlers
    is written at the next interval, and the pool stays silent throughout. Fails if every
    round trip pings the row, or if the count is written only with the periodic ping."""
    interval = 0.05
    running = [0]
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        async with trioq.pg.Pool(dsn, max_size=1, connect_kwargs={"autocommit": True}) as pool:
            liveness = Liveness(dsn, pool, trioq.Queue().driver, name="idle",
                                queues={"default": 1}, interval=interval,
                                running=lambda: running[0])  # fmt: skip
            liveness.row_every = 60.0
            async with trio.open_nursery() as nursery:
                await nursery.start(liveness.run)
                await wait_until(lambda: _true(liveness.probes >= 1))  # the first ping is done
                version = await _row(conn, liveness.worker)
                probes = liveness.probes
                await wait_until(lambda: _true(liveness.probes >= probes + 10))
                assert await _row(conn, liveness.worker) == version  # ten round trips, no write
                running[0] = 3
                await wait_until(lambda: _running_is(conn, liveness.worker, 3))
                assert liveness.pool_pings == 0
                nursery.cancel_scope.cancel()


async def _row(conn: Any, worker: int | None) -> tuple[Any, ...]:
    (row,) = await rows(conn, "SELECT xmin::text, seen_at, running FROM trioq.workers"
                        " WHERE id = %s", worker)  # fmt: skip
    return tuple(row)


async def _running_is(conn: Any, worker: int | None, count: int) -> bool:
    return bool((await _row(conn, worker))[2] == count)


@asynccontextmanager
async def _watched(
    dsn: str, holding: list[bool], interval: float
) -> AsyncIterator[tuple[Any, Liveness]]:
    """A connection to the migrated database and a running `Liveness` (its row's ping a
    minute apart; holding a job while ``holding[0]``), after its first turn: a watch if
    idle, a round trip if busy."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        async with trioq.pg.Pool(dsn, max_size=1, connect_kwargs={"autocommit": True}) as pool:
            liveness = Liveness(dsn, pool, trioq.Queue().driver, name="idle",
                                queues={"default": 1}, interval=interval, running=lambda: 0,
                                holding=lambda: holding[0])  # fmt: skip
            liveness.row_every = 60.0
            async with trio.open_nursery() as nursery:
                await nursery.start(liveness.run)
                await wait_until(lambda: _true(liveness.probes + liveness.watches >= 1))
                yield conn, liveness
                nursery.cancel_scope.cancel()


@contextlib.contextmanager
def _stopped(pid: int) -> Iterator[None]:
    """The backend ``pid`` SIGSTOPped for the block: its session lives, and never answers."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_an_idle_worker_watches_its_liveness_connection_and_sends_nothing(
    dsn: str,
) -> None:
    """Holding no job, a worker's liveness connection sends nothing between its row's pings
    (here a minute apart): no round trip over 20 intervals, no write, nothing through the
    pool. Once it holds a job it asks every interval again. Fails if an idle worker
    probes, or if a busy one does not."""
    interval = 0.05
    holding = [False]
    async with _watched(dsn, holding, interval) as (conn, liveness):
        version = await _row(conn, liveness.worker)  # the row was pinged
        await trio.sleep(20 * interval)  # an absence: nothing to wait for
        assert (liveness.probes, liveness.pool_pings) == (0, 0)
        assert await _row(conn, liveness.worker) == version
        holding[0] = True
        with liveness.claiming():  # a claim that took a job
            pass
        await wait_until(lambda: _true(liveness.probes >= 5))
        assert await _row(conn, liveness.worker) == version  # round trips, no write
        assert liveness.pool_pings == 0


async def test_a_claim_wakes_the_idle_liveness_connection_to_prove_itself_at_once(
    dsn: str,
) -> None:
    """The interval is 20 s and the row's ping a minute away: only the claim's wake-up can
    make the liveness connection's round trip within a few seconds of the claim."""
    async with _watched(dsn, [False], interval=20) as (_conn, liveness):
        with liveness.claiming(), trio.fail_after(5):  # a claim on its way
            await wait_until(lambda: _true(liveness.probes == 1))


async def test_a_slow_claim_after_idleness_is_covered_from_its_sending(dsn: str) -> None:
    """Idle, its liveness session stuck (its backend SIGSTOPped: the round trip never
    answers), the worker sends a claim that takes long to return (a controlled queue's
    claim waiting for its queue's lock). From the claim's sending the worker counts as
    holding: its liveness connection is asked at once, and the pool pings 1.25 intervals
    after the sending, while the claim is still on its way. Fails if the worker waited for
    the claim to return (a suspicion raised after the claim's snapshot would then have had
    its grace: a verdict on the jobs it was committing)."""
    interval = 0.2
    async with _watched(dsn, [False], interval) as (conn, liveness):
        (pid,) = await liveness_pids(conn)
        with _stopped(pid):
            sent = trio.current_time()
            with liveness.claiming():  # it has not returned when the pool pings
                await wait_until(lambda: _true(liveness.pool_pings >= 1))
                late = trio.current_time() - sent
            assert liveness.probes == 0  # the liveness connection never answered
            assert late >= interval  # the liveness connection had its chance first
        await wait_until(lambda: _true(liveness.probes >= 1))  # it answers again


async def test_failing_claims_are_no_proof_a_busy_worker_still_pings_through_its_pool(
    dsn: str,
) -> None:
    """A busy worker whose liveness session is stuck (its backend SIGSTOPped) and whose
    claims keep failing, one every half interval: a failed claim cleared no suspicion, so
    it proves nothing, and the pool pings all the same. Fails if each claim's sending
    pushed the pool's ping back (it never came)."""
    interval = 0.2
    async with _watched(dsn, [True], interval) as (conn, liveness):
        (pid,) = await liveness_pids(conn)

        async def failing_claims() -> None:
            while True:
                with contextlib.suppress(RuntimeError), liveness.claiming():
                    await trio.sleep(0.01)
                    raise RuntimeError("the claim failed")
                await trio.sleep(interval / 2)

        with _stopped(pid):
            async with trio.open_nursery() as claims:
                claims.start_soon(failing_claims)
                await wait_until(lambda: _true(liveness.pool_pings >= 2))
                claims.cancel_scope.cancel()


async def test_a_watching_worker_reconnects_the_moment_its_session_ends(dsn: str) -> None:
    """An idle worker's liveness session is terminated: the server's FATAL and the close
    wake its watch, and it reconnects and takes its lock again (the same row) within
    seconds, though its interval is 20 s and its row's ping a minute away. Fails if the
    idle worker only noticed at its next round trip."""
    async with _watched(dsn, [False], interval=20) as (conn, liveness):
        worker = liveness.worker
        (pid,) = await liveness_pids(conn)
        await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with trio.fail_after(5):
            await wait_until(lambda: _locked_by_another(conn, pid))
        assert liveness.worker == worker and liveness.probes == 0


async def _locked_by_another(conn: Any, pid: int) -> bool:
    pids = await liveness_pids(conn)
    return len(pids) == 1 and pids[0] != pid


def test_the_liveness_connection_keeps_tcp_keepalives_the_dsn_does_not_set() -> None:
    """The kernel notices a silent peer of an idle, watched connection (`KEEPALIVES`); a
    DSN that sets a keepalive parameter keeps its own."""
    from trioq._worker.services.liveness import KEEPALIVES

    pool: Any = None
    mine = Liveness("host=db keepalives_idle=7", pool, trioq.Queue().driver, name="n",
                    queues={}, interval=0.5, running=lambda: 0)  # fmt: skip
    kwargs = mine._connect_kwargs
    assert "keepalives_idle" not in kwargs  # the DSN's 7 stands
    assert kwargs["keepalives_count"] == KEEPALIVES["keepalives_count"] == "3"
    default = Liveness("host=db", pool, trioq.Queue().driver, name="n", queues={},
                       interval=0.5, running=lambda: 0)  # fmt: skip
    assert {k: default._connect_kwargs[k] for k in KEEPALIVES} == KEEPALIVES


async def test_a_serving_worker_watches_while_idle_and_asks_while_it_holds_a_job(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime's wiring: idle, its liveness connection makes no round trip; its claim
    ends that (the liveness connection proves itself at once, then every interval while the
    job is held), and once the job's outcome is written it watches again. The row's ping is
    a minute apart here: only the claim's wake-up ends the watch within the test."""
    import trioq._worker.services.liveness as liveness_module

    monkeypatch.setattr(liveness_module, "ROW_EVERY", 60.0)
    started: list[int] = []
    release = trio.Event()
    interval = 0.05
    async with serving(dsn, holding_registry(started, release), liveness_interval=interval,
                       liveness_grace=1.0) as (conn, runtime):  # fmt: skip
        liveness = runtime._services.liveness
        await wait_until(lambda: _true(liveness.watches >= 1))
        await trio.sleep(20 * interval)  # the start's claims (each asks once) are over
        probes = liveness.probes
        await trio.sleep(20 * interval)  # an absence: nothing to wait for
        assert liveness.probes == probes and liveness.pool_pings == 0
        await trioq.enqueue(conn, "hold")
        await wait_until(lambda: _true(len(started) == 1))
        await wait_until(lambda: _true(liveness.probes >= 5))
        release.set()
        await wait_until(lambda: _done(conn))
        await wait_until(lambda: _true(runtime.statistics().held_leases == 0))
        probes, watches = liveness.probes, liveness.watches
        await wait_until(lambda: _true(liveness.watches > watches))
        await trio.sleep(20 * interval)
        assert liveness.probes <= probes + 1  # one in flight when the outcome was written
        assert liveness.pool_pings == 0
