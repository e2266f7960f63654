"""Enqueue throughput next to pgqueuer and the pgbench ceiling (not a test): one job per call
(``await trioq.enqueue(conn, ...)`` on an autocommit connection) and in bulk
(``trioq.enqueue_bulk`` of B jobs per call), from one or several producer connections.

``--shapes`` lists the workloads as ``BATCHxPRODUCERS`` (default ``1x1,1x10,100x1,1000x1``:
single enqueue from 1 and from 10 connections, bulk enqueue of 100 and of 1,000 jobs per
call). Each measurement gets a fresh database ``trioq_enqueue_<label>`` (dropped after) and
runs ``--jobs`` jobs (``--bulk-jobs`` for batches above 1) in a child process: trioq under
each ``--trioq LABEL=PYTHON`` (default: this Python; give another checkout's venv to compare
versions), pgqueuer under ``--pgqueuer-python`` (a venv with
``bench/peers/requirements-pgqueuer.txt``; skipped if absent) with ``Queries.enqueue`` (one
job, or lists of B: its bulk form). The ceiling, for one job per call only: pgbench,
PRODUCERS clients, ``-M prepared``, a one-statement insert of the same row with its
``pg_notify`` (as trioq's insert statement does), each its own transaction; and the floor
under any Python client on trio (``floor``, ``peers/floor_enqueue.py``): trioq's own insert
statement through libpq's calls on trio, prepared and adapted once, nothing else. Repetitions
interleave everything; the tables show medians, and every run is printed.

    python bench/bench_enqueue_peers.py --dsn DSN --repeat 3 \\
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

import attrs
import trio
from _common import (
    add_common_options,
    create_database,
    drop_bench_db,
    find_pgbench,
    run_with_peer,
    show_settings,
)

import trioq

HERE = Path(__file__).parent
DEFAULT_SHAPES = "1x1,1x10,100x1,1000x1"
PGBENCH_SCRIPT = """\
WITH ins AS (INSERT INTO trioq.jobs (queue, task, args, priority, run_at, state, max_attempts)
             VALUES ('default', 't', '{"n": 1}'::jsonb, 0, now(), 'available', 25)
             RETURNING id, queue)
