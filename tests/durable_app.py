"""An app for the durable process test: ``trioq serve --app durable_app:config``.

One task, ``saga``: ``STEPS`` steps, each a `job.step_transaction` that writes its row of
``public.ledger`` (job, step, attempt) in the transaction that records the step, with a
short durable sleep in the middle and a wait for the signal ``go`` after it. A worker
SIGKILLed at any point (or a Postgres restart) leaves each step either recorded with its
row or not at all, so the ledger must hold every (job, step) exactly once.
"""

from __future__ import annotations

import os
from typing import Any

import trio

import trioq

STEPS = 5
tasks = trioq.Registry()


async def write(conn: Any, job_id: int, step: int, attempt: int, ms: int) -> int:
    await conn.execute("INSERT INTO public.ledger (job_id, step, attempt) VALUES (%s, %s, %s)",
                       (job_id, step, attempt))  # fmt: skip
    if ms:
        await trio.sleep(ms / 1000)  # inside the step's transaction: a kill here rolls it back
    return step


@tasks.task(queue="durable", max_attempts=100, retry=trioq.retry.Constant(seconds=0.05),
            keep_result=True)  # fmt: skip
async def saga(job: trioq.JobContext, ms: int) -> list[int]:
    done = []
    for step in range(STEPS):
        done.append(await job.step_transaction(f"step {step}", write, job.id, step,
                                               job.attempt, ms))  # fmt: skip
        if step == STEPS // 2:
            await job.sleep(0.2)
            done.append(await job.wait_for("go", timeout=600))
    return done


config = trioq.Config(
    registry=tasks,
    queues={"durable": trioq.QueueConfig(concurrency=int(os.environ.get("APP_CONCURRENCY", "8")))},
    lease=2.0,
    heartbeat_interval=0.5,
    sweep_interval=0.3,
    poll_interval=0.5,
    shutdown_grace=5.0,
)
