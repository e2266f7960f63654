"""Every query the dashboard runs has a bounded cost on a big table: no sequential scan of
``jobs`` or ``dead_jobs``, with every filter combination the pages send.

The database is filled by `bigtable.fill` (about 900,000 jobs in 20 queues plus 300,000
dead jobs, a week of history, cron ticks). Each statement the dashboard's pages and
actions run (`trioq._db.statements.Statements`) is explained the way the dashboard runs it:
bound server side on a connection that never prepares (``prepare_threshold=None``), so
the planner sees the values. The test fails if a statement of the dashboard is not covered here.
"""

from __future__ import annotations

import ast
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from bigtable import Sizes, fill
from psycopg import sql

import trioq
import trioq.web
from trioq._db.statements import names, statements
from trioq.web._limits import COUNT_CAP, LEASE_CAP, MAX_QUEUES, WINDOW
from trioq.web._queries import overview

pytestmark = pytest.mark.slow

SIZES = Sizes()
ST = statements("trioq")
LIB = ST  # the library statements the actions reuse: the same set
FIRST_DEAD = SIZES.jobs + 1

_NO_FILTER = {"queue": None, "task": None, "contains": None, "text": None}
FILTERS: dict[str, dict[str, Any]] = {
    "none": _NO_FILTER,
    "queue": {**_NO_FILTER, "queue": "queue_3"},
    "task": {**_NO_FILTER, "task": "task_5"},
    "json": {**_NO_FILTER, "contains": '{"user_id": 4242}'},
    "text": {**_NO_FILTER, "text": "user42@"},
    "all": {"queue": "queue_3", "task": "task_5", "contains": '{"user_id": 4242}', "text": "42"},
}
PAGE = {"window": WINDOW, "limit": 51, "offset": 0}
CAPS = {"cap": COUNT_CAP, "max_queues": MAX_QUEUES, "lease_cap": LEASE_CAP}
DEAD_FILTERS = [(None, None), ("queue_3", None), (None, "task_5"), ("queue_3", "task_5")]


def cases() -> Iterator[tuple[str, sql.Composed, Mapping[str, Any]]]:
    """(name, statement, params): every statement the dashboard runs, every shape of call."""
    yield "depth_available", ST.depth_available, CAPS
    yield "depth_dead", ST.depth_dead, CAPS
    yield "queues_scheduled", ST.queues_scheduled, CAPS
    yield "lease_rows", ST.lease_rows, CAPS
    now = int(time.time())
    for seconds in (3600, 86400):  # the overview's two ranges
        yield f"history_minutes {seconds}", ST.history_minutes, {"since": now - seconds,
                                                                "queue": None}
        yield f"history_minutes {seconds}", ST.history_minutes, {"since": now - seconds,
                                                                "queue": "queue_3"}
    yield "history_queues", ST.history_queues, {"since": now - 86400}
    yield "clock_epoch", ST.clock_epoch, {}
    yield "worker_rows", ST.worker_rows, {"worker_cap": 1000}
    for state, statement in ST.job_lists.items():
        for name, filters in FILTERS.items():
            yield f"job_lists[{state}] {name}", statement, {**filters, **PAGE}
    yield "job", ST.job, {"id": 42, "load": 1024 * 1024}
    yield "dead_job", ST.dead_job, {"id": FIRST_DEAD + 42}
    yield "job_progress", ST.job_progress, {"id": 42, "load": 1024 * 1024}
    yield "job_progress dead", ST.job_progress, {"id": FIRST_DEAD + 42, "load": 1024 * 1024}
    for queue, task in DEAD_FILTERS:
        where = {"queue": queue, "task": task}
        yield f"dead_ids {queue} {task}", ST.dead_ids, {**where, "after": 0, "batch": 1000}
        yield f"dead_ids {queue} {task} later", ST.dead_ids, {
            **where, "after": FIRST_DEAD + 150_000, "batch": 1000}  # fmt: skip
        yield f"dead_count {queue} {task}", ST.dead_count, {**where, "cap": COUNT_CAP}
    ids = list(range(FIRST_DEAD, FIRST_DEAD + 1000))
    yield "dead_count_ids", ST.dead_count_ids, {"ids": ids}
    yield "cron_last", ST.cron_last, {}
    yield "Queue.cron_entries", LIB.cron_entries, {"limit": 1000}
    # What the actions run through trioq.Queue: by ids only (batches of ids, or one job).
    by_ids = {"ids": ids, "queue": None, "task": None}
    yield "Queue.dead_retry", LIB.dead_retry, by_ids
    yield "Queue.dead_purge", LIB.dead_purge, {**by_ids, "before": None, "older_than": None}
    yield "Queue.cancel", LIB.cancel, {"id": 42, "channel": LIB.channel}
    yield "Queue.clock", LIB.clock, {}
    yield "Queue.queue_settings", LIB.queue_settings, {"names": None}
    yield "Queue.queue_settings one", LIB.queue_settings, {"names": ["queue_3"]}
    yield "paused_settings", ST.paused_settings, {"limit": 200}
    yield "Queue.steps", LIB.job_steps, {"id": 42}
    yield "Queue.signal", LIB.signal_job, {"id": 42, "key": None, "name": "approval",
                                           "payload": "{}", "channel": LIB.channel}


