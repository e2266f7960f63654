"""No job can stop a worker: poison data in errors, delays, results and rows (issue #10).

Each case runs through a real worker against real Postgres with good jobs beside the bad
one: the worker keeps running, every good job completes, and the bad job ends with a
clear recorded reason. The completer's own defence (a batch that fails on a value is
split, made safe, or dead-lettered) is tested directly, with outcomes no handler could
produce any more.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

import pytest
import trio
import trio.testing
from clitool import trioq_cli
from helpers import Counter, drained, rows, scalar, serving, wait_until

import trioq
from trioq._outcome import Kind, Outcome
from trioq._worker.completer import Completer
from trioq.retry import Constant

GOOD = 20
LATER = Constant(seconds=3600)  # a failed job waits, visibly, as scheduled


def registry(bad: Any, *, keep_result: bool = False) -> tuple[trioq.Registry, Counter]:
    tasks = trioq.Registry()
    good = Counter()

    @tasks.task(name="good")
    async def good_task(job: trioq.JobContext, i: int) -> None:
        good.hit(i)

    tasks.task(name="bad", retry=LATER, keep_result=keep_result)(bad)
    return tasks, good


async def run_with_good_jobs(
    dsn: str, bad: Any, *, keep_result: bool = False, bad_args: Any = None
) -> tuple[Any, int]:
    """Enqueue the bad job among good ones in one transaction, run them; the bad job's id.

    Returns once every good job has run and the bad job has left ``running``; the worker
    must then still run a new job."""
    tasks, good = registry(bad, keep_result=keep_result)
    async with serving(dsn, tasks, queues={"default": trioq.QueueConfig(concurrency=4)}) as (
        conn,
        _runtime,
    ):
        async with conn.transaction():
            first = await trioq.enqueue_many(conn, [trioq.JobSpec(task="good", args={"i": i})
                                                    for i in range(GOOD // 2)])  # fmt: skip
            bad_job = await trioq.enqueue(conn, "bad", bad_args)
            await trioq.enqueue_many(conn, [trioq.JobSpec(task="good", args={"i": i})
                                            for i in range(GOOD // 2, GOOD)])  # fmt: skip
        assert first
        await good.wait_for(GOOD)

        async def settled() -> bool:
            state = await scalar(conn, "SELECT state FROM trioq.jobs WHERE id = %s",
                                 bad_job.job_id)  # fmt: skip
            return bool(state != "running")

        await wait_until(settled)
        await trioq.enqueue(conn, "good", {"i": -1})  # the worker is alive
        await good.wait_for(GOOD + 1)
        return conn, bad_job.job_id


async def last_error(dsn: str, job_id: int) -> tuple[str, str | None]:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        found = await rows(conn, "SELECT state, last_error FROM trioq.jobs WHERE id = %s", job_id)
        if found:
            return found[0][0], found[0][1]
        dead = await rows(conn, "SELECT reason, last_error FROM trioq.dead_jobs WHERE id = %s",
                          job_id)  # fmt: skip
        assert dead, f"job {job_id} is neither in jobs nor in dead_jobs"
        return f"dead: {dead[0][0]}", dead[0][1]


# -- what handlers raise --------------------------------------------------------------------------


async def test_an_error_holding_nul_fails_only_its_job(dsn: str) -> None:
    async def bad(job: trioq.JobContext) -> None:
        raise ValueError("bad\x00byte")

    _conn, job_id = await run_with_good_jobs(dsn, bad)
    assert await last_error(dsn, job_id) == ("scheduled", "ValueError: bad\\x00byte")


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_an_error_holding_a_lone_surrogate_fails_only_its_job(dsn: str, sync: bool) -> None:
    """A non-UTF-8 file name decoded with surrogateescape, as os.listdir returns it."""
    name = b"caf\xe9.txt".decode("utf-8", "surrogateescape")

    def bad_sync(job: trioq.JobContext) -> None:
        raise FileNotFoundError(f"no such file: {name}")

    async def bad_async(job: trioq.JobContext) -> None:
        bad_sync(job)

    _conn, job_id = await run_with_good_jobs(dsn, bad_sync if sync else bad_async)
    state, error = await last_error(dsn, job_id)
    assert (state, error) == ("scheduled", "FileNotFoundError: no such file: caf\\udce9.txt")


async def test_an_exception_whose_str_fails_is_named_by_its_type(dsn: str) -> None:
    class Odd(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    async def bad(job: trioq.JobContext) -> None:
        raise Odd

    _conn, job_id = await run_with_good_jobs(dsn, bad)
    assert await last_error(dsn, job_id) == ("scheduled", "Odd: <str() failed: RuntimeError>")


async def test_a_huge_error_is_stored_cut_with_a_note(dsn: str) -> None:
    async def bad(job: trioq.JobContext) -> None:
        raise ValueError("x" * 10_000_000)

    _conn, job_id = await run_with_good_jobs(dsn, bad)
    state, error = await last_error(dsn, job_id)
    assert state == "scheduled" and error is not None
    assert len(error) < 5_000
    assert error.endswith("more characters cut by trioq]")


async def test_memory_error_is_recorded_by_name(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    async def bad(job: trioq.JobContext) -> None:
        raise MemoryError

    with caplog.at_level(logging.INFO, logger="trioq.runtime"):
        _conn, job_id = await run_with_good_jobs(dsn, bad)
    assert await last_error(dsn, job_id) == ("scheduled", "MemoryError")
    assert f"job {job_id} (bad) attempt 1 failed: MemoryError" in caplog.text


@pytest.mark.parametrize("delay", [dt.timedelta.max, 1e13, dt.timedelta(days=366)])
async def test_a_snooze_too_far_fails_the_call_not_the_worker(dsn: str, delay: Any) -> None:
    async def bad(job: trioq.JobContext) -> None:
        job.snooze(delay)

    _conn, job_id = await run_with_good_jobs(dsn, bad)
    state, error = await last_error(dsn, job_id)
    assert state == "scheduled"
    assert error is not None and error.startswith("ValueError: snooze delay must be at most 365")


@pytest.mark.parametrize(
    ("delay", "message"),
    [(0, "snooze delay must be at least 0.01 s, got 0 s"),
     (dt.timedelta(0), "snooze delay must be at least 0.01 s, got 0 s"),
     (0.001, "snooze delay must be at least 0.01 s, got 0.001 s"),
     (None, "TypeError: snooze delay must be a timedelta or seconds, got None")],
    ids=["0", "timedelta(0)", "1 ms", "None"],
)  # fmt: skip
async def test_a_snooze_for_nothing_is_a_failure_not_a_loop(
    dsn: str, delay: Any, message: str
) -> None:
    """snooze(0) refunded the attempt and ran the job again at once, forever, without a word;
    snooze(None) did the same. Now each is the handler's error: retried, then dead."""

    async def bad(job: trioq.JobContext) -> None:
        job.snooze(delay)

    _conn, job_id = await run_with_good_jobs(dsn, bad)
    state, error = await last_error(dsn, job_id)
    assert state == "scheduled"
    assert error is not None and message in error


