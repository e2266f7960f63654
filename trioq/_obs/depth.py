"""Queue depths at a bounded cost: per queue and state, a count that is exact up to a cap.

`read_depths` runs the depth statements (``trioq/_db/sql/status.py``) on one connection. The
metrics' `DepthSampler` and ``trioq status`` (`Queue.status` with a ``cap``) both use it,
so the two always agree; each statement reads at most about ``cap`` index entries per
queue, whatever the size of the tables (docs/observability.md#queue-depth).
"""

from __future__ import annotations

from typing import Any

import attrs

from .._db.sql.status import MAX_DEPTH_QUEUES
from .._db.statements import Statements

__all__ = ["Depths", "read_depths"]


@attrs.frozen
class Depths:
    counts: dict[tuple[str, str], int]  # (queue, state) -> count, at most the cap
    head_wait: dict[str, float]  # queue -> how long its next job to be claimed has been due
    #: (queue, "waiting" for a signal | "sleeping") -> durable jobs parked, up to the cap
    parked: dict[tuple[str, str], int] = attrs.field(factory=dict)


async def read_depths(conn: Any, sql: Statements, cap: int) -> Depths:
    """The capped counts of every queue's available, scheduled, running, waiting and dead
    jobs (states without jobs are absent), and the wait of each queue's head job."""
    params = {"cap": cap, "max_queues": MAX_DEPTH_QUEUES}
    counts: dict[tuple[str, str], int] = {}
    heads: dict[str, float] = {}
    cur = await conn.execute(sql.depth_available, params)
    for queue, n, wait in await cur.fetchall():
        counts[queue, "available"] = int(n)
        if wait is not None:
            heads[queue] = max(0.0, float(wait))
    cur = await conn.execute(sql.depth_dead, params)
    counts.update(((queue, "dead"), int(n)) for queue, n in await cur.fetchall())
    cur = await conn.execute(sql.depth_scheduled_running, params)
    counts.update(((queue, state), int(n)) for state, queue, n in await cur.fetchall())
    cur = await conn.execute(sql.depth_waiting, {"cap": cap})
    counts.update(((queue, "waiting"), int(n)) for queue, n in await cur.fetchall())
    cur = await conn.execute(sql.depth_parked, {"cap": cap})
    parked = {(queue, "waiting" if signal else "sleeping"): int(n)
              for queue, signal, n in await cur.fetchall()}  # fmt: skip
    return Depths(counts=counts, head_wait=heads, parked=parked)
