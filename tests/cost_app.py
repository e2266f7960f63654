"""An app for the weighted-slots process test: ``trioq serve --app cost_app:config``.

One queue, ``heavy``, of ``APP_CONCURRENCY`` slots; its global limit is set in the database
by the test. ``light`` costs 1, ``big`` costs 3 (its jobs are enqueued by name without a
cost too: the worker resolves it), ``any`` takes the cost its row says. Each handler records
its start and end (the database's clock, from its own connection) with its worker and the
units it holds, so the test can check what every process ran at once.
"""

from __future__ import annotations

import os

import trio

import trioq

tasks = trioq.Registry()
WORKER = os.environ.get("PGAPPNAME", "?")


@tasks.task(queue="heavy", max_attempts=100)
async def light(job: trioq.JobContext, ms: int) -> None:
    await _hold(job, ms)


@tasks.task(queue="heavy", max_attempts=100, cost=3)
async def big(job: trioq.JobContext, ms: int) -> None:
    await _hold(job, ms)


@tasks.task(name="any", queue="heavy", max_attempts=100)
async def any_cost(job: trioq.JobContext, ms: int) -> None:
    await _hold(job, ms)


async def _hold(job: trioq.JobContext, ms: int) -> None:
    async with job.connection() as conn:
        cur = await conn.execute("SELECT clock_timestamp()")
        row = await cur.fetchone()
        assert row is not None
        await trio.sleep(ms / 1000)
        await conn.execute(
            "INSERT INTO public.handler_spans (job_id, worker, cost, started, ended)"
            " VALUES (%s, %s, %s, %s, clock_timestamp())",
            (job.id, WORKER, job.cost, row[0]),
        )


config = trioq.Config(
    registry=tasks,
    queues={"heavy": trioq.QueueConfig(concurrency=int(os.environ.get("APP_CONCURRENCY", "4")))},
    lease=float(os.environ.get("APP_LEASE", "2")),
    heartbeat_interval=float(os.environ.get("APP_HEARTBEAT", "0.5")),
    sweep_interval=float(os.environ.get("APP_SWEEP", "0.3")),
    poll_interval=float(os.environ.get("APP_POLL", "2")),
    shutdown_grace=float(os.environ.get("APP_GRACE", "5")),
)
