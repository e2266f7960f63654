"""The app of ``tests/test_failover.py``: ``trioq serve --app failover_app:config``.

Each job writes one ledger row in its own transaction (``job.transaction()``): the row and
the job's completion commit together, so a job whose effect committed twice shows as two
rows.
"""

from __future__ import annotations

import trioq

tasks = trioq.Registry()


@tasks.task(max_attempts=3)
async def pay(job: trioq.JobContext, n: int) -> None:
    async with job.transaction() as tx:
        await tx.execute("INSERT INTO ledger (job_id, n) VALUES (%s, %s)", (job.id, n))


config = trioq.Config(
    registry=tasks,
    queues={"default": trioq.QueueConfig(concurrency=10)},
    poll_interval=0.5,
    shutdown_grace=5,
)
