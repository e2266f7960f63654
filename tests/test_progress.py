"""A running job's progress (docs/progress.md): ``await job.progress(value)`` in a handler,
written at most once per job per ``Config.progress_interval`` (the latest value winning),
fenced by the lease, bounded in size, and read by `trioq.job_status`, ``trioq jobs show`` and
the dashboard's job page; every reader survives a hostile value written by hand. Real
Postgres."""

from __future__ import annotations

import datetime as dt
import json
import math
import time
from typing import Any

import attrs
import psycopg
import pytest
import trio
from asgi import call
from clitool import trioq_cli
from helpers import migrated, rows, scalar, serving, wait_until

import trioq
import trioq.testing as tt
import trioq.web
from trioq._outcome import Kind, Outcome
from trioq._progress import MAX_PROGRESS_BYTES, ProgressBuffer, UnreadableProgress
from trioq._worker.completer import Completer
from trioq._worker.services.progress import ProgressWriter

LEASE = dt.timedelta(minutes=5)
AUTO = {"autocommit": True}

# Counts every write of a job's progress: a row-level trigger on the column (the test's own
# table, so nothing of trioq's is changed).
COUNT_WRITES = """
CREATE TABLE progress_writes (job_id int8, at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION count_progress_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.progress_writes (job_id) VALUES (NEW.id);
    RETURN NULL;
END $$;
CREATE TRIGGER count_progress_write AFTER UPDATE OF progress ON trioq.jobs
    FOR EACH ROW EXECUTE FUNCTION count_progress_write();
"""


async def writes(conn: Any, job_id: int | None = None) -> int:
    if job_id is None:
        return int(await scalar(conn, "SELECT count(*) FROM progress_writes"))
    return int(await scalar(conn, "SELECT count(*) FROM progress_writes WHERE job_id = %s",
                            job_id))  # fmt: skip


async def claimed(conn: Any, n: int = 1, owner: str = "w") -> list[trioq.Lease]:
    """``n`` jobs enqueued and claimed by ``owner``: their leases."""
    await trioq.enqueue_bulk(conn, "t", [{"i": i} for i in range(n)])
    jobs = await trioq.Queue().claim(conn, "default", owner=owner, limit=n, lease=LEASE)
    return [trioq.Lease(job.id, job.attempt) for job in jobs]


def writer(pool: trioq.pg.Pool, buffer: ProgressBuffer, owner: str = "w") -> ProgressWriter:
    return ProgressWriter(pool, trioq.Queue().driver, buffer, owner=owner, interval=3600)


# -- the writer: coalescing, the fence, failures ----------------------------------------------


async def test_ten_thousand_reports_are_one_write_of_the_last(dsn: str) -> None:
    async with migrated(dsn) as conn, trioq.pg.Pool(dsn, max_size=2, connect_kwargs=AUTO) as pool:
        await conn.execute(COUNT_WRITES)
        first, second = await claimed(conn, 2)
        buffer = ProgressBuffer()
        for i in range(10_000):
            buffer.record(first, json.dumps({"done": i, "of": 10_000}))
        buffer.record(second, '"halfway"')
        done = await writer(pool, buffer).run_once()
        assert (done.written, done.fenced) == (2, 0)
        assert await writes(conn, first.job_id) == 1 and await writes(conn, second.job_id) == 1
        status = await trioq.job_status(conn, first.job_id)
        assert status.progress == {"done": 9_999, "of": 10_000}
        assert status.progress_at is not None
        assert (await trioq.job_status(conn, second.job_id)).progress == "halfway"
        assert buffer.coalesced == 9_999 and len(buffer) == 0
        again = await writer(pool, buffer).run_once()  # nothing new: nothing written
        assert again.written == 0 and await writes(conn) == 2


