"""Durable jobs (issue 24): steps recorded once and replayed, sleeps that free the slot, the
replay's order checked, the records going with their job. Real workers, real Postgres; the
database's clock is moved (``trioq.now``) instead of waiting for a sleep."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections import Counter
from typing import Any

import pytest
import trio
import trio.lowlevel
from clitool import trioq_cli
from helpers import rows, scalar, serving, wait_until

import trioq
from trioq.retry import Constant
from trioq.testing import advance_clock, drain, set_clock

UTC = dt.UTC


async def _true(value: object) -> bool:
    return bool(value)


def holds(conn: Any, query: str, *params: Any) -> Any:
    """A predicate for `wait_until`: the query's one value is true."""

    async def check() -> bool:
        return bool(await scalar(conn, query, *params))

    return check


async def dead_reason(conn: Any, job_id: int) -> tuple[str, str] | None:
    found = await rows(conn, "SELECT reason, last_error FROM trioq.dead_jobs WHERE id = %s",
                       job_id)  # fmt: skip
    return found[0] if found else None


async def test_a_retry_resumes_from_the_step_that_failed(dsn: str) -> None:
    """Steps 1 and 2 run once; step 3 fails twice, then succeeds: the retries replay 1 and 2
    from their records (their functions are not called again) and the results flow on."""
    calls: Counter[str] = Counter()
    tasks = trioq.Registry()

    def charge(order: int) -> dict[str, Any]:
        calls["charge"] += 1
        return {"charged": order * 10}

    async def reserve(order: int) -> list[int]:
        calls["reserve"] += 1
        await trio.lowlevel.checkpoint()
        return [order, order + 1]

    def ship(items: list[int]) -> str:
        calls["ship"] += 1
        if calls["ship"] < 3:
            raise RuntimeError("carrier down")
        return f"shipped {items}"

    @tasks.task(max_attempts=5, retry=Constant(seconds=0), keep_result=True)
    async def order(job: trioq.JobContext, order: int) -> Any:
        paid = await job.step("charge", charge, order)
        items = await job.step("reserve", reserve, order)
        sent = await job.step("ship", ship, items)
        return {"paid": paid, "sent": sent, "attempt": job.attempt}

    async with serving(dsn, tasks) as (conn, _runtime):
        job = await order.enqueue(conn, order=7)
        with trio.fail_after(20):
            result = await trioq.result(conn, job.job_id)
        assert result == {"paid": {"charged": 70}, "sent": "shipped [7, 8]", "attempt": 3}
        assert calls == {"charge": 1, "reserve": 1, "ship": 3}
        # kept as done (keep_result): its records stay until the row is pruned
        steps = await rows(conn, "SELECT position, name, kind, attempt FROM trioq.job_steps "
                                 "WHERE job_id = %s ORDER BY position", job.job_id)  # fmt: skip
        assert steps == [(0, "charge", "step", 1), (1, "reserve", "step", 1),
                         (2, "ship", "step", 3)]  # fmt: skip


