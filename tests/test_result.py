"""Reading a job's status and result: every state, waiting with a notification (and only
for flagged jobs), the poll fallback, timeouts, and what the caller's connection is left
with afterwards. Against real Postgres."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pytest
import trio
from helpers import FAST, migrated, rows, serving, wait_until

import trioq
from trioq import Failure, Lease, Queue

UTC = dt.UTC
LEASE = dt.timedelta(seconds=30)
Q = Queue()


async def claim(conn: Any, queue: str = "default") -> trioq.Job:
    (job,) = await Q.claim(conn, queue, owner="w", limit=1, lease=LEASE)
    return job


async def finished_notes(conn: Any) -> list[str]:
    """The ``@finished`` payloads that arrived on ``conn`` (listening) so far."""
    await conn.execute("SELECT 1")  # reads whatever is pending
    notes = [n.payload for n in conn._notifies_backlog]
    conn._notifies_backlog.clear()
    return [p for p in notes if p.startswith("@finished:")]


async def test_job_status_reports_every_state(dsn: str) -> None:
    async with migrated(dsn) as conn:
        scheduled = await trioq.enqueue(conn, "t", {"n": 1}, delay=3600)
        available = await trioq.enqueue(conn, "t", {"n": 2}, queue="a")
        running = await trioq.enqueue(conn, "t", {"n": 3}, queue="r")
        done = await trioq.enqueue(conn, "t", {"n": 4}, queue="d")
        cancelled = await trioq.enqueue(conn, "t", {"n": 5}, queue="c")
        dead = await trioq.enqueue(conn, "t", {"n": 6}, queue="x", max_attempts=3)
        r = await claim(conn, "r")
        d = await claim(conn, "d")
        await Q.complete_many(conn, owner="w", leases=[Lease(d.id, 1)], results=[{"ok": [1]}])
        await Q.cancel(conn, cancelled.job_id)
        x = await claim(conn, "x")
        failure = Failure(lease=Lease(x.id, 1), error="ValueError: no", traceback="tb", fatal=True)
        await Q.fail_many(conn, owner="w", failures=[failure])

        s = await trioq.job_status(conn, scheduled.job_id)
        assert (s.state, s.args, s.attempt, s.pending, s.final) == ("scheduled", {"n": 1}, 0,
                                                                    True, False)  # fmt: skip
        assert s.run_at is not None and s.enqueued_at is not None and s.run_at > s.enqueued_at
        s = await trioq.job_status(conn, available.job_id)
        assert (s.state, s.queue, s.lease_owner) == ("available", "a", None)
        s = await trioq.job_status(conn, running.job_id)
        assert (s.state, s.attempt, s.lease_owner) == ("running", 1, "w")
        assert s.lease_expires_at == r.lease_expires_at
        s = await trioq.job_status(conn, done.job_id)
        assert (s.state, s.result, s.final, s.lease_owner) == ("done", {"ok": [1]}, True, None)
        assert s.finished_at is not None
        s = await trioq.job_status(conn, cancelled.job_id)
        assert (s.state, s.final, s.finished_at is not None) == ("cancelled", True, True)
        s = await trioq.job_status(conn, dead.job_id)
        assert (s.state, s.task, s.args, s.attempt, s.max_attempts) == ("dead", "t", {"n": 6}, 1, 3)
        assert (s.reason, s.last_error, s.traceback) == ("fatal error", "ValueError: no", "tb")
        assert s.finished_at is not None and s.final
        s = await trioq.job_status(conn, 10**12)
        assert s == trioq.JobStatus(id=10**12, state="unknown")
        assert not s.pending and not s.final
        assert trioq.JobStatus(id=1, state="done", run_at=dt.datetime(2030, 1, 1, tzinfo=UTC)
                               ).to_json()["run_at"] == "2030-01-01T00:00:00+00:00"  # fmt: skip


async def test_result_of_finished_jobs_and_the_errors(dsn: str) -> None:
    async with migrated(dsn) as conn:
        kept = await trioq.enqueue(conn, "t")
        dead = await trioq.enqueue(conn, "t", max_attempts=1)
        cancelled = await trioq.enqueue(conn, "t")
        job = await claim(conn)
        await Q.complete_many(conn, owner="w", leases=[Lease(job.id, 1)], results=["hi"])
        job = await claim(conn)
        failure = Failure(lease=Lease(job.id, 1), error="KeyError: 'card'", traceback="tb")
        await Q.fail_many(conn, owner="w", failures=[failure])
        await Q.cancel(conn, cancelled.job_id)

        assert await trioq.result(conn, kept.job_id) == "hi"
        with pytest.raises(trioq.JobDeadError) as died:
            await trioq.result(conn, dead.job_id)
        assert str(died.value) == (
            f"job {dead.job_id} (task 't') is dead: attempts exhausted after 1 of 1 attempts; "
            "last error: KeyError: 'card'"
        )
        assert died.value.status.traceback == "tb" and died.value.job_id == dead.job_id
        with pytest.raises(trioq.JobCancelledError, match=r"was cancelled$"):
            await trioq.result(conn, cancelled.job_id)
        with pytest.raises(trioq.JobNotFoundError, match=r"^no job 999999: never enqueued"):
            await trioq.result(conn, 999999)
        assert issubclass(trioq.JobNotFoundError, LookupError)
        assert issubclass(trioq.JobDeadError, trioq.JobResultError)
        # A finished job's result is read inside a transaction too (a job reading the result
        # of one it depends on, in its own transaction).
        async with conn.transaction():
            assert await trioq.result(conn, kept.job_id) == "hi"


async def test_only_jobs_somebody_waits_for_notify_when_they_end(dsn: str) -> None:
    """Ordinary completions, kept results, deaths, retries and cancels send nothing; a
    flagged job sends one ``@finished:<id>`` when it ends, and not when it retries."""
    async with migrated(dsn) as conn, await trioq.connect(dsn, autocommit=True) as listener:
        await listener.execute("LISTEN trioq_trioq")
        ids = [(await trioq.enqueue(conn, "t", max_attempts=2)).job_id for _ in range(5)]
        jobs = [await claim(conn) for _ in ids]
        await Q.complete_many(conn, owner="w", leases=[Lease(jobs[0].id, 1)])
        await Q.complete_many(conn, owner="w", leases=[Lease(jobs[1].id, 1)], results=[1])
        await Q.fail_many(conn, owner="w", failures=[
            Failure(lease=Lease(jobs[2].id, 1), error="e", fatal=True),
            Failure(lease=Lease(jobs[3].id, 1), error="e"),
        ])  # fmt: skip
        await Q.cancel(conn, jobs[4].id)
        await Q.cancel_running_many(conn, owner="w", leases=[Lease(jobs[4].id, 1)])
        assert await finished_notes(listener) == []

        flagged = [
            (await trioq.enqueue(conn, "t", max_attempts=2, queue="f")).job_id for _ in range(3)
        ]
        for job_id in flagged:
            await conn.execute(Q.sql.wait_flag, {"id": job_id, "channel": Q.sql.channel})
        a, b, c = [await claim(conn, "f") for _ in flagged]
        await Q.fail_many(conn, owner="w", failures=[Failure(lease=Lease(a.id, 1), error="e")])
        assert await finished_notes(listener) == []  # a retry is not an end
        again = await claim(conn, "f")
        assert again.id == a.id
        await Q.complete_many(conn, owner="w", leases=[Lease(a.id, 2), Lease(b.id, 1)])
        await Q.fail_many(conn, owner="w", failures=[
            Failure(lease=Lease(c.id, 1), error="e", fatal=True)
        ])  # fmt: skip
        assert sorted(await finished_notes(listener)) == sorted(
            f"@finished:{i}" for i in (a.id, b.id, c.id)
        )
        # Pruning a flagged row that was kept sends nothing more.
        done = await trioq.enqueue(conn, "t", queue="k")
        await conn.execute(Q.sql.wait_flag, {"id": done.job_id, "channel": Q.sql.channel})
        job = await claim(conn, "k")
        await Q.complete_many(conn, owner="w", leases=[Lease(job.id, 1)], results=[1])
        assert await finished_notes(listener) == [f"@finished:{job.id}"]
        await conn.execute("DELETE FROM trioq.jobs WHERE id = %s", (job.id,))
        assert await finished_notes(listener) == []


async def test_flagging_an_available_job_wakes_its_queue(dsn: str) -> None:
    """A claim that met the row locked by the flagging statement skipped it: the queue's
    notification at the flag's commit makes that worker claim again."""
    async with migrated(dsn) as conn, await trioq.connect(dsn, autocommit=True) as listener:
        job = await trioq.enqueue(conn, "t", queue="mail")
        later = await trioq.enqueue(conn, "t", queue="mail", delay=60)
        await listener.execute("LISTEN trioq_trioq")
        for job_id in (job.job_id, later.job_id, job.job_id):
            await conn.execute(Q.sql.wait_flag, {"id": job_id, "channel": Q.sql.channel})
        await listener.execute("SELECT 1")
        # once: the second flag of the same job writes nothing
        assert [n.payload for n in listener._notifies_backlog or ()] == ["mail"]


