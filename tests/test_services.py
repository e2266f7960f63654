"""The maintenance services one round at a time: each test calls ``run_once()`` and reads
what it returns, against real Postgres, instead of waiting for the loop's timers."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from helpers import rows, wait_until

import trioq
from trioq._db.driver import RESTART_GRACE
from trioq._worker.leases import HeldJob, HeldJobs
from trioq._worker.services.heartbeat import Heartbeat, HeartbeatRound
from trioq._worker.services.listener import Listener
from trioq._worker.services.liveness import Liveness
from trioq._worker.services.scheduler import MAX_SLEEP, CronSet, Scheduler, ScheduleRound
from trioq._worker.services.sweeper import CHECKS, VERDICT_MARGIN, Sweeper, fleet_gap

UTC = dt.UTC
T0 = dt.datetime(2030, 1, 1, tzinfo=UTC)
LEASE = dt.timedelta(seconds=30)
Q = trioq.Queue()


@asynccontextmanager
async def database(dsn: str) -> AsyncIterator[tuple[Any, trioq.pg.Pool]]:
    """A migrated database, a connection, and a one-connection pool: the service's
    statements and the test's share the clock set with `set_clock`."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        async with trioq.pg.Pool(dsn, max_size=1, connect_kwargs={"autocommit": True}) as pool:
            await set_clock(conn, pool, T0)
            yield conn, pool


async def set_clock(conn: Any, pool: trioq.pg.Pool, when: dt.datetime) -> None:
    query = "SELECT set_config('trioq.now', %s, false)"
    await conn.execute(query, (when.isoformat(),))
    async with pool.connection() as service_conn:  # the pool's one connection keeps it
        await service_conn.execute(query, (when.isoformat(),))


async def claim_one(conn: Any, owner: str, lease: dt.timedelta = LEASE) -> trioq.Job:
    (job,) = await Q.claim(conn, "default", owner=owner, limit=1, lease=lease)
    return job


# -- sweeper -----------------------------------------------------------------------------------


async def test_sweeper_returns_expired_leases_and_wakes_the_fetchers(dsn: str) -> None:
    async with database(dsn) as (conn, pool):
        woken: list[None] = []
        sweeper = Sweeper(pool, Q.driver, interval=1, reclaim_interval=1, grace=2,
                          on_returned=lambda: woken.append(None))  # fmt: skip
        expired = await trioq.enqueue(conn, "t")
        await claim_one(conn, "crashed", lease=dt.timedelta(seconds=5))
        fresh = await trioq.enqueue(conn, "t")
        await claim_one(conn, "alive")
        assert (await sweeper.run_once()).swept.returned == frozenset()
        assert woken == []
        await set_clock(conn, pool, T0 + dt.timedelta(seconds=10))
        swept = (await sweeper.run_once()).swept
        assert swept.returned == frozenset({expired.job_id})
        assert swept.dead == swept.cancelled == frozenset()
        assert swept.queues == {"default"}
        assert woken == [None]
        assert (await sweeper.run_once()).swept.returned == frozenset()  # nothing twice
        cur = await conn.execute("SELECT id, state FROM trioq.jobs ORDER BY id")
        assert await cur.fetchall() == [(expired.job_id, "available"), (fresh.job_id, "running")]


async def register(
    conn: Any, name: str, seen_ago: float, suspected_ago: float | None = None
) -> int:
    """A worker's row, last pinged ``seen_ago`` seconds before T0, suspected by a sweeper
    ``suspected_ago`` seconds before T0 (None: not suspected)."""
    suspected = None if suspected_ago is None else T0 - dt.timedelta(seconds=suspected_ago)
    row = await rows(
        conn, "INSERT INTO trioq.workers (name, host, pid, queues, seen_at, suspected_at)"
        " VALUES (%s, 'h', 1, '{}', %s, %s) RETURNING id",
        name, T0 - dt.timedelta(seconds=seen_ago), suspected,
    )  # fmt: skip
    return int(row[0][0])


