"""An app for the process tests: ``trioq serve --app serve_app:config`` (tests/ on the path).

Every run of a job is recorded in the table ``runs`` (created by the tests), so a
test can see which process ran which attempt. Settings come from the environment
so each test can pick its lease and grace.
"""

from __future__ import annotations

import os

import trio

import trioq

tasks = trioq.Registry()


@tasks.task(max_attempts=int(os.environ.get("APP_MAX_ATTEMPTS", "5")))
async def sleepy(job: trioq.JobContext, first_seconds: float, then_seconds: float = 0) -> None:
    """Sleeps ``first_seconds`` on its first attempt (to be killed), ``then_seconds`` after."""
    async with job.connection() as conn:
        await conn.execute(
            "INSERT INTO runs (job_id, attempt, pid) VALUES (%s, %s, %s)",
            (job.id, job.attempt, os.getpid()),
        )
    await trio.sleep(first_seconds if job.attempt == 1 else then_seconds)


config = trioq.Config(
    registry=tasks,
    queues={"default": trioq.QueueConfig(concurrency=int(os.environ.get("APP_CONCURRENCY", "20")))},
    lease=float(os.environ.get("APP_LEASE", "30")),
    heartbeat_interval=float(os.environ.get("APP_HEARTBEAT", "5")),
    sweep_interval=float(os.environ.get("APP_SWEEP", "5")),
    poll_interval=0.2,
    shutdown_grace=float(os.environ.get("APP_GRACE", "30")),
)
