"""An app for the cron process tests: ``trioq serve --app cron_app:config``.

It declares no cron entries: the tests add them to the database (``trioq cron add``) while
the workers run. ``beat`` does nothing: the tests watch the rows (the ledger of
``tests/test_cron_processes.py``). The poll interval is long (``APP_POLL``, default 300 s),
so an entry added or removed reaches the schedulers by notification or not in time.
"""

from __future__ import annotations

import os

import trioq

tasks = trioq.Registry()


@tasks.task()
async def beat(job: trioq.JobContext) -> None:
    pass


config = trioq.Config(
    registry=tasks,
    queues={"default": trioq.QueueConfig(concurrency=2)},
    poll_interval=float(os.environ.get("APP_POLL", "300")),
    shutdown_grace=2.0,
)