async def wait_until_state(conn: Any, job_id: int, state: str) -> None:
    while (await trioq.job_status(conn, job_id)).state != state:  # noqa: ASYNC110 - the db
        await trio.sleep(0.02)


async def test_result_waits_for_a_running_job_with_a_notification(dsn: str) -> None:
    """poll_interval is a minute: only the notification can end the waits in time."""
    tasks = trioq.Registry()
    release = trio.Event()

    @tasks.task(keep_result=True)
    async def square(job: trioq.JobContext, n: int) -> int:
        await release.wait()
        return n * n

    @tasks.task
    async def forget(job: trioq.JobContext) -> None:
        await release.wait()

    config = trioq.Config(dsn=dsn, registry=tasks, **FAST)
    async with (
        migrated(dsn) as conn,
        await trioq.connect(dsn, autocommit=True) as other,
        await trioq.connect(dsn, autocommit=True) as watch,
    ):
        got: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            runtime = await nursery.start(trioq.serve, config)
            kept = await square.enqueue(conn, n=7)
            gone = await forget.enqueue(conn)

            async def wait_kept() -> None:
                got["kept"] = await trioq.result(conn, kept.job_id, poll_interval=60)

            async def wait_gone() -> None:
                with pytest.raises(trioq.JobNotFoundError) as missing:
                    await trioq.result(other, gone.job_id, poll_interval=60)
                got["gone"] = str(missing.value)

            with trio.fail_after(10):
                await wait_until_state(watch, kept.job_id, "running")
                await wait_until_state(watch, gone.job_id, "running")
                async with trio.open_nursery() as waiters:
                    waiters.start_soon(wait_kept)
                    waiters.start_soon(wait_gone)
                    await wait_flagged(watch, kept.job_id, gone.job_id)
                    start = trio.current_time()
                    release.set()
            assert trio.current_time() - start < 5
            runtime.stop(grace=False)
        assert got["kept"] == 49
        assert got["gone"] == (
            f"job {gone.job_id} completed, but its result was not kept: register its task "
            "with keep_result=True"
        )
        for c in (conn, other):  # each caller's connection is left as it was
            await assert_not_listening(c)


