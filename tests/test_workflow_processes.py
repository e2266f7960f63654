"""A 10,000-job diamond-shaped workflow run by real ``trioq serve`` processes, two of them
SIGKILLed mid-run; the order is checked from a ledger.

The graph is a lattice of diamonds: ``LAYERS`` layers of ``WIDTH`` jobs, and job ``i`` of a
layer waits for jobs ``i`` and ``i + 1`` (mod ``WIDTH``) of the layer before. So every job
but the first layer's has two dependencies and two dependants. It goes in as one
`trioq.Workflow`. Some jobs fail their first attempt (a retry is not an ending). Each
completes with `job.transaction()`, which also writes a row of ``ran`` (the job, its
attempt, the clock, the transaction id). A killed worker's jobs come back through the
sweeper when their leases expire.

A trigger on ``trioq.jobs`` keeps the ledger: every start of an attempt (``running``),
every job freed (``waiting`` to runnable), each on ``clock_timestamp()`` with the writing
transaction's id. From it the test checks, for every one of the ~20,000 edges and every
job:

- every job completed exactly once (one ``ran`` row), and no job is left or dead;
- no attempt of a job started before every one of its dependencies had completed;
- each dependant was freed exactly once, in the same transaction as the completion of one
  of its dependencies (the last one), after every dependency had completed.

The size is ``TRIOQ_WORKFLOW_JOBS`` (default 10,000, what CI runs: about 25 s here on 2
shared cores); the seed is printed and ``TRIOQ_WORKFLOW_SEED`` replays one.
"""

from __future__ import annotations

import os
import pathlib
import random
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import trio
from test_flow_processes import Workers, query, wait_for

import trioq

pytestmark = pytest.mark.slow

TESTS = pathlib.Path(__file__).parent
WIDTH = 100
JOBS = int(os.environ.get("TRIOQ_WORKFLOW_JOBS", "10000"))
LAYERS = max(JOBS // WIDTH, 2)
LEDGER = """
CREATE TABLE ran (job_id bigint, n int, attempt int, at timestamptz,
                  tx xid8 DEFAULT pg_current_xact_id());
CREATE TABLE ledger (job_id bigint, attempt int, event text, at timestamptz, tx xid8);
CREATE FUNCTION ledger_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'running' AND OLD.state <> 'running' THEN
        INSERT INTO public.ledger VALUES (NEW.id, NEW.attempt, 'start', clock_timestamp(),
                                          pg_current_xact_id());
    ELSIF OLD.state = 'waiting' AND NEW.state <> 'waiting' THEN
        INSERT INTO public.ledger VALUES (NEW.id, NEW.attempt, 'freed:' || NEW.state,
                                          clock_timestamp(), pg_current_xact_id());
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_jobs AFTER UPDATE OF state ON trioq.jobs
    FOR EACH ROW EXECUTE FUNCTION public.ledger_jobs();
"""


@pytest.fixture
def workers(dsn: str, tmp_path: pathlib.Path) -> Iterator[Workers]:
    async def migrate() -> None:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            await trioq.migrate(conn)

    trio.run(migrate)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LEDGER)
    group = Workers(dsn, tmp_path)
    group.target = "workflow_app:config"
    try:
        yield group
    finally:
        group.stop_all()


def lattice(rnd: random.Random) -> tuple[trioq.Workflow, dict[str, list[str]]]:
    """The diamond lattice as a workflow, and each step's dependencies."""
    wf = trioq.Workflow()
    deps: dict[str, list[str]] = {}
    for layer in range(LAYERS):
        for i in range(WIDTH):
            name = f"{layer}.{i}"
            args = {"n": layer * WIDTH + i, "ms": rnd.choice([0, 0, 1, 3]),
                    "flaky": rnd.random() < 0.03}  # fmt: skip
            before = [f"{layer - 1}.{i}", f"{layer - 1}.{(i + 1) % WIDTH}"] if layer else []
            deps[name] = before
            wf.add(name, trioq.JobSpec(task="node", queue="graph", args=args, max_attempts=100),
                   after=before)  # fmt: skip
    return wf, deps


