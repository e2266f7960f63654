"""Summarize a py-spy ``--format raw`` profile (collapsed stacks) of the trioq worker.

    python bench/peers/spy_summary.py /tmp/prof/trioq-c100-b0-r0.txt [--top 25]

Only samples inside ``trio.run`` count (start-up imports are left out). Prints: the share of
samples waiting in epoll (idle: the worker waits for Postgres), the share by module of the
leaf frame (where the CPU is), the inclusive share of every trioq function (time spent in it
or below it), and the top leaf functions. Recorded with ``--idle`` (as ``bench_peers.py
--py-spy`` does), shares are of wall time.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
IDLE_LEAVES = ("get_events", "select", "poll", "epoll")


def is_idle(func: str) -> bool:
    """A leaf frame that is the event loop blocking in epoll (py-spy ``--idle`` samples)."""
    return func.rsplit(".", 1)[-1] in IDLE_LEAVES


def parse(path: Path) -> list[tuple[list[tuple[str, str]], int]]:
    samples = []
    for raw in path.read_text().splitlines():
        stack_text, _, count = raw.rpartition(" ")
        if not stack_text or not count.isdigit():
            continue
        frames = []
        for part in stack_text.split(";"):
            m = FRAME.match(part)
            frames.append((m["func"], m["file"]) if m else (part, ""))
        samples.append((frames, int(count)))
    return samples


def module_of(file: str) -> str:
    file = file.rsplit("site-packages/", maxsplit=1)[-1]
    if "/trioq/" in f"/{file}" or file.startswith("trioq/"):
        return file[file.index("trioq/") :]
    for prefix in ("trio/_core", "trio", "psycopg_binary", "psycopg", "attr", "trioq_worker"):
        if file.startswith(prefix):
            return prefix
    return file.rsplit("/", 1)[-1] or "?"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("profile", type=Path)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    samples = [(f, n) for f, n in parse(a.profile) if any(fn == "run" and "trio/" in fl
                                                            for fn, fl in f)]  # fmt: skip
    total = sum(n for _, n in samples)
    if not total:
        raise SystemExit("no samples inside trio.run")
    idle = sum(n for f, n in samples if is_idle(f[-1][0]))
    print(f"{a.profile}: {total} samples in trio.run, {idle / total:.1%} idle (waiting in epoll)")

    by_module: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for frames, n in samples:
        func, file = frames[-1]
        if is_idle(func):
            continue
        by_module[module_of(file)] += n
        leaves[f"{func} ({module_of(file)})"] += n
        seen = {f"{fn} ({module_of(fl)})" for fn, fl in frames if "trioq/" in fl}
        for key in seen:
            inclusive[key] += n
    busy = total - idle
    print(f"\nCPU samples by module of the leaf frame ({busy} busy samples):")
    for name, n in by_module.most_common(a.top):
        print(f"  {n / total:6.1%} of wall  {n / busy:6.1%} of CPU  {name}")
    print("\ninclusive share of trioq functions (busy samples only):")
    for name, n in inclusive.most_common(a.top):
        print(f"  {n / total:6.1%} of wall  {n / busy:6.1%} of CPU  {name}")
    print("\ntop leaf functions:")
    for name, n in leaves.most_common(a.top):
        print(f"  {n / total:6.1%} of wall  {n / busy:6.1%} of CPU  {name}")


if __name__ == "__main__":
    main()
