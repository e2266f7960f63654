"""Jobs that wait for others: inserting a graph of jobs, and reading a job's dependencies.

Every job with dependencies goes in through `insert_graph`, in one transaction (the
caller's, or one of its own in autocommit): ``enqueue(after=...)``, ``enqueue_many`` with
``JobSpec(after=...)``, ``enqueue_bulk(after=...)``, `trioq.Workflow` and `trioq.Batch`.

1. Existing dependencies (``after`` ids) are locked in id order (`_sql._DEPENDENCIES_LOCK`)
   until the commit, and flagged (``has_dependants``): one that ends meanwhile waits for
   the commit, and its ending then resolves the new edges. An id that does not exist is an
   `UnknownDependencyError` naming it, before anything is inserted.
2. The jobs' ids are reserved, the jobs inserted (``waiting`` with ``dependencies_left``
   when they have dependencies), then their edges.
3. Dependencies that had already ended (kept as done, cancelled, dead) are resolved at once
   by the same database function the triggers call on every later ending
   (``jobs_ended`` in ``migrations/0008_workflows.sql``), for the new jobs' edges only: a
   done one counts as done, a dead or cancelled one applies the job's policy.
4. One notification per queue that got a job it can run now, and ``@scheduled`` for one
   due later; jobs that become runnable later are notified by the ending that frees them.

What happens afterwards is all in the database: see the migration and
``docs/workflows.md``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Sequence
from typing import Any

import attrs
import psycopg
from psycopg.pq import TransactionStatus

from ._db.statements import SCHEDULED_PAYLOAD, Statements
from ._exceptions import UnknownDependencyError
from ._job import JobSpec, JSONValue, check_job_id
from ._obs.carrier import carrier

__all__ = [
    "OUTCOMES",
    "Dependency",
    "GraphJob",
    "insert_graph",
    "read_dependants",
    "read_dependencies",
]

Conn = psycopg.AsyncConnection[Any]

#: What became of a dependency: ``pending`` until it ends.
OUTCOMES = ("pending", "done", "dead", "cancelled", "deleted")
_ENDED = {"done": "done", "cancelled": "cancelled", "dead": "dead"}


@attrs.frozen(kw_only=True)
class GraphJob:
    """One job of a graph to insert: its spec (``spec.after``: existing jobs it waits for),
    the positions in the graph of the jobs it waits for, and its batch."""

    spec: JobSpec
    waits_for: tuple[int, ...] = ()
    batch_id: int | None = None


@attrs.frozen(kw_only=True)
class Dependency:
    """A job a job waits (or waited) for, and what became of it.

    ``outcome``: ``pending``, ``done``, ``dead``, ``cancelled`` or ``deleted`` (its row was
    deleted by hand before it ended). ``result``: its kept result when it is done and its
    task keeps results (``result_kept``); a done dependency whose task does not keep them
    has ``result_kept=False``. ``error``: a dead one's reason and last error, or a cancelled
    one's last error.
    """

    job_id: int
    task: str | None
    outcome: str
    result: JSONValue = None
    result_kept: bool = False
    error: str | None = None


async def insert_graph(
    conn: Conn, sql: Statements, jobs: Sequence[GraphJob], *, notify: bool
) -> list[int]:
    """Insert ``jobs`` and their edges; their ids, in order (see the module docs)."""
    own = conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE
    async with conn.transaction() if own else contextlib.nullcontext():
        ended = await _lock_existing(conn, sql, jobs, notify)
        cur = await conn.execute(sql.reserve_ids, {"jobs": f"{sql.schema}.jobs", "n": len(jobs)})
        row = await cur.fetchone()
        assert row is not None
        now, ids = row[0], list(row[1])
        run_ats = [job.spec.run_at or now + job.spec.delay for job in jobs]
        await conn.execute(sql.insert_graph, _rows(jobs, ids, run_ats))
        edges = [
            (ids[i], ids[j] if internal else j)
            for i, job in enumerate(jobs)
            for internal, deps in ((True, job.waits_for), (False, job.spec.after))
            for j in deps
        ]
        if edges:
            await conn.execute(sql.insert_edges, {"jobs": [e[0] for e in edges],
                                                  "depends_on": [e[1] for e in edges]})  # fmt: skip
        if ended:
            await _resolve_ended(conn, sql, ended, ids)
        if notify:
            payloads = sorted({
                job.spec.queue if run_at <= now else SCHEDULED_PAYLOAD
                for job, run_at in zip(jobs, run_ats, strict=True)
                if not job.waits_for and not job.spec.after
            })  # fmt: skip
            if payloads:
                await conn.execute(sql.notify, {"channel": sql.channel, "queues": payloads})
    return ids


async def _lock_existing(
    conn: Conn, sql: Statements, jobs: Sequence[GraphJob], notify: bool
) -> list[tuple[int, str, str | None, str | None]]:
    """Lock and flag the existing jobs the graph waits for; those that had ended already,
    as (id, outcome, task, detail). Raises `UnknownDependencyError` for ids that do not
    exist."""
    wanted = sorted({job_id for job in jobs for job_id in job.spec.after})
    if not wanted:
        return []
    cur = await conn.execute(sql.dependencies_lock, {"ids": wanted})
    rows = await cur.fetchall()
    unknown = tuple(r[0] for r in rows if r[1] == "unknown")
    if unknown:
        shown = ", ".join(map(str, unknown[:10])) + (", ..." if len(unknown) > 10 else "")
        raise UnknownDependencyError(
            f"after lists {'jobs' if len(unknown) > 1 else 'job'} {shown}, which "
            f"{'do' if len(unknown) > 1 else 'does'} not exist: never enqueued, completed "
            "without keep_result=True (its row is gone), or pruned; enqueue a dependant "
            "before its dependency can end (in one transaction, or a trioq.Workflow)",
            job_ids=unknown,
        )
    flag = [r[0] for r in rows if r[1] != "dead" and not r[5]]
    if flag:
        await conn.execute(sql.dependencies_flag,
                           {"ids": flag, "channel": sql.channel, "notify": notify})  # fmt: skip
    return [(r[0], _ENDED[r[1]], r[2], r[3]) for r in rows if r[1] in _ENDED]


async def _resolve_ended(
    conn: Conn, sql: Statements, ended: list[tuple[int, str, str | None, str | None]],
    ids: list[int],
) -> None:  # fmt: skip
    params = {
        "ids": [e[0] for e in ended],
        "outcomes": [e[1] for e in ended],
        "tasks": [e[2] for e in ended],
        "details": [e[3] for e in ended],
        "batches": [None] * len(ended),
        "channel": sql.channel,
        "only": ids,
    }
    await conn.execute(sql.resolve_ended, params)


def _rows(jobs: Sequence[GraphJob], ids: list[int], run_ats: list[dt.datetime]) -> dict[str, Any]:
    depended: set[int] = {j for job in jobs for j in job.waits_for}
    specs = [job.spec for job in jobs]
    return {
        "ids": ids,
        "queues": [s.queue for s in specs],
        "tasks": [s.task for s in specs],
        "args": [s.args_json for s in specs],
        "priorities": [s.priority for s in specs],
        "run_ats": run_ats,
        "max_attempts": [s.max_attempts for s in specs],
        "concurrency_keys": [s.concurrency_key for s in specs],
        "dependants": [i in depended for i in range(len(jobs))],
        "waits": [len(job.waits_for) + len(job.spec.after) for job in jobs],
        "policies": [s.on_dependency_failure for s in specs],
        "batches": [job.batch_id for job in jobs],
        "trace": carrier(),  # the enqueuing span's context, as every enqueue stores it
    }


async def read_dependencies(conn: Conn, sql: Statements, job_id: int) -> list[Dependency]:
    """The dependencies of job ``job_id``, by id (none for a job enqueued without any, or
    whose row is gone)."""
    check_job_id(job_id)
    cur = await conn.execute(sql.dependencies, {"id": job_id})
    found = []
    for dep, task, outcome, kept, result, error in await cur.fetchall():
        found.append(Dependency(job_id=dep, task=task, outcome=outcome,
                                result_kept=bool(kept), result=result, error=error))  # fmt: skip
    return found


async def read_dependants(conn: Conn, sql: Statements, job_id: int, *, limit: int) -> list[int]:
    """Up to ``limit`` ids of the jobs that wait (or waited) for job ``job_id``."""
    check_job_id(job_id)
    cur = await conn.execute(sql.dependants, {"id": job_id, "limit": limit})
    return [row[0] for row in await cur.fetchall()]
