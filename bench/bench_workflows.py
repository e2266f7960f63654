"""What workflows cost a job outside any graph (not a test): the server's own time.

Migration ``workflows`` adds two row triggers on ``trioq.jobs`` whose ``WHEN`` clauses are
false for a job without dependencies, dependants or batch. This measures what those
clauses cost: the server execution time (``EXPLAIN ANALYZE``) of the statements a plain
job goes through, on ``--batch`` plain jobs, with the two triggers enabled and disabled
(what the jobs cost before the migration), interleaved ``--repeat`` times on a fresh
scratch database:

- ``claim`` (``UPDATE ... state = 'running'``: an update of every row, which evaluates the
  update trigger's ``WHEN``);
- ``complete`` (``DELETE``: evaluates the delete trigger's);
- ``complete, kept`` (``UPDATE`` to ``done``).

For comparison it also times the same completion of jobs that each have one waiting
dependant (``complete, with dependants``: the trigger fires and frees them). The table is
analyzed after the claim, so each completion is planned with the rows running (with the
statistics of the jobs still available the planner picks a nested loop over the table).

Usage::

    python bench/bench_workflows.py --dsn postgresql://postgres@/postgres?host=/tmp/pg
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
from collections.abc import Callable
from typing import Any

import psycopg
import trio
from _common import add_common_options, create_bench_db, drop_bench_db
from psycopg import sql

import trioq

DB = "trioq_bench_workflows"
LEASE = dt.timedelta(seconds=30)
TRIGGERS = ("jobs_ended_update", "jobs_ended_delete")
CELLS = ("claim", "complete", "complete, kept")


async def _set_triggers(conn: Any, on: bool) -> None:
    verb = "ENABLE" if on else "DISABLE"
    await conn.execute(
        "ALTER TABLE trioq.jobs " + ", ".join(f"{verb} TRIGGER {t}" for t in TRIGGERS)
    )


async def _explain(conn: Any, statement: sql.Composed, params: dict[str, Any]) -> float:
    cur = psycopg.AsyncClientCursor(conn)
    await cur.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + statement, params)
    row = await cur.fetchone()
    assert row is not None
    return float(row[0][0]["Execution Time"])


async def plain_ms(dsn: str, triggers: bool, batch: int) -> dict[str, float]:
    """Server ms of the claim, the completion and the kept completion of ``batch`` jobs."""
    q = trioq.Queue()
    took: dict[str, float] = {}
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await _set_triggers(conn, triggers)
        for cell, keep in (("complete", False), ("complete, kept", True)):
            await conn.execute("TRUNCATE trioq.jobs, trioq.job_dependencies")
            await trioq.enqueue_bulk(conn, "plain", [{}] * batch, queue="bench")
            await conn.execute("VACUUM ANALYZE trioq.jobs")
            params = {"queue": "bench", "owner": "w", "limit": batch, "lease": LEASE}
            took.setdefault("claim", await _explain(conn, q.sql.claim, params))
            await conn.execute("ANALYZE trioq.jobs")  # the completion's plan sees them running
            rows = await (await conn.execute("SELECT id, attempt FROM trioq.jobs")).fetchall()
            fence = {"ids": [r[0] for r in rows], "attempts": [r[1] for r in rows], "owner": "w"}
            if keep:
                fence["results"] = ["1"] * len(rows)
            took[cell] = await _explain(conn, q.sql.complete_keep if keep else q.sql.complete,
                                        fence)  # fmt: skip
        await _set_triggers(conn, True)
    return took


async def dependants_ms(dsn: str, batch: int) -> float:
    """Server ms of completing ``batch`` jobs that each have one waiting dependant."""
    q = trioq.Queue()
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await conn.execute("TRUNCATE trioq.jobs, trioq.job_dependencies")
        ids = await trioq.enqueue_bulk(conn, "plain", [{}] * batch, queue="bench")
        specs = [trioq.JobSpec(task="next", queue="after", after=(i,)) for i in ids]
        await trioq.enqueue_many(conn, specs)
        await conn.execute("VACUUM ANALYZE trioq.jobs")
        jobs = await q.claim(conn, "bench", owner="w", limit=batch, lease=LEASE)
        await conn.execute("ANALYZE trioq.jobs")
        fence = {"ids": [j.id for j in jobs], "attempts": [j.attempt for j in jobs], "owner": "w"}
        return await _explain(conn, q.sql.complete, fence)


def run(fn: Callable[..., Any], *args: Any) -> Any:
    return trio.run(fn, *args)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_common_options(p, creates=DB, repeat=9, quiet_cores=0.3, quiet_wait=0, pgbench=False)
    p.add_argument("--batch", type=int, default=1000)
    a = p.parse_args()
    dsn = run(create_bench_db, a.dsn, DB)
    try:
        took: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        with_deps: list[float] = []
        for _ in range(a.repeat):
            for triggers in (False, True):
                took[triggers].append(run(plain_ms, dsn, triggers, a.batch))
            with_deps.append(run(dependants_ms, dsn, a.batch))
        print(f"server execution ms for {a.batch:,} plain jobs, median of {a.repeat} "
              "(min-max), interleaved")  # fmt: skip
        print(f"  {'statement':<16} {'triggers off':>22} {'triggers on':>22} {'on/off':>7}")
        for cell in CELLS:
            off = [t[cell] for t in took[False]]
            on = [t[cell] for t in took[True]]
            print(f"  {cell:<16} {_fmt(off):>22} {_fmt(on):>22} "
                  f"{statistics.median(on) / statistics.median(off):>7.3f}")  # fmt: skip
        print(f"  {'complete, with dependants':<16} {_fmt(with_deps):>22}  (each frees one "
              "waiting job)")  # fmt: skip
    finally:
        run(drop_bench_db, a.dsn, DB)


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


if __name__ == "__main__":
    main()
