"""The example app ``trioq demo`` runs: a few tasks that show the moving parts.

Serve it yourself with::

    trioq serve --app trioq.examples.hello:tasks
    trioq enqueue greet --args '{"name": "ada"}'
"""

from __future__ import annotations

import random

import trio

import trioq
from trioq.retry import Constant

tasks = trioq.Registry()


@tasks.task(queue="default")
async def greet(job: trioq.JobContext, name: str) -> str:
    """An async task: runs in the trio loop."""
    await trio.sleep(0.01)
    message = f"hello, {name} (job {job.id}, attempt {job.attempt})"
    print(f"  {message}")
    return message


@tasks.task(queue="default", retry=Constant(seconds=0.1), max_attempts=3)
async def flaky(job: trioq.JobContext, chance: float = 0.5) -> str:
    """Fails now and then: retried after 0.1 s, up to 3 attempts, then dead."""
    if job.attempt < 3 and random.random() < chance:
        print(f"  flaky job {job.id} fails on attempt {job.attempt} (will retry)")
        raise RuntimeError(f"unlucky on attempt {job.attempt}")
    print(f"  flaky job {job.id} succeeded on attempt {job.attempt}")
    return "ok"


@tasks.task(queue="default")
def crunch(job: trioq.JobContext, n: int) -> int:
    """A sync task: runs in a worker thread, so it may block."""
    total = sum(i * i for i in range(n))
    print(f"  crunch job {job.id}: sum of squares below {n} = {total}")
    return total