async def test_a_lost_lease_writes_no_progress(dsn: str) -> None:
    async with migrated(dsn) as conn, trioq.pg.Pool(dsn, max_size=2, connect_kwargs=AUTO) as pool:
        await conn.execute(COUNT_WRITES)
        (lease,) = await claimed(conn)
        # The lease expired and another worker claimed the job (attempt 2, its owner).
        await conn.execute("UPDATE trioq.jobs SET lease_owner = 'thief', attempt = 2, "
                           "max_attempts = 5 WHERE id = %s", (lease.job_id,))  # fmt: skip
        buffer = ProgressBuffer()
        buffer.record(lease, '{"stale": true}')
        done = await writer(pool, buffer).run_once()
        assert (done.written, done.fenced) == (0, 1)
        assert await writes(conn) == 0
        assert (await trioq.job_status(conn, lease.job_id)).progress is None
        assert len(buffer) == 0 and buffer.last(lease) is None  # dropped: never ours again
        # The thief's own attempt writes; the old owner's value never overwrites it.
        thief = ProgressBuffer()
        thief.record(trioq.Lease(lease.job_id, 2), '{"mine": 1}')
        assert (await writer(pool, thief, owner="thief").run_once()).written == 1
        buffer.record(lease, '{"stale": 2}')
        assert (await writer(pool, buffer).run_once()).written == 0
        assert (await trioq.job_status(conn, lease.job_id)).progress == {"mine": 1}


async def test_a_value_recorded_while_a_round_writes_waits_for_the_next(dsn: str) -> None:
    async with migrated(dsn) as conn, trioq.pg.Pool(dsn, max_size=2, connect_kwargs=AUTO) as pool:
        (lease,) = await claimed(conn)
        buffer = ProgressBuffer()
        buffer.record(lease, "1")
        snapshot = buffer.snapshot()
        buffer.record(lease, "2")  # newer than what the round is writing
        buffer.written(snapshot)
        assert buffer.snapshot() == [(lease, "2")]
        assert (await writer(pool, buffer).run_once()).written == 1
        assert (await trioq.job_status(conn, lease.job_id)).progress == 2


async def test_a_failed_round_keeps_the_values_for_the_next(dsn: str) -> None:
    async with migrated(dsn) as conn, trioq.pg.Pool(dsn, max_size=2, connect_kwargs=AUTO) as pool:
        (lease,) = await claimed(conn)
        buffer = ProgressBuffer()
        buffer.record(lease, '{"n": 1}')
        await conn.execute("ALTER TABLE trioq.jobs RENAME COLUMN progress TO progress_gone")
        with pytest.raises(psycopg.errors.UndefinedColumn):
            await writer(pool, buffer).run_once()
        assert buffer.snapshot() == [(lease, '{"n": 1}')]  # still pending
        await conn.execute("ALTER TABLE trioq.jobs RENAME COLUMN progress_gone TO progress")
        assert (await writer(pool, buffer).run_once()).written == 1
        assert (await trioq.job_status(conn, lease.job_id)).progress == {"n": 1}


async def test_a_value_the_schema_refuses_does_not_hold_the_others_back(dsn: str) -> None:
    async with migrated(dsn) as conn, trioq.pg.Pool(dsn, max_size=2, connect_kwargs=AUTO) as pool:
        good, bad = await claimed(conn, 2)
        buffer = ProgressBuffer()
        buffer.record(good, '"fine"')
        # Over migration 18's check (8 MiB stored): job.progress() would never take it.
        buffer.record(bad, json.dumps([1] * (2 * 1024 * 1024)))
        done = await writer(pool, buffer).run_once()
        assert done.written == 1 and len(buffer) == 0
        assert (await trioq.job_status(conn, good.job_id)).progress == "fine"
        assert (await trioq.job_status(conn, bad.job_id)).progress is None


