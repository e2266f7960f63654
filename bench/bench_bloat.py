"""Bloat under sustained load, nobody tuning Postgres (not a test).

A real ``trioq serve --app backlog_app:tasks`` (``--processes``, ``--concurrency`` slots each;
a no-op task) drains jobs that a feeder enqueues at ``--rate`` per second (through
`Queue.enqueue_bulk`, every 50 ms) for ``--duration`` seconds. ``--pin-at`` seconds in, a
session opens a REPEATABLE READ transaction, reads one row and sits idle in it for
``--pin-for`` seconds: the xmin horizon is pinned, so neither vacuum nor page pruning can
remove any row version that died meanwhile. Every ``--sample`` seconds the run prints the
jobs table's dead and live tuples (the statistics), its heap and total size, the autovacuums
so far, the backlog (available jobs), the WAL written, and a probe's claim latency over the
window (the probe claims one job of the queue every 100 ms with the runtime's statement,
`Queue.claim`, and completes it: a claim that steps over dead index entries is slower).

Each of ``--variants`` runs in a fresh schema, one after another:

- ``autovacuum``: Postgres's defaults, and serve's vacuumer off (``--vacuum-interval off``):
  what trioq did before its vacuumer;
- ``tuned``: the jobs table's autovacuum storage parameters set as docs/scaling.md used to
  recommend (`TUNED`), the vacuumer off: what a table's parameters can do (not lower
  ``autovacuum_naptime``, a server setting);
- ``vacuumer``: Postgres's defaults and serve's defaults (the vacuumer on).

The summary per variant: jobs/s done, dead tuples (max before the pin, at the pin's end, and
how long after it they are back under ``--dead-bound``), claim p50/p99 before, during and
from 30 s after the pin, sizes at the end. A local server also gives the autovacuum workers'
activity (``pg_stat_progress_vacuum`` is sampled).

Usage::

    python bench/bench_bloat.py --dsn "$(trioq db url)" --json bloat.json
    python bench/bench_bloat.py --rate 5000 --duration 600 --pin-at 120 --pin-for 300
    python bench/bench_bloat.py --rate 500 --duration 40 --pin-at 10 --pin-for 10  # smoke
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from pathlib import Path
from typing import Any

import trio
from _common import (
    Table,
    default_dsn,
    drop_schema,
    fmt,
    fresh_schema,
    serve_process,
    show_settings,
    wait_workers,
    write_report,
)
from psycopg import sql

import trioq
from trioq import Lease, Queue

QUEUE = "backlog"
TASK = "bench.noop"
LEASE = dt.timedelta(seconds=60)
SCHEMA = "bench_bloat"
HERE = Path(__file__).resolve().parent
TRIOQ = (sys.executable, "-m", "trioq._cli")
TICK = 0.05  # the feeder's period
PROBE_EVERY = 0.1
#: The ``tuned`` variant's storage parameters of the jobs table.
TUNED = ("autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000, "
         "autovacuum_vacuum_cost_delay = 0")  # fmt: skip
#: Per variant: the serve flags, whether the table is tuned.
VARIANTS = {"autovacuum": (["--vacuum-interval", "off"], False),
            "tuned": (["--vacuum-interval", "off"], True),
            "vacuumer": ([], False)}  # fmt: skip
SERVER_SETTINGS = ("server_version", "fsync", "synchronous_commit", "shared_buffers",
                   "autovacuum_naptime", "autovacuum_vacuum_cost_delay",
                   "autovacuum_vacuum_cost_limit", "autovacuum_vacuum_scale_factor")  # fmt: skip

Conn = Any  # trioq.TrioConnection


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Run:
    """What one variant's tasks share: the probe's claims and the samples."""

    def __init__(self) -> None:
        self.claims: list[tuple[float, float]] = []  # (seconds into the run, claim seconds)
        self.samples: list[dict[str, Any]] = []
        self.sent = 0
        self.t0 = time.perf_counter()
        self.pinned: tuple[float, float] | None = None  # when the pin began and ended
        self.pin_open = False

    def now(self) -> float:
        return time.perf_counter() - self.t0


async def feeder(conn: Conn, q: Queue, run: Run, rate: float, duration: float) -> None:
    """``rate`` jobs/s, sent every `TICK` as what is due since the start."""
    while (elapsed := run.now()) < duration:
        due = int(elapsed * rate) - run.sent
        if due > 0:
            async with conn.transaction():
                await q.enqueue_bulk(conn, TASK, [{}] * due, queue=QUEUE)
            run.sent += due
        await trio.sleep(TICK)


async def probe(conn: Conn, q: Queue, run: Run) -> None:
    """Claim one job every `PROBE_EVERY` with the runtime's claim; complete it."""
    while True:
        t0 = time.perf_counter()
        jobs = await q.claim(conn, QUEUE, owner="bloat-probe", limit=1, lease=LEASE)
        run.claims.append((run.now(), time.perf_counter() - t0))
        if jobs:
            await q.complete_many(conn, owner="bloat-probe",
                                  leases=[Lease(j.id, j.attempt) for j in jobs])  # fmt: skip
        await trio.sleep(PROBE_EVERY)


