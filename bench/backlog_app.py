"""The no-op app `bench_backlog.py` serves: ``trioq serve --app backlog_app:tasks``.

One task, ``bench.noop``, that does nothing, on the queue ``backlog``; served with trioq's
defaults (a `Registry`, so ``--concurrency`` slots, default 10). bench/ must be on the path.
"""

from __future__ import annotations

import trioq

tasks = trioq.Registry()


@tasks.task(name="bench.noop", queue="backlog")
async def noop(job: trioq.JobContext, **args: object) -> None:
    """Nothing: the drain measures the queue and the runtime, not a handler."""
