"""Debounce (``enqueue(..., dedup_key=k, debounce=...)``), on real Postgres: a burst of
enqueues with one key makes one job that runs after the burst with the last args, a burst
after the job started makes a new job, ``max_wait`` bounds an endless burst, and enqueuers
of one key racing from two connections and from two processes make exactly one job, the
last committed args winning. Time moves through ``trioq.now`` (no sleeping)."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from typing import Any

import psycopg
import pytest
import trio
from clitool import trioq_cli
from helpers import migrated, rows, scalar, serving, wait_until, wait_until_blocked

import trioq
from trioq import Debounce, Lease
from trioq._job import DEBOUNCE_NEEDS_KEY
from trioq.testing import set_clock

UTC = dt.UTC
T0 = dt.datetime(2030, 1, 1, tzinfo=UTC)
SEC = dt.timedelta(seconds=1)
LEASE = dt.timedelta(seconds=30)
Q = trioq.Queue()
PENDING = "SELECT id, args, run_at, state FROM trioq.jobs WHERE state <> 'running' ORDER BY id"


async def burst(conn: Any, at: dt.datetime, args: Any, **options: Any) -> trioq.EnqueueResult:
    await set_clock(conn, at)
    return await trioq.enqueue(conn, "t", args, dedup_key="k", **options)


async def test_a_burst_makes_one_job_run_after_it_with_the_last_args(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        got = [await burst(conn, T0 + i * SEC, {"i": i}, debounce=5) for i in range(3)]
        assert [r.duplicate for r in got] == [False, True, True]
        assert {r.job_id for r in got} == {got[0].job_id}
        assert await rows(conn, PENDING) == [(got[0].job_id, {"i": 2}, T0 + 7 * SEC, "scheduled")]
        await set_clock(conn, T0 + 6 * SEC)
        assert await Q.promote_due(conn) == []  # the burst pushed it: not due yet
        await set_clock(conn, T0 + 7 * SEC)
        assert await Q.promote_due(conn) == ["default"]
        (job,) = await Q.claim(conn, "default", owner="w", limit=5, lease=LEASE)
        assert (job.id, job.args) == (got[0].job_id, {"i": 2})
        # another key, or no debounce, is another job
        other = await burst(conn, T0 + 7 * SEC, {}, debounce=5, queue="q2")
        assert other.job_id != got[0].job_id and not other.duplicate


@pytest.mark.parametrize("limited", [False, True], ids=["plain claim", "limited claim"])
async def test_a_burst_after_the_start_makes_a_new_job(dsn: str, limited: bool) -> None:
    """The claim clears the key: an enqueue after the start is a new job (its burst must
    run too), and the started job, snoozed back to scheduled, never meets it in the
    index. Both claims (a queue with a limit is claimed by claim_limited)."""
    async with migrated(dsn, T0) as conn:
        if limited:
            await Q.set_limits(conn, "default", global_concurrency=5)
        first = await burst(conn, T0, {"n": 1}, debounce=5)
        await set_clock(conn, T0 + 5 * SEC)
        await Q.promote_due(conn)
        if limited:
            got = await Q.claim_limited(conn, "default", owner="w", limit=5, lease=LEASE)
            (job,) = got.jobs
        else:
            (job,) = await Q.claim(conn, "default", owner="w", limit=5, lease=LEASE)
        second = await burst(conn, T0 + 6 * SEC, {"n": 2}, debounce=5)
        third = await burst(conn, T0 + 7 * SEC, {"n": 3}, debounce=5)
        assert job.id == first.job_id
        assert second.job_id != first.job_id and third == trioq.EnqueueResult(
            second.job_id, duplicate=True
        )
        await Q.release_many(conn, owner="w", leases=[Lease(job.id, 1)], delays=[60 * SEC])
        assert await rows(conn, PENDING) == [
            (first.job_id, {"n": 1}, T0 + 67 * SEC, "scheduled"),
            (second.job_id, {"n": 3}, T0 + 12 * SEC, "scheduled"),
        ]
        # and the snoozed job takes no more args: the next enqueue goes to the new one
        assert (await burst(conn, T0 + 8 * SEC, {"n": 4}, debounce=5)).job_id == second.job_id


async def test_max_wait_runs_an_endless_burst(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        every_4s = [await burst(conn, T0 + 4 * i * SEC, {"i": i},
                                debounce=Debounce(5, max_wait=10)) for i in range(3)]  # fmt: skip
        (job_id,) = {r.job_id for r in every_4s}
        # pushed to 8 + 5 = 13 s, but no later than 0 + 10 s
        assert await rows(conn, PENDING) == [(job_id, {"i": 2}, T0 + 10 * SEC, "scheduled")]
        late = await burst(conn, T0 + 11 * SEC, {"i": 3}, debounce=Debounce(5, max_wait=10))
        assert late.job_id == job_id  # not promoted yet: still waiting, takes the args
        assert await rows(conn, PENDING) == [(job_id, {"i": 3}, T0 + 10 * SEC, "available")]
        got = await Q.claim(conn, "default", owner="w", limit=5, lease=LEASE)
        assert [(j.id, j.args) for j in got] == [(job_id, {"i": 3})]


async def test_the_key_can_be_uniques(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        a = await trioq.enqueue(conn, "t", {"u": 1, "x": 1}, unique=trioq.Unique(by_args=["u"]),
                                debounce=2)  # fmt: skip
        b = await trioq.enqueue(conn, "t", {"u": 1, "x": 2}, unique=trioq.Unique(by_args=["u"]),
                                debounce=2)  # fmt: skip
        c = await trioq.enqueue(conn, "t", {"u": 2}, unique=trioq.Unique(by_args=["u"]),
                                debounce=2)  # fmt: skip
        assert a.job_id == b.job_id != c.job_id
        assert await scalar(conn, "SELECT args FROM trioq.jobs WHERE id = %s", a.job_id) == {
            "u": 1, "x": 2}  # fmt: skip
        tasks = trioq.Registry()

        @tasks.task()
        async def noted(job: trioq.JobContext, n: int) -> None: ...

        d = await noted.enqueue(conn, n=1, dedup_key="n", debounce=2)
        e = await noted.enqueue(conn, n=2, dedup_key="n", debounce=2)
        (f,) = await trioq.enqueue_many(conn, [
            trioq.JobSpec(task="noted", args={"n": 3}, dedup_key="n", debounce=2)])  # fmt: skip
        assert d.job_id == e.job_id == f.job_id and f.duplicate
        assert await scalar(conn, "SELECT args FROM trioq.jobs WHERE id = %s", d.job_id) == {
            "n": 3}  # fmt: skip


# -- races --------------------------------------------------------------------------------------


async def test_two_connections_racing_make_one_job_and_the_last_commit_wins(dsn: str) -> None:
    async with migrated(dsn, T0) as a, await trioq.connect(dsn, autocommit=True) as b:
        await set_clock(b, T0)
        results: list[trioq.EnqueueResult] = []

        async def second() -> None:
            results.append(await trioq.enqueue(b, "t", {"by": "b"}, dedup_key="k", debounce=5))

        for outcome in ("COMMIT", "ROLLBACK"):
            results.clear()
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    await a.execute("BEGIN")
                    first = await trioq.enqueue(a, "t", {"by": "a"}, dedup_key="k", debounce=5)
                    nursery.start_soon(second)
                    await wait_until_blocked(a, b)  # b waits for a's transaction
                    await a.execute(outcome)
            jobs = await rows(a, "SELECT id, args FROM trioq.jobs")
            if outcome == "COMMIT":  # a's job, b's args (b committed last)
                assert results == [trioq.EnqueueResult(first.job_id, duplicate=True)]
                assert jobs == [(first.job_id, {"by": "b"})]
                await a.execute("DELETE FROM trioq.jobs")
            else:  # a's job never existed: b's enqueue made one
                assert not results[0].duplicate and jobs == [(results[0].job_id, {"by": "b"})]


async def test_an_enqueue_racing_the_claim_makes_a_new_job(dsn: str) -> None:
    """The claim holds the row (open transaction): the enqueue waits, then finds the job
    started (no longer under the key) and inserts a new one; the started job keeps its
    args."""
    async with migrated(dsn, T0) as a, await trioq.connect(dsn, autocommit=True) as b:
        first = await trioq.enqueue(a, "t", {"n": 1}, dedup_key="k", debounce=5)
        await set_clock(b, T0 + 10 * SEC)
        await Q.promote_due(b)
        results: list[trioq.EnqueueResult] = []

        async def enqueue() -> None:
            results.append(await trioq.enqueue(b, "t", {"n": 2}, dedup_key="k", debounce=5))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await a.execute("BEGIN")
                await set_clock(a, T0 + 10 * SEC)
                (job,) = await Q.claim(a, "default", owner="w", limit=1, lease=LEASE)
                nursery.start_soon(enqueue)
                await wait_until_blocked(a, b)
                await a.execute("COMMIT")
        assert job.id == first.job_id and job.args == {"n": 1}
        assert not results[0].duplicate and results[0].job_id != first.job_id
        assert await rows(a, "SELECT id, args, state FROM trioq.jobs ORDER BY id") == [
            (first.job_id, {"n": 1}, "running"), (results[0].job_id, {"n": 2}, "scheduled")]


_PROCESS = """
import sys, psycopg
from trioq import producer
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    for i in range(int(sys.argv[3])):
        producer.enqueue(conn, "t", {"by": sys.argv[2], "i": i}, dedup_key="k", debounce=60)
    # the last enqueue of this process: its args are there unless the other committed later
    print(conn.execute("SELECT args FROM trioq.jobs").fetchone()[0])