async def pinner(dsn: str, run: Run, at: float, length: float) -> None:
    """Hold a snapshot (REPEATABLE READ, one read, idle in transaction) from ``at`` s in."""
    await trio.sleep(max(0.0, at - run.now()))
    async with await trioq.connect(dsn, autocommit=True) as conn, conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        await conn.execute("SELECT txid_current()")  # an xid too: pins like a writer would
        start = run.now()
        await trio.sleep(length)
        run.pinned = (start, run.now())


async def sampler(conn: Conn, schema: str, run: Run, every: float, quiet: bool) -> None:
    jobs = f"{schema}.jobs"
    stat = ("SELECT n_dead_tup, n_live_tup, autovacuum_count, vacuum_count,"
            " pg_relation_size(%(t)s::regclass), pg_total_relation_size(%(t)s::regclass),"
            " pg_current_wal_lsn(),"
            " (SELECT count(*) FROM pg_stat_progress_vacuum v WHERE v.relid = %(t)s::regclass)"
            " FROM pg_stat_user_tables WHERE relid = %(t)s::regclass")  # fmt: skip
    backlog = sql.SQL("SELECT count(*) FROM {} WHERE state = 'available'").format(
        sql.Identifier(schema, "jobs"))
    lsn0: int | None = None
    last = 0.0
    while True:
        cur = await conn.execute(stat, {"t": jobs})
        dead, live, autovac, vac, heap, total, lsn, vacuuming = await cur.fetchone()
        avail = (await (await conn.execute(backlog)).fetchone())[0]
        lsn_b = _lsn(str(lsn))
        lsn0 = lsn_b if lsn0 is None else lsn0
        t = run.now()
        window = [c for s, c in run.claims if last <= s < t]
        row = {"t": t, "dead": dead, "live": live, "autovacuums": autovac, "vacuums": vac,
               "vacuuming": vacuuming, "heap_mb": heap / 2**20, "total_mb": total / 2**20,
               "available": avail, "wal_mb": (lsn_b - lsn0) / 2**20, "sent": run.sent,
               "claim_p50_ms": _ms(pct(window, 0.5)), "claim_p99_ms": _ms(pct(window, 0.99)),
               "claim_max_ms": _ms(max(window) if window else None),
               "pinned": run.pin_open}  # fmt: skip
        run.samples.append(row)
        last = t
        if not quiet:
            print(f"  {t:6.0f}s dead {dead:>9,} live {live:>8,} heap {row['heap_mb']:7.1f} MB"
                  f" total {row['total_mb']:7.1f} MB av {autovac:>3} backlog {avail:>7,}"
                  f" claim p50 {fmt(row['claim_p50_ms'], '.1f'):>6} p99"
                  f" {fmt(row['claim_p99_ms'], '.1f'):>6} ms"
                  f"{' PIN' if row['pinned'] else ''}{' VAC' if vacuuming else ''}",
                  flush=True)  # fmt: skip
        await trio.sleep(every)


