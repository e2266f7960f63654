"""An app for the observability tests: ``trioq serve --app obs_app:config`` (tests/ on the path).

Tasks whose outcomes are known in advance (``ok`` completes, ``flaky`` fails its first
attempt, ``doomed`` dies), and ``sleeper`` on a queue of its own, to hold slots busy.
"""

from __future__ import annotations

import attrs
import trio

import trioq
from trioq.retry import Constant

tasks = trioq.Registry()


@tasks.task
async def ok(job: trioq.JobContext) -> None:
    pass


@tasks.task(max_attempts=3, retry=Constant(seconds=0))
async def flaky(job: trioq.JobContext) -> None:
    if job.attempt == 1:
        raise ValueError("the first attempt fails")


@tasks.task(max_attempts=1)
async def doomed(job: trioq.JobContext) -> None:
    raise ValueError("always")


@tasks.task(queue="slow")
async def sleeper(job: trioq.JobContext, seconds: float) -> None:
    await trio.sleep(seconds)


config = trioq.Config(
    registry=tasks,
    queues={"default": trioq.QueueConfig(concurrency=10), "slow": trioq.QueueConfig(concurrency=2)},
    poll_interval=0.2,
    metrics_depth_interval=0.2,
    shutdown_grace=1,
)

#: The same app with cron entries (``trioq cron list --app obs_app:with_cron``).
with_cron = attrs.evolve(
    config,
    cron=(
        trioq.CronEntry(name="nightly", schedule="0 3 * * *", task="ok"),
        trioq.CronEntry(name="hourly", schedule="@hourly", task="ok"),
    ),
)
