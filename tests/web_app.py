"""An app for the dashboard's browser tests: ``trioq serve --app web_app:config``.

- ``quick``: sleeps ``seconds`` (queue ``web``);
- ``flaky``: fails (its only attempt: it dies, with a traceback) while the row of
  ``web_switch`` named by its args says so, else returns a result, which is kept, so its
  job page shows it done;
- ``sleeper``: sleeps for ``seconds`` (queue ``slow``), to be cancelled while it runs;
- ``stepper``: reports ``{"done": i, "of": steps}`` (``job.progress``) for i = 1, 2, ...,
  going on to the next step once ``web_switch`` has a row named ``<name>-<i>``, and keeps
  its result once all are done (queue ``slow``).

Timings are short so the tests see outcomes quickly: heartbeats every 0.3 s (a cancel
request reaches a running handler within that), history written every 0.5 s.
"""

from __future__ import annotations

import trio

import trioq

tasks = trioq.Registry()


@tasks.task(queue="web")
async def quick(job: trioq.JobContext, seconds: float = 0.05) -> None:
    await trio.sleep(seconds)


@tasks.task(queue="web", max_attempts=1, keep_result=True)
async def flaky(job: trioq.JobContext, name: str) -> dict[str, str]:
    async with job.connection() as conn:
        cur = await conn.execute("SELECT fail FROM web_switch WHERE name = %s", (name,))
        row = await cur.fetchone()
    if row is not None and row[0]:
        raise RuntimeError(f"switch {name!r} is on: failing on purpose")
    return {"ok": name}


@tasks.task(queue="slow")
async def sleeper(job: trioq.JobContext, seconds: float = 600) -> None:
    await trio.sleep(seconds)


@tasks.task(queue="slow", keep_result=True)
async def stepper(job: trioq.JobContext, name: str, steps: int) -> int:
    for i in range(1, steps + 1):
        await job.progress({"done": i, "of": steps})
        while True:  # the test says when to go on
            async with job.connection() as conn:
                cur = await conn.execute("SELECT 1 FROM web_switch WHERE name = %s",
                                         (f"{name}-{i}",))  # fmt: skip
                if await cur.fetchone() is not None:
                    break
            await trio.sleep(0.05)
    return steps


config = trioq.Config(
    registry=tasks,
    queues={"web": trioq.QueueConfig(concurrency=5), "slow": trioq.QueueConfig(concurrency=2)},
    lease=3.0,
    heartbeat_interval=0.3,
    poll_interval=0.2,
    sweep_interval=1.0,
    history_interval=0.5,
    progress_interval=0.2,
    shutdown_grace=1.0,
    # Shown on the cron page with its next tick; it never fires while a test runs.
    cron=[trioq.CronEntry(name="new-year", schedule="0 0 1 1 *", task="quick", queue="web")],
)