"""


def test_a_burst_from_two_processes_makes_one_job(dsn: str) -> None:
    trio.run(_migrate, dsn)
    procs = [
        subprocess.Popen([sys.executable, "-c", _PROCESS, dsn, name, "40"],
                         stdout=subprocess.PIPE, text=True)
        for name in ("p", "q")
    ]  # fmt: skip
    outs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    with psycopg.connect(dsn) as conn:
        jobs = conn.execute("SELECT args FROM trioq.jobs").fetchall()
    assert len(jobs) == 1
    (args,) = jobs[0]
    assert args in ({"by": "p", "i": 39}, {"by": "q", "i": 39}), args  # a last enqueue
    assert outs, outs


async def _migrate(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)


# -- refusals -----------------------------------------------------------------------------------


BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"debounce": 5}, ValueError, DEBOUNCE_NEEDS_KEY),
    ({"debounce": 5, "unique": trioq.Unique(key="w", period=60)}, ValueError,
     DEBOUNCE_NEEDS_KEY),
    ({"debounce": 5, "dedup_key": "k", "delay": 1}, ValueError,
     "debounce sets the run time (the period after the last enqueue): give no run_at or delay"),
    ({"debounce": 5, "dedup_key": "k", "run_at": T0}, ValueError,
     "debounce sets the run time (the period after the last enqueue): give no run_at or delay"),
    ({"debounce": 5, "dedup_key": "k", "start_by": 60}, ValueError,
     "give start_by or debounce, not both (debounce moves the run time)"),
    ({"debounce": "5s", "dedup_key": "k"}, TypeError,
     "debounce must be a timedelta, seconds or a trioq.Debounce, got '5s'"),
    ({"debounce": True, "dedup_key": "k"}, TypeError,
     "debounce must be a timedelta, seconds or a trioq.Debounce, got True"),
    ({"debounce": "\x00", "dedup_key": "k"}, TypeError,
     "debounce must be a timedelta, seconds or a trioq.Debounce, got '\\x00'"),
    ({"debounce": 0, "dedup_key": "k"}, ValueError,
     "debounce period must be between 1 ms and 366 days, got 0:00:00"),
    ({"debounce": -1, "dedup_key": "k"}, ValueError,
     "debounce period must be between 1 ms and 366 days, got -1 day, 23:59:59"),
    ({"debounce": float("inf"), "dedup_key": "k"}, ValueError,
     "debounce period must be a finite number of seconds, got inf"),
    ({"debounce": 10**9, "dedup_key": "k"}, ValueError,
     "debounce period must be between 1 ms and 366 days, got 11574 days, 1:46:40"),
]  # fmt: skip


@pytest.mark.parametrize(("options", "kind", "words"), BAD)
async def test_bad_debounces_are_refused_with_the_same_words_on_every_path(
    dsn: str, options: dict[str, Any], kind: type[Exception], words: str
) -> None:
    tasks = trioq.Registry()

    @tasks.task()
    async def noted(job: trioq.JobContext) -> None: ...

    async with migrated(dsn, T0) as conn:
        for call in (
            lambda: trioq.enqueue(conn, "t", **options),
            lambda: noted.enqueue(conn, **options),
            lambda: trioq.enqueue_many(conn, [trioq.JobSpec(task="t", **options)]),
        ):
            with pytest.raises(kind) as caught:
                await call()
            assert str(caught.value) == words
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0


def test_debounce_itself_refuses_a_max_wait_below_its_period() -> None:
    with pytest.raises(ValueError, match=r"^debounce max_wait \(0:00:01\) must be at least its "):
        Debounce(5, max_wait=1)
    with pytest.raises(ValueError, match=r"^debounce max_wait must be between 1 ms and 366 days"):
        Debounce(5, max_wait=-5)
    assert Debounce(dt.timedelta(seconds=5), max_wait=5) == Debounce(5, max_wait=5.0)


def test_the_command_line_debounces(dsn: str) -> None:
    assert trioq_cli("migrate", "--dsn", dsn).returncode == 0
    first = trioq_cli("enqueue", "t", "--args", '{"n": 1}', "--dedup-key", "k", "--debounce",
                      "30s", "--dsn", dsn)  # fmt: skip
    again = trioq_cli("enqueue", "t", "--args", '{"n": 2}', "--dedup-key", "k", "--debounce",
                      "30s", "--debounce-max-wait", "1m", "--dsn", dsn)  # fmt: skip
    assert first.stdout.startswith("enqueued job 1"), first.stderr
    assert again.stdout.startswith("debounced into job 1 (it had not started)"), again.stderr
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT args FROM trioq.jobs").fetchall() == [({"n": 2},)]
    for args, words in [
        (["--debounce", "30s"], DEBOUNCE_NEEDS_KEY),
        (["--debounce", "0", "--dedup-key", "k"], "--debounce '0': must be more than 0"),
        (["--debounce-max-wait", "1m", "--dedup-key", "k"], "--debounce-max-wait needs"),
        (["--debounce", "1m", "--debounce-max-wait", "1s", "--dedup-key", "k"],
         "debounce max_wait (0:00:01) must be at least its period (0:01:00)"),
        (["--debounce", "1m", "--dedup-key", "k", "--unique-period", "1h"], DEBOUNCE_NEEDS_KEY),
    ]:  # fmt: skip
        out = trioq_cli("enqueue", "t", *args, "--dsn", dsn)
        assert out.returncode in (1, 2), (args, out.stdout)
        assert words in out.stderr and "Traceback" not in out.stderr, (args, out.stderr)


async def test_the_sql_api_debounces_into_the_same_job_as_python(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        first = await trioq.enqueue(conn, "t", {"by": "python"}, dedup_key="k", debounce=5)
        await set_clock(conn, T0 + 2 * SEC)
        by_sql = await scalar(conn, "SELECT trioq.enqueue('t', %s, dedup_key => 'k',"
                                    " debounce => '5 s', debounce_max_wait => '6 s')",
                              '{"by": "sql"}')  # fmt: skip
        assert by_sql == first.job_id
        assert await rows(conn, PENDING) == [(first.job_id, {"by": "sql"}, T0 + 7 * SEC,
                                              "scheduled")]  # fmt: skip
        other = await scalar(conn, "SELECT trioq.enqueue('t', dedup_key => 'other',"
                                   " debounce => '5 s', debounce_max_wait => '6 s')")  # fmt: skip
        await set_clock(conn, T0 + 6 * SEC)
        await scalar(conn, "SELECT trioq.enqueue('t', '{\"n\": 2}', dedup_key => 'other',"
                           " debounce => '5 s')")  # fmt: skip
        assert await scalar(conn, "SELECT run_at FROM trioq.jobs WHERE id = %s",
                            other) == T0 + 8 * SEC  # fmt: skip (the first's max_wait holds)


# -- a real worker ------------------------------------------------------------------------------


async def test_a_serving_worker_runs_each_burst_once_with_its_last_args(dsn: str) -> None:
    """A burst runs once with its last args; a burst while that job runs makes a job of its
    own, which runs once after it. Each burst is one transaction (one clock), so the test
    does not depend on how fast the box enqueues."""
    tasks = trioq.Registry()
    seen: list[int] = []
    release = trio.Event()

    @tasks.task()
    async def reindex(job: trioq.JobContext, n: int) -> None:
        seen.append(n)
        if n == 3:
            await release.wait()

    async def one_burst(conn: Any, ns: range) -> None:
        async with conn.transaction():
            for n in ns:
                await trioq.enqueue(conn, "reindex", {"n": n}, dedup_key="doc", debounce=0.3)

    async with serving(dsn, tasks) as (conn, _runtime):
        await one_burst(conn, range(1, 4))

        async def started() -> bool:
            return seen == [3]

        await wait_until(started)
        await one_burst(conn, range(4, 6))  # while the first runs
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 2
        release.set()

        async def finished() -> bool:
            return len(seen) == 2 and await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0

        await wait_until(finished)
        assert seen == [3, 5]


_BURST = """
import sys, time, psycopg
from trioq import producer
name, first = sys.argv[2], int(sys.argv[3])
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    for i in range(40):
        if i == 39:  # the database's time before the last enqueue: its job runs after this + 3 s
            print(conn.execute("SELECT clock_timestamp()").fetchone()[0].isoformat())
        producer.enqueue(conn, "hold", {"ms": first + i}, queue="limited", dedup_key="k",
                         debounce=3)
        time.sleep(0.02)  # a burst spread over about a second, well inside the period