async def test_the_records_go_with_their_job_and_stay_with_a_dead_one(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task(max_attempts=1)
    async def once(job: trioq.JobContext, fail: bool) -> None:
        await job.step("a", lambda: 1)
        if fail:
            raise RuntimeError("no")

    async with serving(dsn, tasks) as (conn, _runtime):
        ok = await once.enqueue(conn, fail=False)
        bad = await once.enqueue(conn, fail=True)
        await wait_until(lambda: dead_reason(conn, bad.job_id))
        async def records(job_id: int) -> int:
            return int(await scalar(conn, "SELECT count(*) FROM trioq.job_steps "
                                          "WHERE job_id = %s", job_id))  # fmt: skip
        await wait_until(holds(conn, "SELECT count(*) = 0 FROM trioq.jobs WHERE id = %s",
                               ok.job_id))  # fmt: skip
        assert await records(ok.job_id) == 0  # completed: its records went with it
        assert await records(bad.job_id) == 1  # dead: kept, a retry resumes from them
        await trioq.Queue().dead_purge(conn, trioq.DeadFilter(ids=[bad.job_id]))
        assert await records(bad.job_id) == 0


async def test_a_dead_job_retried_resumes_from_its_records(dsn: str) -> None:
    calls: Counter[str] = Counter()
    fail = [True]
    tasks = trioq.Registry()

    @tasks.task(max_attempts=1, keep_result=True)
    async def flow(job: trioq.JobContext) -> Any:
        first = await job.step("first", lambda: calls.update(["first"]) or "one")
        if fail[0]:
            raise RuntimeError("second is broken")
        return [first, await job.step("second", lambda: calls.update(["second"]) or "two")]

    async with serving(dsn, tasks) as (conn, _runtime):
        job = await flow.enqueue(conn)
        await wait_until(lambda: dead_reason(conn, job.job_id))
        fail[0] = False
        assert await trioq.Queue().dead_retry(conn, trioq.DeadFilter(ids=[job.job_id])) == [
            job.job_id
        ]
        with trio.fail_after(10):
            assert await trioq.result(conn, job.job_id) == ["one", "two"]
    assert calls == {"first": 1, "second": 1}


async def test_a_sleep_frees_the_slot_and_the_job_resumes_after_it(dsn: str) -> None:
    """One slot: a job sleeps a day (the database's clock moved instead), and while it sleeps
    another job runs in that slot; the sleeper holds no lease and no attempt."""
    seen: list[str] = []
    tasks = trioq.Registry()

    def first() -> str:
        seen.append("before")
        return "b"

    @tasks.task(keep_result=True)
    async def sleeper(job: trioq.JobContext) -> Any:
        before = await job.step("before", first)
        await job.sleep(dt.timedelta(days=1))
        seen.append(f"woke at attempt {job.attempt}")
        return [before, await job.step("after", lambda: "a")]

    @tasks.task
    async def other(job: trioq.JobContext) -> None:
        seen.append("other ran")

    async with serving(dsn, tasks, queues={"default": trioq.QueueConfig(concurrency=1)}) as (
        conn, _runtime
    ):
        job = await sleeper.enqueue(conn)
        await wait_until(holds(conn, "SELECT state = 'scheduled' FROM trioq.jobs WHERE id = %s",
                               job.job_id))  # fmt: skip
        row = await rows(conn, "SELECT attempt, lease_owner, run_at - now() > interval '23 h' "
                               "FROM trioq.jobs WHERE id = %s", job.job_id)  # fmt: skip
        assert row == [(0, None, True)]  # attempt refunded, no lease, due in a day
        await other.enqueue(conn)
        await wait_until(lambda: _true("other ran" in seen))
        # A day later (the rows' clock): due again; the scheduler promotes it.
        await conn.execute("UPDATE trioq.jobs SET run_at = now() WHERE id = %s", (job.job_id,))
        await conn.execute("UPDATE trioq.job_steps SET result = jsonb_build_object('until', "
                           "now()) WHERE job_id = %s AND kind = 'sleep'", (job.job_id,))
        await conn.execute("SELECT pg_notify('trioq_trioq', '@scheduled')")
        with trio.fail_after(10):
            assert await trioq.result(conn, job.job_id) == ["b", "a"]
    assert seen == ["before", "other ran", "woke at attempt 1"]


async def test_a_job_woken_before_its_sleep_is_over_sleeps_again(dsn: str) -> None:
    runs: list[int] = []
    tasks = trioq.Registry()

    @tasks.task
    async def sleeper(job: trioq.JobContext) -> None:
        runs.append(job.attempt)
        await job.sleep(3600)

    async with serving(dsn, tasks) as (conn, _runtime):
        job = await sleeper.enqueue(conn)
        await wait_until(holds(conn, "SELECT state = 'scheduled' FROM trioq.jobs WHERE id = %s",
                               job.job_id))  # fmt: skip
        await conn.execute("UPDATE trioq.jobs SET run_at = now(), state = 'available' "
                           "WHERE id = %s", (job.job_id,))  # fmt: skip
        await conn.execute("SELECT pg_notify('trioq_trioq', 'default')")
        await wait_until(lambda: _true(len(runs) == 2))
        await wait_until(holds(conn, "SELECT state = 'scheduled' AND run_at - now() > "
                               "interval '50 min' FROM trioq.jobs WHERE id = %s", job.job_id))
        assert await scalar(conn, "SELECT count(*) FROM trioq.job_steps WHERE job_id = %s",
                            job.job_id) == 1  # fmt: skip


async def test_a_replay_that_does_not_match_its_records_is_dead_naming_the_step(
    dsn: str,
) -> None:
    version = ["old"]
    tasks = trioq.Registry()

    @tasks.task(max_attempts=3, retry=Constant(seconds=0))
    async def flow(job: trioq.JobContext) -> None:
        await job.step("fetch", lambda: 1)
        if version[0] == "old":
            await job.step("tax-v1", lambda: 2)
            raise RuntimeError("then it failed")
        await job.step("tax-v2", lambda: 3)

    async with serving(dsn, tasks) as (conn, _runtime):
        job = await flow.enqueue(conn)
        await wait_until(holds(conn, "SELECT attempt >= 1 AND last_error IS NOT NULL "
                               "FROM trioq.jobs WHERE id = %s", job.job_id))
        version[0] = "new"
        await wait_until(lambda: dead_reason(conn, job.job_id))
        reason, error = await dead_reason(conn, job.job_id) or ("", "")
    assert reason == "fatal error"
    assert error.startswith("DurableError: job ")
    assert "position 1 is step 'tax-v2' in this run, but step 'tax-v1'" in error


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("twice", "step 'a' was called twice in one run (at positions 0 and 1)"),
        ("not json", "the result of step 'a' must be JSON"),
        ("nul", "the result of step 'a' must not contain NUL"),
        ("huge", "the result of step 'a' is 2,000,002 bytes of JSON, over max_result_bytes"),
        ("bad name", "step name must be 1 to 200 characters, got 0"),
        ("sleep 0", "sleep delay must be positive"),
        ("sleep far", "sleep delay must be at most 36500 days"),
        ("naive", "is a naive datetime"),
    ],
)  # fmt: skip
async def test_what_a_durable_job_cannot_record_is_refused(
    dsn: str, body: str, message: str
) -> None:
    tasks = trioq.Registry()

    @tasks.task(max_attempts=1)
    async def bad(job: trioq.JobContext) -> None:
        if body == "twice":
            await job.step("a", lambda: 1)
            await job.step("a", lambda: 2)
        elif body == "not json":
            await job.step("a", lambda: {1, 2})
        elif body == "nul":
            await job.step("a", lambda: "x\x00y")
        elif body == "huge":
            await job.step("a", lambda: "x" * 2_000_000)
        elif body == "bad name":
            await job.step("", lambda: 1)
        elif body == "sleep 0":
            await job.sleep(0)
        elif body == "sleep far":
            await job.sleep(dt.timedelta(days=365 * 200))
        elif body == "naive":
            await job.sleep_until(dt.datetime(2030, 1, 1))

    async with serving(dsn, tasks) as (conn, _runtime):
        job = await bad.enqueue(conn)
        await wait_until(lambda: dead_reason(conn, job.job_id))
        _reason, error = await dead_reason(conn, job.job_id) or ("", "")
    assert message in error, error


