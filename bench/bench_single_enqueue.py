"""Single enqueue per connection: ``await trioq.enqueue(conn, ...)`` one job at a time on an
autocommit connection, next to pgqueuer's ``Queries.enqueue`` of one job and the pgbench
ceiling (not a test).

Each measurement gets a fresh database ``trioq_enqueue_<label>`` (dropped after) and runs
``--jobs`` enqueues in a child process: trioq under each ``--trioq LABEL=PYTHON`` (default:
this Python; give another checkout's venv to compare versions), pgqueuer under
``--pgqueuer-python`` (a venv with ``bench/peers/requirements-pgqueuer.txt``; skipped if
absent). The ceiling: pgbench, 1 client, ``-M prepared``, a one-statement insert of the same
row with its ``pg_notify`` (as trioq's insert statement does), each its own transaction.
Repetitions interleave everything; the table shows medians, and every run is printed.

    python bench/bench_single_enqueue.py --dsn DSN --repeat 3 \\
        --trioq before=/work/main/.venv/bin/python --trioq after=.venv/bin/python \\
        --pgqueuer-python /tmp/trioq-bench-peers/pgqueuer/bin/python
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio
from _common import add_common_options, create_database, drop_bench_db, find_pgbench, run_with_peer

import trioq

HERE = Path(__file__).parent
PGBENCH_SCRIPT = """\
WITH ins AS (INSERT INTO trioq.jobs (queue, task, args, priority, run_at, state, max_attempts)
             VALUES ('default', 't', '{"n": 1}'::jsonb, 0, now(), 'available', 25)
             RETURNING id, queue)
SELECT id, pg_catalog.pg_notify('trioq_trioq', queue) FROM ins;
"""


def _child(python: str, worker: str, dsn: str, jobs: int) -> dict[str, Any]:
    done = subprocess.run(
        [python, str(HERE / "peers" / worker), "--dsn", dsn, "--jobs", str(jobs)],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _pgbench(pgbench: str, dsn: str, jobs: int) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(PGBENCH_SCRIPT)
        script.flush()
        done = subprocess.run(
            [pgbench, "-n", "-M", "prepared", "-c", "1", "-t", str(jobs), "-f", script.name, dsn],
            capture_output=True, text=True, check=True, timeout=600,
        )  # fmt: skip
    for line in done.stdout.splitlines():
        if line.startswith("tps = "):
            tps = float(line.split()[2])
            return {"wall": jobs / tps, "cpu": None, "jobs": jobs}
    raise RuntimeError(f"no tps in pgbench's output: {done.stdout}")


async def _measure(admin: str, label: str, run: Any) -> dict[str, Any]:
    database = f"trioq_enqueue_{label}"
    await drop_bench_db(admin, database)
    dsn = await create_database(admin, database)
    try:
        if label == "pgbench":
            async with await trioq.connect(dsn, autocommit=True) as conn:
                await trioq.migrate(conn)
        return await trio.to_thread.run_sync(run, dsn)
    finally:
        await drop_bench_db(admin, database)


async def main(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    cells: dict[str, Any] = {}
    for spec in args.trioq or [f"trioq={sys.executable}"]:
        label, _, python = spec.partition("=")
        cells[label] = lambda dsn, p=python: _child(p, "trioq_enqueue.py", dsn, args.jobs)
    if args.pgqueuer_python:
        py = args.pgqueuer_python
        cells["pgqueuer"] = lambda dsn: _child(py, "pgqueuer_enqueue.py", dsn, args.jobs)
    async with await trioq.connect(args.dsn, autocommit=True) as conn:
        cur = await conn.execute("SHOW server_version_num")
        row = await cur.fetchone()
        assert row is not None
    pgbench = find_pgbench(args.pgbench, int(row[0]) // 10000)
    if pgbench:
        cells["pgbench"] = lambda dsn: _pgbench(pgbench, dsn, args.jobs)
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in cells}
    labels = list(cells)
    for rep in range(args.repeat):
        for label in labels[rep % len(labels):] + labels[: rep % len(labels)]:
            result = await _measure(args.dsn, label, cells[label])
            runs[label].append(result)
            cpu = result["cpu"]
            cpu_text = "-" if cpu is None else f"{cpu / result['jobs'] * 1e6:.0f} us"
            print(f"  run {rep + 1} {label:>10}: {result['jobs'] / result['wall']:8,.0f} jobs/s"
                  f"  client CPU/job {cpu_text}", flush=True)  # fmt: skip
    print(f"\nmedians of {args.repeat}, {args.jobs} single enqueues on one connection:")
    for label, found in runs.items():
        rate = statistics.median(r["jobs"] / r["wall"] for r in found)
        cpus = [r["cpu"] / r["jobs"] * 1e6 for r in found if r["cpu"] is not None]
        cpu_text = f"{statistics.median(cpus):.0f} us" if cpus else "-"
        print(f"  {label:>10}: {rate:8,.0f} jobs/s   client CPU/job {cpu_text}")
    return runs


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(parser, creates="trioq_enqueue_<label>", repeat=3, quiet_cores=0.3,
                       quiet_wait=0.0, pgbench=True)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--trioq", action="append", metavar="LABEL=PYTHON")
    parser.add_argument("--pgqueuer-python", default="/tmp/trioq-bench-peers/pgqueuer/bin/python")
    run_with_peer(main, parser.parse_args())
