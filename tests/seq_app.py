"""An app for the sequences process test: ``trioq serve --app seq_app:config``.

One queue, ``seq``, of ``APP_CONCURRENCY`` slots. ``step`` records each run in ``seq_runs``
(its job, attempt, worker, start and end on the database's clock), sleeps its ``ms`` and, when
``fail``, fails its first attempt (retried 50 ms later).
"""

from __future__ import annotations

import os

import trio

import trioq

tasks = trioq.Registry()
WORKER = os.environ.get("PGAPPNAME", "?")


@tasks.task(queue="seq", max_attempts=5, retry=trioq.retry.Constant(seconds=0.05))
async def step(job: trioq.JobContext, key: str, n: int, ms: int, fail: bool) -> None:
    async with job.connection() as conn:
        await conn.execute(
            "INSERT INTO seq_runs (job_id, attempt, worker, started)"
            " VALUES (%s, %s, %s, clock_timestamp())", (job.id, job.attempt, WORKER))  # fmt: skip
    try:
        await trio.sleep(ms / 1000)
        if fail and job.attempt == 1:
            raise RuntimeError("the first attempt fails")
    finally:
        with trio.CancelScope(shield=True):
            async with job.connection() as conn:
                await conn.execute(
                    "UPDATE seq_runs SET ended = clock_timestamp()"
                    " WHERE job_id = %s AND attempt = %s", (job.id, job.attempt))  # fmt: skip


config = trioq.Config(
    registry=tasks,
    queues={"seq": trioq.QueueConfig(concurrency=int(os.environ.get("APP_CONCURRENCY", "4")))},
    lease=2.0,
    heartbeat_interval=0.5,
    sweep_interval=0.3,
    poll_interval=0.5,
    shutdown_grace=5.0,
)