async def test_a_step_transaction_commits_its_writes_with_its_record_once(dsn: str) -> None:
    """The step's writes and its record commit together: a later failure of the handler
    retries it, and the replay returns the result without writing again."""
    tasks = trioq.Registry()
    runs: list[int] = []

    async def reserve(conn: Any, order: int) -> int:
        cur = await conn.execute("INSERT INTO ledger (order_id) VALUES (%s) RETURNING id",
                                 (order,))  # fmt: skip
        row = await cur.fetchone()
        return int(row[0])

    @tasks.task(max_attempts=3, retry=Constant(seconds=0), keep_result=True)
    async def order(job: trioq.JobContext, order: int) -> Any:
        runs.append(job.attempt)
        entry = await job.step_transaction("reserve", reserve, order)
        if job.attempt < 2:
            raise RuntimeError("after the reservation")
        return entry

    async with await trioq.connect(dsn, autocommit=True) as setup:
        await setup.execute("CREATE TABLE ledger (id serial PRIMARY KEY, order_id int)")
    async with serving(dsn, tasks) as (conn, _runtime):
        job = await order.enqueue(conn, order=5)
        with trio.fail_after(10):
            entry = await trioq.result(conn, job.job_id)
        assert await rows(conn, "SELECT id, order_id FROM ledger") == [(entry, 5)]
    assert runs == [1, 2]


async def test_a_step_transaction_whose_lease_was_lost_writes_nothing(dsn: str) -> None:
    tasks = trioq.Registry()
    inside = trio.Event()
    go_on = trio.Event()
    lost: list[str] = []

    async def write(conn: Any) -> str:
        await conn.execute("INSERT INTO ledger VALUES (1)")
        inside.set()
        await go_on.wait()
        return "written"

    @tasks.task
    async def work(job: trioq.JobContext) -> None:
        try:
            await job.step_transaction("write", write)
        except trioq.LeaseLostError as ex:
            lost.append(str(ex))
            raise

    async with await trioq.connect(dsn, autocommit=True) as setup:
        await setup.execute("CREATE TABLE ledger (n int)")
    async with serving(dsn, tasks) as (conn, _runtime):
        job = await work.enqueue(conn)
        with trio.fail_after(10):
            await inside.wait()
        # Another worker took it (the lease expired and was reclaimed): not ours any more.
        await conn.execute("UPDATE trioq.jobs SET lease_owner = 'other' WHERE id = %s",
                           (job.job_id,))  # fmt: skip
        go_on.set()
        await wait_until(lambda: _true(lost))
        assert "lease lost before step 'write' was recorded" in lost[0]
        assert await scalar(conn, "SELECT count(*) FROM ledger") == 0
        assert await scalar(conn, "SELECT count(*) FROM trioq.job_steps") == 0


async def test_step_key_and_steps(dsn: str) -> None:
    tasks = trioq.Registry()
    seen: list[Any] = []

    @tasks.task(max_attempts=2, retry=Constant(seconds=0))
    async def flow(job: trioq.JobContext) -> None:
        seen.append(job.step_key("charge"))
        await job.step("charge", lambda: {"ok": True})
        if job.attempt == 1:
            raise RuntimeError("again")
        seen.append([(s.position, s.name, s.kind, s.result, s.attempt)
                     for s in await job.steps()])  # fmt: skip

    async with serving(dsn, tasks) as (conn, _runtime):
        job = await flow.enqueue(conn)
        await wait_until(lambda: _true(len(seen) == 3))
    key = f"trioq:trioq:{job.job_id}:charge"
    assert seen == [key, key, [(0, "charge", "step", {"ok": True}, 1)]]


# -- signals and waits ---------------------------------------------------------------------------


def approval_registry(seen: list[Any]) -> trioq.Registry:
    tasks = trioq.Registry()

    @tasks.task(keep_result=True, max_attempts=1)
    async def review(job: trioq.JobContext, timeout: float | None = None) -> Any:
        draft = await job.step("draft", lambda: "v1")
        seen.append(("ran", job.attempt))
        try:
            verdict = await job.wait_for("approval", timeout=timeout)
        except trioq.WaitTimeout as ex:
            return {"draft": draft, "verdict": "timed out", "name": ex.name}
        return {"draft": draft, "verdict": verdict}

    return tasks