"""


@pytest.mark.slow
def test_a_burst_from_two_producers_runs_once_on_two_serve_processes(
    dsn: str, tmp_path: Any
) -> None:
    """Two ``trioq serve`` processes serve the queue while two producer processes each send
    40 debounced enqueues of one key: one job runs, once, with the args of a last enqueue,
    and not before the period after the last enqueue (the handlers record their starts on the
    database's clock)."""
    from test_flow_processes import Workers, wait_for

    assert trioq_cli("migrate", "--dsn", dsn).returncode == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_STARTS)
    group = Workers(dsn, tmp_path, record_starts="1")
    try:
        names = [group.start(2), group.start(2)]
        group.wait_ready(names)
        procs = [subprocess.Popen([sys.executable, "-c", _BURST, dsn, name, str(first)],
                                  stdout=subprocess.PIPE, text=True)
                 for name, first in (("p", 0), ("q", 100))]  # fmt: skip
        outs = [proc.communicate(timeout=120)[0] for proc in procs]
        assert [proc.returncode for proc in procs] == [0, 0], outs
        before_last = max(dt.datetime.fromisoformat(out.strip()) for out in outs)
        wait_for(dsn, "SELECT count(*) FROM trioq.jobs", [(0,)], timeout=60)
    finally:
        group.stop_all()
    with psycopg.connect(dsn) as conn:
        starts = conn.execute("SELECT job_id, at, args FROM handler_starts").fetchall()
    assert len(starts) == 1, starts  # one run of one job
    _, at, args = starts[0]
    assert at >= before_last + dt.timedelta(seconds=3), (starts, before_last)
    assert args in ({"ms": 39}, {"ms": 139}), args  # a last enqueue's args


# The handlers of flow_app record (job_id, at); the job's args are taken from its row.
_STARTS = """
CREATE TABLE handler_starts (job_id bigint, at timestamptz, args jsonb);
CREATE FUNCTION handler_args() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.args := (SELECT j.args FROM trioq.jobs j WHERE j.id = NEW.job_id);
    RETURN NEW;
END $$;
CREATE TRIGGER handler_args BEFORE INSERT ON handler_starts
    FOR EACH ROW EXECUTE FUNCTION handler_args();
"""
