"""An app for the workflow process test: ``trioq serve --app workflow_app:config``.

One task, ``node``, on the queue ``graph``: a node of the test's diamond lattice. It fails
its first attempt when ``flaky`` (a retry is not an ending: its dependants keep waiting),
sleeps ``ms``, then records that it ran in ``public.ran`` in the transaction that completes
it (`job.transaction()`), so a row there means the completion committed, exactly once.
"""

from __future__ import annotations

import os

import trio

import trioq

tasks = trioq.Registry()


@tasks.task(queue="graph", max_attempts=100, retry=trioq.retry.Constant(seconds=0.05))
async def node(job: trioq.JobContext, n: int, ms: int, flaky: bool) -> None:
    if flaky and job.attempt == 1:
        raise RuntimeError(f"node {n}: a first attempt that fails")
    if ms:
        await trio.sleep(ms / 1000)
    async with job.transaction() as conn:
        await conn.execute(
            "INSERT INTO public.ran (job_id, n, attempt, at)"
            " VALUES (%s, %s, %s, clock_timestamp())",
            (job.id, n, job.attempt),
        )


config = trioq.Config(
    registry=tasks,
    queues={"graph": trioq.QueueConfig(concurrency=int(os.environ.get("APP_CONCURRENCY", "8")))},
    lease=2.0,
    heartbeat_interval=0.5,
    sweep_interval=0.3,
    poll_interval=2.0,
    shutdown_grace=5.0,
)