async def test_a_wait_frees_the_slot_and_a_signal_wakes_it(dsn: str) -> None:
    seen: list[Any] = []
    async with serving(dsn, approval_registry(seen),
                       queues={"default": trioq.QueueConfig(concurrency=1)}) as (conn, _rt):
        job = await trioq.enqueue(conn, "review")
        await wait_until(holds(conn, "SELECT state = 'scheduled' AND waiting_for = 'approval' "
                                     "AND lease_owner IS NULL AND attempt = 0 "
                                     "FROM trioq.jobs WHERE id = %s", job.job_id))  # fmt: skip
        async with conn.transaction():
            assert await trioq.signal(conn, job.job_id, "approval", {"ok": True}) == "woke"
            assert await trioq.signal(conn, job.job_id, "approval", 1) == "duplicate"
        with trio.fail_after(10):
            result = await trioq.result(conn, job.job_id)
        assert result == {"draft": "v1", "verdict": {"ok": True}}
    assert seen == [("ran", 1), ("ran", 1)]


async def test_a_signal_sent_before_the_wait_is_not_lost(dsn: str) -> None:
    seen: list[Any] = []
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        job = await trioq.enqueue(conn, "review")
        assert await trioq.signal(conn, job.job_id, "approval", "yes") == "stored"
    async with serving(dsn, approval_registry(seen)) as (conn, _rt):
        with trio.fail_after(10):
            assert await trioq.result(conn, job.job_id) == {"draft": "v1", "verdict": "yes"}
    assert seen == [("ran", 1)]  # it never parked


