"""The drain direct and through a transaction-mode PgBouncer (docs/pooling.md).

    python bench/bench_pooler.py --dsn postgresql://app@db/app \\
        --pooler-dsn postgresql://app@pgbouncer:6432/app [--jobs 10000] [--repeat 2]

Runs ``trioq stress`` (burn-down, 2 worker processes) alternately direct and with the
workers' pools through the pooler (their LISTEN and liveness lock stay direct), and prints
each run's drain rate and its verification. It starts no PgBouncer: give it one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any


def _stress(dsn: str, pooler: str | None, jobs: int, processes: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "trioq._cli", "stress", "--dsn", dsn, "--jobs", str(jobs),
            "--processes", str(processes), "--quiet", "--json", "-"]  # fmt: skip
    if pooler is not None:
        argv += ["--pooler-dsn", pooler]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"trioq stress failed ({done.returncode}):\n{done.stderr}{done.stdout}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True, help="Postgres itself")
    parser.add_argument("--pooler-dsn", required=True, help="PgBouncer (transaction mode)")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    print(f"{'path':<8} {'jobs/s':>8} {'lost':>5} {'dups':>5}  fsync")
    for _ in range(args.repeat):
        for label, pooler in (("direct", None), ("pooler", args.pooler_dsn)):
            report = _stress(args.dsn, pooler, args.jobs, args.processes)
            v, rate = report["verification"], report["drain"]["rate"]
            dups, fsync = v["duplicate_completions"], report["database"]["fsync"]
            print(f"{label:<8} {rate:>8,.0f} {v['lost']:>5} {dups:>5}  {fsync}", flush=True)


if __name__ == "__main__":
    main()