def _lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) + int(lo, 16)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


async def prepare(admin: Conn, variant: str) -> Queue:
    await fresh_schema(admin, SCHEMA)
    if VARIANTS[variant][1]:
        await admin.execute(sql.SQL("ALTER TABLE {} SET (" + TUNED + ")").format(
            sql.Identifier(SCHEMA, "jobs")))  # fmt: skip
    return Queue(schema=SCHEMA)


async def one_variant(dsn: str, variant: str, opts: argparse.Namespace) -> dict[str, Any]:
    async with await trioq.connect(dsn, autocommit=True) as admin:
        q = await prepare(admin, variant)
        cur = await admin.execute("SELECT reloptions FROM pg_class WHERE oid = %s::regclass",
                                  (f"{SCHEMA}.jobs",))  # fmt: skip
        reloptions = (await cur.fetchone() or [None])[0]
    print(f"{variant}: jobs reloptions {reloptions}", flush=True)
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    cmd = [*TRIOQ, "serve", "--app", "backlog_app:tasks", "--dsn", dsn, "--schema", SCHEMA,
           "--processes", str(opts.processes), "--concurrency", str(opts.concurrency),
           *VARIANTS[variant][0]]  # fmt: skip
    run = Run()
    async with (await trioq.connect(dsn, autocommit=True) as feed,
                await trioq.connect(dsn, autocommit=True) as probe_conn,
                await trioq.connect(dsn, autocommit=True) as stats,
                serve_process(cmd, env) as proc, trio.open_nursery() as nursery):  # fmt: skip
        with trio.fail_after(60):
            await wait_workers(stats, SCHEMA, opts.processes, [proc])
        run.t0 = time.perf_counter()

        async def pin() -> None:
            await trio.sleep(max(0.0, opts.pin_at - run.now()))
            run.pin_open = True
            try:
                await pinner(dsn, run, opts.pin_at, opts.pin_for)
            finally:
                run.pin_open = False

        nursery.start_soon(sampler, stats, SCHEMA, run, opts.sample, opts.quiet)
        nursery.start_soon(probe, probe_conn, q, run)
        if opts.pin_for > 0:
            nursery.start_soon(pin)
        await feeder(feed, q, run, opts.rate, opts.duration)
        done_at = run.now()
        nursery.cancel_scope.cancel()
    return summarise(variant, reloptions, run, done_at, opts)