async def test_the_completer_writes_the_last_value_and_a_refused_one_costs_no_outcome(
    dsn: str,
) -> None:
    async with migrated(dsn) as conn, trioq.pg.Pool(dsn, max_size=2, connect_kwargs=AUTO) as pool:
        await conn.execute(COUNT_WRITES)
        kept, deleted, refused = await claimed(conn, 3)
        buffer = ProgressBuffer()
        buffer.record(kept, '"last"')
        buffer.record(deleted, '"gone with its row"')
        outcomes = [Outcome(kind=Kind.KEEP, lease=kept, result=1),
                    Outcome(kind=Kind.COMPLETE, lease=deleted)]  # fmt: skip
        completer = Completer(pool, trioq.Queue().driver, "w", capacity=4,
                              written=lambda batch: None, progress=buffer)  # fmt: skip
        async with trio.open_nursery() as nursery:
            nursery.start_soon(completer.run)
            for outcome in outcomes:
                await completer.submit(outcome)
            await completer.close()
        assert (await trioq.job_status(conn, kept.job_id)).progress == "last"
        assert await writes(conn) == 1  # the deleted job's value was not written first
        # A value over the schema's check: dropped, the outcome written all the same.
        buffer.record(refused, json.dumps([1] * (2 * 1024 * 1024)))
        completer = Completer(pool, trioq.Queue().driver, "w", capacity=4,
                              written=lambda batch: None, progress=buffer)  # fmt: skip
        with trio.fail_after(10):  # not retried for ever
            async with trio.open_nursery() as nursery:
                nursery.start_soon(completer.run)
                await completer.submit(Outcome(kind=Kind.KEEP, lease=refused, result=2))
                await completer.close()
        status = await trioq.job_status(conn, refused.job_id)
        assert (status.state, status.result, status.progress) == ("done", 2, None)


# -- the worker: rate, final value, retries, dead jobs, sync handlers ---------------------------


async def test_a_tight_loop_costs_the_database_a_few_writes(dsn: str) -> None:
    tasks = trioq.Registry()
    took: list[float] = []

    @tasks.task(keep_result=True)
    async def busy(job: trioq.JobContext) -> str:
        started = time.monotonic()
        for i in range(10_000):
            await job.progress({"done": i + 1, "of": 10_000})
        took.append(time.monotonic() - started)
        return "ok"

    async with serving(dsn, tasks, progress_interval=0.1) as (conn, _runtime):
        await conn.execute(COUNT_WRITES)
        job_id = (await trioq.enqueue(conn, "busy")).job_id
        assert await trioq.result(conn, job_id, timeout=30) == "ok"
        count = await writes(conn, job_id)
        status = await trioq.job_status(conn, job_id)
    # One write per interval the loop ran, one more at most for the last value: never
    # anything like one per call.
    assert 1 <= count <= math.ceil(took[0] / 0.1) + 2, (count, took)
    assert count < 100
    assert status.progress == {"done": 10_000, "of": 10_000}  # the last value won


async def test_progress_is_visible_while_the_job_runs_and_after_it_is_kept(dsn: str) -> None:
    tasks = trioq.Registry()
    go_on = trio.Event()

    @tasks.task(keep_result=True)
    async def stepper(job: trioq.JobContext) -> int:
        await job.progress({"done": 40, "of": 100})
        await go_on.wait()
        await job.progress({"done": 100, "of": 100, "stage": "finished"})
        return 7

    async with serving(dsn, tasks, progress_interval=0.05) as (conn, _runtime):
        job_id = (await trioq.enqueue(conn, "stepper")).job_id

        async def seen() -> bool:
            return (await trioq.job_status(conn, job_id)).progress == {"done": 40, "of": 100}

        await wait_until(seen)
        running = await trioq.job_status(conn, job_id)
        assert running.state == "running" and running.progress_at is not None
        shown = trioq_cli("jobs", "show", str(job_id), "--dsn", dsn)
        assert shown.returncode == 0, shown.stderr
        # jsonb keeps an object's keys in its own order (shorter first)
        assert '  progress:  {"of": 100, "done": 40} (at ' in shown.stdout
        as_json = trioq_cli("jobs", "--json", "show", str(job_id), "--dsn", dsn)
        assert json.loads(as_json.stdout)["progress"] == {"done": 40, "of": 100}
        app = trioq.web.app(dsn)
        try:
            page = await call(app, "GET", f"/jobs/{job_id}/live")
            assert page.status == 200
            assert 'id="progress-bar" max="1" value="0.4"' in page.text
            assert "&#34;done&#34;: 40" in page.text
        finally:
            await app.aclose()
        go_on.set()
        assert await trioq.result(conn, job_id, timeout=10) == 7
        done = await trioq.job_status(conn, job_id)
        assert done.progress == {"done": 100, "of": 100, "stage": "finished"}