SELECT id, pg_catalog.pg_notify('trioq_trioq', queue) FROM ins;
"""


@attrs.frozen
class Shape:
    batch: int
    producers: int

    @property
    def label(self) -> str:
        what = "single enqueue" if self.batch == 1 else f"bulk enqueue, batch {self.batch:,}"
        return f"{what}, {self.producers} producer{'s' if self.producers > 1 else ''}"


def parse_shapes(text: str) -> list[Shape]:
    shapes = []
    for part in text.split(","):
        batch, sep, producers = part.strip().partition("x")
        if not sep or not batch.isdigit() or not producers.isdigit():
            raise argparse.ArgumentTypeError(f"--shapes: {part!r} is not BATCHxPRODUCERS")
        if int(batch) < 1 or int(producers) < 1:
            raise argparse.ArgumentTypeError(f"--shapes: {part!r}: both must be at least 1")
        shapes.append(Shape(int(batch), int(producers)))
    return shapes


def _child(python: str, worker: str, dsn: str, jobs: int, shape: Shape) -> dict[str, Any]:
    done = subprocess.run(
        [python, str(HERE / "peers" / worker), "--dsn", dsn, "--jobs", str(jobs),
         "--batch", str(shape.batch), "--producers", str(shape.producers)],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{worker} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _pgbench(pgbench: str, dsn: str, jobs: int, clients: int) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(PGBENCH_SCRIPT)
        script.flush()
        done = subprocess.run(
            [pgbench, "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)),
             "-t", str(jobs // clients), "-f", script.name, dsn],
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


def _cells(args: argparse.Namespace, shape: Shape, pgbench: str | None) -> dict[str, Any]:
    jobs = args.jobs if shape.batch == 1 else args.bulk_jobs
    cells: dict[str, Any] = {}
    for spec in args.trioq or [f"trioq={sys.executable}"]:
        label, _, python = spec.partition("=")
        cells[label] = lambda dsn, p=python: _child(p, "trioq_enqueue.py", dsn, jobs, shape)
    if args.pgqueuer_python:  # run_with_peer dropped one that does not exist
        py = args.pgqueuer_python
        cells["pgqueuer"] = lambda dsn: _child(py, "pgqueuer_enqueue.py", dsn, jobs, shape)
    if shape.batch == 1:  # libpq on trio, trioq's own statement, nothing else (`peers/_libpq`)
        cells["floor"] = lambda dsn: _child(sys.executable, "floor_enqueue.py", dsn, jobs, shape)
    if pgbench and shape.batch == 1:
        cells["pgbench"] = lambda dsn: _pgbench(pgbench, dsn, jobs, shape.producers)
    return cells


async def _series(admin: str, shape: Shape, cells: dict[str, Any], repeat: int) -> dict[str, Any]:
    print(f"\n{shape.label}:", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in cells}
    labels = list(cells)
    for rep in range(repeat):
        for label in labels[rep % len(labels):] + labels[: rep % len(labels)]:
            result = await _measure(admin, label, cells[label])
            runs[label].append(result)
            cpu = result["cpu"]
            cpu_text = "-" if cpu is None else f"{cpu / result['jobs'] * 1e6:.1f} us"
            print(f"  run {rep + 1} {label:>10}: {result['jobs'] / result['wall']:9,.0f} jobs/s"
                  f"  client CPU/job {cpu_text}", flush=True)  # fmt: skip
    summary = {}
    for label, found in runs.items():
        rate = statistics.median(r["jobs"] / r["wall"] for r in found)
        cpus = [r["cpu"] / r["jobs"] * 1e6 for r in found if r["cpu"] is not None]
        summary[label] = {"jobs_per_s": rate, "cpu_us": statistics.median(cpus) if cpus else None}
    return {"shape": attrs.asdict(shape), "runs": runs, "medians": summary}


def _print_summary(results: list[dict[str, Any]], repeat: int) -> None:
    print(f"\nmedians of {repeat} (jobs/s; client CPU per job):")
    for result in results:
        medians = result["medians"]
        shape = Shape(**result["shape"])
        parts = []
        for label, m in medians.items():
            cpu = "" if m["cpu_us"] is None else f", {m['cpu_us']:.1f} us"
            parts.append(f"{label} {m['jobs_per_s']:,.0f}{cpu}")
        line = f"  {shape.label}: " + "; ".join(parts)
        first = next(iter(medians.values()))["jobs_per_s"]
        if "pgqueuer" in medians:
            line += f"  -> {first / medians['pgqueuer']['jobs_per_s']:.2f}x pgqueuer"
        if "floor" in medians:
            line += f", {first / medians['floor']['jobs_per_s']:.0%} of the floor"
        if "pgbench" in medians:
            line += f", {first / medians['pgbench']['jobs_per_s']:.0%} of pgbench"
            if "floor" in medians:
                floor = medians["floor"]["jobs_per_s"] / medians["pgbench"]["jobs_per_s"]
                line += f" (the floor: {floor:.0%})"
        print(line)


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    async with await trioq.connect(args.dsn, autocommit=True) as conn:
        cur = await conn.execute("SHOW server_version_num")
        row = await cur.fetchone()
        assert row is not None
        settings = await show_settings(conn, ["fsync", "synchronous_commit"])
    print(f"server settings: {settings}")
    pgbench = find_pgbench(args.pgbench, int(row[0]) // 10000)
    results = []
    for shape in args.shapes:
        cells = _cells(args, shape, pgbench)
        results.append(await _series(args.dsn, shape, cells, args.repeat))
    _print_summary(results, args.repeat)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(parser, creates="trioq_enqueue_<label>", repeat=3, quiet_cores=0.3,
                       quiet_wait=0.0, pgbench=True)
    parser.add_argument("--shapes", type=parse_shapes, default=parse_shapes(DEFAULT_SHAPES))
    parser.add_argument("--jobs", type=int, default=5000, help="per single-enqueue measurement")
    parser.add_argument("--bulk-jobs", type=int, default=100_000, help="per bulk measurement")
    parser.add_argument("--trioq", action="append", metavar="LABEL=PYTHON")
    parser.add_argument("--pgqueuer-python", default="/tmp/trioq-bench-peers/pgqueuer/bin/python")
    run_with_peer(main, parser.parse_args())
