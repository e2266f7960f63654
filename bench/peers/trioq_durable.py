"""trioq's side of `bench/bench_durable.py`, run by trioq's Python in a process of its own.

    trioq_durable.py steps    --dsn DSN --workflows N --concurrency C --kind step|transaction
    trioq_durable.py signal   --dsn DSN --signals N --gap MS
    trioq_durable.py sleepers --dsn DSN --count N --concurrency C
    trioq_durable.py drain    --dsn DSN --jobs N --concurrency C

``steps``: ``--workflows`` jobs of a 10-step durable task are enqueued (one bulk insert,
untimed), then one worker (``trioq.serve``, its defaults but the queue's concurrency) runs
them. Each step is ``await job.step(f"s{i}", value, i)`` (or ``job.step_transaction``, whose
function takes the connection and runs no statement), ``value`` returning ``{"i": i}``.
Timed from the first handler's start to the last outcome written (the runtime's
``outcomes_written``); the process's CPU (all threads) and, with ``--pg-pid``, the server's
(`_probe.server_cpu`) over the same span.

``signal``: one worker and, in the same process, a producer on its own autocommit
connection. ``--signals`` times: enqueue a job whose handler waits for ``"go"``
(``job.wait_for``); poll until it is parked (``scheduled``, the run ended); wait ``--gap`` ms
(randomized +-50 %, seeded, as ``bench_pickup_peers.py``); then ``trioq.signal`` autocommit
and wait for the handler's line after the wait. Latency: the ``perf_counter`` just before the
signal call to that line (so it includes the signal's round trip and commit); also the
signal call's own time, and the time to the woken run's first line (the rest is the
replay: its records read, the wait's transaction).

``sleepers``: ``--count`` durable jobs that record two steps and sleep 365 days (the real
path: enqueued in bulk, each run by the worker to its sleep), then ``VACUUM ANALYZE``.

``drain``: ``--jobs`` no-op (not durable) jobs in the sleepers' queue, drained as ``steps``
is timed.

``--round-trips`` counts trioq.pg's waits for the server over the span (a monkeypatch in
this process: use it to explain a number, not to measure one); ``--cprofile FILE`` profiles
the whole process's CPU; ``--prototype`` applies changes sketched in
`trioq_durable_prototypes`.

Each command prints one line of JSON.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import functools
import json
import random
import time
from typing import Any

import trio
from _probe import server_cpu

import trioq

QUEUE = "bench"
STEPS = 10

tasks = trioq.Registry()
first: list[float] = []  # perf_counter and process_time at the first handler's start
woke: list[float] = []
run_started: list[float] = []  # signal: each run's first line
arrived = [trio.Event()]
server = [0]  # the postmaster's pid (0: do not read the server's CPU)


def value(i: int) -> dict[str, int]:
    return {"i": i}


async def value_in(conn: Any, i: int) -> dict[str, int]:
    return {"i": i}


exchanges = [0]  # --round-trips: trioq.pg's exchanges with the server


def count_round_trips() -> None:
    """Count the exchanges of trioq.pg's connections with the server: the runs of its
    ``wait_gen`` whose generator waits for the socket at least once (one that has nothing
    to send or read, as psycopg's prepared-statement upkeep mostly has, is not one).
    Monkeypatched here only."""
    from trioq._pg import connection  # private: where TrioConnection waits for its socket

    original = vars(connection)["wait_gen"]

    def watched(gen: Any) -> Any:
        waited = False
        try:
            ready = None
            while True:
                wait = gen.send(ready)
                if not waited:
                    waited = True
                    exchanges[0] += 1
                ready = yield wait
        except StopIteration as stop:
            return stop.value

    async def counted(gen: Any, fileno: int) -> Any:
        return await original(watched(gen), fileno)

    setattr(connection, "wait_gen", counted)  # noqa: B010 - not exported: no attribute to type


def _started() -> None:
    if not first:  # the span starts
        first.extend((time.perf_counter(), time.process_time(), server_cpu(server[0]),
                      exchanges[0]))  # fmt: skip


@tasks.task(name="steps", queue=QUEUE)
async def steps(job: trioq.JobContext, n: int) -> None:
    _started()
    for i in range(STEPS):
        await job.step(f"s{i}", value, i)


@tasks.task(name="steps_tx", queue=QUEUE)
async def steps_tx(job: trioq.JobContext, n: int) -> None:
    _started()
    for i in range(STEPS):
        await job.step_transaction(f"s{i}", value_in, i)


@tasks.task(name="waiter", queue=QUEUE)
async def waiter(job: trioq.JobContext, n: int) -> None:
    run_started.append(time.perf_counter())
    await job.wait_for("go")
    woke.append(time.perf_counter())
    arrived[0].set()


@tasks.task(name="sleeper", queue=QUEUE)
async def sleeper(job: trioq.JobContext, n: int) -> None:
    await job.step("fetch", value, n)
    await job.step("plan", value, n + 1)
    await job.sleep(dt.timedelta(days=365))


@tasks.task(name="noop", queue=QUEUE)
async def noop(job: trioq.JobContext, n: int) -> None:
    _started()


def _config(dsn: str, concurrency: int, app_pool: int | None = None) -> trioq.Config:
    queues = {QUEUE: trioq.QueueConfig(concurrency=concurrency)}
    if app_pool is None:
        return trioq.Config(registry=tasks, dsn=dsn, queues=queues)
    return trioq.Config(registry=tasks, dsn=dsn, queues=queues, app_pool_size=app_pool)


async def _run(dsn: str, task: str, jobs: int, concurrency: int,
               app_pool: int | None) -> dict[str, Any]:  # fmt: skip
    """Enqueue ``jobs`` of ``task``, run them all on one worker; the timed span's figures."""
    first.clear()
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        await trioq.enqueue_bulk(conn, task, [{"n": i} for i in range(jobs)], queue=QUEUE)
        await conn.execute("VACUUM ANALYZE trioq.jobs")
    async with trio.open_nursery() as nursery:
        runtime = await nursery.start(trioq.serve, _config(dsn, concurrency, app_pool))
        # the runtime has no event for "outcomes written": poll its counter (1 ms)
        while runtime.statistics().outcomes_written < jobs:  # noqa: ASYNC110
            await trio.sleep(0.001)
        t1, c1, s1 = time.perf_counter(), time.process_time(), server_cpu(server[0])
        e1 = exchanges[0]
        runtime.stop()
    t0, c0, s0, e0 = first
    return {"wall_s": t1 - t0, "client_cpu_s": c1 - c0,
            "server_cpu_s": s1 - s0 if server[0] else None, "round_trips": e1 - e0}  # fmt: skip


async def signal(dsn: str, signals: int, gap_ms: float) -> dict[str, Any]:
    rng = random.Random(15)
    latencies: list[float] = []
    calls: list[float] = []
    pickups: list[float] = []  # the signal's start -> the woken run's first line
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        async with trio.open_nursery() as nursery:
            runtime = await nursery.start(trioq.serve, _config(dsn, 10))
            for i in range(-1, signals):  # -1: warms both sides, not counted
                arrived[0] = trio.Event()
                job = await waiter.enqueue(conn, n=i)
                # parked: its run ended (no event for it: poll the row, 1 ms)
                while (await trioq.job_status(conn, job.job_id)).state != "scheduled":  # noqa: ASYNC110
                    await trio.sleep(0.001)
                await trio.sleep(gap_ms * rng.uniform(0.5, 1.5) / 1000)
                t0 = time.perf_counter()
                await trioq.signal(conn, job.job_id, "go", {"n": i})
                calls.append(time.perf_counter() - t0)
                await arrived[0].wait()
                latencies.append(woke[-1] - t0)
                pickups.append(run_started[-1] - t0)
            runtime.stop()
    return {"latencies_ms": [x * 1e3 for x in latencies[1:]],
            "signal_call_ms": [x * 1e3 for x in calls[1:]],
            "pickup_ms": [x * 1e3 for x in pickups[1:]]}  # fmt: skip


async def sleepers(dsn: str, count: int, concurrency: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        await trioq.enqueue_bulk(conn, "sleeper", [{"n": i} for i in range(count)], queue=QUEUE)
        async with trio.open_nursery() as nursery:
            runtime = await nursery.start(trioq.serve, _config(dsn, concurrency))
            parked = 0
            while parked < count:
                await trio.sleep(0.5)
                cur = await conn.execute("SELECT count(*) FROM trioq.jobs WHERE state = "
                                         "'scheduled' AND durable")  # fmt: skip
                row = await cur.fetchone()
                assert row is not None
                parked = int(row[0])
            runtime.stop()
        await conn.execute("VACUUM ANALYZE")
        cur = await conn.execute("SELECT count(*) FROM trioq.job_steps")
        row = await cur.fetchone()
        assert row is not None
    return {"sleepers": count, "step_records": int(row[0]), "took_s": time.perf_counter() - t0}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["steps", "signal", "sleepers", "drain"])
    p.add_argument("--dsn", required=True)
    p.add_argument("--workflows", type=int, default=1000)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--app-pool", type=int, help="Config.app_pool_size (default: trioq's)")
    p.add_argument("--kind", choices=["step", "transaction"], default="step")
    p.add_argument("--signals", type=int, default=200)
    p.add_argument("--gap", type=float, default=20.0)
    p.add_argument("--pg-pid", type=int, default=0, help="the postmaster, to read its CPU")
    p.add_argument("--cprofile", help="steps/drain: write a cProfile of the process here")
    p.add_argument("--prototype", help="apply trioq_durable_prototypes NAME[+NAME]")
    p.add_argument("--round-trips", action="store_true",
                   help="steps/drain: count the exchanges with the server (costs CPU)")
    a = p.parse_args()
    server[0] = a.pg_pid
    if a.round_trips:
        count_round_trips()
    if a.prototype:
        import trioq_durable_prototypes

        trioq_durable_prototypes.apply(a.prototype.split("+"), a.dsn, a.app_pool or 10)
    found: dict[str, Any]
    if a.command == "signal":
        found = trio.run(signal, a.dsn, a.signals, a.gap)
    elif a.command == "sleepers":
        found = trio.run(sleepers, a.dsn, a.count, a.concurrency)
    else:
        task, jobs = ("noop", a.jobs) if a.command == "drain" else (
            "steps" if a.kind == "step" else "steps_tx", a.workflows)  # fmt: skip
        run = functools.partial(trio.run, _run, a.dsn, task, jobs, a.concurrency, a.app_pool)
        if a.cprofile:
            profiler = cProfile.Profile(time.process_time)  # CPU, not the wall
            found = profiler.runcall(run)
            profiler.dump_stats(a.cprofile)
        else:
            found = run()
        found["jobs"] = jobs
    print(json.dumps(found))


if __name__ == "__main__":
    main()
