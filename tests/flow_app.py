"""An app for the flow-control process tests: ``trioq serve --app flow_app:config``.

Two queues: ``limited`` (concurrency limits) and ``rated`` (rate limits). Their limits are
set in the database by the tests, not here. A handler sleeps for its ``ms`` and records
when it started (the database's clock) in ``handler_starts`` if the table exists.
"""

from __future__ import annotations

import os

import trio

import trioq

tasks = trioq.Registry()
RECORD = os.environ.get("APP_RECORD_STARTS") == "1"


@tasks.task(queue="limited", max_attempts=100)
async def hold(job: trioq.JobContext, ms: int) -> None:
    await _record(job)
    await trio.sleep(ms / 1000)


@tasks.task(queue="rated", max_attempts=100)
async def call_api(job: trioq.JobContext, ms: int) -> None:
    await _record(job)
    await trio.sleep(ms / 1000)


async def _record(job: trioq.JobContext) -> None:
    if RECORD:
        async with job.connection() as conn:
            await conn.execute(
                "INSERT INTO handler_starts (job_id, at) VALUES (%s, clock_timestamp())",
                (job.id,),
            )


_CONCURRENCY = int(os.environ.get("APP_CONCURRENCY", "4"))

config = trioq.Config(
    registry=tasks,
    queues={
        "limited": trioq.QueueConfig(concurrency=_CONCURRENCY),
        "rated": trioq.QueueConfig(concurrency=_CONCURRENCY),
    },
    lease=float(os.environ.get("APP_LEASE", "2")),
    heartbeat_interval=float(os.environ.get("APP_HEARTBEAT", "0.5")),
    sweep_interval=float(os.environ.get("APP_SWEEP", "0.3")),
    poll_interval=float(os.environ.get("APP_POLL", "2")),
    shutdown_grace=float(os.environ.get("APP_GRACE", "5")),
)