# -- what handlers return -------------------------------------------------------------------------


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (nested(5_000), "nested too deep to encode"),
        ({"n": 10**5000}, "Exceeds the limit"),
        ({"text": "a\x00b"}, "must not contain NUL"),
        ({1, 2}, "is not JSON serializable"),
    ],
    ids=["deep", "huge int", "NUL", "set"],
)
async def test_a_result_that_cannot_be_stored_fails_its_job(
    dsn: str, result: Any, message: str
) -> None:
    async def bad(job: trioq.JobContext) -> Any:
        return result

    _conn, job_id = await run_with_good_jobs(dsn, bad, keep_result=True)
    state, error = await last_error(dsn, job_id)
    assert state == "dead: fatal error"
    assert error is not None and "result of task 'bad' is not JSON" in error and message in error


# -- rows written by another producer -------------------------------------------------------------

DEEP = "repeat('[', 3000) || repeat(']', 3000)"
HUGE_NUMBER = """'{"n": 1' || repeat('0', 5000) || '}'"""


@pytest.mark.parametrize(
    ("args_sql", "why"),
    [(DEEP, "RecursionError"), (HUGE_NUMBER, "ValueError")],
    ids=["nested 3000 deep", "5000 digits"],
)
async def test_undecodable_args_are_dead_lettered_alone(dsn: str, args_sql: str, why: str) -> None:
    tasks, good = registry(lambda job, **kw: None)
    async with serving(dsn, tasks, queues={"default": trioq.QueueConfig(concurrency=4)}) as (
        conn,
        _runtime,
    ):
        async with conn.transaction():  # good jobs before and after, claimed in one batch
            await trioq.enqueue_many(conn, [trioq.JobSpec(task="good", args={"i": i})
                                            for i in range(5)])  # fmt: skip
            # psycopg.sql.SQL around fixed text: the args are built by Postgres itself
            cur = await conn.execute(
                f"INSERT INTO trioq.jobs (queue, task, args) VALUES ('default', 'bad', "
                f"({args_sql})::jsonb) RETURNING id"
            )
            (bad_id,) = await cur.fetchone()
            await trioq.enqueue_many(conn, [trioq.JobSpec(task="good", args={"i": i})
                                            for i in range(5, 10)])  # fmt: skip
        await good.wait_for(10)
        await wait_until(lambda: drained(conn))
        (reason, error, attempt), = await rows(
            conn, "SELECT reason, last_error, attempt FROM trioq.dead_jobs WHERE id = %s", bad_id
        )  # fmt: skip
        assert (reason, attempt) == ("undecodable args", 1)
        assert error.startswith(f"args cannot be decoded: {why}")
    listed = trioq_cli("dead", "list", "--dsn", dsn)
    assert listed.returncode == 0, listed.stderr
    assert f"{bad_id:>8}  default" in listed.stdout and "undecodable args" in listed.stdout
    as_json = trioq_cli("dead", "list", "--json", "--dsn", dsn)
    assert as_json.returncode == 0, as_json.stderr
    (row,) = json.loads(as_json.stdout)
    assert row["id"] == bad_id and row["args"].startswith(f"<undecodable args ({why}")
    status = trioq_cli("status", "--dsn", dsn)
    assert status.returncode == 0 and "default" in status.stdout


