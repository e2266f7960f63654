"""Per-minute job history: the aggregator's rules, the writer's upsert and pruning, and a
real runtime whose outcomes end up in ``job_history``."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import psycopg
import pytest
import trio
from helpers import rows, traced, wait_until
from test_runtime import serving

import trioq
from trioq._job import Failure, Job, Lease
from trioq._obs.history import (
    BUCKETS,
    Cell,
    CellKey,
    History,
    bucket,
    bucket_bounds_ms,
    classify,
    percentile_ms,
)
from trioq._outcome import Kind, Outcome
from trioq._worker.services import history_writer as _history_writer
from trioq._worker.services.history_writer import HistoryWriter
from trioq.retry import Constant

# -- the rules, without a database ------------------------------------------------------------


def test_buckets_are_powers_of_two_milliseconds() -> None:
    assert [bucket(us) for us in (0, 999, 1000, 1999, 2000, 3999, 4000)] == [0, 0, 1, 1, 2, 2, 3]
    assert bucket(50_000) == 6  # 50 ms is in [32, 64)
    assert bucket(10**15) == BUCKETS - 1  # 31 years: the open-ended last bucket
    assert bucket_bounds_ms(0) == (0.0, 1.0)
    assert bucket_bounds_ms(6) == (32.0, 64.0)
    assert bucket_bounds_ms(BUCKETS - 1) == (2.0 ** (BUCKETS - 2), float("inf"))
    for i in range(1, BUCKETS - 1):  # every bucket's bounds map back to it
        low, high = bucket_bounds_ms(i)
        assert bucket(int(low * 1000)) == i and bucket(int(high * 1000) - 1) == i


def test_percentiles_interpolate_inside_a_bucket() -> None:
    hist = [0] * BUCKETS
    assert percentile_ms(hist, 0.5) is None
    hist[6] = 100  # 100 runs between 32 and 64 ms
    assert percentile_ms(hist, 0.5) == pytest.approx(48.0)
    assert percentile_ms(hist, 1.0) == pytest.approx(64.0)
    assert percentile_ms(hist, 0.99, max_ms=40.0) == 40.0  # never above the largest seen
    hist[BUCKETS - 1] = 100
    assert percentile_ms(hist, 0.99, max_ms=9e6) is not None


def _job(*, queue: str = "q", task: str = "t", attempt: int = 1, max_attempts: int = 3) -> Job:
    return Job.from_row((1, queue, task, "{}", 0, 0, attempt, max_attempts, 0, 0))


def _outcome(kind: Kind, job: Job | None, **options: Any) -> Outcome:
    outcome = Outcome(kind=kind, lease=Lease(1, job.attempt if job else 1), **options)
    outcome.job = job
    return outcome


def _failure(job: Job, *, fatal: bool = False) -> Failure:
    return Failure(lease=Lease(1, job.attempt), error="x", fatal=fatal)


def test_what_an_outcome_counts_as() -> None:
    first, last = _job(attempt=1), _job(attempt=3)
    assert classify(_outcome(Kind.COMPLETE, first)) == "completed"
    assert classify(_outcome(Kind.KEEP, first)) == "completed"
    assert classify(_outcome(Kind.NOTHING, first, committed=True)) == "completed"
    assert classify(_outcome(Kind.NOTHING, first)) is None  # a lost lease: not ours
    assert classify(_outcome(Kind.FAIL, first, failure=_failure(first))) == "retried"
    assert classify(_outcome(Kind.FAIL, last, failure=_failure(last))) == "dead"
    assert classify(_outcome(Kind.FAIL, first, failure=_failure(first, fatal=True))) == "dead"
    assert classify(_outcome(Kind.CANCELLED, first)) == "cancelled"
    assert classify(_outcome(Kind.RELEASE, first)) is None  # shutdown or snooze


def _by_task(cells: dict[CellKey, Cell]) -> dict[str, Cell]:
    """The cells summed per task (a run that ends as the minute turns lands in the next)."""
    summed: dict[str, Cell] = {}
    for (_, _, task), cell in cells.items():
        summed.setdefault(task, Cell()).merge(cell)
    return summed


def test_the_fast_path_and_the_slow_path_agree() -> None:
    """Completions are summed in floats (the fast path), failures one by one in ints."""
    history = History()
    now_us = int(time.time() * 1_000_000)
    due = Job.from_row((1, "q", "t", "{}", 0, now_us - 3_000_000, 1, 3, now_us - 9_000_000, 0))
    now = time.monotonic()
    done, failed = _outcome(Kind.COMPLETE, due), _outcome(Kind.FAIL, due, failure=_failure(due))
    for outcome in (done, failed):
        outcome.started, outcome.ended = now - 0.05, now  # started 2.95 s after it was due
    history.record([done])
    history.record([failed])
    (cell,) = _by_task(history.take()).values()
    assert (cell.completed, cell.retried, cell.runs) == (1, 1, 2)
    assert cell.exec_hist[6] == 2 and cell.wait_hist[12] == 2  # 50 ms; 2.95 s in [2048, 4096)
    assert 2 * 49_000 <= cell.exec_us_sum <= 2 * 51_000
    assert 2_900_000 <= cell.wait_us_max <= 3_100_000


def test_record_adds_up_per_minute_queue_and_task() -> None:
    history = History()
    a, b = _job(task="a"), _job(task="b")
    timed = _outcome(Kind.COMPLETE, a)
    now = time.monotonic()
    timed.started, timed.ended = now - 0.05, now  # 50 ms, ended just now
    history.record([timed, _outcome(Kind.COMPLETE, a), _outcome(Kind.CANCELLED, b)])
    history.record([_outcome(Kind.COMPLETE, None)])  # no job: not the runtime's, skipped
    cells = history.take()
    assert len(history) == 0
    assert all(key[0] % 60 == 0 for key in cells)
    by_task = _by_task(cells)
    assert set(by_task) == {"a", "b"}
    assert by_task["a"].completed == 2 and by_task["a"].runs == 1  # one of them ran timed
    assert by_task["a"].exec_hist[6] == 1 and 49_000 <= by_task["a"].exec_us_max <= 51_000
    assert by_task["a"].wait_hist[BUCKETS - 1] == 1  # due at the epoch: the last bucket
    assert by_task["b"].cancelled == 1 and by_task["b"].runs == 0
    history.record([_outcome(Kind.COMPLETE, a)])
    history.restore(cells)  # a failed write comes back, merged with what came since
    again = _by_task(history.take())
    assert again["a"].completed == 3 and again["a"].exec_hist[6] == 1


# -- the writer, against Postgres ---------------------------------------------------------------


async def _history_rows(conn: Any) -> list[tuple[Any, ...]]:
    return await rows(
        conn,
        "SELECT queue, task, completed, retried, dead, cancelled, runs, exec_us_sum,"
        " exec_us_max, exec_hist, wait_us_max, wait_hist FROM trioq.job_history ORDER BY 1, 2",
    )


async def test_rounds_merge_into_one_row_per_minute(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        history = History()
        async with trioq.pg.Pool(dsn, max_size=2, connect_kwargs={"autocommit": True}) as pool:
            writer = HistoryWriter(
                pool, "trioq", history, interval=1, retention=dt.timedelta(days=7)
            )
            minute = 1_800_000_000 // 60 * 60
            for exec_us, wait_us in ((5_000, 100), (40_000, 3_000_000)):
                cell = Cell(completed=1)
                cell.time(exec_us, wait_us)
                history.restore({(minute, "q", "t"): cell, (minute, "q", "u"): Cell(dead=2)})
                done = await writer.run_once()
                assert done.written == 2 and done.pruned == 0
            assert len(history) == 0
        (t, u) = await _history_rows(conn)
        assert t[:9] == ("q", "t", 2, 0, 0, 0, 2, 45_000, 40_000)
        assert t[9][3] == 1 and t[9][6] == 1 and sum(t[9]) == 2  # 5 ms and 40 ms, merged
        assert t[10] == 3_000_000 and t[11][12] == 1 and t[11][0] == 1
        assert u[2:6] == (0, 0, 4, 0)


async def test_a_failed_write_keeps_the_history(dsn: str) -> None:
    history = History()
    history.restore({(0, "q", "t"): Cell(completed=3)})
    async with trioq.pg.Pool(dsn, max_size=1, connect_kwargs={"autocommit": True}) as pool:
        writer = HistoryWriter(pool, "trioq", history, interval=1, retention=dt.timedelta(1))
        with pytest.raises(psycopg.errors.UndefinedTable):
            await writer.run_once()  # not migrated: the table is missing
    assert history.take()[(0, "q", "t")].completed == 3


async def test_old_rows_are_pruned_in_batches(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_history_writer, "PRUNE_BATCH", 2)
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        zeros = "array_fill(0::int8, ARRAY[24])"
        await conn.execute(
            "INSERT INTO trioq.job_history (minute, queue, task, exec_hist, wait_hist)"
            f" SELECT now() - g * interval '1 day' - interval '1 hour', 'q', 't', {zeros},"
            f" {zeros} FROM generate_series(0, 9) AS g"
        )
        now = [0.0]
        async with trioq.pg.Pool(dsn, max_size=1, connect_kwargs={"autocommit": True}) as pool:
            writer = HistoryWriter(
                pool, "trioq", History(), interval=1, retention=dt.timedelta(days=7),
                clock=lambda: now[0],
            )  # fmt: skip
            pruned = [(await writer.run_once()).pruned for _ in range(2)]
            assert pruned == [2, 1]  # 7, 8 and 9 days and an hour old; 2 a round, at once
            assert await rows(conn, "SELECT count(*) FROM trioq.job_history") == [(7,)]
            await conn.execute(
                "INSERT INTO trioq.job_history (minute, queue, task, exec_hist, wait_hist)"
                f" VALUES (now() - interval '30 days', 'q', 't', {zeros}, {zeros})"
            )
            now[0] = _history_writer.PRUNE_EVERY - 1  # the last prune was not a full batch
            async with pool.connection() as pooled:  # the pool's one connection
                pass
            with traced(pooled) as sent:
                assert (await writer.run_once()).pruned == 0
            assert sent == []  # an idle round before the prune is due sends nothing
            now[0] = _history_writer.PRUNE_EVERY
            assert (await writer.run_once()).pruned == 1
        assert await rows(conn, "SELECT count(*) FROM trioq.job_history") == [(7,)]


async def test_concurrent_writers_add_up_without_deadlock(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
    this_minute = int(time.time()) // 60 * 60  # recent: the rounds also prune (a day)
    rounds = 15
    keys = [(this_minute - 60 * m, q, "t") for m in range(10) for q in ("a", "b", "c")]

    async def writer_rounds(pool: trioq.pg.Pool, reverse: bool) -> None:
        history = History()
        writer = HistoryWriter(pool, "trioq", history, interval=1, retention=dt.timedelta(1))
        for _ in range(rounds):
            history.restore({key: Cell(completed=1) for key in (keys[::-1] if reverse else keys)})
            await writer.run_once()

    async with trioq.pg.Pool(dsn, max_size=4, connect_kwargs={"autocommit": True}) as pool:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(4):
                    nursery.start_soon(writer_rounds, pool, i % 2 == 1)
    async with await trioq.connect(dsn, autocommit=True) as conn:
        got = await rows(conn, "SELECT count(*), min(completed), max(completed)"
                               " FROM trioq.job_history")  # fmt: skip
    assert got == [(len(keys), 4 * rounds, 4 * rounds)]


# -- a real worker ----------------------------------------------------------------------------


async def test_a_workers_outcomes_land_in_the_history(dsn: str) -> None:
    tasks = trioq.Registry()
    started = trio.Event()

    @tasks.task(queue="h")
    async def ok(job: trioq.JobContext) -> None:
        await trio.sleep(0.05)

    @tasks.task(queue="h", retry=Constant(seconds=0))
    async def flaky(job: trioq.JobContext) -> None:
        if job.attempt == 1:
            raise RuntimeError("first attempt fails")

    @tasks.task(queue="h")
    async def fatal(job: trioq.JobContext) -> None:
        raise trioq.FatalError("no")

    @tasks.task(queue="h", max_attempts=1)
    async def once(job: trioq.JobContext) -> None:
        raise RuntimeError("the only attempt fails")

    @tasks.task(queue="h")
    async def tx(job: trioq.JobContext) -> None:
        async with job.transaction() as conn:
            await conn.execute("SELECT 1")

    @tasks.task(queue="h")
    async def forever(job: trioq.JobContext) -> None:
        started.set()
        await trio.sleep_forever()

    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        # Due 5 s ago, enqueued 2 s ago: the queue wait starts at enqueued_at.
        await conn.execute(
            "INSERT INTO trioq.jobs (queue, task, run_at, enqueued_at)"
            " VALUES ('h', 'ok', now() - interval '5 s', now() - interval '2 s')"
        )
    async with serving(dsn, tasks, queues={"h": trioq.QueueConfig(concurrency=4)},
                       history_interval=60) as (conn, _):  # fmt: skip
        for task in (ok, ok, flaky, fatal, once, tx, forever):
            await task.enqueue(conn)  # with the task's max_attempts
        with trio.fail_after(10):
            await started.wait()
        (job_id,) = (await rows(conn, "SELECT id FROM trioq.jobs WHERE task = 'forever'"))[0]
        await trioq.Queue().cancel(conn, job_id)

        async def settled() -> bool:
            left = await rows(conn, "SELECT count(*) FROM trioq.jobs WHERE state <> 'cancelled'")
            return left == [(0,)]

        await wait_until(settled)
    # The interval is 60 s: what is there was written by the shutdown's last round.
    async with await trioq.connect(dsn, autocommit=True) as conn:
        got = {r[1]: r for r in await _history_rows(conn)}
    assert set(got) == {"ok", "flaky", "fatal", "once", "tx", "forever"}
    counts = {task: r[2:6] for task, r in got.items()}  # completed, retried, dead, cancelled
    assert counts == {
        "ok": (3, 0, 0, 0),
        "flaky": (1, 1, 0, 0),
        "fatal": (0, 0, 1, 0),
        "once": (0, 0, 1, 0),
        "tx": (1, 0, 0, 0),
        "forever": (0, 0, 0, 1),
    }
    ok_row = got["ok"]
    assert ok_row[6] == 3 and sum(ok_row[9]) == 3  # three timed runs
    assert ok_row[9][6] == 3, ok_row[9]  # 50 ms each: [32, 64) ms
    assert 2_000_000 <= ok_row[10] < 30_000_000  # the job enqueued 2 s before it was due
    assert got["forever"][6] == 0  # stopped by the cancel: not timed
