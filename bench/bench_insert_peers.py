"""The one-row-insert workload next to pgqueuer (not a test): a backlog of ``--jobs`` jobs,
each writing one ledger row, drained by one worker process.

* trioq (``trioq_insert.py``): the row in ``job.transaction(shared=False)`` (a transaction of
  its own), which commits it with the job's completion (exactly once); ``trioq-shared``:
  ``job.transaction(shared=True)``; ``trioq-default``: ``job.transaction()``, as the docs
  write it first (group commit under ``serve``, ``Config.group_commit``);
  ``trioq-one``: ``job.complete_with(the INSERT)`` (the statement, the completion and
  ``COMMIT`` in one round trip); ``trioq-one-shared``: ``complete_with(..., shared=True)``
  (group commit). One worker, ``--concurrency`` slots, default pools and settings (app
  pool 10 connections, 2 shared lanes of at most 32 jobs).
* pgqueuer (``pgqueuer_insert.py``): the row on an asyncpg pool of 10 connections,
  autocommit; pgqueuer completes the job afterwards on its own connection (at least
  once). Batch sizes ``--pgqueuer-batches``, with ``max_concurrent_tasks`` = concurrency
  when the batch allows it (pgqueuer wants at least twice the batch), else unlimited.

Each measurement gets a fresh database ``trioq_insert_<label>`` (dropped after), and counts
the ledger rows afterwards (every job once). Repetitions rotate the order; the table shows
medians and every run is printed. Timing: first handler call to the last completion. Worker
CPU is the worker process's; server CPU (when Postgres is local) is its backends' and
helpers' over the same span (`_probe.server_cpu`).

    python bench/bench_insert_peers.py --dsn DSN --repeat 3 \\
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
    postmaster_pid,
    run_with_peer,
)

import trioq

HERE = Path(__file__).parent


def _child(python: str, argv: list[str], dsn: str, pg_pid: int) -> dict[str, Any]:
    done = subprocess.run(
        [python, *argv, "--dsn", dsn, "--pg-pid", str(pg_pid)], check=False,
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def _measure(
    admin: str, label: str, python: str, argv: list[str], pg_pid: int
) -> dict[str, Any]:
    database = "trioq_insert_" + label.replace("-", "_")
    await drop_bench_db(admin, database)
    dsn = await create_database(admin, database)
    try:
        return await trio.to_thread.run_sync(_child, python, argv, dsn, pg_pid)
    finally:
        await drop_bench_db(admin, database)


def _cells(args: argparse.Namespace) -> dict[str, tuple[str, list[str]]]:
    jobs, c = ["--jobs", str(args.jobs)], str(args.concurrency)
    trioq_worker = str(HERE / "peers" / "trioq_insert.py")
    cells = {
        "trioq": (sys.executable, [trioq_worker, *jobs, "--concurrency", c]),
        "trioq-shared": (sys.executable, [trioq_worker, *jobs, "--concurrency", c, "--shared"]),
        "trioq-default": (sys.executable, [trioq_worker, *jobs, "--concurrency", c, "--default"]),
        "trioq-one": (sys.executable, [trioq_worker, *jobs, "--concurrency", c, "--one"]),
        "trioq-one-shared": (
            sys.executable, [trioq_worker, *jobs, "--concurrency", c, "--one", "--shared"]
        ),
    }
    if args.pgqueuer_python:
        worker = str(HERE / "peers" / "pgqueuer_insert.py")
        for batch in args.pgqueuer_batches:
            limit = c if args.concurrency >= 2 * batch else "0"
            cells[f"pgqueuer-b{batch}"] = (
                args.pgqueuer_python,
                [worker, *jobs, "--batch", str(batch), "--concurrency", limit],
            )
    return cells


def _per_job(result: dict[str, Any], key: str) -> str:
    """``result[key]`` (CPU seconds) per job in µs, or ``-`` when not measured."""
    value = result.get(key)
    return "    -" if value is None else f"{value / result['jobs'] * 1e6:5.0f} us"


async def main(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    cells = _cells(args)
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in cells}
    labels = list(cells)
    async with await trioq.connect(args.dsn, autocommit=True) as conn:
        pg_pid = await postmaster_pid(conn)  # 0: not local, no server CPU
    for rep in range(args.repeat):
        for label in labels[rep % len(labels) :] + labels[: rep % len(labels)]:
            python, argv = cells[label]
            result = await _measure(args.dsn, label, python, argv, pg_pid)
            runs[label].append(result)
            ok = result["rows"] == result["distinct"] == result["jobs"]
            print(f"  run {rep + 1} {label:>16}: {result['jobs'] / result['wall']:8,.0f} jobs/s"
                  f"  worker CPU/job {result['cpu'] / result['jobs'] * 1e6:5.0f} us"
                  f"  server {_per_job(result, 'server_cpu')}"
                  f"  ledger {'ok' if ok else 'WRONG: ' + str(result)}", flush=True)  # fmt: skip
    print(f"\nmedians of {args.repeat}, {args.jobs} jobs, concurrency {args.concurrency}:")
    for label, found in runs.items():
        rate = statistics.median(r["jobs"] / r["wall"] for r in found)
        cpu = statistics.median(r["cpu"] / r["jobs"] * 1e6 for r in found)
        server = [r["server_cpu"] / r["jobs"] * 1e6 for r in found if r.get("server_cpu")]
        shown = f"{statistics.median(server):.0f} us" if server else "-"
        print(f"  {label:>16}: {rate:8,.0f} jobs/s   worker CPU/job {cpu:.0f} us"
              f"   server CPU/job {shown}")
    return runs


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(parser, creates="trioq_insert_<label>", repeat=3, quiet_cores=0.3,
                       quiet_wait=0.0, pgbench=False)  # fmt: skip
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--pgqueuer-batches", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--pgqueuer-python", default="/tmp/trioq-bench-peers/pgqueuer/bin/python")
    run_with_peer(main, parser.parse_args())
