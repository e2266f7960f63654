"""Durable jobs under SIGKILL and a Postgres restart: ``JOBS`` sagas of 5 `step_transaction`
steps, a sleep and a signal each, run by real ``trioq serve`` processes on a private cluster,
one of them SIGKILLed every ``KILL_EVERY`` seconds and replaced, and Postgres restarted once.
Half the signals are sent before their job waits, half once it is parked. Every step's ledger
row must be there exactly once, every job done (with its signal), none dead.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import time
from collections.abc import Iterator
from typing import Any

import attrs
import psycopg
import pytest
import trio
from durable_app import STEPS
from pgcluster import copy_cluster, scratch_dir, template_cluster
from test_flow_processes import Workers, query

import trioq
from trioq._pg.embedded import EmbeddedPostgres

pytestmark = pytest.mark.slow

JOBS = int(os.environ.get("TRIOQ_DURABLE_JOBS", "2000"))
KILL_EVERY = 1.0


@attrs.define
class Cluster:
    server: EmbeddedPostgres
    dsn: str


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    workdir = scratch_dir()
    try:
        server = attrs.evolve(copy_cluster(template_cluster(), workdir / "data"),
                              database="postgres")  # fmt: skip
        status = server.start_detached()
        try:
            yield Cluster(server, status.dsn)
        finally:
            server.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _signal(dsn: str, ids: list[int]) -> int:
    async def send() -> int:
        sent = 0
        async with await trioq.connect(dsn, autocommit=True) as conn:
            for job_id in ids:
                with contextlib.suppress(trioq.JobNotFoundError):
                    sent += await trioq.signal(conn, job_id, "go", job_id) != "duplicate"
        return sent

    return trio.run(send)


def _query(dsn: str, sql: str) -> list[Any]:
    """`query`, through a Postgres restart (the server refuses connections meanwhile)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return query(dsn, sql)
        except psycopg.OperationalError:
            assert time.monotonic() < deadline, "Postgres did not come back"
            time.sleep(0.2)


def test_every_step_of_every_saga_once_while_workers_are_killed(cluster: Cluster,
                                                                 tmp_path: Any) -> None:
    seed = int(os.environ.get("TRIOQ_DURABLE_SEED", random.randrange(2**32)))
    rnd = random.Random(seed)
    print(f"\ndurable proof: seed {seed}, {JOBS} sagas of {STEPS} steps, a sleep and a signal")
    dsn = cluster.dsn

    async def setup() -> list[int]:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            await trioq.migrate(conn)
            await conn.execute("CREATE TABLE ledger (job_id bigint, step int, attempt int)")
            return await trioq.enqueue_bulk(conn, "saga", [{"ms": n % 3} for n in range(JOBS)],
                                            queue="durable")  # fmt: skip

    ids = trio.run(setup)
    early = ids[::2]
    assert _signal(dsn, early) == len(early)  # stored: their waits return at once
    workers = Workers(dsn, tmp_path)
    workers.target = "durable_app:config"
    try:
        workers.wait_ready([workers.start(8) for _ in range(2)])
        kills, restarted, t0 = 0, False, time.monotonic()
        while _query(dsn, "SELECT count(*) FROM trioq.jobs WHERE state <> 'done'") != [(0,)]:
            assert time.monotonic() - t0 < 300, "the sagas did not finish"
            time.sleep(KILL_EVERY)
            parked = [r[0] for r in _query(dsn, "SELECT id FROM trioq.jobs WHERE "
                                                "waiting_for = 'go'")]  # fmt: skip
            if parked:
                _signal(dsn, parked)
            done = _query(dsn, "SELECT count(*) FROM trioq.jobs WHERE state = 'done'")[0][0]
            if not restarted and done >= JOBS // 2:
                cluster.server.stop()
                cluster.server.start_detached()
                restarted = True
                print(f"restarted Postgres at {done} sagas done")
            elif kills < 20 and workers.alive():
                workers.kill(rnd.choice(workers.alive()))
                workers.wait_ready([workers.start(8)], timeout=120)
                kills += 1
        elapsed = time.monotonic() - t0
    finally:
        workers.stop_all()
    assert query(dsn, "SELECT count(*) FROM trioq.dead_jobs") == [(0,)]
    twice = query(dsn, "SELECT job_id, step, count(*) FROM ledger GROUP BY 1, 2 "
                       "HAVING count(*) <> 1 LIMIT 5")  # fmt: skip
    assert twice == [], f"steps not written exactly once: {twice}"
    assert query(dsn, "SELECT count(*) FROM ledger") == [(JOBS * STEPS,)]
    wrong = query(dsn, "SELECT id, result::text FROM trioq.jobs WHERE result <> "
                       "jsonb_build_array(0, 1, 2, id, 3, 4) LIMIT 3")  # fmt: skip
    assert wrong == [], wrong
    resumed = query(dsn, "SELECT count(DISTINCT job_id) FROM ledger WHERE attempt > 1")[0][0]
    print(f"{JOBS} sagas in {elapsed:.1f} s with {kills} workers SIGKILLed and Postgres "
          f"restarted: {JOBS * STEPS} steps written once each, every signal read; "
          f"{resumed} sagas resumed by a later attempt")
    assert kills >= 2 and restarted, "the faults did not happen: the test proved nothing"
