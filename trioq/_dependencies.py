"""Jobs that wait for others: how a graph of jobs goes in, and a job's dependencies read.

Every job with dependencies goes in through `trioq._db.insert.graph`, in one transaction
(the caller's, or one of its own in autocommit): ``enqueue(after=...)``, ``enqueue_many`` with
``JobSpec(after=...)``, ``enqueue_bulk(after=...)``, `trioq.Workflow` and `trioq.Batch`.

1. Existing dependencies (``after`` ids) are locked in id order (``DEPENDENCIES_LOCK`` in
   ``trioq/_db/sql/workflows.py``) until the commit, and flagged (``has_dependants``): one
   that ends meanwhile waits for the commit, and its ending then resolves the new edges.
   An id that does not exist is an `UnknownDependencyError` naming it, before anything is
   inserted.
2. The jobs' ids are reserved, the jobs inserted (``waiting`` with ``dependencies_left``
   when they have dependencies), then their edges.
3. Dependencies that had already ended (kept as done, cancelled, dead) are resolved at once
   by the same database function the triggers call on every later ending
   (``jobs_ended`` in ``trioq/_db/migrations/0008_workflows.sql``), for the new jobs' edges only: a
   done one counts as done, a dead or cancelled one applies the job's policy.
4. One notification per queue that got a job it can run now, and ``@scheduled`` for one
   due later; jobs that become runnable later are notified by the ending that frees them.

What happens afterwards is all in the database: see the migration and
``docs/workflows.md``.
"""

from __future__ import annotations

import attrs

from ._db.statements import Statements
from ._job import JSONValue, check_job_id
from ._pg.conn import Conn

__all__ = ["OUTCOMES", "Dependency", "read_dependants", "read_dependencies"]


#: What became of a dependency: ``pending`` until it ends.
OUTCOMES = ("pending", "done", "dead", "cancelled", "deleted")


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