def summarise(variant: str, reloptions: Any, run: Run, done_at: float,
              opts: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    pin_start, pin_end = run.pinned or (opts.pin_at, opts.pin_at)
    samples = run.samples
    before = [s for s in samples if s["t"] < pin_start]
    during = [s for s in samples if pin_start <= s["t"] <= pin_end]
    after = [s for s in samples if s["t"] > pin_end]
    back = next((s["t"] - pin_end for s in after if s["dead"] < opts.dead_bound), None)
    claims_before = [c for t, c in run.claims if t < pin_start]
    claims_during = [c for t, c in run.claims if pin_start <= t <= pin_end]
    claims_after = [c for t, c in run.claims if t > pin_end + 30]
    backlog_end = samples[-1]["available"] if samples else None
    done = run.sent - (backlog_end or 0)

    def claim(values: list[float]) -> dict[str, float | None]:
        top = max(values) if values else None
        return {"n": len(values), "p50_ms": _ms(pct(values, 0.5)),
                "p99_ms": _ms(pct(values, 0.99)), "max_ms": _ms(top)}  # fmt: skip

    return {
        "variant": variant,
        "reloptions": reloptions,
        "sent": run.sent,
        "jobs_s": done / done_at if done_at else None,
        "backlog_end": backlog_end,
        "pin": [pin_start, pin_end] if run.pinned else None,
        "dead_max_before_pin": max((s["dead"] for s in before), default=None),
        "dead_max_during_pin": max((s["dead"] for s in during), default=None),
        "dead_max_after_pin": max((s["dead"] for s in after), default=None),
        "dead_max_from_60s_after_pin": max(
            (s["dead"] for s in after if s["t"] > pin_end + 60), default=None),
        "dead_back_under_bound_s": back,
        "heap_mb_max": max((s["heap_mb"] for s in samples), default=None),
        "total_mb_max": max((s["total_mb"] for s in samples), default=None),
        "total_mb_end": samples[-1]["total_mb"] if samples else None,
        "autovacuums": samples[-1]["autovacuums"] if samples else None,
        "vacuums": samples[-1]["vacuums"] if samples else None,
        "wal_mb": samples[-1]["wal_mb"] if samples else None,
        "claim_before_pin": claim(claims_before),
        "claim_during_pin": claim(claims_during),
        "claim_from_30s_after_pin": claim(claims_after),
        "samples": samples,
    }


def report(results: list[dict[str, Any]], opts: argparse.Namespace) -> None:
    table = Table([("variant", 9, "<"), ("jobs/s", 7, ">"), ("dead max before pin", 19, ">"),
                   ("during pin", 10, ">"), ("from 60 s after", 15, ">"),
                   (f"< {opts.dead_bound:,} after", 13, ">"), ("claim p99 before", 16, ">"),
                   ("during", 7, ">"), ("30 s after", 10, ">"), ("MB max/end", 11, ">"),
                   ("autovacuums", 11, ">"), ("vacuums", 7, ">")], markdown=True)  # fmt: skip
    rows = [[r["variant"], fmt(r["jobs_s"]), fmt(r["dead_max_before_pin"]),
             fmt(r["dead_max_during_pin"]), fmt(r["dead_max_from_60s_after_pin"]),
             fmt(r["dead_back_under_bound_s"], ".0f") + " s",
             fmt(r["claim_before_pin"]["p99_ms"], ".1f"),
             fmt(r["claim_during_pin"]["p99_ms"], ".1f"),
             fmt(r["claim_from_30s_after_pin"]["p99_ms"], ".1f"),
             f"{fmt(r['total_mb_max'], '.0f')}/{fmt(r['total_mb_end'], '.0f')}",
             fmt(r["autovacuums"]), fmt(r["vacuums"])] for r in results]  # fmt: skip
    print(table.render(rows))


async def main(opts: argparse.Namespace) -> None:
    async with await trioq.connect(opts.dsn, autocommit=True) as conn:
        settings = await show_settings(conn, SERVER_SETTINGS)
    print(f"server: {settings}", flush=True)
    print(f"rate {opts.rate}/s for {opts.duration} s, pin at {opts.pin_at} s for {opts.pin_for} s,"
          f" {opts.processes} x {opts.concurrency} slots", flush=True)  # fmt: skip
    results = []
    for variant in opts.variants.split(","):
        if variant not in VARIANTS:
            raise SystemExit(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")
        print(f"--- {variant}", flush=True)
        results.append(await one_variant(opts.dsn, variant, opts))
    await drop_schema(opts.dsn, SCHEMA)
    report(results, opts)
    if opts.json:
        write_report(opts.json, opts, results, server=settings)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=default_dsn())
    parser.add_argument("--rate", type=float, default=5000.0, help="jobs/s (%(default)s)")
    parser.add_argument("--duration", type=float, default=600.0, help="s (%(default)s)")
    parser.add_argument("--pin-at", type=float, default=120.0, help="s (%(default)s)")
    parser.add_argument("--pin-for", type=float, default=300.0, help="s; 0: no pin (%(default)s)")
    parser.add_argument("--sample", type=float, default=5.0, help="s (%(default)s)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--dead-bound", type=int, default=50_000)
    parser.add_argument("--variants", default="autovacuum,vacuumer",
                        help=f"some of {', '.join(VARIANTS)} (%(default)s)")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


if __name__ == "__main__":
    trio.run(main, parse())
