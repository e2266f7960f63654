"""The claim of this checkout against an older one, interleaved (not a test): is a queue that
uses none of a release's new features claimed as fast as before it?

Runs ``bench/bench_flow.py --repeat 1 --json`` of each checkout in turn, ``--rounds`` times
(this one, then the baseline, then the baseline, then this one, ...: neither always goes
first), each on a fresh database of the same server, and prints each variant's median claim
and complete time for both and their ratio. The baseline is any other checkout of trioq (a
``git worktree add --detach DIR <commit>``); it runs with this interpreter and the
baseline's own package first on its path.

    python bench/bench_flow_baseline.py --baseline /work/wt-base \\
        --dsn postgresql://postgres@127.0.0.1:55432/postgres --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run(checkout: Path, dsn: str, jobs: int, extra: list[str]) -> dict[str, dict[str, float]]:
    """One repetition of ``checkout``'s bench_flow: each variant's claim and complete ms."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "flow.json"
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        subprocess.run(
            [sys.executable, str(checkout / "bench" / "bench_flow.py"), "--dsn", dsn,
             "--repeat", "1", "--quiet-wait", "0", "--contend", "0", "--jobs", str(jobs),
             "--json", str(out), *extra],
            check=True, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        report = json.loads(out.read_text())
    return {r["variant"]: {"claim": r["claim_ms"], "complete": r["complete_ms"]}
            for r in report["runs"]}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", type=Path, required=True, help="the older checkout")
    p.add_argument("--dsn", required=True, help="an admin DSN (the scripts create databases)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--jobs", type=int, default=5_000)
    p.add_argument("--this-args", default="",
                   help="more options for this checkout's bench_flow (e.g. '--plan-cache auto': "
                        "plans as Postgres chooses, as the baseline's claims run)")  # fmt: skip
    opts = p.parse_args()
    here = HERE.parent
    found: dict[str, list[dict[str, dict[str, float]]]] = {"this": [], "baseline": []}
    for i in range(opts.rounds):
        order = [("this", here), ("baseline", opts.baseline)]
        for name, checkout in order if i % 2 == 0 else order[::-1]:
            extra = opts.this_args.split() if name == "this" else []
            found[name].append(run(checkout, opts.dsn, opts.jobs, extra))
            plain = found[name][-1].get("plain", {}).get("claim", float("nan"))
            print(f"round {i + 1}: {name:8} plain claim {plain:.3f} ms", flush=True)
    variants = [v for v in found["this"][0] if v in found["baseline"][0]]
    print(f"\nmedians of {opts.rounds} rounds ({opts.jobs:,} jobs, batch 10), ms:")
    print(f"{'variant':14} {'claim':>8} {'baseline':>8} {'ratio':>6} {'complete':>8} "
          f"{'baseline':>8} {'ratio':>6}")  # fmt: skip
    for variant in variants:
        cells: list[Any] = [variant]
        for what in ("claim", "complete"):
            mine = statistics.median(r[variant][what] for r in found["this"])
            base = statistics.median(r[variant][what] for r in found["baseline"])
            cells += [mine, base, mine / base]
        print(f"{cells[0]:14} {cells[1]:8.3f} {cells[2]:8.3f} {cells[3]:6.3f} {cells[4]:8.3f} "
              f"{cells[5]:8.3f} {cells[6]:6.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