async def test_the_last_value_is_written_before_the_outcome(dsn: str) -> None:
    """No round of the writer in the test (an hour's interval): the completer writes it."""
    tasks = trioq.Registry()

    @tasks.task(keep_result=True)
    async def kept(job: trioq.JobContext) -> None:
        await job.progress("kept")

    @tasks.task(max_attempts=1)
    async def dies(job: trioq.JobContext) -> None:
        await job.progress({"at": "the end"})
        raise trioq.FatalError("no")

    @tasks.task
    async def gone(job: trioq.JobContext) -> None:
        await job.progress("deleted with its row")

    async with serving(dsn, tasks, progress_interval=3600) as (conn, _runtime):
        await conn.execute(COUNT_WRITES)
        ids = [(await trioq.enqueue(conn, name)).job_id for name in ("kept", "dies", "gone")]
        await wait_until(lambda: _ended(conn, ids))
        kept_status, dead_status, gone_status = [await trioq.job_status(conn, i) for i in ids]
        assert (kept_status.state, kept_status.progress) == ("done", "kept")
        assert (dead_status.state, dead_status.progress) == ("dead", {"at": "the end"})
        assert dead_status.progress_at is not None
        assert gone_status.state == "unknown"
        assert await writes(conn, ids[2]) == 0  # a deleted row is not written first
        dead_page = trioq_cli("jobs", "show", str(ids[1]), "--dsn", dsn)
        assert '  progress:  {"at": "the end"}' in dead_page.stdout


async def _ended(conn: Any, ids: list[int]) -> bool:
    states = [(await trioq.job_status(conn, i)).state for i in ids]
    return all(state in ("done", "dead", "unknown") for state in states)


