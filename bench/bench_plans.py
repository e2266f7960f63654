"""The claim planned every time against planned once (not a test).

Postgres keeps a custom plan for trioq's claim: its ``LIMIT %(limit)s`` defeats the generic
plan's estimate (a tenth of the rows), so every execution of the prepared statement is
planned again. The worker's own pool sets ``plan_cache_mode = force_generic_plan`` on direct
connections (`trioq._db.statements.GENERIC_PLANS`). This script measures what that buys: two
connections to one database, one left to Postgres (``auto``) and one planning once
(``generic``), take turns claiming and completing the same queue, ``--claims`` claims each
per fill, for each batch size in ``--batches``; it prints each side's median claim round trip
(client wall time, the statement prepared after 5 executions as psycopg does), and how many
executions Postgres planned afresh (``pg_prepared_statements.custom_plans``).

Usage::

    python bench/bench_plans.py --dsn postgresql://postgres@127.0.0.1:55432/postgres
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import psycopg
import trio
from _common import Table, add_common_options, create_bench_db, drop_bench_db, write_json

import trioq
from trioq import Lease
from trioq._db.statements import rendered

DATABASE = "trioq_bench_plans"
QUEUE = "plans"
MODES = ("auto", "generic")


def measure(dsn: str, batch: int, claims: int, rounds: int) -> dict[str, Any]:
    """``rounds`` fills of ``batch * claims * 2`` jobs, claimed by both sides in turn."""
    claim = rendered("trioq", "claim")
    complete = rendered("trioq", "complete")
    conns = {mode: psycopg.connect(dsn, autocommit=True) for mode in MODES}
    try:
        conns["generic"].execute("SET plan_cache_mode = force_generic_plan")
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        params = {"queue": QUEUE, "limit": batch, "owner": "bench",
                  "lease": "60 seconds"}  # fmt: skip
        for _ in range(rounds):
            fill = conns["auto"]
            fill.execute("TRUNCATE trioq.jobs")
            fill.execute("INSERT INTO trioq.jobs (queue, task, args) SELECT %s, 't',"
                         " jsonb_build_object('n', g) FROM generate_series(1, %s) AS g",
                         (QUEUE, batch * claims * 2))  # fmt: skip
            fill.execute("VACUUM ANALYZE trioq.jobs")
            for i in range(claims * 2):
                mode = MODES[i % 2]
                conn = conns[mode]
                t0 = time.perf_counter()
                rows = conn.execute(claim, params).fetchall()
                times[mode].append(time.perf_counter() - t0)
                leases = [Lease(r[0], r[6]) for r in rows]
                conn.execute(complete, {"ids": [x.job_id for x in leases],
                                        "attempts": [x.attempt for x in leases],
                                        "owner": "bench"}).fetchall()  # fmt: skip
        planned = {}
        for mode, conn in conns.items():
            row = conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                               " WHERE statement LIKE '%%WITH proved AS (%%), c AS (%%'"
                               ).fetchone()  # fmt: skip
            planned[mode] = row
        return {
            "batch": batch,
            **{f"{mode}_ms": statistics.median(times[mode]) * 1000 for mode in MODES},
            **{f"{mode}_plans": planned[mode] for mode in MODES},
        }
    finally:
        for conn in conns.values():
            conn.close()


async def migrate(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)


def main(opts: argparse.Namespace) -> None:
    dsn = trio.run(create_bench_db, opts.dsn, DATABASE)
    rows = []
    try:
        trio.run(migrate, dsn)
        for rep in range(opts.repeat):
            for batch in opts.batches:
                row = measure(dsn, batch, opts.claims, 1)
                rows.append(row)
                print(f"[{rep + 1}/{opts.repeat}] batch {batch:3}: auto {row['auto_ms']:.3f} ms,"
                      f" generic {row['generic_ms']:.3f} ms (executions generic/custom:"
                      f" auto {row['auto_plans']}, generic {row['generic_plans']})",
                      flush=True)  # fmt: skip
    finally:
        trio.run(drop_bench_db, opts.dsn, DATABASE)
    table = Table([("batch", 5, ">"), ("auto ms", 8, ">"), ("generic ms", 10, ">"),
                   ("generic/auto", 12, ">")], markdown=opts.markdown)  # fmt: skip
    out = []
    for batch in opts.batches:
        mine = [r for r in rows if r["batch"] == batch]
        auto = statistics.median(r["auto_ms"] for r in mine)
        generic = statistics.median(r["generic_ms"] for r in mine)
        out.append([str(batch), f"{auto:.3f}", f"{generic:.3f}", f"{generic / auto:.2f}"])
    print("\nmedian claim round trip over repetitions:\n" + table.render(out))
    if opts.json:
        write_json(opts.json, {"options": vars(opts), "runs": rows})


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_options(p, creates=DATABASE, repeat=3, quiet_cores=0.3, quiet_wait=0,
                       pgbench=False)  # fmt: skip
    p.add_argument("--batches", type=int, nargs="+", default=[1, 10, 100])
    p.add_argument("--claims", type=int, default=100, help="claims of each side per fill")
    p.add_argument("--markdown", action="store_true", help="the table as markdown")
    return p.parse_args(argv)


if __name__ == "__main__":
    main(parse(sys.argv[1:]))