def _nodes(plan: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def _render(plan: Mapping[str, Any], depth: int = 0) -> Iterator[str]:
    parts = [plan["Node Type"], plan.get("Index Name", ""), plan.get("Relation Name", "")]
    extra = f"rows={plan.get('Actual Rows', plan.get('Plan Rows'))}"
    if "Shared Hit Blocks" in plan:
        extra += f" buffers={plan['Shared Hit Blocks'] + plan['Shared Read Blocks']}"
    yield "  " * depth + "-> " + " ".join(p for p in parts if p) + f" ({extra})"
    for child in plan.get("Plans", ()):
        yield from _render(child, depth + 1)


def dashboard_statements() -> set[str]:
    """The statements the dashboard's code reads (``st.name``, ``queue.name``: every attribute
    of the package's source named like a statement of `Statements`)."""
    known = {*names(), "job_lists"}  # job_lists: the list_<state> statements, by state
    read = set()
    for path in Path(trioq.web.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in known:
                read.add(node.attr)
    return read


def test_every_dashboard_statement_is_covered() -> None:
    covered = {name.split(" ")[0].split("[")[0].removeprefix("Queue.") for name, _, _ in cases()}
    used = dashboard_statements()
    assert {"job_lists", "dead_count", "depth_available", "cancel"} <= used  # the walk sees them
    assert used <= covered, f"statements without a plan test: {sorted(used - covered)}"
    listed = {name.split(" ")[0] for name, _, _ in cases() if name.startswith("job_lists[")}
    assert listed == {f"job_lists[{state}]" for state in ST.job_lists}


async def test_no_sequential_scan_of_jobs_or_dead_jobs(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
    timings = await fill(dsn, SIZES)
    print("\nfill (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    problems = []
    async with await trioq.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        for name, statement, params in cases():
            explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + statement
            await conn.execute("BEGIN")  # the actions' statements write: roll them back
            try:
                cur = await conn.execute(explain, params)
                row = await cur.fetchone()
            finally:
                await conn.execute("ROLLBACK")
            assert row is not None
            plan, ms = row[0][0]["Plan"], row[0][0]["Execution Time"]
            print(f"\n{name}: {ms:.1f} ms\n" + "\n".join(_render(plan)))
            scans = [
                n["Relation Name"] for n in _nodes(plan)
                if n["Node Type"] == "Seq Scan" and n.get("Relation Name") in ("jobs", "dead_jobs")
            ]  # fmt: skip
            if scans:
                problems.append(f"{name}: sequential scan of {scans}")
        assert not problems, "\n".join(problems)
        # The overview on this table: the big counts are capped, not counted.
        seen = await overview(conn, ST, now=time.time())
        assert len(seen.queues) == SIZES.queues
        assert all(q.available.capped and str(q.available) == "1,000+" for q in seen.queues)
        assert all(q.dead.capped for q in seen.queues)
        assert sum(q.running.n for q in seen.queues) == SIZES.running
        assert len(seen.workers) == SIZES.workers
        assert sum(w.stale for w in seen.workers) == SIZES.workers // 2
