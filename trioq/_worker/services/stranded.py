"""The stranded sweep: waiting jobs that can never be freed go to dead_jobs, saying why.

A job enqueued with dependencies waits (``state = 'waiting'``) until each has ended; the
ending of each resolves its edge in the same transaction, so trioq's own writes never strand
a job. A row written by hand can: an edge to a job that never existed (or is dead, or
ended without resolving the edge), a count of dependencies larger than its pending edges,
a count that is NULL or below 1 (the schema refuses those since migration 12, unless the
check was dropped), or a cycle (a waits for b, b for a). Such a job waited forever, shown
nowhere as a problem. Every ``Config.stranded_interval`` (default 60 s) one process at a
time (an advisory lock; the others skip the round) finds them (`STRANDED`, `STRANDED_EDGES`
and Tarjan's strongly connected components for the cycles), locks them, checks again under
the locks, and moves them to dead_jobs with reason ``stranded`` and a last_error that
says what was wrong; their dependants are resolved as for any dependency that died
(cancelled, or run anyway, by their policy). A round reads every waiting job once: 110,000
of them (100,000 waiting on live jobs, a chain of 10,000) took 0.33 s (docs/workflows.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import attrs

from ..._db.statements import Statements
from ..._pg.conn import Conn
from ..._pg.pool import Pool
from .loop import every

__all__ = ["EDGE_CAP", "STRANDED_BATCH", "Stranded", "StrandedRound", "cycles"]

logger = logging.getLogger("trioq.runtime")

#: Stranded jobs one round moves at most (the next round takes the rest).
STRANDED_BATCH = 1000
#: Edges between waiting jobs one round reads at most to look for cycles.
EDGE_CAP = 200_000


@attrs.frozen(kw_only=True)
class StrandedRound:
    """What one round did: the jobs it moved to dead_jobs, each with why; whether it had
    the turn (another process's round held it: nothing done)."""

    moved: dict[int, str] = attrs.field(factory=dict)
    turn: bool = True
    #: Sequences whose waiting jobs had no unfinished head, each advanced (migration 26).
    advanced: list[str] = attrs.field(factory=list)


class Stranded:
    def __init__(self, pool: Pool, sql: Statements, *, interval: float) -> None:
        self._pool = pool
        self._sql = sql
        self.interval = interval
        #: Jobs moved so far.
        self.moved = 0

    async def run(self) -> None:
        await every(self.interval, self.run_once, failed="the stranded sweep failed",
                    wait_first=True)  # fmt: skip

    async def run_once(self) -> StrandedRound:
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(self._sql.stranded_turn, {"space": self._space})
            if not (await cur.fetchone() or (False,))[0]:
                return StrandedRound(turn=False)
            cur = await conn.execute(self._sql.sequences_stuck,
                                     {"channel": self._sql.channel, "limit": STRANDED_BATCH})
            advanced = [row[0] for row in await cur.fetchall()]
            for key in advanced:
                logger.warning("sequence %r had waiting jobs and no unfinished head: its "
                               "earliest waiting job was freed", key)  # fmt: skip
            found = await self._find(conn, None)
            if not found:
                return StrandedRound(advanced=advanced)
            cur = await conn.execute(self._sql.stranded_lock, {"ids": sorted(found)})
            locked = [row[0] for row in await cur.fetchall()]
            # Checked again under the locks: what froze them is still there.
            found = await self._find(conn, locked) if locked else {}
            if found:
                ids = sorted(found)
                errors = [found[i] for i in ids]
                cur = await conn.execute(self._sql.stranded_move, {"ids": ids, "errors": errors})
                moved = {row[0]: row[3] for row in await cur.fetchall()}
            else:
                moved = {}
        for job_id, error in sorted(moved.items()):
            logger.warning("job %d moved to dead_jobs (stranded): %s", job_id, error)
        self.moved += len(moved)
        return StrandedRound(moved=moved, advanced=advanced)

    @property
    def _space(self) -> str:
        return f"trioq.stranded:{self._sql.schema}"

    async def _find(self, conn: Conn, ids: list[int] | None) -> dict[int, str]:
        """The stranded jobs (among ``ids``), each with why."""
        limit = STRANDED_BATCH if ids is None else len(ids)
        cur = await conn.execute(self._sql.stranded, {"ids": ids, "limit": limit})
        found: dict[int, str] = {row[0]: f"stranded: {row[1]}" for row in await cur.fetchall()}
        cur = await conn.execute(self._sql.stranded_edges, {"ids": ids, "limit": EDGE_CAP})
        edges = await cur.fetchall()
        if ids is None and len(edges) >= EDGE_CAP:
            logger.warning("more than %d edges between waiting jobs: the stranded sweep "
                           "looked for cycles among the first %d", EDGE_CAP, EDGE_CAP)  # fmt: skip
        for cycle in cycles(edges):
            shown = ", ".join(str(i) for i in cycle[:20]) + (", ..." if len(cycle) > 20 else "")
            for job_id in cycle:
                found.setdefault(job_id, f"stranded: it waits for itself, in a cycle of "
                                         f"dependencies among jobs {shown}")  # fmt: skip
        return found


def cycles(edges: Iterable[Sequence[int]]) -> list[list[int]]:
    """The strongly connected components with more than one job (or a job waiting for
    itself) of the graph of ``edges`` (job, dependency): every job in a cycle, each
    component's ids sorted. Tarjan's algorithm, iterative (a chain of 100,000 waiting jobs
    does not recurse)."""
    graph: dict[int, list[int]] = {}
    looped: set[int] = set()
    for job, dependency in edges:
        graph.setdefault(job, []).append(dependency)
        graph.setdefault(dependency, [])
        if job == dependency:
            looped.add(job)
    walk = _Tarjan(graph)
    for root in graph:
        if root not in walk.index:
            walk.visit(root)
    return [c for c in walk.components if len(c) > 1 or c[0] in looped]


class _Tarjan:
    def __init__(self, graph: dict[int, list[int]]) -> None:
        self.graph = graph
        self.index: dict[int, int] = {}
        self.low: dict[int, int] = {}
        self.stack: list[int] = []
        self.on_stack: set[int] = set()
        self.components: list[list[int]] = []

    def visit(self, root: int) -> None:
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                self.index[node] = self.low[node] = len(self.index)
                self.stack.append(node)
                self.on_stack.add(node)
            if i < len(self.graph[node]):
                work.append((node, i + 1))
                nxt = self.graph[node][i]
                if nxt not in self.index:
                    work.append((nxt, 0))
                elif nxt in self.on_stack:
                    self.low[node] = min(self.low[node], self.index[nxt])
                continue
            if self.low[node] == self.index[node]:
                self._pop(node)
            if work:  # back in the parent: its continuation is on top
                parent = work[-1][0]
                self.low[parent] = min(self.low[parent], self.low[node])

    def _pop(self, node: int) -> None:
        component = []
        while True:
            member = self.stack.pop()
            self.on_stack.discard(member)
            component.append(member)
            if member == node:
                break
        self.components.append(sorted(component))
