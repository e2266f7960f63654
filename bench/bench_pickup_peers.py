"""Idle pickup next to pgqueuer (not a test): how long a job enqueued into an idle worker
waits before its handler starts.

Each library runs in its own child process that holds both the worker and a producer on a
separate connection (trioq: ``peers/trioq_pickup.py``, ``trioq.serve`` with defaults and 10
slots, ``trioq.enqueue`` autocommit; pgqueuer: ``peers/pgqueuer_pickup.py``, one
``QueueManager`` with its defaults, ``Queries.enqueue``, under ``--pgqueuer-python``). The
producer waits ``--gap`` ms (randomized +-50 %, the same seeded sequence for both) so the
worker is idle, enqueues one job and waits until its handler has started: the latency is
the producer's clock just before the enqueue call to the handler's first line, so it
includes the enqueue's own round trip and commit. Each measurement gets a fresh database
``trioq_pickup_<label>`` (dropped after); repetitions interleave the libraries; the table
shows medians of each run's p50, p95 and p99 (and the worst max). ``floor``
(``peers/floor_pickup.py``): the same pickup with trioq's own insert and claim statements
through libpq's calls on trio and a LISTEN connection, no runtime: the insert sent to the
claim's answer; what trioq pays above it is its runtime and psycopg. The in-process latency
floor of `bench/bench_schedule.py` (trioq only, COMMIT sent -> handler start) splits it
further.

    python bench/bench_pickup_peers.py --dsn DSN --repeat 3 \\
        --pgqueuer-python /tmp/trioq-bench-peers/pgqueuer/bin/python
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio
from _common import (
    add_common_options,
    create_database,
    drop_bench_db,
    run_with_peer,
    show_settings,
    wait_quiet,
)

import trioq

HERE = Path(__file__).parent
QUANTILES = ("p50", "p95", "p99")


def _child(python: str, worker: str, dsn: str, jobs: int, gap: float) -> list[float]:
    done = subprocess.run(
        [python, str(HERE / "peers" / worker), "--dsn", dsn, "--jobs", str(jobs),
         "--gap", str(gap)],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{worker} failed:\n{done.stderr[-3000:]}")
    latencies: list[float] = json.loads(done.stdout.strip().splitlines()[-1])["latencies_ms"]
    if len(latencies) != jobs:
        raise RuntimeError(f"{worker}: {len(latencies)} latencies for {jobs} jobs")
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def summary(latencies: list[float]) -> dict[str, float]:
    return {"p50": percentile(latencies, 50), "p95": percentile(latencies, 95),
            "p99": percentile(latencies, 99), "max": max(latencies)}  # fmt: skip


async def _measure(args: argparse.Namespace, label: str, python: str, worker: str) -> Any:
    others = await wait_quiet(args.quiet_cores, args.quiet_wait)
    database = f"trioq_pickup_{label}"
    await drop_bench_db(args.dsn, database)
    dsn = await create_database(args.dsn, database)
    try:
        found = await trio.to_thread.run_sync(_child, python, worker, dsn, args.jobs, args.gap)
    finally:
        await drop_bench_db(args.dsn, database)
    return {**summary(found), "others": others}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    async with await trioq.connect(args.dsn, autocommit=True) as conn:
        settings = await show_settings(conn, ["server_version", "fsync", "synchronous_commit"])
    print(f"server settings: {settings}; {args.jobs} jobs per run, gap {args.gap} ms +-50 %")
    cells = {"trioq": (sys.executable, "trioq_pickup.py"),
             "floor": (sys.executable, "floor_pickup.py")}  # fmt: skip
    if args.pgqueuer_python:
        cells["pgqueuer"] = (args.pgqueuer_python, "pgqueuer_pickup.py")
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in cells}
    labels = list(cells)
    for rep in range(args.repeat):
        for label in labels[rep % len(labels):] + labels[: rep % len(labels)]:
            result = await _measure(args, label, *cells[label])
            runs[label].append(result)
            print(f"  run {rep + 1} {label:>9}: p50 {result['p50']:6.2f}  p95 {result['p95']:6.2f}"
                  f"  p99 {result['p99']:6.2f}  max {result['max']:7.2f} ms"
                  f"  (others {result['others']:.2f} cores)", flush=True)  # fmt: skip
    print(f"\nmedians of {args.repeat} runs (ms; max: the worst run's):")
    medians = {}
    for label, found in runs.items():
        medians[label] = {q: statistics.median([r[q] for r in found]) for q in QUANTILES}
        medians[label]["max"] = max(r["max"] for r in found)
        m = medians[label]
        print(f"  {label:>9}: p50 {m['p50']:6.2f}  p95 {m['p95']:6.2f}  p99 {m['p99']:6.2f}"
              f"  max {m['max']:7.2f}")  # fmt: skip
    return {"settings": settings, "runs": runs, "medians": medians}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(parser, creates="trioq_pickup_<label>", repeat=3, quiet_cores=0.3,
                       quiet_wait=30.0, pgbench=False)  # fmt: skip
    parser.add_argument("--jobs", type=int, default=300, help="jobs per run (%(default)s)")
    parser.add_argument("--gap", type=float, default=20.0, help="idle gap, ms (%(default)s)")
    parser.add_argument("--pgqueuer-python", default="/tmp/trioq-bench-peers/pgqueuer/bin/python")
    run_with_peer(main, parser.parse_args())
