"""What each kind of flow-control limit costs a claim (not a test).

One measurement per setting ("variant"), in a database ``trioq_bench_flow`` that the script
creates (dropping a leftover one) and drops at the end. Each fills ``--jobs`` jobs (a third
of them with one of 50 concurrency keys), then drains them on one connection: claim
``--batch`` jobs, complete them, again, until the queue is empty (claim and complete each
an autocommit transaction, no worker runtime). It reports the median time of a claim and of
a complete, and jobs/s. Variants, interleaved over ``--repeat`` repetitions:

* ``plain``: no settings: the plain claim (the fast path);
* ``global``: a global concurrency limit far above the batch (``claim_limited``: the queue
  row lock, the count of running jobs);
* ``global+keys``: plus a per-key concurrency limit above what a key ever runs here (the
  per-key scan and counts);
* ``global+rate``: a global limit plus a queue rate limit far above the drain's rate (the
  rate log: a row per claim, its window sum, pruning);
* ``everything``: global, rate, per-key concurrency and per-key rate.

And one variant per feature of issue 26 that touches a claim, each beside its "off" (``plain``
or ``global``), so that both the cost of the feature and the claim of a queue without it can
be read from one run (``bench/bench_flow_baseline.py`` compares the "off" cells with an older
checkout's):

* ``cost``: weighted slots on the plain claim, a third of the jobs costing 2 (the claim's
  window over the units taken); ``global+cost``: the same under a global limit (the running
  jobs' units summed);
* ``start_by``: every job carries a deadline to start, a day away (both claims check it and
  clear it);
* ``debounce``: every job carries a debounce key (the claim clears it: one more index
  entry to remove);
* ``pause-ended``: the queue's row says paused until an hour ago (the plain claim's
  ``NOT EXISTS`` finds the row and lets it through: a timed pause ends on the clock).

* ``fair``: fair share (``claim_limited``'s rotation over the 50 keys, the unkeyed jobs one
  group).

Aging does not change the claim (``--aging`` measures its round).

``--fair`` measures fair share's promise instead: a real worker (``trioq.serve`` in this
process, ``--fair-slots`` slots, no-op handlers) drains ``--fair-backlog`` jobs of tenant a
(100,000) while tenant b enqueues 10 jobs at once; it prints the wait of b's jobs (enqueued ->
handler started) with fair share on and off, interleaved over ``--repeat`` repetitions (off,
b waits for a's backlog: use a smaller ``--fair-backlog`` to keep that short).

``--contend N`` adds the same drain by N connections at once on ``global`` (each claim waits
for the queue's row lock): how many claims a second one controlled queue takes, serialized.

``--aging`` measures the aging round instead (the claim does not change with aging: same
statement, index and plan), on backlogs of ``--aging-backlogs`` jobs (default 10,000 and
100,000): a round with nothing to do (every waiting job in the best class: a queue that
uses no priorities), a round that finds jobs due but all at the best already, and rounds
that move a full batch (1,000 jobs a level, three levels), each the median of ``--repeat``
rounds, server time from ``EXPLAIN ANALYZE`` beside the client's.

Usage::

    python bench/bench_flow.py --dsn postgresql://postgres@127.0.0.1:55432/postgres --repeat 3
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from typing import Any

import trio
from _common import (
    Table,
    add_common_options,
    create_bench_db,
    drop_bench_db,
    fmt,
    scalar,
    wait_quiet,
    write_json,
)
from psycopg import sql

import trioq
import trioq._db.statements as statements_module
from trioq import Lease

DATABASE = "trioq_bench_flow"
QUEUE = "flow"
LEASE = dt.timedelta(seconds=60)
BIG = 1_000_000
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "global": {"global_concurrency": BIG},
    "global+keys": {"global_concurrency": BIG, "key_concurrency": BIG},
    "global+rate": {"global_concurrency": BIG, "rate_limit": f"{BIG}/1s"},
    "everything": {"global_concurrency": BIG, "rate_limit": f"{BIG}/1s",
                   "key_concurrency": BIG, "key_rate_limit": f"{BIG}/1s"},
    "cost": {},
    "global+cost": {"global_concurrency": BIG},
    "start_by": {},
    "debounce": {},
    "pause-ended": {},
    "fair": {"fair": True},
}  # fmt: skip
#: What a feature's variant writes into every job after the fill (SQL over the jobs of the
#: queue; ``n`` is the job's number in the fill, 1-based), or into the queue's row.
FEATURE_SQL: dict[str, str] = {
    "cost": "UPDATE trioq.jobs SET cost = 2 WHERE (args->>'n')::int % 3 = 1",
    "global+cost": "UPDATE trioq.jobs SET cost = 2 WHERE (args->>'n')::int % 3 = 1",
    "start_by": "UPDATE trioq.jobs SET start_by = now() + interval '1 day'",
    "debounce": "UPDATE trioq.jobs SET debounce_key = 'd' || id,"
                " debounce_deadline = now() + interval '1 day'",
    "pause-ended": "INSERT INTO trioq.queues (name, paused, paused_until)"
                   " VALUES ('flow', true, now() - interval '1 hour')",
}  # fmt: skip
Q = trioq.Queue()


async def fill(conn: Any, jobs: int, variant: str) -> None:
    await conn.execute("TRUNCATE trioq.jobs, trioq.queues, trioq.rate_starts")
    await conn.execute(
        "INSERT INTO trioq.jobs (queue, task, args, concurrency_key)"
        " SELECT %s, 't', jsonb_build_object('n', g),"
        "        CASE WHEN g %% 3 = 0 THEN 'k' || (g %% 50) END"
        "   FROM generate_series(1, %s) AS g",
        (QUEUE, jobs),
    )
    if VARIANTS[variant]:
        await Q.set_limits(conn, QUEUE, **VARIANTS[variant])
    if variant in FEATURE_SQL:
        await conn.execute(FEATURE_SQL[variant])
    await conn.execute("VACUUM ANALYZE trioq.jobs")
    await conn.execute("CHECKPOINT")


async def plan_as_the_worker(conn: Any, mode: str) -> None:
    """The session plans as the worker's own pool does (``worker``: generic plans, where this
    checkout's worker sets them), or as Postgres chooses (``auto``)."""
    setup = getattr(statements_module, "GENERIC_PLANS", None)
    if mode == "worker" and setup is not None:
        await conn.execute(setup)


