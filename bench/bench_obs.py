"""What observability costs: the no-op drain with metrics off and on, and enqueue with and
without OpenTelemetry (issue #11). Prints numbers; docs/observability.md has the results.

    python bench/bench_obs.py drain   [--jobs 20000] [--concurrency 100] [--repeat 7]
    python bench/bench_obs.py enqueue [--calls 3000] [--repeat 7]
    python bench/bench_obs.py names   [--names 1000]

``drain``: per repetition, two fresh workers drain the same prefilled backlog of no-op jobs
(``trioq.serve`` in a process of its own, tracing off), one with ``Config.metrics`` set and
scraped every second, one without, in alternating order; it reports jobs/s and the worker's
CPU per job (user + system, all threads: the metrics server's thread included).

``enqueue``: ``trioq.enqueue`` one job per call, each its own transaction, in three
processes: OpenTelemetry never imported; imported with no span current; an SDK tracer
provider with a current (recording) span, so that every call stores the trace context.

``names``: a worker with one task claims a job of each of ``--names`` task names no task has
(and 10 of its own), gives them back, and is scraped once: the size of ``/metrics``, its series
and its distinct ``task`` label values (docs/observability.md#task-names).

The server is a throwaway cluster (durability off) unless ``--dsn`` names one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from typing import Any

import trio

import trioq
from trioq.testing import ThrowawayPostgres

HERE = os.path.dirname(os.path.abspath(__file__))


# -- the child processes ---------------------------------------------------------------------------


async def _drain_child(dsn: str, jobs: int, concurrency: int, metrics: bool) -> dict[str, Any]:
    tasks = trioq.Registry()

    @tasks.task(queue="bench")
    async def noop(job: trioq.JobContext, n: int) -> None:
        pass

    config = trioq.Config(
        registry=tasks, dsn=dsn, queues={"bench": trioq.QueueConfig(concurrency=concurrency)},
        metrics="127.0.0.1:0" if metrics else None, tracing=False,
    )  # fmt: skip
    scrapes = 0
    async with trio.open_nursery() as nursery:
        cpu0, t0 = time.process_time(), time.perf_counter()
        runtime: trioq.Runtime = await nursery.start(trioq.serve, config)
        while runtime.statistics().outcomes_written < jobs:
            await trio.sleep(0.001)
            if runtime.metrics_url is not None and time.perf_counter() - t0 > scrapes:
                await trio.to_thread.run_sync(_scrape, runtime.metrics_url)
                scrapes += 1
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        runtime.stop()
    return {"seconds": seconds, "cpu_us_per_job": cpu / jobs * 1e6, "scrapes": scrapes}


def _scrape(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()  # type: ignore[no-any-return]


async def _names_child(dsn: str, names: int) -> dict[str, Any]:
    tasks = trioq.Registry()

    @tasks.task(queue="bench")
    async def noop(job: trioq.JobContext, n: int) -> None:
        pass

    config = trioq.Config(registry=tasks, dsn=dsn, metrics="127.0.0.1:0", tracing=False,
                          queues={"bench": trioq.QueueConfig(concurrency=100)})  # fmt: skip
    async with trio.open_nursery() as nursery:
        runtime: trioq.Runtime = await nursery.start(trioq.serve, config)
        written = 0
        while written < names + 10:  # each job given back, or completed
            await trio.sleep(0.01)
            written = runtime.statistics().outcomes_written
        assert runtime.metrics_url is not None
        t0 = time.perf_counter()
        text = (await trio.to_thread.run_sync(_scrape, runtime.metrics_url)).decode()
        seconds = time.perf_counter() - t0
        runtime.stop()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    labels = {m for line in samples for m in re.findall(r'task="([^"]*)"', line)}
    return {"bytes": len(text.encode()), "samples": len(samples), "task_labels": len(labels),
            "scrape_ms": seconds * 1000}  # fmt: skip


async def _enqueue_child(dsn: str, calls: int, mode: str) -> dict[str, Any]:
    if mode != "plain":
        from opentelemetry import trace

    async with await trioq.connect(dsn, autocommit=True) as conn:
        for _ in range(100):  # warm up: prepared statements, the version check
            await trioq.enqueue(conn, "t")
        if mode == "span":
            from opentelemetry.sdk.trace import TracerProvider

            trace.set_tracer_provider(TracerProvider())  # recording spans, no exporter
            with trace.get_tracer("bench").start_as_current_span("request"):
                return await _enqueues(conn, calls)
        return await _enqueues(conn, calls)


async def _enqueues(conn: Any, calls: int) -> dict[str, Any]:
    from trioq._obs.carrier import carrier

    t0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        await trioq.enqueue(conn, "t", {"user_id": 1})
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    n = 100_000  # the part that depends on OpenTelemetry, alone (no database: exact)
    t0 = time.perf_counter()
    for _ in range(n):
        carrier()
    return {"us_per_call": wall / calls * 1e6, "cpu_us_per_call": cpu / calls * 1e6,
            "carrier_us": (time.perf_counter() - t0) / n * 1e6,
            "otel_imported": "opentelemetry.trace" in sys.modules}  # fmt: skip


def _child(argv: list[str]) -> None:
    kind, dsn, *rest = argv
    if kind == "drain":
        jobs, concurrency, metrics = int(rest[0]), int(rest[1]), rest[2] == "on"
        result = trio.run(_drain_child, dsn, jobs, concurrency, metrics)
    elif kind == "names":
        result = trio.run(_names_child, dsn, int(rest[0]))
    else:
        result = trio.run(_enqueue_child, dsn, int(rest[0]), rest[1])
    print("RESULT " + json.dumps(result))


def _run_child(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True,
                         text=True, check=True, timeout=600)  # fmt: skip
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])  # type: ignore[no-any-return]


# -- the parent ------------------------------------------------------------------------------------


async def _prefill(dsn: str, jobs: int) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await conn.execute("TRUNCATE trioq.jobs")
        await trioq.enqueue_bulk(conn, "noop", [{"n": i} for i in range(jobs)], queue="bench")
        await conn.execute("VACUUM ANALYZE trioq.jobs")


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):,.1f} ({min(values):,.1f}-{max(values):,.1f})"


def drain(pg: ThrowawayPostgres, opts: argparse.Namespace) -> None:
    dsn = pg.database()
    results: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for i in range(opts.repeat):
        for variant in ("off", "on") if i % 2 == 0 else ("on", "off"):
            trio.run(_prefill, dsn, opts.jobs)
            r = _run_child("drain", dsn, str(opts.jobs), str(opts.concurrency), variant)
            results[variant].append(r)
            print(f"  {i + 1}/{opts.repeat} metrics {variant:3}: {opts.jobs / r['seconds']:,.0f} "
                  f"jobs/s, {r['cpu_us_per_job']:.1f} us CPU/job, {r['scrapes']} scrapes",
                  flush=True)  # fmt: skip
    print(f"\nno-op drain, {opts.jobs} jobs, concurrency {opts.concurrency}, "
          f"{opts.repeat} repetitions each: median (min-max)")  # fmt: skip
    for variant, runs in results.items():
        rates = [opts.jobs / r["seconds"] for r in runs]
        cpu = [r["cpu_us_per_job"] for r in runs]
        print(f"  metrics {variant:3}: {_summary(rates)} jobs/s, {_summary(cpu)} us CPU/job")
    off = statistics.median(opts.jobs / r["seconds"] for r in results["off"])
    on = statistics.median(opts.jobs / r["seconds"] for r in results["on"])
    print(f"  on / off (medians): {on / off:.3f}")


def enqueue(pg: ThrowawayPostgres, opts: argparse.Namespace) -> None:
    dsn = pg.database()
    modes = ("plain", "imported", "span")
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for i in range(opts.repeat):
        for mode in modes if i % 2 == 0 else modes[::-1]:
            results[mode].append(_run_child("enqueue", dsn, str(opts.calls), mode))
    print(f"\ntrioq.enqueue, {opts.calls} calls per run (each its own transaction), "
          f"{opts.repeat} runs: median (min-max)")  # fmt: skip
    labels = {"plain": "OpenTelemetry not imported", "imported": "imported, no span",
              "span": "a current span (context stored)"}  # fmt: skip
    for mode in modes:
        wall = [r["us_per_call"] for r in results[mode]]
        cpu = [r["cpu_us_per_call"] for r in results[mode]]
        carrier = [r["carrier_us"] for r in results[mode]]
        print(f"  {labels[mode]:32}: {_summary(wall)} us/call, {_summary(cpu)} us CPU/call; "
              f"the trace context alone {statistics.median(carrier):.2f} us")  # fmt: skip


def names(pg: ThrowawayPostgres, opts: argparse.Namespace) -> None:
    dsn = pg.database()
    trio.run(_prefill_names, dsn, opts.names)
    r = _run_child("names", dsn, str(opts.names))
    print(f"/metrics after {opts.names} unknown task names (and 10 jobs of a known one): "
          f"{r['bytes']:,} bytes, {r['samples']:,} samples, {r['task_labels']} distinct task "
          f"label values, scraped in {r['scrape_ms']:.1f} ms")  # fmt: skip


async def _prefill_names(dsn: str, names: int) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await conn.execute("TRUNCATE trioq.jobs")
        await conn.execute(
            "INSERT INTO trioq.jobs (task, queue, args) SELECT 'ghost_' || i, 'bench', '{}'"
            " FROM generate_series(1, %(n)s) AS i", {"n": names},
        )  # fmt: skip
        await trioq.enqueue_bulk(conn, "noop", [{"n": i} for i in range(10)], queue="bench")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("drain", "enqueue", "names"))
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--names", type=int, default=1000)
    p.add_argument("--dsn", help="a superuser DSN (default: a throwaway cluster)")
    opts = p.parse_args()
    with ThrowawayPostgres(dsn=opts.dsn) as pg:
        {"drain": drain, "enqueue": enqueue, "names": names}[opts.what](pg, opts)


if __name__ == "__main__":
    main()
