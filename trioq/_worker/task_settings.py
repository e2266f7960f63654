"""What a claimed job left to its task, resolved by the worker that claimed it: its
``max_attempts`` and its ``cost``.

A job enqueued by name (`trioq.enqueue(conn, "name")`, `JobSpec`, a cron entry, a producer
without the registry) that did not choose ``max_attempts`` holds the default in its row and
says so (``max_attempts_unset``). The worker that claims it knows the task: before the
handlers run, it writes the task's ``max_attempts`` into those rows, fenced by the lease, so
the failure path and the sweeper (which has no registry) count the task's attempts, and the
dashboard shows them. A job already past the task's number (a deploy lowered it) gets the
attempt it is on as its last. Nothing is sent unless a claimed job's number differs from its
task's (``docs/tasks.md``, "Settings the task declares").

The cost (weighted slots, ``docs/flow-control.md``) works alike: a job enqueued without one
holds NULL, which the claims count as 1. Where its task costs more, the worker writes the
task's cost into the row before the handler runs, fenced. On a queue with a global limit
the same statement gives the job back (the claim counted 1 where it costs more): the next
claim counts its cost, so the running jobs never cost more than the limit. Nothing is sent
unless a claimed job's task costs more than 1.
"""

from __future__ import annotations

import logging

import attrs

from .._db.driver import Driver
from .._flow import LimitedClaim
from .._job import Job, Lease
from .._pg.conn import Conn
from .._registry import Registry

__all__ = ["CostResolved", "resolve_cost", "resolve_max_attempts"]

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


@attrs.frozen(kw_only=True)
class CostResolved:
    """A claim with its jobs' costs resolved: the jobs to run (each with its cost), those
    given back in the database (no outcome to write), and those to release because the
    write failed on a queue with a global limit (run there, they would exceed it)."""

    claim: LimitedClaim
    given_back: int = 0
    release: tuple[Lease, ...] = ()


async def resolve_cost(
    conn: Conn, driver: Driver, registry: Registry, *, owner: str, claim: LimitedClaim,
    global_limit: bool,
) -> CostResolved:  # fmt: skip
    """``claim`` with each job's cost its task's where its row left it to the task (None:
    counted 1 by the claim). With ``global_limit`` (the queue has one), such a job whose
    task costs more is given back in the same statement, for the next claim to count."""
    differ: list[tuple[Job, int, bool]] = []
    for job in claim.jobs:
        if job.cost is None and (task := registry.get(job.task)) is not None and task.cost != 1:
            differ.append((job, task.cost, global_limit))
    if not differ:
        return CostResolved(claim=claim)
    costs = {job.id: cost for job, cost, _ in differ}
    try:
        written = await driver.resolve_cost(conn, owner=owner, jobs=differ)
    except Exception as ex:  # the database; Cancelled is not an Exception
        if global_limit:
            logger.warning("could not write the tasks' cost of %d claimed job(s) of a queue "
                           "with a global limit: releasing them (%s)", len(differ), ex)  # fmt: skip
            jobs = [job for job in claim.jobs if job.id not in costs]
            release = tuple(Lease(job.id, job.attempt) for job, _, _ in differ)
            return CostResolved(claim=attrs.evolve(claim, jobs=jobs), release=release)
        logger.warning("could not write the tasks' cost of %d claimed job(s), which run with "
                       "it all the same (%s)", len(differ), ex)  # fmt: skip
        written = {}
    jobs = [job.with_cost(costs[job.id]) if job.id in costs else job
            for job in claim.jobs if not written.get(job.id, False)]  # fmt: skip
    back = sum(written.values())
    return CostResolved(claim=attrs.evolve(claim, jobs=jobs), given_back=back)