async def drain_one(conn: Any, variant: str, batch: int) -> tuple[list[float], list[float]]:
    """Claim and complete until empty; the claim and complete times (seconds)."""
    claims: list[float] = []
    completes: list[float] = []
    limited = bool(VARIANTS[variant])
    while True:
        t0 = time.perf_counter()
        if limited:
            jobs = (await Q.claim_limited(conn, QUEUE, owner="b", limit=batch, lease=LEASE)).jobs
        else:  # a queue whose jobs have costs claims weighted, as a worker does
            jobs = await Q.claim(conn, QUEUE, owner="b", limit=batch, lease=LEASE,
                                 weighted=variant == "cost")  # fmt: skip
        t1 = time.perf_counter()
        if not jobs:
            return claims, completes
        await Q.complete_many(conn, owner="b", leases=[Lease(j.id, j.attempt) for j in jobs])
        claims.append(t1 - t0)
        completes.append(time.perf_counter() - t1)


async def measure(dsn: str, variant: str, opts: argparse.Namespace, workers: int) -> dict[str, Any]:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await fill(conn, opts.jobs, variant)
    others = await wait_quiet(opts.quiet_cores, opts.quiet_wait)
    results: list[tuple[list[float], list[float]]] = []

    async def worker() -> None:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            await plan_as_the_worker(conn, opts.plan_cache)
            results.append(await drain_one(conn, variant, opts.batch))

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(workers):
            nursery.start_soon(worker)
    elapsed = time.perf_counter() - t0
    claims = [c for r in results for c in r[0]]
    completes = [c for r in results for c in r[1]]
    return {
        "variant": variant,
        "workers": workers,
        "claims": len(claims),
        "claim_ms": statistics.median(claims) * 1000,
        "complete_ms": statistics.median(completes) * 1000,
        "claims_s": len(claims) / elapsed,
        "jobs_s": opts.jobs / elapsed,
        "others": others,
    }


async def _aging_fill(conn: Any, jobs: int, mixed: bool) -> None:
    """``jobs`` waiting jobs an hour old: all priority 0, or a tenth at priorities 3, 5, 7."""
    await conn.execute("TRUNCATE trioq.jobs, trioq.queues")
    await conn.execute(
        "INSERT INTO trioq.jobs (queue, task, args, priority, run_at)"
        " SELECT %s, 't', '{}', CASE WHEN %s AND g %% 10 = 0 THEN 3 + 2 * (g %% 3) ELSE 0 END,"
        "        now() - interval '1 hour' FROM generate_series(1, %s) AS g",
        (QUEUE, mixed, jobs),
    )
    await conn.execute("VACUUM ANALYZE trioq.jobs")


async def _aging_round(conn: Any) -> tuple[float, float, int]:
    """One round: client ms, server ms (EXPLAIN ANALYZE of the same statement on the same
    rows, first, rolled back), jobs moved."""
    params = {"queue": QUEUE, "default": trioq.DEFAULT_AGING, "limit": 1000, "lowest": -100,
              "highest": 100, "most": 200}  # fmt: skip
    async with conn.transaction(force_rollback=True):
        cur = await conn.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + Q.sql.age, params)
        row = await cur.fetchone()
    assert row is not None
    t0 = time.perf_counter()
    moved = await Q.age(conn, QUEUE)
    return (time.perf_counter() - t0) * 1000, float(row[0][0]["Execution Time"]), moved


