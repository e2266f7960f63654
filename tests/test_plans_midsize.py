"""Query plans of the drain's statements on a table of a few tens of thousands of jobs,
with statistics taken while every job was available (what a worker meets at the start of a
drain): the claim and the fenced statements must find their rows through the primary key.

At this size (not at 1M, `tests/test_explain.py`), the claim's UPDATE joined with its CTE
and the fences joined with ``unnest`` were planned as a scan of the whole table: 5.1 ms
for a claim of 100 among 20,000 jobs, 3.1 ms for a complete (docs/benchmarks.md).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import trioq
from trioq import Queue
from trioq._db.statements import rendered, statements

JOBS = 20_000
BATCH = 100
OWNER = "w"
LEASE = dt.timedelta(seconds=30)
SQL = statements("trioq")


def _scans(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """(node type, relation) of every scan in a JSON plan."""
    found = []
    if "Relation Name" in plan:
        found.append((plan["Node Type"], plan["Relation Name"]))
    for child in plan.get("Plans", []):
        found.extend(_scans(child))
    return found


async def _explain(conn: Any, statement: Any, params: dict[str, Any]) -> list[tuple[str, str]]:
    cur = await conn.execute(b"EXPLAIN (FORMAT JSON) " + statement, params, prepare=False)
    row = await cur.fetchone()
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return _scans(plan[0]["Plan"])


async def _filled(conn: Any) -> None:
    """``JOBS`` available jobs with empty args (narrow rows: the whole table is a few
    hundred pages, so a sequential scan looks cheap to the planner), statistics taken now."""
    await conn.execute(
        "INSERT INTO trioq.jobs (queue, task, args) SELECT 'default', 't', '{}'"
        " FROM generate_series(1, %s)", (JOBS,),
    )  # fmt: skip
    await conn.execute("VACUUM ANALYZE trioq.jobs")


async def test_the_claim_and_the_fences_use_the_primary_key_on_a_midsize_table(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        await _filled(conn)
        claim = {"queue": "default", "owner": OWNER, "limit": BATCH, "lease": LEASE}
        scans = await _explain(conn, rendered("trioq", "claim"), claim)
        assert ("Seq Scan", "jobs") not in scans, scans
        jobs = await Queue().claim(conn, "default", owner=OWNER, limit=BATCH, lease=LEASE)
        fence = {
            "ids": [job.id for job in jobs],
            "attempts": [job.attempt for job in jobs],
            "owner": OWNER,
            "lease": LEASE,
        }
        for name in ("complete", "heartbeat", "cancel_running", "complete_in_transaction"):
            statement = getattr(SQL, name).as_bytes(None)
            scans = await _explain(conn, statement, fence)
            assert ("Seq Scan", "jobs") not in scans, (name, scans)