async def suspect(conn: Any, name: str, ago: float) -> None:
    """A sweeper suspected worker ``name`` ``ago`` seconds before T0."""
    await conn.execute("UPDATE trioq.workers SET suspected_at = %s WHERE name = %s",
                       (T0 - dt.timedelta(seconds=ago), name))  # fmt: skip


async def suspicions(conn: Any) -> dict[str, dt.datetime | None]:
    return dict(await rows(conn, "SELECT name, suspected_at FROM trioq.workers"))


async def test_sweeper_returns_the_jobs_of_dead_workers_at_once(dsn: str) -> None:
    """Dead: nobody holds its lock and no ping for longer than the grace, found twice, a
    grace apart (the first check only suspects it, however fresh its last ping). A worker
    that only stopped pinging (its lock held: alive, just idle or slow) is neither suspected
    nor robbed; one whose lock is free but that pings through its pool is suspected again
    and again, and kept."""
    async with (
        await trioq.connect(dsn, autocommit=True) as conn,
        await trioq.connect(dsn, autocommit=True) as alive_session,
    ):
        await trioq.migrate(conn)
        async with trioq.pg.Pool(dsn, max_size=1, connect_kwargs={"autocommit": True}) as pool:
            await set_clock(conn, pool, T0)  # long after the server started (its grace)
            woken: list[None] = []
            sweeper = Sweeper(pool, Q.driver, interval=60, reclaim_interval=1, grace=2,
                              on_returned=lambda: woken.append(None))  # fmt: skip
            dead = await register(conn, "dead", seen_ago=10)
            slow = await register(conn, "slow", seen_ago=10)
            fresh = await register(conn, "fresh", seen_ago=0)
            await alive_session.execute(Q.sql.worker_lock, {"space": Q.sql.lock_space, "id": slow})
            jobs = {}
            for owner in ("dead", "slow", "fresh"):
                await trioq.enqueue(conn, "t", queue=owner)
                (job,) = await Q.claim(conn, owner, owner=owner, limit=1, lease=LEASE)
                jobs[owner] = job.id
            first = await sweeper.run_once(sweep=False)  # suspects, takes nothing
            assert first.reclaimed.returned == frozenset() and woken == []
            assert (first.reclaimed.suspected, sweeper.suspected) == (2, 2)
            assert await suspicions(conn) == {"dead": T0, "slow": None, "fresh": T0}
            await set_clock(conn, pool, T0 + dt.timedelta(seconds=1))
            await conn.execute(Q.sql.worker_ping, {"id": fresh, "running": 1})  # via its pool
            await set_clock(conn, pool, T0 + dt.timedelta(seconds=1.9))  # within the grace
            early = await sweeper.run_once(sweep=False)
            assert early.reclaimed.returned == frozenset()
            assert early.reclaimed.suspected == 1  # "fresh" again: its lock is still free
            await set_clock(conn, pool, T0 + dt.timedelta(seconds=2.1))  # a grace later
            round_ = await sweeper.run_once(sweep=False)
            assert round_.reclaimed.returned == {jobs["dead"]}
            assert round_.reclaimed.queues == {"dead"}
            assert woken == [None]
            left = await rows(conn, "SELECT name FROM trioq.workers ORDER BY name")
            assert left == [("fresh",), ("slow",)]
            states = dict(await rows(conn, "SELECT id, state FROM trioq.jobs"))
            assert states == {jobs["dead"]: "available", jobs["slow"]: "running",
                              jobs["fresh"]: "running"}  # fmt: skip
            error = await rows(conn, "SELECT last_error FROM trioq.jobs WHERE id = %s",
                               jobs["dead"])  # fmt: skip
            assert error == [("worker died (its liveness lock was free)",)]
            assert (await sweeper.run_once(sweep=False)).reclaimed.returned == frozenset()
            assert dead and fresh


