"""Group-commit enqueue next to pgqueuer (not a test): 100 trio tasks each enqueueing single
jobs through one pool with `trioq.open_group_producer`, against pgqueuer's single enqueue with
as many producers, and trioq's own `enqueue_bulk` (the rate a batch API reaches), on each
server given (fsync on and off), in one interleaved run.

Cells, each in a child process on a fresh database ``trioq_producers_<cell>`` (dropped after):

- ``group``: `open_group_producer` (``--flushers`` batches in flight, a pool of flushers + 1);
- ``pool``: the same tasks, each call ``trioq.enqueue`` on a pool connection (a transaction
  per job: what group commit replaces);
- ``bulk``: one task, ``enqueue_bulk`` of 1,000 jobs per call;
- ``pgqueuer/conns``: pgqueuer 1.6's ``Queries.enqueue``, one job per call, its producers on
  a connection each (uvloop); ``pgqueuer/pool10``, ``pgqueuer/pool25``: the producers share an
  asyncpg pool of 10 or 25 connections (``AsyncpgPoolDriver``). Its best is the comparison.
- ``floor``: the group producer with its commit replaced by nothing (no database): what the
  Python side of a single-call enqueue costs, the ceiling of any single-call API here.

    python bench/bench_producers.py --dsn fsync_on=postgresql://...:55432/postgres \\
        --dsn fsync_off=postgresql://...:55433/postgres --repeat 3
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
from _common import create_database, drop_bench_db, show_settings

import trioq

HERE = Path(__file__).parent
PGQUEUER_PYTHON = "/tmp/trioq-bench-peers/pgqueuer/bin/python"


def _cells(args: argparse.Namespace) -> dict[str, list[str]]:
    jobs, producers = str(args.jobs), str(args.producers)
    trioq_group = [sys.executable, str(HERE / "peers" / "trioq_group.py"), "--jobs", jobs,
                   "--producers", producers, "--flushers", str(args.flushers),
                   "--pool", str(args.flushers + 1)]  # fmt: skip
    cells = {
        "group": [*trioq_group, "--mode", "group"],
        "pool": [*trioq_group, "--mode", "pool"],
        "bulk": [*trioq_group, "--mode", "bulk", "--jobs", str(args.bulk_jobs)],
    }
    if Path(args.pgqueuer_python).exists():
        pgq = [args.pgqueuer_python, str(HERE / "peers" / "pgqueuer_enqueue.py"), "--jobs", jobs,
               "--producers", producers]  # fmt: skip
        cells["pgqueuer/conns"] = pgq
        cells["pgqueuer/pool10"] = [*pgq, "--pool", "10"]
        cells["pgqueuer/pool25"] = [*pgq, "--pool", "25"]
    return cells


def _run(command: list[str], dsn: str) -> dict[str, Any]:
    done = subprocess.run([*command, "--dsn", dsn], capture_output=True, text=True,
                          check=False, timeout=900)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{command[1]} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def floor(jobs: int, producers: int, flushers: int) -> dict[str, Any]:
    """The group producer with no database: each batch 'commits' at once."""
    import time

    from trioq import _group_producer

    class Free(_group_producer.GroupProducer):
        async def _commit(self, batch: Any, *, retries: int) -> None:
            self._batches += 1
            for request in batch:
                request.result = trioq.EnqueueResult(1)
                request.done.set()

    async def main() -> dict[str, Any]:
        producer = Free(None, trioq.Queue(), 1000, flushers)  # type: ignore[arg-type]
        share = jobs // producers
        async with trio.open_nursery() as nursery:
            for _ in range(flushers):
                nursery.start_soon(producer._flush_loop)

            async def produce(first: int) -> None:
                for i in range(first, first + share):
                    await producer.enqueue("t", {"n": i})

            cpu0, t0 = time.process_time(), time.perf_counter()
            async with trio.open_nursery() as tasks:
                for k in range(producers):
                    tasks.start_soon(produce, k * share)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            producer._send.close()
        return {"wall": wall, "cpu": cpu, "jobs": share * producers}

    return trio.run(main)


async def _measure(admin: str, cell: str, command: list[str]) -> dict[str, Any]:
    database = "trioq_producers_" + cell.replace("/", "_")
    await drop_bench_db(admin, database)
    dsn = await create_database(admin, database)
    try:
        return await trio.to_thread.run_sync(_run, command, dsn)
    finally:
        await drop_bench_db(admin, database)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    servers = dict(spec.partition("=")[::2] for spec in args.dsn)
    report: dict[str, Any] = {}
    for name, admin in servers.items():
        async with await trioq.connect(admin, autocommit=True) as conn:
            print(f"{name}: {await show_settings(conn, ['server_version', 'fsync'])}")
    cells = _cells(args)
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rep in range(args.repeat):
        order = list(cells)[rep % len(cells):] + list(cells)[: rep % len(cells)]
        for name, admin in servers.items():
            for cell in order:
                result = await _measure(admin, cell, cells[cell])
                runs.setdefault((name, cell), []).append(result)
                rate = result["jobs"] / result["wall"]
                print(f"  run {rep + 1} {name:>10} {cell:>16}: {rate:9,.0f} jobs/s  client CPU/job "
                      f"{result['cpu'] / result['jobs'] * 1e6:6.1f} us"
                      + (f"  ({result['batches']} batches)" if "batches" in result else ""),
                      flush=True)  # fmt: skip
    floors = [await trio.to_thread.run_sync(floor, args.jobs, args.producers, args.flushers)
              for _ in range(args.repeat)]
    print(f"\nmedians of {args.repeat} (jobs/s, client CPU us/job):")
    for name in servers:
        medians = {}
        for cell in cells:
            found = runs[(name, cell)]
            medians[cell] = (statistics.median(r["jobs"] / r["wall"] for r in found),
                             statistics.median(r["cpu"] / r["jobs"] * 1e6 for r in found))
        report[name] = medians
        line = "; ".join(f"{cell} {rate:,.0f} ({cpu:.0f} us)" for cell, (rate, cpu)
                         in medians.items())  # fmt: skip
        print(f"  {name}: {line}")
        peers = [rate for cell, (rate, _) in medians.items() if cell.startswith("pgqueuer")]
        if peers:
            print(f"    group / best pgqueuer: {medians['group'][0] / max(peers):.2f}x; group / "
                  f"bulk: {medians['group'][0] / medians['bulk'][0]:.0%}")  # fmt: skip
    rate = statistics.median(r["jobs"] / r["wall"] for r in floors)
    cpu = statistics.median(r["cpu"] / r["jobs"] * 1e6 for r in floors)
    print(f"  floor (no database): {rate:,.0f} jobs/s, {cpu:.0f} us/job")
    report["floor"] = (rate, cpu)
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", action="append", required=True, metavar="NAME=ADMIN_DSN")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--bulk-jobs", type=int, default=200_000)
    parser.add_argument("--producers", type=int, default=100)
    parser.add_argument("--flushers", type=int, default=4)
    parser.add_argument("--pgqueuer-python", default=PGQUEUER_PYTHON)
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    found = trio.run(main, options)
    if options.json:
        options.json.write_text(json.dumps(found, indent=2, default=str))
