"""Flow control in the worker runtime (in-process workers, real Postgres): limits from
QueueConfig, changes at run time reaching the workers, two workers sharing one global limit,
waiting without busy polling, and pausing releasing what was claimed but not started."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import psycopg
import pytest
import trio
from helpers import scalar, wait_until

import trioq
from trioq import QueueConfig, RateLimit
from trioq._db.driver import Driver

FAST: dict[str, Any] = {"lease": 3, "heartbeat_interval": 0.5, "sweep_interval": 0.3}
Q = trioq.Queue()


@asynccontextmanager
async def serving(
    dsn: str, registry: trioq.Registry, workers: int = 1, **options: Any
) -> AsyncIterator[tuple[Any, list[trioq.Runtime]]]:
    """A migrated database, a connection to it, and ``workers`` running runtimes."""
    config = trioq.Config(dsn=dsn, registry=registry, **{**FAST, **options})
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        async with trio.open_nursery() as nursery:
            runtimes = [
                await nursery.start(trioq.serve, attrs.evolve(config, worker_id=f"w{i}"))
                for i in range(workers)
            ]
            try:
                yield conn, runtimes
            finally:
                for runtime in runtimes:
                    runtime.stop(grace=False)


class Gauge:
    """How many handlers run at once, and the most there ever were."""

    def __init__(self) -> None:
        self.now = self.peak = self.done = 0
        self.per_key: dict[str, int] = {}
        self.peak_per_key = 0

    async def run(self, seconds: float, key: str | None = None) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)
        if key is not None:
            self.per_key[key] = self.per_key.get(key, 0) + 1
            self.peak_per_key = max(self.peak_per_key, self.per_key[key])
        try:
            await trio.sleep(seconds)
        finally:
            self.now -= 1
            if key is not None:
                self.per_key[key] -= 1
            self.done += 1


async def test_queue_config_limits_are_stored_and_hold_across_two_workers(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    tasks = trioq.Registry()
    gauge = Gauge()

    @tasks.task(queue="q", concurrency_key="account")
    async def work(job: trioq.JobContext, account: str) -> None:
        await gauge.run(0.05, account)

    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        await Q.set_limits(conn, "q", global_concurrency=9)  # replaced by the config
    queues = {"q": QueueConfig(concurrency=4, global_concurrency=3, key_concurrency=1)}
    with caplog.at_level(logging.WARNING, logger="trioq.runtime"):
        async with serving(dsn, tasks, workers=2, queues=queues) as (conn, _):
            assert "QueueConfig replaces the stored limits {'global_concurrency': 9}" in caplog.text
            [stored] = await Q.queue_settings(conn)
            assert (stored.global_concurrency, stored.key_concurrency) == (3, 1)
            for i in range(40):
                await work.enqueue(conn, account=f"a{i % 4}")
            await wait_until(lambda: trio_true(gauge.done == 40), timeout=20)
    assert gauge.peak == 3  # 2 workers x 4 slots, yet never more than 3 at once
    assert gauge.peak_per_key == 1


async def trio_true(condition: bool) -> bool:
    await trio.lowlevel.checkpoint()
    return condition


async def test_a_limit_set_at_run_time_reaches_running_workers(dsn: str) -> None:
    """The change is announced: with polling at 60 s, the workers still obey at once."""
    tasks = trioq.Registry()
    gauge = Gauge()
    release = trio.Event()

    @tasks.task(queue="q")
    async def work(job: trioq.JobContext) -> None:
        gauge.now += 1
        gauge.peak = max(gauge.peak, gauge.now)
        await release.wait()
        gauge.now -= 1
        gauge.done += 1

    queues = {"q": QueueConfig(concurrency=5)}
    async with serving(dsn, tasks, queues=queues, poll_interval=60) as (conn, _):
        await Q.set_limits(conn, "q", global_concurrency=2)
        await trioq.enqueue_bulk(conn, "work", [{}] * 6, queue="q")
        await wait_until(lambda: trio_true(gauge.now == 2), timeout=10)
        with trio.move_on_after(0.3):  # a third must not start
            await wait_until(lambda: trio_true(gauge.now > 2), timeout=20)
        assert gauge.peak == 2
        await Q.set_limits(conn, "q", global_concurrency=None)
        await wait_until(lambda: trio_true(gauge.now == 5), timeout=10)
        release.set()
        await wait_until(lambda: trio_true(gauge.done == 6), timeout=10)


async def test_a_full_queue_wakes_when_its_own_outcomes_are_written(dsn: str) -> None:
    """Global limit 1 and polling at 60 s: each job starts right after the last one's
    outcome is written, not a poll later."""
    tasks = trioq.Registry()
    gauge = Gauge()

    @tasks.task(queue="q")
    async def work(job: trioq.JobContext) -> None:
        await gauge.run(0.01)

    queues = {"q": QueueConfig(concurrency=3, global_concurrency=1)}
    async with serving(dsn, tasks, queues=queues, poll_interval=60) as (conn, _):
        await trioq.enqueue_bulk(conn, "work", [{}] * 20, queue="q")
        await wait_until(lambda: trio_true(gauge.done == 20), timeout=20)
    assert gauge.peak == 1


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> list[trioq.LimitedClaim]:
    """Every limited claim the runtimes make from now on, in order."""
    made: list[trioq.LimitedClaim] = []
    original = Driver.claim_limited  # what the runtime claims with

    async def counted(self: Driver, *args: Any, **kwargs: Any) -> trioq.LimitedClaim:
        got = await original(self, *args, **kwargs)
        made.append(got)
        return got

    monkeypatch.setattr(Driver, "claim_limited", counted)
    return made


async def test_a_rate_limited_worker_sleeps_until_the_window_opens(
    dsn: str, claims: list[trioq.LimitedClaim]
) -> None:
    """3 starts a second, 9 jobs: three windows, and a handful of claims, not a busy loop."""
    tasks = trioq.Registry()
    starts: list[Any] = []

    @tasks.task(queue="q")
    async def work(job: trioq.JobContext) -> None:
        async with job.connection() as c:
            starts.append(await scalar(c, "SELECT clock_timestamp()"))

    queues = {"q": QueueConfig(concurrency=5, rate_limit=RateLimit(3, 1))}
    async with serving(dsn, tasks, queues=queues, poll_interval=60) as (conn, _):
        await trioq.enqueue_bulk(conn, "work", [{}] * 9, queue="q")
        await wait_until(lambda: trio_true(len(starts) == 9), timeout=20)
    starts.sort()
    assert (starts[6] - starts[0]).total_seconds() >= 2.0 - 0.05  # three windows of 1 s
    assert len(claims) <= 8, [(len(c.jobs), c.reason, c.retry_in) for c in claims]
    assert any(c.reason == "rate" and c.retry_in for c in claims)


async def test_pausing_releases_claimed_jobs_not_started_and_resuming_goes_on(
    dsn: str,
) -> None:
    tasks = trioq.Registry()
    gauge = Gauge()

    @tasks.task(queue="q")
    async def work(job: trioq.JobContext) -> None:
        await gauge.run(0.002)

    queues = {"q": QueueConfig(concurrency=10)}
    async with serving(dsn, tasks, queues=queues, poll_interval=60) as (conn, _):
        await trioq.enqueue_bulk(conn, "work", [{}] * 3000, queue="q")
        await wait_until(lambda: trio_true(gauge.done > 100), timeout=20)
        await Q.pause(conn, "q")
        await wait_until(
            lambda: value_is(conn, "SELECT count(*) FROM trioq.jobs WHERE state = 'running'", 0),
            timeout=20,
        )
        done = gauge.done
        assert 0 < done < 3000
        # What waits was released unstarted (attempt refunded) or never claimed.
        assert await scalar(conn, "SELECT max(attempt) FROM trioq.jobs") == 0
        with trio.move_on_after(0.5):
            await wait_until(lambda: trio_true(gauge.done > done), timeout=20)
        assert gauge.done == done, "a handler started after the pause"
        await trioq.enqueue(conn, "work", queue="q")  # enqueueing goes on while paused
        await Q.resume(conn, "q")
        await wait_until(lambda: trio_true(gauge.done == 3001), timeout=20)


async def value_is(conn: Any, query: str, expected: Any) -> bool:
    return bool(await scalar(conn, query) == expected)


async def test_the_governor_reads_settings_and_acts_on_changes(dsn: str) -> None:
    """One round at a time (``run_once``): what changed, what was paused, who was told."""
    from trioq._worker.services.governor import Governor

    changed: list[str] = []
    paused: list[str] = []

    async def on_paused(name: str) -> None:
        paused.append(name)

    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        async with trioq.pg.Pool(dsn, max_size=1, connect_kwargs={"autocommit": True}) as pool:
            configs = {"a": QueueConfig(global_concurrency=4), "b": QueueConfig()}
            governor = Governor(pool, Q, configs, poll_interval=1, on_change=changed.append,
                                on_paused=on_paused)  # fmt: skip
            [applied] = await governor.apply_config()
            assert (applied.name, applied.global_concurrency) == ("a", 4)
            first = await governor.run_once()
            assert (first.changed, first.paused) == (("a",), ())
            assert governor.controlled("a") and not governor.controlled("b")
            assert (await governor.run_once()).changed == ()  # nothing new
            await Q.pause(conn, "b")
            await Q.set_limits(conn, "other", global_concurrency=1)  # not served here
            second = await governor.run_once()
            assert (second.changed, second.paused) == (("b",), ("b",))
            assert governor.settings("b").paused and governor.controlled("b")
            await Q.resume(conn, "b")
            third = await governor.run_once()
            assert (third.changed, third.paused) == (("b",), ())
            assert not governor.controlled("b")
            assert changed == ["a", "b", "b"] and paused == ["b"]


async def test_a_full_queue_is_not_woken_by_another_queues_outcomes(
    dsn: str, claims: list[trioq.LimitedClaim]
) -> None:
    """A busy unlimited queue beside a limited one that is full: the full one claims again
    when one of its own slots frees, not on every batch the other queue completes."""
    tasks = trioq.Registry()
    release = trio.Event()
    quick_done = Gauge()

    @tasks.task(queue="limited")
    async def hold(job: trioq.JobContext) -> None:
        await release.wait()

    @tasks.task(queue="busy")
    async def quick(job: trioq.JobContext) -> None:
        await quick_done.run(0)

    queues = {"limited": QueueConfig(concurrency=2, global_concurrency=1),
              "busy": QueueConfig(concurrency=5)}  # fmt: skip
    async with serving(dsn, tasks, queues=queues, poll_interval=60) as (conn, _):
        await trioq.enqueue_bulk(conn, "hold", [{}] * 2, queue="limited")
        await wait_until(
            lambda: value_is(conn, "SELECT count(*) FROM trioq.jobs WHERE state = 'running'", 1),
            timeout=20,
        )
        before = len(claims)
        for _ in range(20):  # 20 transactions: many small batches of the busy queue
            await trioq.enqueue_bulk(conn, "quick", [{}] * 10, queue="busy")
        await wait_until(lambda: trio_true(quick_done.done == 200), timeout=20)
        assert len(claims) - before <= 2, [(len(c.jobs), c.reason) for c in claims[before:]]
        release.set()


async def test_the_poll_reads_settings_and_finds_the_queues_with_work(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One statement for every served queue: its settings (defaults without a row), and
    whether a claim could take a job of it now; the fetchers of those with work are woken,
    and aging skips the others. A job not due yet, past its start deadline or running is not
    work; nor is a queue that is not served."""
    import trioq._worker.services.aging as aging_module
    from trioq._worker.services.aging import Aging
    from trioq._worker.services.governor import Governor

    woken: list[str] = []

    async def on_paused(name: str) -> None:
        pass

    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        async with trioq.pg.Pool(dsn, max_size=1, connect_kwargs={"autocommit": True}) as pool:
            served = ["due", "later", "late", "running", "empty", "paused"]
            governor = Governor(pool, Q, {n: QueueConfig() for n in served}, poll_interval=60,
                                on_change=woken.append, on_paused=on_paused)  # fmt: skip
            assert all(governor.has_work(n) for n in served)  # before the first poll
            first = await governor.run_once()
            assert first.due == () and woken == [] and first.changed == ()
            assert not any(governor.has_work(n) for n in served)
            for queue in ("due", "later", "late", "running", "paused", "unserved"):
                await Q.enqueue(conn, "t", queue=queue, notify=False)
            await conn.execute("UPDATE trioq.jobs SET run_at = now() + interval '1 hour'"
                               " WHERE queue = 'later'")  # by hand: available, not due
            await conn.execute("UPDATE trioq.jobs SET run_at = now() - interval '2 s',"
                               " start_by = now() - interval '1 s'"
                               " WHERE queue = 'late'")  # fmt: skip
            await conn.execute("UPDATE trioq.jobs SET state = 'running', lease_owner = 'x',"
                               " lease_expires_at = now() + interval '1 h', attempt = 1"
                               " WHERE queue = 'running'")  # fmt: skip
            await Q.pause(conn, "paused")
            second = await governor.run_once()
            assert second.due == ("due", "paused")  # a paused queue's claim says so itself
            assert second.changed == ("paused",) and second.paused == ("paused",)
            assert sorted(woken) == ["due", "paused", "paused"]
            assert [n for n in served if governor.has_work(n)] == ["due", "paused"]
            assert governor.settings("due") == trioq.QueueSettings(name="due")
            aged = Aging(pool, Q, served, has_work=governor.has_work)
            assert (await aged.run_once()).aged == {}  # nothing old enough, but it looked

            calls: list[str] = []
            real = trioq._flow.age_queue

            async def counted(conn: Any, sql: Any, name: str, **kwargs: Any) -> int:
                calls.append(name)
                return await real(conn, sql, name, **kwargs)

            monkeypatch.setattr(aging_module, "age_queue", counted)
            await aged.run_once()
            assert calls == ["due", "paused"]  # the queues with work only
            await conn.execute("DELETE FROM trioq.jobs")
            await governor.run_once()
            calls.clear()
            assert (await aged.run_once()).aged == {} and calls == []