async def test_a_ping_after_the_suspicion_keeps_the_worker(dsn: str) -> None:
    """A worker whose liveness connection is cut (its lock free) and which last wrote its
    row long ago (an idle worker writes it every few seconds) is suspected, not judged: its
    ping through the pool within the grace clears the suspicion, and it keeps its job. Only
    a suspicion a grace old with no ping since makes a death: one written by hand beside a
    fresh ping does not (until the ping is a grace old too)."""
    async with database(dsn) as (conn, pool):
        sweeper = Sweeper(pool, Q.driver, interval=60, reclaim_interval=1, grace=2,
                          on_returned=lambda: None)  # fmt: skip
        worker = await register(conn, "cut", seen_ago=10)
        await register(conn, "pinged", seen_ago=0, suspected_ago=60)
        await trioq.enqueue(conn, "t", queue="cut")
        (job,) = await Q.claim(conn, "cut", owner="cut", limit=1, lease=LEASE)
        assert (await sweeper.run_once(sweep=False)).reclaimed.suspected == 1
        assert (await suspicions(conn))["pinged"] == T0 - dt.timedelta(seconds=60)  # kept
        await set_clock(conn, pool, T0 + dt.timedelta(seconds=1))
        await conn.execute(Q.sql.worker_ping, {"id": worker, "running": 1})  # via its pool
        assert (await suspicions(conn))["cut"] is None
        await set_clock(conn, pool, T0 + dt.timedelta(seconds=1.5))
        again = await sweeper.run_once(sweep=False)  # its lock is still free: suspected anew
        assert again.reclaimed.returned == frozenset() and again.reclaimed.suspected == 1
        await set_clock(conn, pool, T0 + dt.timedelta(seconds=3.4))  # that suspicion: 1.9 s
        assert (await sweeper.run_once(sweep=False)).reclaimed.returned == frozenset()
        assert (await suspicions(conn))["cut"] == T0 + dt.timedelta(seconds=1.5)
        await set_clock(conn, pool, T0 + dt.timedelta(seconds=3.6))  # 2.1 s, no ping since
        assert (await sweeper.run_once(sweep=False)).reclaimed.returned == {job.id}
        assert await rows(conn, "SELECT name FROM trioq.workers") == []  # "pinged" too, now