async def test_a_sync_handler_reports_from_its_thread(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task(keep_result=True)
    def blocking(job: trioq.JobContext) -> str:
        for i in range(1000):
            job.progress_nowait({"done": i + 1, "of": 1000})
        return "ok"

    async with serving(dsn, tasks) as (conn, _runtime):
        job_id = (await trioq.enqueue(conn, "blocking")).job_id
        assert await trioq.result(conn, job_id, timeout=10) == "ok"
        assert (await trioq.job_status(conn, job_id)).progress == {"done": 1000, "of": 1000}


async def test_a_worker_whose_lease_was_stolen_writes_no_more_progress(dsn: str) -> None:
    """The lease expired and another worker took the job; until the heartbeat notices, the
    old handler runs on and reports: the writer's fence keeps every value out. The writer's
    rounds are run by the test (its own interval is an hour)."""
    tasks = trioq.Registry()
    started = trio.Event()
    stolen = trio.Event()
    reported = trio.Event()
    stopped = trio.Event()

    @tasks.task
    async def victim(job: trioq.JobContext) -> None:
        try:
            await job.progress("before")
            started.set()
            await stolen.wait()
            await job.progress("after the theft")
            reported.set()
            await trio.sleep_forever()
        finally:
            stopped.set()

    # A heartbeat far apart: the old handler reports long before it is told.
    async with serving(dsn, tasks, progress_interval=3600, heartbeat_interval=3,
                       lease=60) as (conn, runtime):  # fmt: skip
        await conn.execute(COUNT_WRITES)
        writer = runtime._services.progress_writer
        job_id = (await trioq.enqueue(conn, "victim")).job_id
        await started.wait()
        assert (await writer.run_once()).written == 1
        await conn.execute("UPDATE trioq.jobs SET lease_owner = 'thief', attempt = 2 "
                           "WHERE id = %s", (job_id,))  # fmt: skip
        stolen.set()
        await reported.wait()
        done = await writer.run_once()
        assert (done.written, done.fenced) == (0, 1)
        assert not stopped.is_set()  # the handler still runs: only the fence kept it out
        assert await writes(conn, job_id) == 1
        assert (await trioq.job_status(conn, job_id)).progress == "before"
        assert len(runtime._services.progress) == 0  # dropped, not retried for ever
        await conn.execute("UPDATE trioq.jobs SET lease_owner = NULL, state = 'cancelled', "
                           "finished_at = now() WHERE id = %s", (job_id,))  # fmt: skip
        runtime._services.heartbeat.wake()  # the lease is lost: its handler is cancelled
        await stopped.wait()


async def test_a_job_committing_its_completion_holds_back_no_other_progress(dsn: str) -> None:
    """Its row is locked by its own transaction until it commits: the writer leaves its value
    for later rather than wait for that lock with every other job's value."""
    tasks = trioq.Registry()
    b_reports = trio.Event()

    @tasks.task
    async def locker(job: trioq.JobContext) -> None:
        await job.progress("about to commit")
        await job.complete_with("SELECT pg_advisory_xact_lock(4242)")  # waits for the test

    @tasks.task
    async def other(job: trioq.JobContext) -> None:
        await b_reports.wait()
        await job.progress("not held back")
        await trio.sleep_forever()

    async with serving(dsn, tasks, progress_interval=0.05) as (conn, _runtime):
        await conn.execute("SELECT pg_advisory_lock(4242)")
        a = (await trioq.enqueue(conn, "locker")).job_id
        b = (await trioq.enqueue(conn, "other")).job_id

        async def a_waits() -> bool:
            return bool(await scalar(conn, "SELECT count(*) FROM pg_locks WHERE locktype = "
                                           "'advisory' AND NOT granted"))  # fmt: skip

        await wait_until(a_waits)
        b_reports.set()

        async def b_written() -> bool:
            return (await trioq.job_status(conn, b)).progress == "not held back"

        await wait_until(b_written, timeout=5)
        assert (await trioq.job_status(conn, a)).state == "running"  # still committing
        await conn.execute("SELECT pg_advisory_unlock(4242)")
        await wait_until(lambda: _ended(conn, [a]))
        await trioq.Queue().cancel(conn, b)


# -- the test kit -------------------------------------------------------------------------------


async def test_drain_writes_the_last_progress_and_a_retry_keeps_it(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task(max_attempts=3, keep_result=True, retry=trioq.retry.Constant(seconds=10))
    async def flaky(job: trioq.JobContext) -> str:
        if job.attempt == 1:
            await job.progress({"attempt": 1})
            raise OSError("first attempt fails")
        async with job.connection() as conn:  # the retry sees the first attempt's progress
            seen.append((await trioq.job_status(conn, job.id)).progress)
        if job.attempt == 3:
            await job.progress({"attempt": 3})
            return "ok"
        raise OSError("second attempt fails, reporting nothing")

    @tasks.task(keep_result=True)
    def sync(job: trioq.JobContext) -> None:
        job.progress_nowait([1, 2, 3])

    seen: list[Any] = []
    async with migrated(dsn) as conn:
        await trioq.enqueue(conn, "flaky")
        await trioq.enqueue(conn, "sync")
        result = await tt.drain(conn, tasks, advance=True)
    by_task = [(run.task, run.outcome, run.progress) for run in result.runs]
    assert ("sync", "completed", [1, 2, 3]) in by_task
    assert [r for r in by_task if r[0] == "flaky"] == [
        ("flaky", "retried", {"attempt": 1}),
        ("flaky", "retried", {"attempt": 1}),  # kept until an attempt reports its own
        ("flaky", "completed", {"attempt": 3}),
    ]
    assert seen == [{"attempt": 1}, {"attempt": 1}]


async def test_job_context_keeps_the_last_value_without_a_database() -> None:
    ctx = tt.job_context("t")
    assert ctx.last_progress is None
    await ctx.progress({"done": 1})
    ctx.progress_nowait({"done": 2})
    assert ctx.last_progress == {"done": 2}


# -- the size bound and hostile values through the API -------------------------------------------


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({"text": "a\x00b"}, "progress must not contain NUL characters (Postgres jsonb cannot"),
        ("caf\udce9", "progress must not contain lone surrogates"),
        (math.nan, "progress must be JSON (dicts, lists, str, int, float, bool, None): Out of "
                   "range float values are not JSON compliant"),
        ({1, 2}, "progress must be JSON (dicts, lists, str, int, float, bool, None): Object of "
                 "type set is not JSON serializable"),
        (object(), "progress must be JSON"),
        (nested(5_000), "progress must be JSON (dicts, lists, str, int, float, bool, None): "
                        "nested too deep to encode"),
        ({"n": 10**5000}, "progress must be JSON"),
        ("x" * (64 * 1024), "progress is 65,538 bytes of JSON, over max_progress_bytes (65,536)"),
        (["é" * 40_000], "progress is 80,004 bytes of JSON, over max_progress_bytes (65,536)"),
    ],
    ids=["NUL", "surrogate", "NaN", "set", "object", "deep", "huge int", "over", "over utf-8"],
)
async def test_a_value_that_cannot_be_progress_is_a_value_error(value: Any, error: str) -> None:
    ctx = tt.job_context("t")
    with pytest.raises(ValueError, match="^" + __import__("re").escape(error)):
        await ctx.progress(value)
    with pytest.raises(ValueError, match="^" + __import__("re").escape(error)):
        ctx.progress_nowait(value)
    assert ctx.last_progress is None and len(ctx.services.progress) == 0