async def test_a_signal_rolled_back_with_its_senders_transaction_is_not_sent(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        job = await trioq.enqueue(conn, "review")
        with pytest.raises(ZeroDivisionError):
            async with conn.transaction():
                await trioq.signal(conn, job.job_id, "approval", "yes")
                raise ZeroDivisionError
        assert await scalar(conn, "SELECT count(*) FROM trioq.job_signals") == 0


async def test_a_wait_times_out_with_a_clear_exception(dsn: str) -> None:
    seen: list[Any] = []
    async with serving(dsn, approval_registry(seen)) as (conn, _rt):
        job = await trioq.enqueue(conn, "review", {"timeout": 3600})
        await wait_until(holds(conn, "SELECT state = 'scheduled' FROM trioq.jobs WHERE id = %s",
                               job.job_id))  # fmt: skip
        # An hour later, by the rows' clock: the record's timeout and the row's run_at.
        await conn.execute("UPDATE trioq.job_steps SET result = jsonb_build_object('until', "
                           "now()) WHERE kind = 'wait'")  # fmt: skip
        await conn.execute("UPDATE trioq.jobs SET run_at = now() WHERE id = %s", (job.job_id,))
        await conn.execute("SELECT pg_notify('trioq_trioq', '@scheduled')")
        with trio.fail_after(10):
            result = await trioq.result(conn, job.job_id)
        assert result == {"draft": "v1", "verdict": "timed out", "name": "approval"}


async def test_a_wait_that_timed_out_leaves_the_job_waiting_for_nothing(dsn: str) -> None:
    """Found by ``test_durable_state_machine.py``: the wait times out, a later step fails,
    and the retry's backoff parks the job as ``scheduled`` again. It waits for no signal any
    more: the signal that comes then is stored (for no wait), and neither wakes the job
    before its backoff nor counts it as waiting."""
    tasks = trioq.Registry()

    def fails() -> None:
        raise RuntimeError("the step after the wait fails")

    @tasks.task(max_attempts=3, retry=Constant(seconds=3600))
    async def review(job: trioq.JobContext) -> None:
        with contextlib.suppress(trioq.WaitTimeout):
            await job.wait_for("approval", timeout=60)
        await job.step("after", fails)

    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        await set_clock(conn, dt.datetime(2030, 1, 1, tzinfo=UTC))
        job = await trioq.enqueue(conn, "review")
        await drain(conn, tasks)  # parked, waiting
        await advance_clock(conn, 61)
        assert (await drain(conn, tasks)).retried == 1  # timed out, then the step failed
        assert await rows(conn, "SELECT state, waiting_for FROM trioq.jobs WHERE id = %s",
                          job.job_id) == [("scheduled", None)]  # fmt: skip
        assert await trioq.signal(conn, job.job_id, "approval", "late") == "stored"
        assert await scalar(conn, "SELECT state FROM trioq.jobs WHERE id = %s",
                            job.job_id) == "scheduled"  # fmt: skip


async def test_a_signal_by_the_jobs_key(dsn: str) -> None:
    seen: list[Any] = []
    async with serving(dsn, approval_registry(seen)) as (conn, _rt):
        job = await trioq.enqueue(conn, "review", dedup_key="order-7")
        await wait_until(holds(conn, "SELECT state = 'scheduled' FROM trioq.jobs WHERE id = %s",
                               job.job_id))  # fmt: skip
        assert await trioq.signal(conn, None, "approval", "by key", task="review",
                                  key="order-7") == "woke"  # fmt: skip
        with trio.fail_after(10):
            assert (await trioq.result(conn, job.job_id))["verdict"] == "by key"
        with pytest.raises(trioq.JobNotFoundError, match="task 'review' key 'order-8': no"):
            await trioq.signal(conn, None, "approval", task="review", key="order-8")


async def test_signals_that_cannot_be_delivered_are_refused(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        with pytest.raises(trioq.JobNotFoundError, match="job 999: no such job to signal"):
            await trioq.signal(conn, 999, "approval")
        job = await trioq.enqueue(conn, "review")
        await trioq.Queue().cancel(conn, job.job_id)
        with pytest.raises(trioq.JobNotFoundError, match=r"has ended \(cancelled\)"):
            await trioq.signal(conn, job.job_id, "approval")
        for name, error in (("", ValueError), ("a\x00b", ValueError), (5, TypeError)):
            with pytest.raises(error, match="signal name"):
                await trioq.signal(conn, job.job_id, name, None)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="the payload of signal 'a' must be JSON"):
            await trioq.signal(conn, job.job_id, "a", {1, 2})
        with pytest.raises(ValueError, match="over the limit"):
            await trioq.signal(conn, job.job_id, "a", "x" * (2 << 20))
        with pytest.raises(TypeError, match="task= and key="):
            await trioq.signal(conn, None, "a")
        assert await scalar(conn, "SELECT count(*) FROM trioq.job_signals") == 0


async def test_a_cancel_while_waiting_cancels_the_job(dsn: str) -> None:
    seen: list[Any] = []
    async with serving(dsn, approval_registry(seen)) as (conn, _rt):
        job = await trioq.enqueue(conn, "review")
        await wait_until(holds(conn, "SELECT state = 'scheduled' FROM trioq.jobs WHERE id = %s",
                               job.job_id))  # fmt: skip
        await trioq.Queue().cancel(conn, job.job_id)
        assert (await trioq.job_status(conn, job.job_id)).state == "cancelled"
        with pytest.raises(trioq.JobNotFoundError, match="has ended"):
            await trioq.signal(conn, job.job_id, "approval")


async def test_two_waits_on_one_name_in_a_run_are_refused(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task(max_attempts=1)
    async def twice(job: trioq.JobContext) -> None:
        await job.wait_for("a", timeout=1)
        await job.wait_for("a", timeout=1)

    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        job = await trioq.enqueue(conn, "twice")
        await trioq.signal(conn, job.job_id, "a", 1)
    async with serving(dsn, tasks) as (conn, _rt):
        await wait_until(lambda: dead_reason(conn, job.job_id))
        _reason, error = await dead_reason(conn, job.job_id) or ("", "")
    assert "wait 'a' was called twice in one run" in error


async def test_a_signal_committed_while_the_wait_looks_is_not_missed(dsn: str) -> None:
    """The sender's transaction holds the job's row (its signal inserted, the job seen
    running, so not woken) while the job's wait looks; the wait must see the signal once it
    commits. Looking with the snapshot it started with, it would park the job, and nothing
    would wake it before its timeout (an hour)."""
    reached, go = trio.Event(), trio.Event()
    tasks = trioq.Registry()

    @tasks.task(keep_result=True, max_attempts=1)
    async def review(job: trioq.JobContext) -> Any:
        reached.set()
        await go.wait()
        return await job.wait_for("approval", timeout=3600)

    async with serving(dsn, tasks) as (conn, _rt):
        job = await trioq.enqueue(conn, "review")
        with trio.fail_after(10):
            await reached.wait()
        sender = await trioq.connect(dsn, autocommit=True)
        async with sender, sender.transaction():
            assert await trioq.signal(sender, job.job_id, "approval", "in time") == "stored"
            go.set()
            with trio.fail_after(10):
                while not await scalar(  # noqa: ASYNC110 - the database cannot tell us
                    conn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type "
                          "= 'Lock' AND backend_type = 'client backend'"):  # fmt: skip
                    await trio.sleep(0.01)
        with trio.fail_after(10):
            assert await trioq.result(conn, job.job_id) == "in time"


async def test_a_child_that_ends_while_its_parent_parks_wakes_it(dsn: str) -> None:
    """The parent's wait holds its row (it looked for 'job <child>', found nothing, and is
    parking) when the child ends: the child's end must wait for that row and then wake the
    parent. Seeing the parent as it was (running), it would not wake it, and the wait had not
    seen the signal: the parent slept until its timeout (CI caught this one slot test)."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        parent = (await trioq.enqueue(conn, "parent")).job_id
        child = (await trioq.enqueue(conn, "child")).job_id
        await conn.execute("UPDATE trioq.jobs SET state = 'running', durable = true, attempt = 1, "
                           "lease_owner = 'w', lease_expires_at = now() + interval '1 hour' "
                           "WHERE id IN (%s, %s)", (parent, child))  # fmt: skip
        await conn.execute("UPDATE trioq.jobs SET parent_id = %s WHERE id = %s", (parent, child))
        ended = trio.Event()

        async def child_ends() -> None:
            async with await trioq.connect(dsn, autocommit=True) as other:
                await other.execute("DELETE FROM trioq.jobs WHERE id = %s", (child,))
            ended.set()

        park = ("UPDATE trioq.jobs SET state = 'scheduled', waiting_for = %s, lease_owner = NULL,"
                " lease_expires_at = NULL, run_at = now() + interval '1 hour' WHERE id = %s")
        waiter = await trioq.connect(dsn, autocommit=True)
        async with waiter, trio.open_nursery() as nursery, waiter.transaction():
            await waiter.execute("SELECT 1 FROM trioq.jobs WHERE id = %s FOR NO KEY UPDATE",
                                 (parent,))  # fmt: skip
            await waiter.execute(park, (f"job {child}", parent))
            nursery.start_soon(child_ends)
            with trio.fail_after(10):  # the child's end waits for the row, or has ended
                while not ended.is_set() and not await scalar(  # noqa: ASYNC110
                    conn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type "
                          "= 'Lock' AND backend_type = 'client backend'"):  # fmt: skip
                    await trio.sleep(0.01)
        assert await rows(conn, "SELECT state, waiting_for FROM trioq.jobs WHERE id = %s",
                          parent) == [("available", None)]  # fmt: skip
        assert await scalar(conn, "SELECT payload->>'state' FROM trioq.job_signals "
                                  "WHERE job_id = %s", parent) == "done"  # fmt: skip


async def test_a_patch_sends_old_runs_down_the_old_branch_and_new_ones_down_the_new(
    dsn: str,
) -> None:
    """Old code recorded fetch, tax-v1, then failed; new code asks job.patched("tax-v2")
    where tax-v1 was: the old run replays tax-v1 (no patch recorded), a new run records the
    patch and takes tax-v2, and its retry replays the patch too."""
    version = ["old"]
    taken: list[tuple[int, str]] = []
    tasks = trioq.Registry()

    @tasks.task(max_attempts=3, retry=Constant(seconds=0), keep_result=True)
    async def flow(job: trioq.JobContext, n: int) -> Any:
        await job.step("fetch", lambda: n)
        if version[0] == "new" and await job.patched("tax-v2"):
            tax = await job.step("tax-v2", lambda: "new")
        else:
            tax = await job.step("tax-v1", lambda: "old")
        taken.append((n, tax))
        if job.attempt == 1:
            raise RuntimeError("the first attempt fails after the tax step")
        return [(s.name, s.kind) for s in await job.steps()]

    async with serving(dsn, tasks) as (conn, _runtime):
        old = await flow.enqueue(conn, n=1)
        await wait_until(holds(conn, "SELECT attempt = 1 AND state <> 'running' "
                                     "FROM trioq.jobs WHERE id = %s", old.job_id))  # fmt: skip
        version[0] = "new"
        new = await flow.enqueue(conn, n=2)
        with trio.fail_after(10):
            old_steps = await trioq.result(conn, old.job_id)
            new_steps = await trioq.result(conn, new.job_id)
    assert old_steps == [["fetch", "step"], ["tax-v1", "step"]]
    assert new_steps == [["fetch", "step"], ["patch:tax-v2", "patch"], ["tax-v2", "step"]]
    assert sorted(taken) == [(1, "old"), (1, "old"), (2, "new"), (2, "new")]


async def test_jobs_show_prints_the_step_log(dsn: str) -> None:
    seen: list[Any] = []
    async with serving(dsn, approval_registry(seen)) as (conn, _rt):
        job = await trioq.enqueue(conn, "review", {"timeout": 3600})
        await wait_until(holds(conn, "SELECT state = 'scheduled' FROM trioq.jobs WHERE id = %s",
                               job.job_id))  # fmt: skip
    shown = await trio.to_thread.run_sync(
        lambda: trioq_cli("jobs", "show", str(job.job_id), "--dsn", dsn))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "  steps:     2 recorded" in lines
    assert any(line.split()[:3] == ["0", "step", "draft"] and line.endswith('"v1"')
               for line in lines)  # fmt: skip
    assert any(line.split()[:3] == ["1", "wait", "approval"] and "waiting, until" in line
               for line in lines)  # fmt: skip
    as_json = await trio.to_thread.run_sync(
        lambda: trioq_cli("jobs", "show", str(job.job_id), "--dsn", dsn, "--json"))
    steps = json.loads(as_json.stdout)["steps"]
    assert [(s["position"], s["name"], s["kind"]) for s in steps] == [
        (0, "draft", "step"), (1, "approval", "wait")]


# -- children ------------------------------------------------------------------------------------


def family(log: list[Any]) -> trioq.Registry:
    tasks = trioq.Registry()

    @tasks.task(keep_result=True, max_attempts=1)
    async def child(job: trioq.JobContext, n: int, fail: bool = False) -> int:
        log.append(("child", n))
        if fail:
            raise trioq.FatalError(f"child {n} gives up")
        return n * n

    @tasks.task(keep_result=True, max_attempts=3, retry=Constant(seconds=0))
    async def parent(job: trioq.JobContext, fail_child: bool = False) -> Any:
        kid = await job.spawn(child, {"n": 3, "fail": fail_child})
        log.append(("parent spawned", kid, job.attempt))
        if job.attempt == 1:
            raise RuntimeError("the parent fails once after spawning")
        try:
            return {"child": kid, "result": await job.wait_for_job(kid)}
        except trioq.JobDeadError as ex:
            return {"child": kid, "dead": str(ex)}

    return tasks


async def test_a_parent_waits_for_its_child_without_holding_the_slot(dsn: str) -> None:
    """One slot: the parent spawns, fails once, is retried (the replay returns the same
    child), waits for it (freeing the slot if the child has not ended), and gets its
    result."""
    log: list[Any] = []
    async with serving(dsn, family(log),
                       queues={"default": trioq.QueueConfig(concurrency=1)}) as (conn, _rt):
        job = await trioq.enqueue(conn, "parent")
        with trio.fail_after(20):
            result = await trioq.result(conn, job.job_id)
        kid = result["child"]
        assert result == {"child": kid, "result": 9}
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs WHERE task = 'child'") == 1
    spawned = [entry for entry in log if entry[0] == "parent spawned"]
    assert {entry[1] for entry in spawned} == {kid}  # every replay returned the same child
    # Attempt 2 parks if it runs before the child's end is written (the completer batches),
    # and runs again, still attempt 2 (a wait refunds it), once the child's end wakes it.
    assert [entry[2] for entry in spawned] in ([1, 2], [1, 2, 2])
    assert log.count(("child", 3)) == 1


async def test_a_child_that_dies_is_the_parents_error(dsn: str) -> None:
    log: list[Any] = []
    async with serving(dsn, family(log)) as (conn, _rt):
        job = await trioq.enqueue(conn, "parent", {"fail_child": True})
        with trio.fail_after(20):
            result = await trioq.result(conn, job.job_id)
    assert result["dead"].startswith(f"child job {result['child']} is dead: fatal error")
    assert "child 3 gives up" in result["dead"]


async def test_waiting_for_a_job_that_is_not_a_child_is_refused(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task(max_attempts=1)
    async def nosy(job: trioq.JobContext, other: int) -> None:
        await job.wait_for_job(other)

    async with serving(dsn, tasks) as (conn, _rt):
        other = await trioq.enqueue(conn, "elsewhere", queue="elsewhere")
        job = await trioq.enqueue(conn, "nosy", {"other": other.job_id})
        await wait_until(lambda: dead_reason(conn, job.job_id))
        _reason, error = await dead_reason(conn, job.job_id) or ("", "")
    assert f"job {other.job_id} was not spawned by job {job.job_id}" in error


async def test_a_child_that_ends_wakes_its_parked_parent(dsn: str) -> None:
    """The parent is parked (waiting for 'job <child>') before its child runs: the child's
    end, by the trigger in its completing transaction, wakes it."""
    log: list[Any] = []
    tasks = family(log)

    @tasks.task(keep_result=True)
    async def waiter(job: trioq.JobContext) -> Any:
        kid = await job.spawn("child", {"n": 4}, delay=3600)
        return await job.wait_for_job(kid)

    async with serving(dsn, tasks) as (conn, _rt):
        job = await trioq.enqueue(conn, "waiter")
        await wait_until(holds(conn, "SELECT waiting_for LIKE 'job %%' AND state = 'scheduled' "
                                     "FROM trioq.jobs WHERE id = %s", job.job_id))  # fmt: skip
        assert log == []  # the child has not run
        await conn.execute("UPDATE trioq.jobs SET state = 'available', run_at = now() "
                           "WHERE task = 'child'")  # fmt: skip
        await conn.execute("SELECT pg_notify('trioq_trioq', 'default')")
        with trio.fail_after(10):
            assert await trioq.result(conn, job.job_id) == 16


async def test_the_metrics_count_parked_jobs(dsn: str) -> None:
    from trioq._obs.metrics import DepthSampler
    from trioq._obs.prometheus import _depth

    seen: list[Any] = []
    tasks = approval_registry(seen)

    @tasks.task
    async def napper(job: trioq.JobContext) -> None:
        await job.sleep(3600)

    async with serving(dsn, tasks) as (conn, _rt):
        waiting = await trioq.enqueue(conn, "review")
        sleeping = await trioq.enqueue(conn, "napper")
        await trioq.enqueue(conn, "plain", delay=3600)  # scheduled, not durable: not parked
        for job in (waiting, sleeping):
            await wait_until(holds(conn, "SELECT state = 'scheduled' FROM trioq.jobs "
                                         "WHERE id = %s", job.job_id))  # fmt: skip
        async with trioq.pg.Pool(dsn, max_size=1, connect_kwargs={"autocommit": True}) as pool:
            sampler = DepthSampler(pool, "trioq", interval=0, cap=1000)
            depths = await sampler.run_once()
            sample = await sampler.refresh()
    assert depths.parked == {("default", "waiting"): 1, ("default", "sleeping"): 1}
    assert depths.counts[("default", "scheduled")] == 3
    family = next(m for m in _depth(sample, ["default"], 1000)
                  if m.name == "trioq_durable_parked")  # fmt: skip
    assert {(s.labels["kind"], s.value) for s in family.samples} == {("sleeping", 1),
                                                                     ("waiting", 1)}


# -- the dashboard -------------------------------------------------------------------------------


async def test_the_dashboard_shows_the_steps_and_sends_a_signal(dsn: str) -> None:
    """The job page lists the records; "Send signal" asks on a confirmation page, posts with
    the CSRF token, and the waiting job runs. Read-only and a missing token refuse it."""
    import re

    from asgi import call

    import trioq.web

    seen: list[Any] = []
    async with serving(dsn, approval_registry(seen)) as (conn, _rt):
        job = await trioq.enqueue(conn, "review")
        await wait_until(holds(conn, "SELECT state = 'scheduled' FROM trioq.jobs WHERE id = %s",
                               job.job_id))  # fmt: skip
        app = trioq.web.app(dsn)
        try:
            page = await call(app, "GET", f"/jobs/{job.job_id}")
            assert 'id="steps"' in page.text and "approval" in page.text
            assert ">waiting</span>" in page.text and 'id="signal"' in page.text
            confirm = await call(app, "GET", f"/confirm/signal?ids={job.job_id}")
            assert 'id="signal-name"' in confirm.text
            token = re.search(r'name="csrf" value="([0-9a-f]+)"', confirm.text)
            assert token is not None
            cookies = confirm.cookies()
            for bad, message in ((("name", ""), "signal name"), (("payload", "{nope"), "JSON"),
                                 (("payload", '"a\\u0000b"'), "NUL")):  # fmt: skip
                form = {"ids": str(job.job_id), "name": "approval", "payload": "",
                        "csrf": token[1], bad[0]: bad[1]}  # fmt: skip
                refused = await call(app, "POST", "/actions/signal", form=form, cookies=cookies)
                assert refused.status == 400 and message in refused.text, refused.text
            nocsrf = await call(app, "POST", "/actions/signal", cookies=cookies,
                                form={"ids": str(job.job_id), "name": "approval"})  # fmt: skip
            assert nocsrf.status == 403
            sent = await call(app, "POST", "/actions/signal", cookies=cookies, form={
                "ids": str(job.job_id), "name": "approval", "payload": '{"ok": 1}',
                "csrf": token[1]})  # fmt: skip
            assert sent.status == 303
            assert sent.header("location") == f"/jobs/{job.job_id}?done=signal_woke"
        finally:
            await app.aclose()
        with trio.fail_after(10):
            assert (await trioq.result(conn, job.job_id))["verdict"] == {"ok": 1}
        read_only = trioq.web.app(dsn, read_only=True)
        try:
            page = await call(read_only, "GET", f"/jobs/{job.job_id}")
            assert 'id="signal"' not in page.text
            refused = await call(read_only, "POST", "/actions/signal",
                                 form={"ids": str(job.job_id), "name": "x"})  # fmt: skip
            assert refused.status == 403
        finally:
            await read_only.aclose()


async def test_the_pruner_removes_a_kept_jobs_records_with_it(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task(keep_result=True)
    async def kept(job: trioq.JobContext) -> int:
        return int(await job.step("one", lambda: 1))

    async with serving(dsn, tasks) as (conn, _rt):
        job = await kept.enqueue(conn)
        with trio.fail_after(10):
            assert await trioq.result(conn, job.job_id) == 1
        assert await scalar(conn, "SELECT count(*) FROM trioq.job_steps") == 1
        # The pruner's round, with a retention every kept row is past.
        from trioq._worker.services.pruner import prune

        pruned = await prune(conn, trioq.Queue().sql, retain_done=0, retain_cancelled=None,
                             retain_dead=None, limit=100)  # fmt: skip
        assert pruned.done == 1
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0
        assert await scalar(conn, "SELECT count(*) FROM trioq.job_steps") == 0


async def test_a_cancel_while_sleeping_cancels_the_job(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task
    async def napper(job: trioq.JobContext) -> None:
        await job.step("before", lambda: 1)
        await job.sleep(3600)

    async with serving(dsn, tasks) as (conn, _rt):
        job = await napper.enqueue(conn)
        await wait_until(holds(conn, "SELECT state = 'scheduled' FROM trioq.jobs WHERE id = %s",
                               job.job_id))  # fmt: skip
        assert (await trioq.Queue().cancel(conn, job.job_id)).status == "cancelled"
        assert (await trioq.job_status(conn, job.job_id)).state == "cancelled"


async def test_a_sleep_of_ten_years_is_taken(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task
    async def long_nap(job: trioq.JobContext) -> None:
        await job.sleep(dt.timedelta(days=3650))

    async with serving(dsn, tasks) as (conn, _rt):
        job = await long_nap.enqueue(conn)
        await wait_until(holds(conn, "SELECT state = 'scheduled' AND run_at > now() + "
                                     "interval '9 years' FROM trioq.jobs WHERE id = %s",
                               job.job_id))  # fmt: skip