async def test_a_new_session_judges_nobody_until_the_restart_grace_has_passed(dsn: str) -> None:
    """After a server restart or a failover every lock is free and every session new: a
    session's checks suspect nobody until RESTART_GRACE has passed since its first check
    (kept in the session), so every worker has that long to reconnect. Once it has (the
    setting moved back by hand, as the clock would), the same free lock is suspected; a
    new session is blind again. Fails if the rule is dropped, or forgotten between checks."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        await conn.execute("INSERT INTO trioq.workers (name, host, pid, queues)"
                           " VALUES ('cut', 'h', 1, '{}')")  # fmt: skip
        grace = dt.timedelta(seconds=1)
        assert (await Q.reclaim_dead_workers(conn, grace=grace)).suspected == 0
        assert (await Q.reclaim_dead_workers(conn, grace=grace)).suspected == 0  # kept
        since = float((await rows(conn, "SELECT current_setting('trioq.judging_since')"))[0][0])
        older = since - RESTART_GRACE.total_seconds() - 1
        await conn.execute("SELECT set_config('trioq.judging_since', %s, false)", (str(older),))
        assert (await Q.reclaim_dead_workers(conn, grace=grace)).suspected == 1
        async with await trioq.connect(dsn, autocommit=True) as fresh:
            await conn.execute("UPDATE trioq.workers SET suspected_at = NULL")
            assert (await Q.reclaim_dead_workers(fresh, grace=grace)).suspected == 0


def test_the_fleet_checks_for_dead_workers_a_few_times_an_interval_whatever_its_size() -> None:
    """Every process checked every interval: 200 idle workers sent 400 checks a second. Each
    now checks every interval while the fleet has at most CHECKS workers, else every
    workers / CHECKS intervals at a random point of that span around it (so the fleet's
    checks do not bunch): CHECKS checks per interval on average, for 5 or 200 workers."""
    assert fleet_gap(0.5, 1) == fleet_gap(0.5, CHECKS) == 0.5
    assert fleet_gap(0.5, 200, lambda: 0.0) == 0.5 * 200 / CHECKS * 0.5
    assert fleet_gap(0.5, 200, lambda: 0.999) == pytest.approx(0.5 * 200 / CHECKS * 1.499)
    for workers in (5, 50, 200):
        draws = [i / 1000 for i in range(1000)]  # evenly over [0, 1)
        mean = sum(fleet_gap(0.5, workers, functools.partial(float, d)) for d in draws) / 1000
        per_interval = workers * 0.5 / mean  # the fleet's checks per interval
        assert per_interval == pytest.approx(CHECKS, rel=0.01)


def test_the_fleet_shares_its_sweeps_and_a_suspicion_brings_the_next_check_forward() -> None:
    """A process sweeps expired leases and checks for dead workers every interval in a
    small fleet; in a fleet of 200 each does it 50 times less often (the fleet still does
    it CHECKS times an interval). A check that suspected a worker is followed by one just
    after the grace, however big the fleet."""
    sweeper = Sweeper(None, Q.driver, interval=5, reclaim_interval=0.5, grace=1,  # type: ignore[arg-type]
                      on_returned=lambda: None)  # fmt: skip
    sweeper.schedule(100.0, swept=True, reclaimed=True)
    assert (sweeper.next_sweep, sweeper.next_reclaim) == (105.0, 100.5)
    sweeper.workers = 200
    sweeps, checks = [], []
    for _ in range(2000):
        sweeper.schedule(100.0, swept=True, reclaimed=True)
        sweeps.append(sweeper.next_sweep - 100)
        checks.append(sweeper.next_reclaim - 100)
    assert sum(sweeps) / len(sweeps) == pytest.approx(5 * 200 / CHECKS, rel=0.05)
    assert sum(checks) / len(checks) == pytest.approx(0.5 * 200 / CHECKS, rel=0.05)
    sweeper.schedule(200.0, swept=False, reclaimed=False)  # neither ran: nothing moves
    assert sweeper.next_reclaim - 100 == checks[-1]
    sweeper.suspected = 1
    sweeper.schedule(200.0, swept=False, reclaimed=True)
    assert sweeper.next_reclaim == pytest.approx(201.0 + VERDICT_MARGIN)


async def test_a_dead_worker_check_counts_the_fleet_and_a_sweep_alone_does_not_check(
    dsn: str,
) -> None:
    """The check counts the workers left (how often this process checks next); a round
    without it (an expired-lease sweep between two checks) sends no check at all."""
    async with database(dsn) as (conn, pool):
        sweeper = Sweeper(pool, Q.driver, interval=60, reclaim_interval=1, grace=2,
                          on_returned=lambda: None)  # fmt: skip
        for i in range(6):
            await register(conn, f"w{i}", seen_ago=0)
        dead = await register(conn, "dead", seen_ago=10, suspected_ago=10)  # no lock: deleted
        round_ = await sweeper.run_once(sweep=False)
        assert round_.reclaimed.workers == 7  # counted before its deletion showed
        assert sweeper.workers == 7
        assert await rows(conn, "SELECT count(*) FROM trioq.workers") == [(6,)]
        assert (await sweeper.run_once(sweep=False)).reclaimed.workers == 6
        await register(conn, "dead-too", seen_ago=10, suspected_ago=10)
        skipped = await sweeper.run_once(sweep=True, reclaim=False)
        assert skipped.reclaimed.workers is None and sweeper.workers == 6
        assert await rows(conn, "SELECT count(*) FROM trioq.workers") == [(7,)]  # still there
        assert dead


async def test_a_lock_held_by_the_sweepers_own_session_is_not_free(dsn: str) -> None:
    """Behind a transaction pooler the sweeper's statement can run on the very server
    session that holds a worker's liveness lock. A try-lock there succeeds (advisory locks
    are re-entrant per session) and took a live worker for dead (issue 22); the lock is
    read from pg_locks now: held by any session, the worker lives."""
    async with database(dsn) as (conn, pool):
        sweeper = Sweeper(pool, Q.driver, interval=60, reclaim_interval=1, grace=2,
                          on_returned=lambda: None)  # fmt: skip
        worker = await register(conn, "pooled", seen_ago=10)
        async with pool.connection() as same_session:  # the pool's one connection
            await same_session.execute(Q.sql.worker_lock, {"space": Q.sql.lock_space,
                                                           "id": worker})  # fmt: skip
        await trioq.enqueue(conn, "t", queue="pooled")
        (job,) = await Q.claim(conn, "pooled", owner="pooled", limit=1, lease=LEASE)
        round_ = await sweeper.run_once(sweep=False)
        assert round_.reclaimed.returned == frozenset()
        assert await rows(conn, "SELECT name FROM trioq.workers") == [("pooled",)]
        assert await rows(conn, "SELECT state FROM trioq.jobs WHERE id = %s", job.id) == [
            ("running",)
        ]


@pytest.mark.parametrize("suspected_ago", [None, 10], ids=["suspicion", "verdict"])
async def test_a_ping_that_races_the_reclaim_keeps_the_worker(
    dsn: str, suspected_ago: float | None
) -> None:
    """The check reads a free lock and a stale ping, then suspects the worker (or, with an
    old suspicion, deletes its row); a ping committed in between (the write waits for its
    row lock, then re-checks the row) keeps the worker and its jobs, and leaves no
    suspicion. Fails if the suspicion is written over a newer version of the row."""
    async with database(dsn) as (conn, pool), await trioq.connect(dsn) as pinger:
        sweeper = Sweeper(pool, Q.driver, interval=60, reclaim_interval=1, grace=2,
                          on_returned=lambda: None)  # fmt: skip
        worker = await register(conn, "racing", seen_ago=10)
        await trioq.enqueue(conn, "t", queue="racing")
        (job,) = await Q.claim(conn, "racing", owner="racing", limit=1, lease=LEASE)
        if suspected_ago is not None:  # after the claim, which clears a suspicion
            await suspect(conn, "racing", suspected_ago)
        await pinger.execute("SELECT set_config('trioq.now', %s, false)", (T0.isoformat(),))
        await pinger.execute(Q.sql.worker_ping, {"id": worker, "running": 1})  # not committed
        rounds: list[Any] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: _append(rounds, sweeper.run_once(sweep=False)))
            await wait_until(lambda: _waits_for_a_lock(conn))  # the delete waits for the ping
            await pinger.commit()
        assert rounds[0].reclaimed.returned == frozenset()
        assert rounds[0].reclaimed.suspected == 0
        assert await suspicions(conn) == {"racing": None}
        assert await rows(conn, "SELECT state FROM trioq.jobs WHERE id = %s", job.id) == [
            ("running",)
        ]


@pytest.mark.parametrize("claim", ["plain", "weighted", "limited"])
async def test_a_claim_clears_its_workers_suspicion_so_the_verdict_spares_its_jobs(
    dsn: str, claim: str
) -> None:
    """An idle worker watches its liveness connection instead of asking it: should its lock
    be free unseen (its session ended in silence), a sweeper's suspicion can be a grace old
    by the time the worker claims. Its claim clears the suspicion in the same statement, as
    a ping does, so the next check suspects it anew instead of taking the jobs it just
    claimed; a worker suspected as long, that claimed nothing, is judged (the control).
    Each claim statement does it; fails if one does not."""
    async with database(dsn) as (conn, pool):
        sweeper = Sweeper(pool, Q.driver, interval=60, reclaim_interval=1, grace=2,
                          on_returned=lambda: None)  # fmt: skip
        for name in ("idle", "gone"):
            await register(conn, name, seen_ago=10, suspected_ago=10)  # a grace old and more
            await trioq.enqueue(conn, "t", queue=name)
        if claim == "limited":
            await Q.set_limits(conn, "idle", global_concurrency=5)
            got = (await Q.driver.claim_limited(conn, "idle", owner="idle", limit=1,
                                                lease=LEASE)).jobs  # fmt: skip
        else:
            got = await Q.driver.claim(conn, "idle", owner="idle", limit=1, lease=LEASE,
                                       weighted=claim == "weighted")  # fmt: skip
        [job] = got
        assert await suspicions(conn) == {"idle": None, "gone": T0 - dt.timedelta(seconds=10)}
        round_ = await sweeper.run_once(sweep=False)
        assert round_.reclaimed.returned == frozenset()  # "gone" held no job
        assert round_.reclaimed.suspected == 1  # "idle" again: its lock is still free
        assert await rows(conn, "SELECT name FROM trioq.workers") == [("idle",)]
        assert await rows(conn, "SELECT state, lease_owner FROM trioq.jobs WHERE id = %s",
                          job.id) == [("running", "idle")]  # fmt: skip


async def _append(found: list[Any], round_: Awaitable[Any]) -> None:
    found.append(await round_)


async def _waits_for_a_lock(conn: Any) -> bool:
    waiting = await rows(conn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type ="
                         " 'Lock' AND datname = current_database()")  # fmt: skip
    return bool(waiting[0][0])


async def test_a_worker_that_stops_holding_running_jobs_leaves_its_row_for_the_sweepers(
    dsn: str,
) -> None:
    """At a graceful stop the worker's row goes, unless jobs it owns are still running (an
    outcome it could not write, a claim cut short by the stop): then the row stays, its lock
    is free, and the sweepers return those jobs within the grace, not at lease expiry."""
    async with database(dsn) as (conn, pool):
        for name, running in (("holding", True), ("clean", False)):
            liveness = Liveness(dsn, pool, Q.driver, name=name, queues={"default": 1}, interval=60,
                                running=lambda: 0)  # fmt: skip
            async with trio.open_nursery() as nursery:
                await nursery.start(liveness.run)
                if running:
                    await trioq.enqueue(conn, "t")
                    job = await claim_one(conn, name)
                nursery.cancel_scope.cancel()
            left = await rows(conn, "SELECT id FROM trioq.workers WHERE name = %s", name)
            assert left == ([(liveness.worker,)] if running else [])
        await set_clock(conn, pool, T0 + dt.timedelta(seconds=5))
        sweeper = Sweeper(pool, Q.driver, interval=60, reclaim_interval=1, grace=2,
                          on_returned=lambda: None)  # fmt: skip
        assert (await sweeper.run_once(sweep=False)).reclaimed.returned == {job.id}
        assert await rows(conn, "SELECT name FROM trioq.workers") == []


# -- heartbeat ---------------------------------------------------------------------------------


def held_job(job: trioq.Job) -> HeldJob:
    return HeldJob(job, trioq.Lease(job.id, job.attempt))


async def test_heartbeat_extends_cancels_and_gives_up_lost_leases(dsn: str) -> None:
    async with database(dsn) as (conn, pool):
        held = HeldJobs()
        beat = Heartbeat(pool, Q.driver, held, owner="w", lease=60, interval=1)
        assert await beat.run_once() == HeartbeatRound(
            extended=0, lost=(), cancelled=()
        )
        for _ in range(3):
            await trioq.enqueue(conn, "t")
        kept = held_job(await claim_one(conn, "w", lease=dt.timedelta(seconds=5)))
        stolen = held_job(await claim_one(conn, "w", lease=dt.timedelta(seconds=5)))
        wanted = held_job(await claim_one(conn, "w"))
        held.add([kept, stolen, wanted])
        # `stolen` expires, is swept and claimed again by another worker; `kept` is heartbeaten
        # just in time; someone asks to cancel `wanted`.
        await conn.execute(
            "UPDATE trioq.jobs SET lease_expires_at = %s WHERE id = %s",
            (T0 - dt.timedelta(seconds=1), stolen.job.id),
        )
        assert (await Q.sweep(conn)).returned == {stolen.job.id}
        again = await claim_one(conn, "other")
        assert again.id == stolen.job.id
        assert (await Q.cancel(conn, wanted.job.id)).status == "requested"

        done = await beat.run_once()

        assert done.extended == 2
        assert done.lost == (stolen.lease,)
        assert done.cancelled == (wanted.lease,)
        assert (stolen.reason, wanted.reason, kept.reason) == ("lost", "cancel", None)
        assert sorted(lease.job_id for lease in held.leases()) == [kept.job.id, wanted.job.id]
        cur = await conn.execute(
            "SELECT lease_expires_at FROM trioq.jobs WHERE id = %s", (kept.job.id,)
        )
        assert await cur.fetchone() == (T0 + dt.timedelta(seconds=60),)


async def test_heartbeat_ignores_a_lost_lease_whose_outcome_was_written(dsn: str) -> None:
    """The heartbeat raced the completer: the job finished; nothing to cancel."""
    async with database(dsn) as (conn, pool):
        held = HeldJobs()
        beat = Heartbeat(pool, Q.driver, held, owner="w", lease=60, interval=1)
        await trioq.enqueue(conn, "t")
        finished = held_job(await claim_one(conn, "w"))
        held.add([finished])
        await Q.complete_many(conn, owner="w", leases=[finished.lease])
        finished.finished = True
        done = await beat.run_once()
        assert (done.extended, done.lost) == (0, ())
        assert finished.reason is None


# -- scheduler ---------------------------------------------------------------------------------


async def test_scheduler_promotes_due_jobs_and_says_how_long_to_sleep(dsn: str) -> None:
    async with database(dsn) as (conn, pool):
        due: list[str] = []
        scheduler = Scheduler(pool, Q, (), poll_interval=1, on_due=due.append)
        assert await scheduler.run_once() == ScheduleRound(
            promoted=(), fired=(), sleep=MAX_SLEEP, read_entries=True, cron=CronSet()
        )  # the first round reads the database's cron entries (none)
        soon = await trioq.enqueue(conn, "t", queue="mail", run_at=T0 + dt.timedelta(seconds=2))
        await trioq.enqueue(conn, "t", queue="sms", run_at=T0 + dt.timedelta(hours=1))
        first = await scheduler.run_once()
        assert (first.promoted, first.sleep) == ((), 2.0)
        await set_clock(conn, pool, T0 + dt.timedelta(seconds=3))
        second = await scheduler.run_once()
        assert (second.promoted, second.sleep) == (("mail",), MAX_SLEEP)
        assert due == ["mail"]
        cur = await conn.execute("SELECT state FROM trioq.jobs WHERE id = %s", (soon.job_id,))
        assert await cur.fetchone() == ("available",)


async def test_a_big_fleet_shares_its_idle_scheduler_rounds(dsn: str) -> None:
    """With nothing due, a process of a fleet of up to four sleeps MAX_SLEEP; of a fleet of
    200, a span around 50 times that (the fleet still makes about four idle rounds every
    MAX_SLEEP). A job due sooner still sets the sleep, whatever the fleet."""
    async with database(dsn) as (conn, pool):
        fleet = [4]
        scheduler = Scheduler(pool, Q, (), poll_interval=1, on_due=lambda q: None,
                              fleet=lambda: fleet[0])  # fmt: skip
        assert (await scheduler.run_once()).sleep == MAX_SLEEP
        fleet[0] = 200
        sleeps = [(await scheduler.run_once()).sleep for _ in range(20)]
        assert all(MAX_SLEEP * 25 <= s < MAX_SLEEP * 75 for s in sleeps), sleeps
        await trioq.enqueue(conn, "t", queue="mail", run_at=T0 + dt.timedelta(seconds=2))
        assert (await scheduler.run_once()).sleep == 2.0


async def test_scheduler_fires_cron_ticks_once_and_sleeps_until_the_next(dsn: str) -> None:
    async with database(dsn) as (conn, pool):
        entry = trioq.CronEntry(name="every-minute", schedule="* * * * *", task="report")
        scheduler = Scheduler(pool, Q, [entry], poll_interval=1, on_due=lambda q: None)
        baseline = await scheduler.run_once()  # first sight records a baseline, fires nothing
        assert (baseline.fired, baseline.sleep) == ((), MAX_SLEEP)
        await set_clock(conn, pool, T0 + dt.timedelta(seconds=61))
        fired = await scheduler.run_once()
        assert [(f.name, f.tick) for f in fired.fired] == [
            ("every-minute", T0 + dt.timedelta(minutes=1))
        ]
        assert (await scheduler.run_once()).fired == ()  # the same tick never twice
        await set_clock(conn, pool, T0 + dt.timedelta(seconds=118))
        assert (await scheduler.run_once()).sleep == 2.0  # until 00:02:00


# -- listener ----------------------------------------------------------------------------------


async def test_listener_dispatches_notifications_until_its_connection_is_lost(dsn: str) -> None:
    async with database(dsn) as (conn, _pool):
        payloads: list[str] = []
        listening: list[None] = []
        listener = Listener(
            dsn, Q.driver, on_notify=payloads.append, on_listening=lambda: listening.append(None)
        )
        async with trio.open_nursery() as nursery:
            rounds: list[Any] = []

            async def one_round(task_status: trio.TaskStatus[None]) -> None:
                rounds.append(await listener.run_once(task_status=task_status))

            await nursery.start(one_round)
            assert listening == [None]
            await conn.execute("SELECT pg_notify('trioq_trioq', 'mail')")
            await conn.execute("SELECT pg_notify('trioq_other', 'not ours')")
            await trioq.enqueue(conn, "t", queue="sms")
            with trio.fail_after(10):
                while len(payloads) < 2:  # noqa: ASYNC110 - the notifications are in flight
                    await trio.sleep(0.01)
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE query ILIKE 'LISTEN%%' AND datname = current_database()"
            )
        assert payloads == ["mail", "sms"]
        assert rounds[0].notifications == 2
        assert "terminat" in rounds[0].error


async def test_listener_raises_when_it_cannot_connect(unused_port: int) -> None:
    listener = Listener(
        f"postgresql://nobody@127.0.0.1:{unused_port}/nothing", Q.driver,
        on_notify=lambda p: None, on_listening=lambda: None,
    )  # fmt: skip
    with pytest.raises(trioq.ConnectError):
        await listener.run_once()


async def test_a_committing_lease_is_not_heartbeated_and_its_cancel_waits_for_the_commit() -> None:
    """`HeldJobs.committing`: no heartbeat while the job's own transaction commits; a cancel
    that comes meanwhile stops the handler only if the commit fails; committed, the lease is
    forgotten (issue 22: before, it was forgotten before the commit went out)."""
    job = trioq.Job(id=1, queue="q", task="t", args={}, priority=0, run_at=T0, attempt=1,
                    max_attempts=3, enqueued_at=T0, lease_expires_at=T0)  # fmt: skip
    for commit_fails in (False, True):
        held = HeldJobs()
        running = held_job(job)
        held.add([running])
        running.scope = trio.CancelScope()
        try:
            with held.committing(running.lease):
                assert held.leases() == [] and held.lose(running.lease) is None
                running.abort("cancel")
                assert not running.scope.cancel_called  # not in the middle of the commit
                if commit_fails:
                    raise RuntimeError("the COMMIT failed")
        except RuntimeError:
            pass
        assert running.scope.cancel_called is commit_fails
        assert held.leases() == ([running.lease] if commit_fails else [])
