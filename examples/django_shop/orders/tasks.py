"""The shop's jobs, run by a trio worker: ``trioq serve --app orders.tasks:tasks``.

The worker does not import Django (its ORM is sync, and bound to a thread): the job
writes with SQL in ``job.transaction()``, so its write and its completion commit
together, exactly once.
"""

import trioq

tasks = trioq.Registry()


@tasks.task
async def send_receipt(job: trioq.JobContext, order_id: int) -> None:
    # A real shop would mail the receipt here; this one records which job sent it.
    async with job.transaction() as tx:
        await tx.execute("UPDATE orders SET receipt_job = %s WHERE id = %s", (job.id, order_id))
