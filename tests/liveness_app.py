"""An app for tests/test_liveness.py: ``trioq serve --app liveness_app:config``.

``effect`` sleeps ``first_seconds`` on its first attempt, then records that it woke (on its
own connection: unfenced, so a handler that runs on after its worker was taken for dead
shows) and writes its effect in ``job.transaction()`` (fenced by the lease). The heartbeat is
slow on purpose (20 s): only the liveness check can stop a handler sooner.
"""

from __future__ import annotations

import os

import trio

import trioq

tasks = trioq.Registry()


@tasks.task(max_attempts=5)
async def effect(job: trioq.JobContext, first_seconds: float) -> None:
    await trio.sleep(first_seconds if job.attempt == 1 else 0)
    async with job.connection() as conn:
        await conn.execute("INSERT INTO woke VALUES (%s, %s, %s)", (job.id, job.attempt,
                                                                    os.getpid()))  # fmt: skip
    async with job.transaction() as tx:
        await tx.execute("INSERT INTO effects VALUES (%s, %s, %s)", (job.id, job.attempt,
                                                                     os.getpid()))  # fmt: skip


config = trioq.Config(
    registry=tasks, lease=60, heartbeat_interval=20, poll_interval=0.2, sweep_interval=5,
)
