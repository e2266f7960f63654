"""DBOS Transact's side of `bench/bench_durable.py`, run by the Python of its own venv
(``requirements-dbos.txt``), with DBOS's own API on its own database of the same server.

    dbos_durable.py steps  --dsn DSN --workflows N --concurrency C --mode sync|async|queue
    dbos_durable.py signal --dsn DSN --signals N --gap MS --mode sync|async

One process, ``DBOS(config=...)`` with its defaults (``system_database_url`` the DSN,
log level WARNING; ``sys_db_pool_size`` raised to ``C + 4`` when ``C`` would exceed its
default 20), then ``DBOS.launch()``.

``steps``: ``--workflows`` runs of a ``@DBOS.workflow`` that calls a ``@DBOS.step``
returning ``{"i": i}`` ten times, ``C`` at a time: ``sync``, ``C`` threads each calling the
workflow function (DBOS's sync API: the workflow runs in the calling thread); ``async``,
``C`` asyncio tasks each awaiting the async workflow (async steps); ``queue``, the workflows
enqueued on a ``DBOS.register_queue`` queue (``worker_concurrency=C``,
``polling_interval_sec=0.01``) before the timed span: the first ``C`` dequeued wait for a
gate that opens, and starts the span, once all are enqueued.
Timed from the first workflow's start to the last one's end; the process's CPU (all
threads) and, with ``--pg-pid``, the server's (`_probe.server_cpu`) over that span.

``signal``: ``--signals`` times, start a workflow that calls ``DBOS.recv("go")``, let it
reach the wait (it sets an event just before ``recv``; then ``--gap`` ms, randomized
+-50 %, seeded as trioq's side), then ``DBOS.send(workflow_id, {"n": i}, "go")`` from
outside any workflow, and wait for the workflow's line after ``recv``. Latency: the
``perf_counter`` just before ``send`` to that line.

Each command prints one line of JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _probe import server_cpu
from dbos import DBOS, DBOSConfig, SetWorkflowID

STEPS = 10
first: list[float] = []
first_lock = threading.Lock()
woke: dict[int, float] = {}
ready: dict[int, threading.Event] = {}
server = [0]
gate = threading.Event()  # queue mode: opened once every workflow is enqueued


def _started() -> None:
    with first_lock:
        if not first:
            first.extend((time.perf_counter(), time.process_time(), server_cpu(server[0])))


# DBOS's decorators, applied as calls (its package is not installed where mypy runs): each
# name is the registered step or workflow, under the function's own name.


def _value(i: int) -> dict[str, int]:
    return {"i": i}


async def _value_async(i: int) -> dict[str, int]:
    return {"i": i}


value = DBOS.step(name="value")(_value)
value_async = DBOS.step(name="value_async")(_value_async)


def _steps(n: int) -> int:
    _started()
    for i in range(STEPS):
        value(i)
    return n


def _gated_steps(n: int) -> int:
    gate.wait()
    for i in range(STEPS):
        value(i)
    return n


async def _steps_async(n: int) -> int:
    _started()
    for i in range(STEPS):
        await value_async(i)
    return n


def _waiter(n: int) -> None:
    ready[n].set()
    DBOS.recv("go", timeout_seconds=600)
    woke[n] = time.perf_counter()


async def _waiter_async(n: int) -> None:
    ready[n].set()
    await DBOS.recv_async("go", timeout_seconds=600)
    woke[n] = time.perf_counter()


steps = DBOS.workflow(name="steps")(_steps)
gated_steps = DBOS.workflow(name="gated_steps")(_gated_steps)
steps_async = DBOS.workflow(name="steps_async")(_steps_async)
waiter = DBOS.workflow(name="waiter")(_waiter)
waiter_async = DBOS.workflow(name="waiter_async")(_waiter_async)


def _url(dsn: str) -> str:
    """A URL for ``dsn`` (SQLAlchemy takes no ``key=value`` conninfo)."""
    if "://" in dsn:
        return dsn
    from urllib.parse import quote, urlencode

    from psycopg.conninfo import conninfo_to_dict

    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items()}
    user = quote(params.pop("user", ""), safe="")
    password = params.pop("password", None)
    auth = f"{user}:{quote(password, safe='')}@" if password else (f"{user}@" if user else "")
    database = quote(params.pop("dbname", ""), safe="")
    host = params.pop("host", "")
    netloc = "" if host.startswith("/") else host  # a socket directory goes in the query
    if host.startswith("/"):
        params["host"] = host
    elif "port" in params:
        netloc += ":" + params.pop("port")
    return f"postgresql://{auth}{netloc}/{database}?{urlencode(params)}"


def _launch(dsn: str, concurrency: int) -> None:
    config: DBOSConfig = {"name": "bench-durable", "system_database_url": _url(dsn),
                          "log_level": "WARNING"}  # fmt: skip
    if concurrency + 4 > 20:  # DBOS's default pool: 20 connections
        config["sys_db_pool_size"] = concurrency + 4
    DBOS(config=config)
    DBOS.launch()


def _span() -> dict[str, Any]:
    t1, c1, s1 = time.perf_counter(), time.process_time(), server_cpu(server[0])
    t0, c0, s0 = first
    return {"wall_s": t1 - t0, "client_cpu_s": c1 - c0,
            "server_cpu_s": s1 - s0 if server[0] else None}  # fmt: skip


def run_steps(dsn: str, workflows: int, concurrency: int, mode: str) -> dict[str, Any]:
    _launch(dsn, concurrency)
    try:
        if mode == "sync":
            with ThreadPoolExecutor(concurrency) as pool:
                done = list(pool.map(steps, range(workflows)))
        elif mode == "async":

            async def drive() -> list[int]:
                todo = iter(range(workflows))
                out: list[int] = []

                async def worker() -> None:
                    for n in todo:
                        out.append(await steps_async(n))

                await asyncio.gather(*(worker() for _ in range(concurrency)))
                return out

            done = asyncio.run(drive())
        else:  # enqueued before the span, as trioq's jobs are: the first C wait for the gate
            queue = DBOS.register_queue("bench", worker_concurrency=concurrency,
                                        polling_interval_sec=0.01)  # fmt: skip
            gate.clear()
            handles = [queue.enqueue(gated_steps, n) for n in range(workflows)]
            _started()
            gate.set()
            done = [h.get_result() for h in handles]
        found = _span()
    finally:
        DBOS.destroy()
    assert sorted(done) == list(range(workflows)), "every workflow ran once"
    found["jobs"] = workflows
    return found


def run_signal(dsn: str, signals: int, gap_ms: float, mode: str) -> dict[str, Any]:
    rng = random.Random(15)
    latencies: list[float] = []
    calls: list[float] = []
    _launch(dsn, 10)
    workflow = waiter if mode == "sync" else waiter_async
    try:
        for i in range(-1, signals):  # -1: warms both sides, not counted
            ready[i] = threading.Event()
            with SetWorkflowID(f"waiter-{i}"):
                handle = DBOS.start_workflow(workflow, i)
            ready[i].wait()
            time.sleep(gap_ms * rng.uniform(0.5, 1.5) / 1000)
            t0 = time.perf_counter()
            DBOS.send(handle.workflow_id, {"n": i}, "go")
            calls.append(time.perf_counter() - t0)
            handle.get_result()
            latencies.append(woke[i] - t0)
    finally:
        DBOS.destroy()
    return {"latencies_ms": [x * 1e3 for x in latencies[1:]],
            "signal_call_ms": [x * 1e3 for x in calls[1:]]}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["steps", "signal", "versions"])
    p.add_argument("--dsn", default="")
    p.add_argument("--workflows", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--mode", choices=["sync", "async", "queue"], default="sync")
    p.add_argument("--signals", type=int, default=200)
    p.add_argument("--gap", type=float, default=20.0)
    p.add_argument("--pg-pid", type=int, default=0, help="the postmaster, to read its CPU")
    a = p.parse_args()
    server[0] = a.pg_pid
    if a.command == "versions":
        import importlib.metadata

        print(json.dumps({name: importlib.metadata.version(name)
                          for name in ("dbos", "sqlalchemy", "psycopg")}))  # fmt: skip
        return
    if a.command == "steps":
        found = run_steps(a.dsn, a.workflows, a.concurrency, a.mode)
    else:
        found = run_signal(a.dsn, a.signals, a.gap, a.mode)
    print(json.dumps(found))


if __name__ == "__main__":
    main()