async def wait_flagged(conn: Any, *ids: int) -> None:
    query = "SELECT count(*) FROM trioq.jobs WHERE id = ANY(%s) AND notify_finished"
    while True:
        cur = await conn.execute(query, (list(ids),))
        row = await cur.fetchone()
        if row == (len(ids),):
            return
        await trio.sleep(0.01)


async def assert_not_listening(conn: Any) -> None:
    cur = await conn.execute("SELECT count(*) FROM pg_listening_channels()")
    assert await cur.fetchone() == (0,)
    assert not [n for n in conn._notifies_backlog or () if n.channel == "trioq_trioq"]


async def test_a_lost_notification_costs_one_poll_interval(dsn: str) -> None:
    """The job ends without its notification (triggers off for that session): the waiter
    finds out at its next poll."""
    async with migrated(dsn) as conn, await trioq.connect(dsn, autocommit=True) as worker:
        job = await trioq.enqueue(conn, "t")
        claimed = await claim(worker)
        await worker.execute("SET session_replication_role = replica")  # no triggers fire
        got: list[Any] = []

        async def wait() -> None:
            got.append(await trioq.result(conn, job.job_id, poll_interval=0.3))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait)
                await wait_flagged(worker, job.job_id)
                start = trio.current_time()
                await Q.complete_many(worker, owner="w", leases=[Lease(claimed.id, 1)],
                                      results=["late"])  # fmt: skip
        assert got == ["late"]
        assert 0.0 < trio.current_time() - start < 2


async def test_timeout_and_cancellation_leave_the_connection_clean(dsn: str) -> None:
    async with migrated(dsn) as conn:
        job = await trioq.enqueue(conn, "t")
        start = trio.current_time()
        with pytest.raises(trio.TooSlowError):
            await trioq.result(conn, job.job_id, timeout=0.3)
        assert 0.3 <= trio.current_time() - start < 3
        await assert_not_listening(conn)
        with trio.move_on_after(0.2) as scope:  # the caller's own deadline
            await trioq.result(conn, job.job_id, timeout=dt.timedelta(seconds=30))
        assert scope.cancelled_caught
        await assert_not_listening(conn)
        cur = await conn.execute("SELECT 1")
        assert await cur.fetchone() == (1,)


