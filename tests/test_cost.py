"""Weighted slots (``cost``), on real Postgres: every enqueue path writes a job's cost (and
refuses a bad one in the same words), the schema refuses what no worker could mean, the
claims take jobs while their units fit (a big job at the head is never passed by small
ones), one process never runs more units than its ``concurrency``, a job costing more than
that (or than the global limit) runs alone instead of stopping the queue, a cost left to the
task is resolved by the worker (given back first on a queue with a global limit, so the
claim counts it), and a task costing more than its queue's slots is refused at start. Across
real ``trioq serve`` processes the global limit counts cost: a ledger on the database clock
proves it (``test_the_global_limit_counts_cost_across_processes``)."""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import random
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
import trio
from clitool import trioq_cli
from helpers import migrated, rows, scalar, serving, wait_until
from test_flow_processes import Workers, query, wait_for

import trioq
from trioq import QueueConfig

LEASE = dt.timedelta(seconds=30)
Q = trioq.Queue()


class Units:
    """The units the handlers of one process hold at once, and the most there ever were."""

    def __init__(self) -> None:
        self.now = self.peak = self.done = 0
        self.beside_big: list[int] = []  # units held by others while a cost-4 job ran

    async def hold(self, job: trioq.JobContext, seconds: float) -> None:
        self.now += job.cost
        self.peak = max(self.peak, self.now)
        if job.cost >= 4:
            self.beside_big.append(self.now - job.cost)
        try:
            await trio.sleep(seconds)
        finally:
            self.now -= job.cost
            self.done += 1


async def _done(units: Units, n: int) -> bool:
    await trio.lowlevel.checkpoint()
    return units.done >= n


async def _costs(conn: Any) -> dict[str, list[int | None]]:
    found = await rows(conn, "SELECT task, cost FROM trioq.jobs ORDER BY id")
    out: dict[str, list[int | None]] = {}
    for task, cost in found:
        out.setdefault(task, []).append(cost)
    return out


# -- every enqueue path -------------------------------------------------------------------------


