"""Durable jobs under SIGKILL: ``JOBS`` sagas of 5 `step_transaction` steps and a sleep each,
run by real ``trioq serve`` processes, one of them SIGKILLed every ``KILL_EVERY`` seconds and
replaced. Every step's ledger row must be there exactly once, every job done, none dead.
"""

from __future__ import annotations

import os
import pathlib
import random
import time
from collections.abc import Iterator

import psycopg
import pytest
import trio
from durable_app import STEPS
from test_flow_processes import Workers, query, wait_for

import trioq

pytestmark = pytest.mark.slow

JOBS = int(os.environ.get("TRIOQ_DURABLE_JOBS", "2000"))
KILL_EVERY = 1.0


@pytest.fixture
def workers(dsn: str, tmp_path: pathlib.Path) -> Iterator[Workers]:
    async def migrate() -> None:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            await trioq.migrate(conn)
            await trioq.enqueue_bulk(conn, "saga", [{"ms": n % 3} for n in range(JOBS)],
                                     queue="durable")  # fmt: skip

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (job_id bigint, step int, attempt int)")
    trio.run(migrate)
    group = Workers(dsn, tmp_path)
    group.target = "durable_app:config"
    try:
        yield group
    finally:
        group.stop_all()


def test_every_step_of_every_saga_once_while_workers_are_killed(workers: Workers) -> None:
    seed = int(os.environ.get("TRIOQ_DURABLE_SEED", random.randrange(2**32)))
    rnd = random.Random(seed)
    print(f"\ndurable proof: seed {seed}, {JOBS} sagas of {STEPS} steps and a sleep")
    dsn = workers.dsn
    workers.wait_ready([workers.start(8) for _ in range(2)])
    kills = 0
    t0 = time.monotonic()
    while query(dsn, "SELECT count(*) FROM trioq.jobs WHERE state <> 'done'") != [(0,)]:
        assert time.monotonic() - t0 < 240, "the sagas did not finish"
        time.sleep(KILL_EVERY)
        running = query(dsn, "SELECT count(*) FROM trioq.jobs WHERE state = 'running'")[0][0]
        if running and kills < 20:
            workers.kill(rnd.choice(workers.alive()))
            workers.wait_ready([workers.start(8)])
            kills += 1
    wait_for(dsn, "SELECT count(*) FROM trioq.jobs WHERE state <> 'done'", [(0,)], timeout=60)
    elapsed = time.monotonic() - t0
    assert query(dsn, "SELECT count(*) FROM trioq.dead_jobs") == [(0,)]
    twice = query(dsn, "SELECT job_id, step, count(*) FROM ledger GROUP BY 1, 2 "
                       "HAVING count(*) <> 1 LIMIT 5")  # fmt: skip
    assert twice == [], f"steps not written exactly once: {twice}"
    assert query(dsn, "SELECT count(*) FROM ledger") == [(JOBS * STEPS,)]
    results = query(dsn, "SELECT DISTINCT result::text FROM trioq.jobs")
    assert results == [("[0, 1, 2, 3, 4]",)]
    resumed = query(dsn, "SELECT count(DISTINCT job_id) FROM ledger WHERE attempt > 1")[0][0]
    print(f"{JOBS} sagas in {elapsed:.1f} s with {kills} workers SIGKILLed: {JOBS * STEPS} "
          f"steps written once each; {resumed} sagas resumed by a later attempt")
    assert kills >= 2, "the workers were not killed: the test proved nothing"