async def test_an_idle_worker_sends_one_statement_a_poll_whatever_its_queues(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five idle queues: after each fetcher's first claim, no claim at all while the polls
    go by (before, each fetcher claimed once a poll, and the settings were read apart); a
    job enqueued without its notification is found by the next poll, and only its queue's
    fetcher claims."""
    import trioq._worker.services.governor as governor_module

    tasks = trioq.Registry()
    done = trio.Event()

    @tasks.task(queue="q3")
    async def quiet(job: trioq.JobContext) -> None:
        done.set()

    claims: list[str] = []
    real_claim = Driver.claim

    async def claim(self: Driver, conn: Any, queue: str, **kwargs: Any) -> Any:
        claims.append(queue)
        return await real_claim(self, conn, queue, **kwargs)

    polls = 0
    real_poll = trioq._flow.poll_queues

    async def poll(*args: Any) -> Any:
        nonlocal polls
        got = await real_poll(*args)
        polls += 1
        return got

    monkeypatch.setattr(Driver, "claim", claim)
    monkeypatch.setattr(governor_module, "poll_queues", poll)
    names = [f"q{i}" for i in range(5)]
    async with serving(dsn, tasks, poll_interval=0.05,
                       queues={n: QueueConfig() for n in names}) as (conn, _):  # fmt: skip
        # At the start each fetcher claims, and once more if LISTEN's first wake-up (a
        # notification may have been missed before it) came after its first claim.
        await wait_until(lambda: _at_least(lambda: set(claims) == set(names)))
        first = polls
        await wait_until(lambda: _at_least(lambda: polls >= first + 2))
        started = len(claims)
        assert started <= 2 * len(names)
        await wait_until(lambda: _at_least(lambda: polls >= first + 7))
        assert len(claims) == started  # five polls, no claim
        await Q.enqueue(conn, "quiet", queue="q3", notify=False)
        with trio.fail_after(10):
            await done.wait()
        assert claims[started:] in (["q3"], ["q3", "q3"])  # the job's, and maybe one after


async def _at_least(predicate: Any) -> bool:
    await trio.lowlevel.checkpoint()
    return bool(predicate())


async def test_a_poll_that_fails_wakes_the_drained_fetchers(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drained fetchers wait for the poll: a round that fails (here the statement
    raises) wakes those, which claim as they did on a timer of their own, and aging looks
    at every queue, for as long as the failures last; a fetcher not waiting drained (one
    backing off a failed claim) is left alone. And the queues with work are woken before
    anything else the round does can fail or wait."""
    import trioq._worker.services.governor as governor_module
    from trioq._worker.services.governor import Governor
    from trioq._worker.wakeup import Wakeup

    woken: list[str] = []
    work = {name: Wakeup() for name in ("a", "b", "c")}

    def wake(name: str) -> None:
        woken.append(name)
        work[name].set()

    async def on_paused(name: str) -> None:
        raise RuntimeError("releasing failed")

    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        async with trioq.pg.Pool(dsn, max_size=1, connect_kwargs={"autocommit": True}) as pool:
            governor = Governor(pool, Q, {name: QueueConfig() for name in work},
                                poll_interval=60, on_change=wake,
                                on_paused=on_paused)  # fmt: skip
            await governor.run_once()
            assert not any(governor.has_work(name) for name in work)
            returned: list[str] = []

            async def drained(name: str) -> None:
                await governor.wait(name, trioq.LimitedClaim(jobs=[]), 0, work[name])
                returned.append(name)

            async def broken(*args: Any) -> Any:
                raise psycopg.OperationalError("the poll failed")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(drained, "a")
                nursery.start_soon(drained, "b")  # "c" backs off a failed claim elsewhere
                await wait_until(lambda: _at_least(lambda: len(governor._drained) == 2))
                monkeypatch.setattr(governor_module, "poll_queues", broken)
                with pytest.raises(psycopg.OperationalError):
                    await governor._poll_round()
            assert sorted(returned) == ["a", "b"] and sorted(woken) == ["a", "b"]
            assert all(governor.has_work(name) for name in work)
            monkeypatch.undo()
            woken.clear()
            await governor.run_once()  # nothing anywhere: back to waiting for the poll
            assert woken == [] and not governor.has_work("a")
            await Q.enqueue(conn, "t", queue="a", notify=False)
            await Q.pause(conn, "a")  # the round's release of its jobs fails after the wake
            with pytest.raises(RuntimeError):
                await governor._poll_round()
            assert woken == ["a"]  # its work was woken before the release failed