async def test_every_enqueue_path_writes_the_cost(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task(cost=4)
    async def render(job: trioq.JobContext, page: int = 0) -> None: ...

    @tasks.task()
    async def plain(job: trioq.JobContext) -> None: ...

    async with migrated(dsn) as conn:
        await trioq.enqueue(conn, "one", cost=3)
        await trioq.enqueue(conn, "one")  # left to the task: NULL
        await trioq.enqueue_many(conn, [trioq.JobSpec(task="many", cost=2),
                                        trioq.JobSpec(task="many")])  # fmt: skip
        await trioq.enqueue_bulk(conn, "bulk", [{}, {}], cost=5)
        await render.enqueue(conn, page=1)
        await plain.enqueue(conn)  # a cost-1 task writes nothing (its default)
        await trioq.enqueue_many(conn, [render.spec(page=2), plain.spec()])
        first = await trioq.enqueue(conn, "after", cost=6)
        await trioq.enqueue(conn, "after", after=[first.job_id], cost=7)
        await trioq.enqueue(conn, "window", unique=trioq.Unique(key="w", period=60), cost=8)
        await trioq.enqueue(conn, "bounce", dedup_key="b", debounce=5, cost=9)
        await trioq.enqueue(conn, "bounce", dedup_key="b", debounce=5, cost=2)  # the first's
        costs = await _costs(conn)
    assert costs["one"] == [3, None]
    assert costs["many"] == [2, None]
    assert costs["bulk"] == [5, 5]
    assert costs["render"] == [4, 4]
    assert costs["plain"] == [None, None]
    assert costs["after"] == [6, 7]
    assert costs["window"] == [8]
    assert costs["bounce"] == [9]


def test_the_cli_enqueues_a_cost(dsn: str) -> None:
    trioq_cli("migrate", "--dsn", dsn)
    done = trioq_cli("enqueue", "report", "--cost", "4", "--dsn", dsn, "--json")
    assert done.returncode == 0, done.stderr
    job_id = json.loads(done.stdout)["job_id"]
    assert query(dsn, "SELECT cost FROM trioq.jobs WHERE id = %s", job_id) == [(4,)]


BAD: list[tuple[object, type[Exception], str]] = [
    (0, ValueError, "cost must be between 1 and 1000 (slots), got 0"),
    (-1, ValueError, "cost must be between 1 and 1000 (slots), got -1"),
    (1001, ValueError, "cost must be between 1 and 1000 (slots), got 1001"),
    (2**63, ValueError, f"cost must be between 1 and 1000 (slots), got {2**63}"),
    ("4", TypeError, "cost must be an int (slots), got '4'"),
    (4.0, TypeError, "cost must be an int (slots), got 4.0"),
    (float("nan"), TypeError, "cost must be an int (slots), got nan"),
    (True, TypeError, "cost must be an int (slots), got True"),
    ("", TypeError, "cost must be an int (slots), got ''"),
    ("\x00", TypeError, "cost must be an int (slots), got '\\x00'"),
    ("\ud800", TypeError, "cost must be an int (slots), got '\\ud800'"),
]


@pytest.mark.parametrize(("cost", "kind", "words"), BAD)
async def test_bad_costs_are_refused_with_the_same_words_on_every_path(
    dsn: str, cost: Any, kind: type[Exception], words: str
) -> None:
    async with migrated(dsn) as conn:
        calls: list[Callable[[], Awaitable[Any]]] = [
            functools.partial(trioq.enqueue, conn, "t", cost=cost),
            functools.partial(trioq.enqueue_bulk, conn, "t", [{}], cost=cost),
            lambda: trioq.enqueue_many(conn, [trioq.JobSpec(task="t", cost=cost)]),
        ]
        for call in calls:
            with pytest.raises(kind) as caught:
                await call()
            assert str(caught.value) == words
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0
    with pytest.raises(kind, match=r"task 't': cost must be"):
        trioq.Registry().task(name="t", cost=cost)(lambda job: None)


@pytest.mark.parametrize(
    ("text", "words"),
    [("0", "between 1 and 1000 (slots), got 0"), ("1001", "got 1001"),
     ("4.5", "an int (slots), got '4.5'"), ("", "an int (slots), got ''"),
     ("9" * 400, "between 1 and 1000 (slots), got 999"), ("²", "an int (slots), got '²'")],
)  # fmt: skip
def test_the_cli_refuses_a_bad_cost_in_the_same_words(dsn: str, text: str, words: str) -> None:
    trioq_cli("migrate", "--dsn", dsn)
    done = trioq_cli("enqueue", "report", "--cost", text, "--dsn", dsn)
    assert done.returncode != 0
    assert done.stderr.startswith("trioq: error: cost must be "), done.stderr
    assert words in done.stderr and "Traceback" not in done.stderr


async def test_the_schema_refuses_a_cost_no_worker_could_mean(dsn: str) -> None:
    async with migrated(dsn) as conn:
        for cost in (0, -5, 1001, 32767):
            with pytest.raises(psycopg.errors.CheckViolation, match="jobs_cost_check"):
                await conn.execute(
                    "INSERT INTO trioq.jobs (queue, task, args, cost) VALUES ('q', 't', '{}', %s)",
                    (cost,),
                )


# -- the claims ---------------------------------------------------------------------------------


async def _enqueue_costs(conn: Any, queue: str, costs: list[int | None]) -> list[int]:
    return [(await trioq.enqueue(conn, "t", queue=queue, cost=c)).job_id for c in costs]


@pytest.mark.parametrize("weighted", [False, True])
async def test_the_plain_claim_takes_jobs_while_their_units_fit(dsn: str, weighted: bool) -> None:
    """Units before each job fewer than asked: the last may go past (it waits in its
    worker's buffer), none is skipped. Cost-1 jobs: exactly as many as asked, as before.
    Weighted (the units counted in SQL) or not (the jobs past them given back): the same."""
    claim = functools.partial(Q.claim, weighted=weighted)
    async with migrated(dsn) as conn:
        ids = await _enqueue_costs(conn, "q", [2, 2, 1, 3, 1])
        before = await rows(conn, "SELECT id, run_at FROM trioq.jobs ORDER BY id")
        got = await claim(conn, "q", owner="w", limit=3, lease=LEASE)
        assert [j.id for j in got] == ids[:2] and [j.cost for j in got] == [2, 2]
        # the statement took 3 jobs; the third was given back at once: its attempt refunded,
        # its place (run_at) kept, as the jobs behind it
        assert await rows(conn, "SELECT id, state, attempt, run_at FROM trioq.jobs"
                                " WHERE id <> ALL(%s) ORDER BY id", ids[:2]) == [
            (i, "available", 0, at) for i, at in before[2:]]  # fmt: skip
        got = await claim(conn, "q", owner="w", limit=1, lease=LEASE)
        assert [j.id for j in got] == ids[2:3]
        got = await claim(conn, "q", owner="w", limit=1, lease=LEASE)  # past the limit
        assert [j.id for j in got] == ids[3:4]
        exact = await _enqueue_costs(conn, "x", [1, 2, 1])  # the units reach the limit exactly
        ctid = "SELECT ctid::text FROM trioq.jobs WHERE id = %s"
        left = await scalar(conn, ctid, exact[2])
        got = await claim(conn, "x", owner="w", limit=3, lease=LEASE)
        assert [j.id for j in got] == exact[:2]
        # weighted: the statement never took the third (its row untouched); else it took it
        # and gave it back (a new row version)
        assert (await scalar(conn, ctid, exact[2]) == left) == weighted
        ones = await _enqueue_costs(conn, "p", [None] * 10)
        got = await claim(conn, "p", owner="w", limit=4, lease=LEASE)
        assert [j.id for j in got] == ones[:4] and {j.cost for j in got} == {None}


async def test_a_big_job_at_the_head_is_never_passed_by_small_ones(dsn: str) -> None:
    """Global limit 4, two units running: the cost-4 job at the head does not fit, and the
    cost-1 jobs behind it wait too (the claim says ``concurrency``); once the running jobs
    end, it starts, alone."""
    async with migrated(dsn) as conn:
        await Q.set_limits(conn, "q", global_concurrency=4)
        await _enqueue_costs(conn, "q", [1, 1])
        running = (await Q.claim_limited(conn, "q", owner="w", limit=2, lease=LEASE)).jobs
        [big] = await _enqueue_costs(conn, "q", [4])
        await _enqueue_costs(conn, "q", [1, 1])
        got = await Q.claim_limited(conn, "q", owner="w", limit=4, lease=LEASE)
        assert (got.jobs, got.reason) == ([], "concurrency")
        await _complete(conn, running)
        got = await Q.claim_limited(conn, "q", owner="w", limit=4, lease=LEASE)
        assert [j.id for j in got.jobs] == [big] and got.jobs[0].cost == 4
        got = await Q.claim_limited(conn, "q", owner="w", limit=4, lease=LEASE)
        assert (got.jobs, got.reason) == ([], "concurrency")


async def _complete(conn: Any, jobs: list[trioq.Job]) -> None:
    await conn.execute("DELETE FROM trioq.jobs WHERE id = ANY(%s)", ([j.id for j in jobs],))


async def test_a_job_costing_more_than_the_global_limit_runs_alone(dsn: str) -> None:
    """A row written by hand with cost 7 on a queue limited to 3: counted as the whole limit,
    it runs when nothing else does, and the queue goes on after it."""
    async with migrated(dsn) as conn:
        await Q.set_limits(conn, "q", global_concurrency=3)
        [small] = await _enqueue_costs(conn, "q", [1])
        await conn.execute("INSERT INTO trioq.jobs (queue, task, args, cost, priority)"
                           " VALUES ('q', 't', '{}', 7, 1)")  # fmt: skip
        [after] = await _enqueue_costs(conn, "q", [1])
        await conn.execute(f"UPDATE trioq.jobs SET priority = 2 WHERE id = {after}")
        got = await Q.claim_limited(conn, "q", owner="w", limit=5, lease=LEASE)
        assert [j.id for j in got.jobs] == [small] and got.reason == "concurrency"
        await _complete(conn, got.jobs)
        got = await Q.claim_limited(conn, "q", owner="w", limit=1, lease=LEASE)
        assert [j.cost for j in got.jobs] == [7]
        assert (await Q.claim_limited(conn, "q", owner="w", limit=5, lease=LEASE)).jobs == []
        await _complete(conn, got.jobs)
        got = await Q.claim_limited(conn, "q", owner="w", limit=5, lease=LEASE)
        assert [j.id for j in got.jobs] == [after]


# -- one process --------------------------------------------------------------------------------


async def test_one_process_never_runs_more_units_than_its_concurrency(dsn: str) -> None:
    """Concurrency 4: one cost-4 job, or four cost-1 jobs, at once; never more. The cost-4
    jobs (by the task, and by the enqueue) run with nothing beside them."""
    tasks = trioq.Registry()
    units = Units()

    @tasks.task(queue="q", cost=4)
    async def big(job: trioq.JobContext) -> None:
        await units.hold(job, 0.03)

    @tasks.task(queue="q")
    async def small(job: trioq.JobContext) -> None:
        await units.hold(job, 0.01)

    async with serving(dsn, tasks, queues={"q": QueueConfig(concurrency=4)}) as (conn, _):
        rnd = random.Random(7)
        for i in range(60):
            if rnd.random() < 0.2:
                await big.enqueue(conn)
            elif i % 7 == 0:
                await trioq.enqueue(conn, "small", queue="q", cost=4)  # by the enqueue
            else:
                await small.enqueue(conn)
        await wait_until(lambda: _done(units, 60), timeout=60)
    assert units.peak == 4
    assert units.beside_big and set(units.beside_big) == {0}


async def test_a_job_costing_more_than_the_process_has_runs_alone(dsn: str) -> None:
    """A row written by hand with cost 9 on a queue of 4 slots: it runs, alone, and the
    jobs behind it after it (it does not stop the queue)."""
    tasks = trioq.Registry()
    order: list[str] = []
    units = Units()

    @tasks.task(queue="q")
    async def t(job: trioq.JobContext, name: str) -> None:
        order.append(name)
        units.now += min(job.cost, 4)
        units.peak = max(units.peak, units.now)
        await trio.sleep(0.02)
        units.now -= min(job.cost, 4)
        units.done += 1

    async with migrated(dsn) as conn:
        await trioq.enqueue(conn, "t", {"name": "a"}, queue="q")
        await conn.execute("INSERT INTO trioq.jobs (queue, task, args, cost)"
                           " VALUES ('q', 't', '{\"name\": \"huge\"}', 9)")  # fmt: skip
        await trioq.enqueue(conn, "t", {"name": "b"}, queue="q")
    async with serving(dsn, tasks, queues={"q": QueueConfig(concurrency=4)}):
        await wait_until(lambda: _done(units, 3), timeout=30)
    assert order == ["a", "huge", "b"]
    assert units.peak == 4


async def test_a_task_costing_more_than_its_queue_has_is_refused_at_start(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task(queue="q", cost=5)
    async def big(job: trioq.JobContext) -> None: ...

    config = trioq.Config(dsn=dsn, registry=tasks, queues={"q": QueueConfig(concurrency=4)})
    with pytest.raises(ValueError, match=r"^task 'big' costs 5 slots, more than queue 'q' has "
                                         r"in this process \(concurrency 4\)"):  # fmt: skip
        await trioq.serve(config)
    # A process that does not serve the task's queue does not care.
    other = trioq.Config(dsn=dsn, registry=tasks, queues={"r": QueueConfig(concurrency=1)})
    async with migrated(dsn), trio.open_nursery() as nursery:
        runtime = await nursery.start(trioq.serve, other)
        runtime.stop()


# -- a cost left to the task --------------------------------------------------------------------


async def test_a_cost_left_to_the_task_is_resolved_by_the_worker(dsn: str) -> None:
    """Enqueued by name without a cost, a job of a cost-3 task: on a plain queue the worker
    writes 3 and runs it with 3 slots; on a queue with a global limit it gives the job back
    first (attempt refunded), so the claim that runs it counts 3."""
    tasks = trioq.Registry()
    units = Units()
    seen: list[tuple[str, int, int]] = []

    @tasks.task(queue="plain", cost=3)
    async def wide(job: trioq.JobContext) -> None:
        seen.append((job.queue, job.cost, job.attempt))
        await units.hold(job, 0.01)

    @tasks.task(queue="limited", cost=3)
    async def wide_limited(job: trioq.JobContext) -> None:
        seen.append((job.queue, job.cost, job.attempt))
        await units.hold(job, 0.01)

    queues = {"plain": QueueConfig(concurrency=4),
              "limited": QueueConfig(concurrency=4, global_concurrency=3)}  # fmt: skip
    async with migrated(dsn) as conn:
        await conn.execute(
            "CREATE TABLE public.cost_ledger (job_id bigint, attempt int, cost int, event text);"
            "CREATE FUNCTION public.cost_ledger() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN IF NEW.state = 'running' AND OLD.state <> 'running' THEN"
            "   INSERT INTO public.cost_ledger VALUES (NEW.id, NEW.attempt, NEW.cost, 'start');"
            " ELSIF OLD.state = 'running' AND NEW.state <> 'running' THEN"
            "   INSERT INTO public.cost_ledger VALUES (OLD.id, OLD.attempt, NEW.cost, 'back');"
            " END IF; RETURN NULL; END $$;"
            "CREATE TRIGGER cost_ledger AFTER UPDATE OF state ON trioq.jobs"
            " FOR EACH ROW EXECUTE FUNCTION public.cost_ledger()"
        )
    async with serving(dsn, tasks, queues=queues) as (conn, _):
        await trioq.enqueue(conn, "wide", queue="plain")
        await trioq.enqueue(conn, "wide_limited", queue="limited")
        await wait_until(lambda: _done(units, 2), timeout=30)
        ledger = await rows(conn, "SELECT job_id, attempt, cost, event FROM public.cost_ledger")
    assert sorted(seen) == [("limited", 3, 1), ("plain", 3, 1)]
    events = [(cost, event) for _, _, cost, event in ledger]
    # plain: claimed once (NULL), resolved in place; limited: claimed (NULL), given back with
    # its cost, claimed again counting 3.
    assert sorted(events, key=str) == sorted([(None, "start"), (None, "start"), (3, "back"),
                                              (3, "start")], key=str)  # fmt: skip


# -- across processes -----------------------------------------------------------------------------

LEDGER = """
CREATE TABLE handler_spans (job_id bigint, worker text, cost int, started timestamptz,
                            ended timestamptz);
CREATE TABLE cost_spans (job_id bigint, attempt int, cost int, event text, at timestamptz,
                         how text);
CREATE FUNCTION cost_spans() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.state = 'running' AND OLD.state <> 'running' THEN
        INSERT INTO public.cost_spans VALUES (NEW.id, NEW.attempt, NEW.cost, 'start',
                                              clock_timestamp(), NULL);
    END IF;
    IF OLD.state = 'running' AND (TG_OP = 'DELETE' OR NEW.state <> 'running') THEN
        INSERT INTO public.cost_spans VALUES (OLD.id, OLD.attempt,
            CASE WHEN TG_OP = 'UPDATE' THEN NEW.cost ELSE OLD.cost END, 'end', clock_timestamp(),
            CASE WHEN TG_OP = 'UPDATE' THEN NEW.state ELSE 'deleted' END);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER cost_spans AFTER UPDATE OF state OR DELETE ON trioq.jobs
    FOR EACH ROW EXECUTE FUNCTION public.cost_spans();
"""


class CostWorkers(Workers):
    target = "cost_app:config"


def weighted_peak(spans: list[tuple[dt.datetime, dt.datetime, int]]) -> int:
    """The most units held at one instant (an end at the same instant as a start first)."""
    edges = sorted([(s, 0, c) for s, _, c in spans] + [(e, -1, -c) for _, e, c in spans])
    now = most = 0
    for _, _, delta in edges:
        now += delta
        most = max(most, now)
    return most


@pytest.mark.slow
def test_the_global_limit_counts_cost_across_processes(dsn: str, tmp_path: Any) -> None:
    """Three ``trioq serve`` processes of 3-4 slots share a queue limited to G units; jobs cost
    1, 2, 3 (by the task, and left to it: resolved by the worker), 4, and 9 (a row by hand:
    more than G and than any process). A trigger keeps a ledger of every entry into and exit
    from ``running`` on the database clock, with the row's cost: at no instant do the running
    jobs cost more than G (each counted at most G). Each process's handlers (their own
    starts and ends, inside what their slots held) never held more units than its slots."""
    seed = int(os.environ.get("TRIOQ_FLOW_SEED", random.randrange(2**32)))
    rnd = random.Random(seed)
    gc = rnd.choice([4, 5, 6])
    slots = [rnd.randint(3, 4) for _ in range(3)]
    print(f"\ncost proof: seed {seed}, global {gc}, slots {slots}")
    subprocess_migrate = trioq_cli("migrate", "--dsn", dsn)
    assert subprocess_migrate.returncode == 0, subprocess_migrate.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LEDGER)
        conn.execute("INSERT INTO trioq.queues (name, global_concurrency) VALUES ('heavy', %s)",
                     (gc,))  # fmt: skip
    workers = CostWorkers(dsn, tmp_path)
    try:
        names = [workers.start(n) for n in slots]
        workers.wait_ready(names)
        jobs = []
        for _ in range(120):
            ms = rnd.randint(5, 40)
            task, cost = rnd.choice([("light", None), ("big", 3), ("big", None), ("any", 2),
                                     ("any", 4), ("any", 1)])  # fmt: skip
            jobs.append((task, json.dumps({"ms": ms}), cost))
        jobs.append(("any", json.dumps({"ms": 20}), 9))
        with psycopg.connect(dsn, autocommit=True) as conn:
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO trioq.jobs (queue, task, args, cost)"
                                " VALUES ('heavy', %s, %s::jsonb, %s)", jobs)  # fmt: skip
            conn.execute("SELECT pg_notify('trioq_trioq', 'heavy')")
        wait_for(dsn, "SELECT count(*) FROM trioq.jobs", [(0,)], timeout=120)
    finally:
        workers.stop_all()
    assert query(dsn, "SELECT count(*) FROM trioq.dead_jobs") == [(0,)]
    ledger = query(dsn, "SELECT job_id, attempt, cost, event, at, how FROM cost_spans")
    # A stay that began counted 1 (cost NULL) and ended with the task's cost written held
    # that cost (its handler ran with it), unless it ended by being given back (available
    # again, its handler never started): that is the one stay counted at its start's cost.
    spans = [(s, e, min(max(counted or 1, 1 if given_back(counted, left, how) else left or 1),
                        gc)) for s, e, counted, left, how in _spans(ledger)]  # fmt: skip
    most = weighted_peak(spans)
    back = sum(1 for _, _, counted, left, how in _spans(ledger)
               if given_back(counted, left, how))  # fmt: skip
    print(f"cost proof: {len(spans)} runs, at most {most} units at once (limit {gc}); "
          f"{back} jobs given back to be counted at their task's cost")  # fmt: skip
    assert most <= gc, (seed, gc, slots)
    assert back > 0  # the `big` jobs enqueued without a cost were resolved, then counted
    handler = query(dsn, "SELECT worker, cost, started, ended FROM handler_spans")
    assert len(handler) == len(jobs)
    for name, n in zip(names, slots, strict=True):
        mine = [(s, e, min(c, n)) for w, c, s, e in handler if w == name]
        assert weighted_peak(mine) <= n, (name, n, seed)