def enqueue(dsn: str, wf: trioq.Workflow) -> trioq.WorkflowJobs:
    async def go() -> trioq.WorkflowJobs:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            return await wf.enqueue(conn)

    return trio.run(go)


def test_a_diamond_lattice_runs_in_order_while_workers_are_killed(workers: Workers) -> None:
    seed = int(os.environ.get("TRIOQ_WORKFLOW_SEED", random.randrange(2**32)))
    rnd = random.Random(seed)
    print(f"\nworkflow proof: seed {seed}, {LAYERS} layers of {WIDTH} jobs")
    dsn = workers.dsn
    wf, deps = lattice(rnd)
    names = [workers.start(8) for _ in range(3)]
    workers.wait_ready(names)
    t0 = time.monotonic()
    jobs = enqueue(dsn, wf)
    total = len(jobs)
    print(f"enqueued {total} jobs and {sum(map(len, deps.values()))} edges in one "
          f"transaction: {time.monotonic() - t0:.2f} s")  # fmt: skip

    # Chaos: SIGKILL a worker while it holds jobs, twice, and start a fresh one each time.
    for fraction in (rnd.uniform(0.15, 0.35), rnd.uniform(0.5, 0.7)):
        wait_for(dsn, f"SELECT count(*) >= {int(total * fraction)} FROM ran", [(True,)], 120)
        victim = rnd.choice(workers.alive())
        held = query(dsn, "SELECT count(*) FROM trioq.jobs WHERE state = 'running'")[0][0]
        workers.kill(victim)
        workers.wait_ready([workers.start(8)])
        print(f"killed {victim} at {fraction:.0%} done ({held} jobs running in all)")
    wait_for(dsn, "SELECT count(*) FROM trioq.jobs", [(0,)], timeout=180)
    elapsed = time.monotonic() - t0
    assert query(dsn, "SELECT count(*) FROM trioq.dead_jobs") == [(0,)]
    print(f"{total} jobs done in {elapsed:.1f} s ({total / elapsed:,.0f} jobs/s)")
    check_ledger(dsn, jobs, deps)


def check_ledger(dsn: str, jobs: trioq.WorkflowJobs, deps: dict[str, list[str]]) -> None:
    ran_rows = query(dsn, "SELECT job_id, at, tx::text FROM ran")
    ran = {job_id: (at, tx) for job_id, at, tx in ran_rows}
    assert len(ran_rows) == len(ran) == len(jobs), "a job completed twice, or not at all"
    starts: dict[int, list[Any]] = defaultdict(list)
    freed: dict[int, list[tuple[Any, str, str]]] = defaultdict(list)
    for job_id, event, at, tx in query(dsn, "SELECT job_id, event, at, tx::text FROM ledger"):
        if event == "start":
            starts[job_id].append(at)
        else:
            freed[job_id].append((at, tx, event))
    rerun = Counter(len(s) for s in starts.values())
    for name, before in deps.items():
        job_id = jobs[name]
        if not before:
            assert job_id not in freed, f"{name} had nothing to wait for"
            continue
        done = [ran[jobs[d]] for d in before]
        last = max(at for at, _ in done)
        assert min(starts[job_id]) > last, f"{name} started before its dependencies completed"
        [(at, tx, event)] = freed[job_id]  # freed exactly once
        assert event == "freed:available", (name, event)
        assert at >= last, f"{name} was freed before its dependencies completed"
        assert tx in {t for _, t in done}, f"{name} was freed outside its dependencies' commits"
    print(f"ledger: {len(jobs)} jobs completed once each, attempts started per job: "
          f"{dict(sorted(rerun.items()))}; every dependant freed once, in the transaction of "
          "its last dependency's completion, and started after it")  # fmt: skip
    assert max(rerun) > 1, "no job ran twice: neither the flaky jobs nor the kills took effect"