async def test_the_same_words_as_args() -> None:
    """The refusals say what an enqueue's say, with ``progress`` for ``args``."""
    for value in ({"text": "a\x00b"}, "caf\udce9", math.nan, {1, 2}):
        with pytest.raises(ValueError) as as_args:
            trioq.JobSpec(task="t", args=value)
        with pytest.raises(ValueError) as as_progress:
            await tt.job_context("t").progress(value)
        assert str(as_progress.value) == str(as_args.value).replace("args", "progress", 1)


async def test_values_at_the_limits_and_empty_ones_are_taken() -> None:
    ctx = tt.job_context("t")
    values: list[Any] = [None, "", {}, [], 0, -1.5, True, "x" * (64 * 1024 - 2)]
    for value in values:
        await ctx.progress(value)
        assert ctx.last_progress == value


def test_the_config_fields_are_checked() -> None:
    tasks = trioq.Registry()
    base = trioq.Config(registry=tasks)
    assert (base.max_progress_bytes, base.progress_interval) == (64 * 1024, 1.0)
    assert trioq.Config(registry=tasks, max_progress_bytes=MAX_PROGRESS_BYTES).max_progress_bytes
    cases: list[tuple[Any, type[Exception], str]] = [
        (0, ValueError, "max_progress_bytes must be between 1 and 1048576 bytes, got 0"),
        (-1, ValueError, "max_progress_bytes must be between 1 and 1048576 bytes, got -1"),
        (MAX_PROGRESS_BYTES + 1, ValueError, "max_progress_bytes must be between 1 and"),
        ("64k", TypeError, "max_progress_bytes must be an int (bytes), got '64k'"),
        (True, TypeError, "max_progress_bytes must be an int (bytes), got True"),
        (None, TypeError, "max_progress_bytes must be an int (bytes), got None"),
        (1.5, TypeError, "max_progress_bytes must be an int (bytes), got 1.5"),
    ]
    for bad, kind, words in cases:
        with pytest.raises(kind, match="^" + __import__("re").escape(words)):
            trioq.Config(registry=tasks, max_progress_bytes=bad)
    for bad in (0, -1, math.nan, math.inf):
        with pytest.raises(ValueError, match="progress_interval"):
            trioq.Config(registry=tasks, progress_interval=bad)
    with pytest.raises(TypeError, match="progress_interval"):
        trioq.Config(registry=tasks, progress_interval="1s")
    small = attrs.evolve(base, max_progress_bytes=10)
    assert small.max_progress_bytes == 10