# -- the completer's own defence ------------------------------------------------------------------


async def test_a_batch_that_fails_on_a_value_is_split_and_made_safe(dsn: str) -> None:
    """Outcomes built by hand, unsafe in every way the runtime itself now prevents."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        queue = trioq.Queue()
        ids = await trioq.enqueue_bulk(conn, "t", [{"i": i} for i in range(8)])
        claimed = await queue.claim(conn, "default", owner="w", limit=8,
                                    lease=dt.timedelta(seconds=60))  # fmt: skip
        leases = [trioq.Lease(job.id, job.attempt) for job in claimed]
        unsafe = trioq.Failure(lease=leases[1], error="nul\x00 and \udcff", traceback="tb\x00",
                               delay=dt.timedelta(seconds=30))  # fmt: skip
        outcomes = [
            Outcome(kind=Kind.COMPLETE, lease=leases[0]),
            Outcome(kind=Kind.FAIL, lease=leases[1], failure=unsafe),
            Outcome(kind=Kind.RELEASE, lease=leases[2], delay=dt.timedelta.max),
            Outcome(kind=Kind.KEEP, lease=leases[3], result={"bad": "a\x00b"}),
            Outcome(kind=Kind.KEEP, lease=leases[4], result={"ok": 1}),
            *(Outcome(kind=Kind.COMPLETE, lease=lease) for lease in leases[5:]),
        ]
        written: list[Outcome] = []
        async with trioq.pg.Pool(dsn, max_size=2, connect_kwargs={"autocommit": True}) as pool:
            completer = Completer(pool, queue.driver, "w", capacity=len(outcomes),
                                  written=written.extend)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(completer.run)
                for outcome in outcomes:
                    await completer.submit(outcome)
                await completer.close()
            assert completer.finished.is_set()
        assert sorted(o.lease.job_id for o in written) == sorted(ids)
        live = dict((r[0], r[1:]) for r in await rows(
            conn, "SELECT id, state, last_error, run_at > now() + interval '300 days', result "
                  "FROM trioq.jobs"))  # fmt: skip
        assert live[ids[1]] == ("scheduled", "nul\\x00 and \\udcff", False, None)
        assert live[ids[2]][0] == "scheduled" and live[ids[2]][2] is True  # clamped to a year
        assert live[ids[4]] == ("done", None, False, {"ok": 1})
        assert set(live) == {ids[1], ids[2], ids[4]}  # the rest completed, ids[3] is dead
        (dead,) = await rows(conn, "SELECT id, reason, last_error FROM trioq.dead_jobs")
        assert dead[:2] == (ids[3], "result not stored")
        assert "must not contain NUL" in dead[2]


async def test_a_submit_after_the_completer_was_cancelled_raises_the_cancellation(
    dsn: str,
) -> None:
    """serve cancelled from outside (no graceful stop): the completer's task ended first, and
    a slot's submit raised BrokenResourceError into the cancellation (seen in a failing test's
    traceback). Now the submit raises the slot's own Cancelled."""
    queue = trioq.Queue()
    lease = trioq.Lease(1, 1)
    async with trioq.pg.Pool(dsn, max_size=1, connect_kwargs={"autocommit": True}) as pool:
        completer = Completer(pool, queue.driver, "w", capacity=1, written=lambda _: None)
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(completer.run)
                await trio.testing.wait_all_tasks_blocked()
                scope.cancel()
                with trio.CancelScope(shield=True):
                    await trio.testing.wait_all_tasks_blocked()  # run() ended, cancelled
                await completer.submit(Outcome(kind=Kind.COMPLETE, lease=lease))
        assert scope.cancelled_caught


def test_the_clis_json_never_fails_on_a_stored_value() -> None:
    """Args that decoded but are too deep to encode again: shown as a note, the rest as is."""
    from trioq._cli.ops import to_json

    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    out = json.loads(to_json([{"id": 1, "args": deep}, {"id": 2, "args": {"a": 1}}]))
    assert out == [
        {"id": 1, "args": "<not shown: list that JSON cannot encode>"},
        {"id": 2, "args": {"a": 1}},
    ]