async def test_a_session_that_listens_keeps_its_channel_and_notifications(dsn: str) -> None:
    async with migrated(dsn) as conn, await trioq.connect(dsn, autocommit=True) as worker:
        await conn.execute("LISTEN trioq_trioq")
        await conn.execute("LISTEN mine")
        job = await trioq.enqueue(conn, "t")  # notifies 'default' on trioq_trioq
        claimed = await claim(worker)
        await worker.execute("NOTIFY mine, 'hello'")

        async def finish() -> None:
            await wait_flagged(worker, job.job_id)
            await Q.complete_many(worker, owner="w", leases=[Lease(claimed.id, 1)],
                                  results=[3])  # fmt: skip

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(finish)
                assert await trioq.result(conn, job.job_id, poll_interval=60) == 3
        cur = await conn.execute("SELECT pg_listening_channels() ORDER BY 1")
        assert await cur.fetchall() == [("mine",), ("trioq_trioq",)]
        notes = [(n.channel, n.payload) for n in conn._notifies_backlog]
        assert ("mine", "hello") in notes and ("trioq_trioq", "default") in notes
        assert not [p for _, p in notes if p.startswith("@finished")]


async def test_waiting_inside_a_transaction_is_refused(dsn: str) -> None:
    async with migrated(dsn) as conn:
        job = await trioq.enqueue(conn, "t")
        async with conn.transaction():
            with pytest.raises(ValueError, match="needs an autocommit connection outside a"):
                await trioq.result(conn, job.job_id)
        await assert_not_listening(conn)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"job_id": "1"}, TypeError, "job_id must be an int, got '1'"),
        ({"job_id": True}, TypeError, "job_id must be an int, got True"),
        ({"job_id": 2**63}, ValueError, "job_id must fit in a bigint"),
        ({"timeout": -1}, ValueError, "timeout must not be negative"),
        ({"timeout": 0}, ValueError, "timeout must be positive, got 0 s"),
        ({"timeout": math.nan}, ValueError, "timeout must be a finite number"),
        ({"timeout": "5"}, TypeError, "timeout must be a timedelta or seconds"),
        ({"poll_interval": 0}, ValueError, "poll_interval must be positive"),
        ({"poll_interval": None}, TypeError, "poll_interval must be seconds"),
    ],
)
async def test_bad_arguments_are_named_before_any_sql(
    dsn: str, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        pass  # closed: any statement would raise something else
    args = {"job_id": 1, **kwargs}
    with pytest.raises(error, match=message.replace("(", r"\(")):
        await trioq.result(conn, args.pop("job_id"), **args)
    if "job_id" in kwargs:
        with pytest.raises(error, match=message):
            await trioq.job_status(conn, kwargs["job_id"])


async def test_a_result_over_max_result_bytes_kills_its_job_and_says_why(dsn: str) -> None:
    """Before: results had no limit (args have 1 MiB): a 50 MB result stalled the worker's
    other jobs and every dashboard refresh read it whole. The limit counts the JSON's
    bytes: a result of exactly the limit is kept, one byte more is dead at once."""
    tasks = trioq.Registry()

    @tasks.task(keep_result=True, max_attempts=5)
    async def big(job: trioq.JobContext, n: int) -> str:
        return "é" * n  # two bytes each in UTF-8, plus the two quotes

    limit = 1002
    async with serving(dsn, tasks, max_result_bytes=limit) as (conn, _):
        fits = await big.enqueue(conn, n=500)  # 1,002 bytes
        over = await big.enqueue(conn, n=501)  # 1,004 bytes
        assert await trioq.result(conn, fits.job_id) == "é" * 500

        async def dead() -> bool:
            return bool(await rows(conn, "SELECT 1 FROM trioq.dead_jobs WHERE id = %s",
                                   over.job_id))  # fmt: skip

        await wait_until(dead)
        ((attempt, error),) = await rows(
            conn, "SELECT attempt, last_error FROM trioq.dead_jobs WHERE id = %s", over.job_id
        )
    assert attempt == 1  # not retried: the same handler returns the same value
    assert "result of task 'big' is 1,004 bytes of JSON, over max_result_bytes (1,002)" in error
    cases: list[tuple[Any, type[Exception]]] = [
        (0, ValueError), (-1, ValueError), ("1", TypeError), (True, TypeError)]  # fmt: skip
    for bad, kind in cases:
        with pytest.raises(kind, match="max_result_bytes"):
            trioq.Config(dsn=dsn, registry=tasks, max_result_bytes=bad)