async def test_a_smaller_limit_applies_in_the_worker(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task(max_attempts=1)
    async def chatty(job: trioq.JobContext) -> None:
        await job.progress("x" * 100)

    async with serving(dsn, tasks, max_progress_bytes=50) as (conn, _runtime):
        job_id = (await trioq.enqueue(conn, "chatty")).job_id
        with pytest.raises(trioq.JobDeadError) as dead:
            await trioq.result(conn, job_id, timeout=10)
        assert "progress is 102 bytes of JSON, over max_progress_bytes (50)" in str(dead.value)


# -- hostile rows: the schema refuses, the readers survive ---------------------------------------


async def test_the_schema_refuses_what_no_reader_should_read(dsn: str) -> None:
    async with migrated(dsn) as conn:
        (lease,) = await claimed(conn)
        huge = "('[' || repeat('1,', 1500000) || '1]')::jsonb"
        for table, column_value, check in [
            ("jobs", f"progress = {huge}", "jobs_progress_check"),
            ("jobs", "progress_at = 'infinity'", "jobs_progress_at_check"),
            ("jobs", "progress_at = '-infinity'", "jobs_progress_at_check"),
        ]:
            with pytest.raises(psycopg.errors.CheckViolation, match=check):
                await conn.execute(f"UPDATE trioq.{table} SET {column_value} "
                                   "WHERE id = %s", (lease.job_id,))  # fmt: skip
        await conn.execute(
            "INSERT INTO trioq.dead_jobs (id, queue, task, args, priority, attempt, "
            "max_attempts, reason, enqueued_at, died_at) VALUES (424242, 'default', 't', '{}', "
            "0, 1, 1, 'x', now(), now())"
        )
        with pytest.raises(psycopg.errors.CheckViolation, match="dead_jobs_progress_check"):
            await conn.execute(f"UPDATE trioq.dead_jobs SET progress = {huge} "
                               "WHERE id = 424242")  # fmt: skip


HOSTILE = {
    "deep": "(repeat('[', 3000) || repeat(']', 3000))::jsonb",
    "just decodable": "(repeat('[', 990) || repeat(']', 990))::jsonb",
    "huge": "('[' || repeat('1,', 5000000) || '1]')::jsonb",  # 30 MB stored: the check dropped
    "string": "'\"<script>alert(1)</script>\\u001b[31m\"'::jsonb",
    "number": "'1e300'::jsonb",
    "digits": "('1' || repeat('0', 5000))::jsonb",
    "array": "'[1, \"two\", null]'::jsonb",
    "null": "'null'::jsonb",
    "bar": "'{\"done\": \"NaN\", \"of\": 0}'::jsonb",
    "negative bar": "'{\"done\": -5, \"of\": 1e308}'::jsonb",
}


async def test_every_reader_survives_a_hostile_value_written_by_hand(dsn: str) -> None:
    async with migrated(dsn) as conn:
        await conn.execute("ALTER TABLE trioq.jobs DROP CONSTRAINT jobs_progress_check")
        await conn.execute("ALTER TABLE trioq.jobs DROP CONSTRAINT jobs_progress_at_check")
        ids = {}
        for name, value in HOSTILE.items():
            insert = ("INSERT INTO trioq.jobs (queue, task, args, progress, progress_at) "
                      f"VALUES ('default', 't', '{{}}', {value}, 'infinity') RETURNING id")
            ids[name] = await scalar(conn, insert)
        # One of them dead: it takes its progress to dead_jobs.
        for check in ("dead_jobs_progress_check", "dead_jobs_progress_at_check"):
            await conn.execute(f"ALTER TABLE trioq.dead_jobs DROP CONSTRAINT {check}")
        bury = (f"WITH gone AS (DELETE FROM trioq.jobs WHERE id = {ids['deep']} RETURNING *) "
                "INSERT INTO trioq.dead_jobs (id, queue, task, args, priority, attempt, "
                "max_attempts, reason, enqueued_at, died_at) SELECT id, queue, task, args, "
                "priority, attempt, max_attempts, 'by hand', enqueued_at, now() FROM gone "
                "RETURNING id")  # fmt: skip
        dead_id = await scalar(conn, bury)
        assert await scalar(conn, "SELECT progress IS NOT NULL FROM trioq.dead_jobs") is True
        statuses = {name: await trioq.job_status(conn, job_id) for name, job_id in ids.items()}
        assert statuses["deep"].state == "dead"
        assert isinstance(statuses["deep"].progress, UnreadableProgress)
        assert str(statuses["deep"].progress).startswith("<unreadable progress (RecursionError")
        assert isinstance(statuses["huge"].progress, UnreadableProgress)
        assert "too large to read" in str(statuses["huge"].progress)
        assert isinstance(statuses["digits"].progress, UnreadableProgress)
        assert str(statuses["string"].progress).startswith("<script>")
        assert statuses["array"].progress == [1, "two", None]
        assert statuses["null"].progress is None and statuses["null"].progress_at is not None
        at = statuses["number"].progress_at
        assert at is not None and at.year == 9999  # infinity, read as the end of the range
    env = {"TRIOQ_DSN": dsn}
    for name, job_id in ids.items():
        shown = trioq_cli("jobs", "show", str(job_id), env=env)
        assert shown.returncode == 0, (name, shown.stderr)
        assert "  progress:  " in shown.stdout and len(shown.stdout) < 5_000, name
        assert "\x1b" not in shown.stdout
        as_json = trioq_cli("jobs", "--json", "show", str(job_id), env=env)
        assert as_json.returncode == 0, (name, as_json.stderr)
        json.loads(as_json.stdout)
    app = trioq.web.app(dsn)
    try:
        for name, job_id in [*ids.items(), ("dead", dead_id)]:
            for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/live"):
                page = await call(app, "GET", path)
                assert page.status == 200, (name, path, page.text[-500:])
                assert "<script>alert" not in page.text
                assert 'id="progress"' in page.text, name
                assert len(page.text) < 200_000
        huge = await call(app, "GET", f"/jobs/{ids['huge']}/live")
        assert 'id="progress-too-large"' in huge.text
        bar = await call(app, "GET", f"/jobs/{ids['bar']}/live")
        assert "progress-bar" not in bar.text
        negative = await call(app, "GET", f"/jobs/{ids['negative bar']}/live")
        assert 'id="progress-bar" max="1" value="0.0"' in negative.text
    finally:
        await app.aclose()


async def test_a_kept_job_keeps_its_progress_and_retry_of_a_dead_one_starts_clean(
    dsn: str,
) -> None:
    async with migrated(dsn) as conn, trioq.pg.Pool(dsn, max_size=2, connect_kwargs=AUTO) as pool:
        (lease,) = await claimed(conn)
        buffer = ProgressBuffer()
        buffer.record(lease, '{"last": true}')
        await writer(pool, buffer).run_once()
        queue = trioq.Queue()
        fail = trioq.Failure(lease=lease, error="boom", fatal=True, delay=dt.timedelta(0))
        await queue.driver.fail_many(conn, owner="w", failures=[fail])
        assert (await trioq.job_status(conn, lease.job_id)).progress == {"last": True}
        assert await rows(conn, "SELECT progress FROM trioq.jobs") == []
        await queue.dead_retry(conn, trioq.DeadFilter(ids=[lease.job_id]))
        status = await trioq.job_status(conn, lease.job_id)
        assert (status.state, status.progress) == ("available", None)