async def aging(opts: argparse.Namespace) -> None:
    dsn = await create_bench_db(opts.dsn, DATABASE)
    columns = [("backlog", 9, ">"), ("round", 28, "<"), ("moved", 6, ">"),
               ("client ms", 9, ">"), ("server ms", 9, ">")]  # fmt: skip
    table = Table(columns, markdown=opts.markdown)
    out = []
    try:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            for backlog in opts.aging_backlogs:
                for label, mixed in (("nothing to do (one class)", False),
                                     ("moving 1,000 a level", True)):  # fmt: skip
                    samples = []
                    for _ in range(opts.repeat):
                        await _aging_fill(conn, backlog, mixed)
                        samples.append(await _aging_round(conn))
                    out.append([f"{backlog:,}", label, str(samples[0][2]),
                                fmt(statistics.median(s[0] for s in samples), ".2f"),
                                fmt(statistics.median(s[1] for s in samples), ".2f")])  # fmt: skip
                    print(out[-1], flush=True)
    finally:
        await drop_bench_db(opts.dsn, DATABASE)
    print("\naging rounds (medians):\n" + table.render(out))


FAIR_QUEUE = "tenants"


async def _fair_run(dsn: str, fair: bool, big: int, small: int, slots: int) -> dict[str, Any]:
    """One drain by a real worker (``trioq.serve`` in this process, ``slots`` slots, no-op
    handlers): ``big`` jobs of tenant a enqueued first, then ``small`` jobs of tenant b at
    once; the wait of each b job (enqueued -> its handler starts, wall clock), and how many
    of a's jobs started meanwhile. Stops once b's jobs have all started."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await conn.execute("TRUNCATE trioq.jobs, trioq.queues, trioq.rate_starts")
        await conn.execute(
            "INSERT INTO trioq.jobs (queue, task, args, concurrency_key)"
            " SELECT %s, 'work', jsonb_build_object('tenant', 'a', 'n', g), 'tenant=\"a\"'"
            "   FROM generate_series(1, %s) AS g", (FAIR_QUEUE, big))  # fmt: skip
        await conn.execute("VACUUM ANALYZE trioq.jobs")
        if fair:
            await Q.set_limits(conn, FAIR_QUEUE, fair=True)
    tasks = trioq.Registry()
    waits: list[float] = []
    started: list[int] = [0]
    all_started = trio.Event()

    @tasks.task(queue=FAIR_QUEUE, concurrency_key="tenant")
    async def work(job: trioq.JobContext, tenant: str, n: int) -> None:
        started[0] += 1
        if tenant == "b":
            waits.append(time.time() - job.enqueued_at.timestamp())
            if len(waits) == small:
                all_started.set()

    config = trioq.Config(dsn=dsn, registry=tasks,
                          queues={FAIR_QUEUE: trioq.QueueConfig(concurrency=slots)})  # fmt: skip
    async with trio.open_nursery() as nursery:
        runtime = await nursery.start(trioq.serve, config)
        async with await trioq.connect(dsn, autocommit=True) as conn:
            await trio.sleep(0.5)  # the worker is busy with a's backlog
            before = started[0]
            for n in range(small):
                await work.enqueue(conn, tenant="b", n=n)
            with trio.fail_after(600):
                await all_started.wait()
        runtime.stop(grace=False)
    waits.sort()
    return {"fair": fair, "p50_ms": waits[len(waits) // 2] * 1000,
            "p99_ms": waits[min(len(waits) - 1, int(len(waits) * 0.99))] * 1000,
            "max_ms": waits[-1] * 1000, "a_started_before_b": before,
            "a_started_in_between": started[0] - before - small}


async def fair_share(opts: argparse.Namespace) -> None:
    dsn = await create_bench_db(opts.dsn, DATABASE)
    runs = []
    try:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            await trioq.migrate(conn)
        for rep in range(opts.repeat):
            for fair in (True, False) if rep % 2 == 0 else (False, True):
                row = await _fair_run(dsn, fair, opts.fair_backlog, 10, opts.fair_slots)
                runs.append(row)
                print(f"[{rep + 1}/{opts.repeat}] fair={fair!s:5}: tenant b's 10 jobs waited "
                      f"p50 {row['p50_ms']:,.1f} ms, p99 {row['p99_ms']:,.1f} ms, max "
                      f"{row['max_ms']:,.1f} ms; tenant a started "
                      f"{row['a_started_in_between']:,} jobs meanwhile", flush=True)  # fmt: skip
    finally:
        await drop_bench_db(opts.dsn, DATABASE)
    table = Table([("fair", 5, "<"), ("p50 ms", 9, ">"), ("p99 ms", 9, ">"), ("max ms", 9, ">"),
                   ("a meanwhile", 11, ">")], markdown=opts.markdown)  # fmt: skip
    out = []
    for fair in (True, False):
        mine = [r for r in runs if r["fair"] is fair]
        out.append([str(fair)] + [fmt(statistics.median(r[k] for r in mine), ",.1f")
                                  for k in ("p50_ms", "p99_ms", "max_ms")]
                   + [fmt(statistics.median(r["a_started_in_between"] for r in mine))])
    print(f"\ntenant b (10 jobs) behind tenant a ({opts.fair_backlog:,} waiting), "
          f"{opts.fair_slots} slots, medians of {opts.repeat}:\n" + table.render(out))
    if opts.json:
        write_json(opts.json, {"options": vars(opts), "runs": runs})


async def main(opts: argparse.Namespace) -> None:
    if opts.aging:
        await aging(opts)
        return
    if opts.fair:
        await fair_share(opts)
        return
    dsn = await create_bench_db(opts.dsn, DATABASE)
    rows: list[dict[str, Any]] = []
    try:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            settings = {name: await scalar(conn, "SELECT current_setting(%s)", (name,))
                        for name in ("server_version", "fsync", "synchronous_commit")}  # fmt: skip
        print(f"PostgreSQL {settings['server_version']}, fsync={settings['fsync']}, "
              f"synchronous_commit={settings['synchronous_commit']}; {opts.jobs:,} jobs, "
              f"batch {opts.batch}, one connection, plans: {opts.plan_cache}")  # fmt: skip
        cells = [(v, 1) for v in VARIANTS] + ([("global", opts.contend)] if opts.contend else [])
        for rep in range(opts.repeat):
            shift = rep % len(cells)
            for variant, workers in cells[shift:] + cells[:shift]:
                row = await measure(dsn, variant, opts, workers)
                rows.append(row)
                print(
                    f"[{rep + 1}/{opts.repeat}] {variant:12} x{workers}: claim "
                    f"{row['claim_ms']:.3f} ms, complete {row['complete_ms']:.3f} ms, "
                    f"{row['jobs_s']:,.0f} jobs/s (others {row['others']:.2f})",
                    flush=True,
                )
    finally:
        await drop_bench_db(opts.dsn, DATABASE)
    table = Table([("variant", 14, "<"), ("conns", 5, ">"), ("claim ms", 9, ">"),
                   ("vs plain", 8, ">"), ("complete ms", 11, ">"), ("claims/s", 9, ">"),
                   ("jobs/s", 9, ">")], markdown=opts.markdown)  # fmt: skip
    out = []
    plain = statistics.median(r["claim_ms"] for r in rows if r["variant"] == "plain")
    for variant, workers in cells:
        mine = [r for r in rows if (r["variant"], r["workers"]) == (variant, workers)]
        claim = statistics.median(r["claim_ms"] for r in mine)
        out.append([variant, str(workers), fmt(claim, ".3f"), fmt(claim / plain, ".2f"),
                    fmt(statistics.median(r["complete_ms"] for r in mine), ".3f"),
                    fmt(statistics.median(r["claims_s"] for r in mine)),
                    fmt(statistics.median(r["jobs_s"] for r in mine))])  # fmt: skip
    print("\nmedians over repetitions:\n" + table.render(out))
    if opts.json:
        write_json(opts.json, {"settings": settings, "options": vars(opts), "runs": rows})


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_options(p, creates=DATABASE, repeat=3, quiet_cores=0.3, quiet_wait=30,
                       pgbench=False)  # fmt: skip
    p.add_argument("--jobs", type=int, default=5_000)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--contend", type=int, default=2, help="connections for the contended cell")
    p.add_argument("--markdown", action="store_true", help="the table as markdown")
    p.add_argument("--plan-cache", choices=("worker", "auto"), default="worker",
                   help="plan as the worker's own pool does (generic plans, where this "
                        "checkout sets them) or as Postgres chooses")  # fmt: skip
    p.add_argument("--aging", action="store_true", help="measure the aging round instead")
    p.add_argument("--aging-backlogs", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--fair", action="store_true",
                   help="measure fair share instead: a small tenant's wait behind a backlog")
    p.add_argument("--fair-backlog", type=int, default=100_000, help="tenant a's jobs")
    p.add_argument("--fair-slots", type=int, default=10, help="the worker's slots")
    return p.parse_args(argv)


if __name__ == "__main__":
    opts = parse(sys.argv[1:])
    trio.run(main, opts)