def given_back(counted: int | None, left: int | None, how: str | None) -> bool:
    """A stay in ``running`` that ended by the give-back of a cost left to the task."""
    return counted is None and left is not None and how == "available"


def _spans(
    ledger: list[tuple[Any, ...]],
) -> list[tuple[dt.datetime, dt.datetime, int | None, int | None, str | None]]:
    """(start, end, the cost at the start, the cost at the end, the state it left for) of
    every stay in ``running``, from the ledger's rows; every start has its end. A job given
    back to be counted at its task's cost starts again with the same attempt (refunded)."""
    opened: dict[tuple[int, int], tuple[dt.datetime, int | None]] = {}
    out = []
    for job_id, attempt, cost, event, at, how in sorted(ledger, key=lambda r: r[4]):
        if event == "start":
            assert (job_id, attempt) not in opened, f"job {job_id} attempt {attempt} twice"
            opened[(job_id, attempt)] = (at, cost)
        else:
            start, counted = opened.pop((job_id, attempt))
            out.append((start, at, counted, cost, how))
    assert not opened, f"{len(opened)} jobs never left running"
    return out


async def test_a_worker_counts_units_in_sql_once_its_queue_has_costs(dsn: str) -> None:
    """A queue whose tasks cost 1 claims with the plain statement (a job past the units is
    given back) until it claims a job that has a cost; from then on, and from the start for a
    queue with a task costing more than 1, the claim counts units in SQL."""
    tasks = trioq.Registry()
    done = trio.Semaphore(0)

    @tasks.task(queue="light")
    async def light(job: trioq.JobContext) -> None:
        done.release()

    @tasks.task(queue="heavy", cost=2)
    async def heavy(job: trioq.JobContext) -> None:
        done.release()

    queues = {"light": QueueConfig(concurrency=4), "heavy": QueueConfig(concurrency=4)}
    async with serving(dsn, tasks, queues=queues) as (conn, runtime):
        state = runtime._queues  # the runtime's own record of each queue
        assert (state["light"].weighted, state["heavy"].weighted) == (False, True)
        await light.enqueue(conn)
        with trio.fail_after(10):
            await done.acquire()
        assert not state["light"].weighted
        await trioq.enqueue(conn, "light", queue="light", cost=3)
        with trio.fail_after(10):
            await done.acquire()
        assert state["light"].weighted
