"""The shop's jobs, run by the worker in the app's process (``app.py``), or by others:
``trioq serve --app quart_trio_shop.tasks:tasks``."""

import trioq

tasks = trioq.Registry()


@tasks.task
async def send_receipt(job: trioq.JobContext, order_id: int) -> None:
    # A real shop would mail the receipt here; this one records which job sent it, in the
    # job's transaction: the write and the job's completion commit together, exactly once.
    async with job.transaction() as tx:
        await tx.execute("UPDATE orders SET receipt_job = %s WHERE id = %s", (job.id, order_id))
