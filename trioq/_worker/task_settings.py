"""What a claimed job left to its task, resolved by the worker that claimed it.

A job enqueued by name (`trioq.enqueue(conn, "name")`, `JobSpec`, a cron entry, a producer
without the registry) that did not choose ``max_attempts`` holds the default in its row and
says so (``max_attempts_unset``). The worker that claims it knows the task: before the
handlers run, it writes the task's ``max_attempts`` into those rows, fenced by the lease, so
the failure path and the sweeper (which has no registry) count the task's attempts, and the
dashboard shows them. A job already past the task's number (a deploy lowered it) gets the
attempt it is on as its last. Nothing is sent unless a claimed job's number differs from its
task's (``docs/tasks.md``, "Settings the task declares").
"""

from __future__ import annotations

import logging

import attrs

from .._db.driver import Driver
from .._flow import LimitedClaim
from .._job import Job
from .._pg.conn import Conn
from .._registry import Registry

__all__ = ["resolve_max_attempts"]

logger = logging.getLogger("trioq.runtime")


async def resolve_max_attempts(
    conn: Conn, driver: Driver, registry: Registry, *, owner: str, claim: LimitedClaim
) -> LimitedClaim:
    """``claim`` with each job's ``max_attempts`` its task's where its row left it to the
    task. Should the write fail, the jobs run with what their rows hold (and the next claim
    tries again): a fault of the database does not cost a claimed job its run."""
    differ: list[tuple[Job, int]] = []
    for job in claim.jobs:
        task = registry.get(job.task)
        if task is not None and job.max_attempts != (want := max(task.max_attempts,
                                                                  job.attempt)):  # fmt: skip
            differ.append((job, want))
    if not differ:
        return claim
    try:
        written = await driver.resolve_max_attempts(conn, owner=owner, jobs=differ)
    except Exception as ex:  # the database; Cancelled is not an Exception
        logger.warning("could not apply the tasks' max_attempts to %d claimed job(s), which "
                       "run with their rows' (%s)", len(differ), ex)  # fmt: skip
        return claim
    if not written:
        return claim
    jobs = [job.with_max_attempts(written[job.id]) if job.id in written else job
            for job in claim.jobs]  # fmt: skip
    return attrs.evolve(claim, jobs=jobs)
