"""procrastinate's side of `bench/bench_peers.py`, run by the Python of a throwaway venv.

    procrastinate_worker.py install  --dsn DSN
    procrastinate_worker.py prefill  --dsn DSN --jobs N
    procrastinate_worker.py drain    --dsn DSN --jobs N --concurrency C
    procrastinate_worker.py versions

``drain`` runs one worker (``App.run_worker_async`` with ``wait=False``, which returns once
no job is left, and the given ``concurrency``; everything else procrastinate's defaults:
``PsycopgConnector`` and its pool, LISTEN/NOTIFY on, finished jobs kept as ``succeeded``)
under ``asyncio.run``, as ``procrastinate worker`` does. procrastinate fetches and finishes
one job per statement: it has no batch setting. Its stdout follows the protocol in `_probe`.
"""

from __future__ import annotations

import asyncio
import time

import procrastinate
from _probe import Probe, say, say_versions, worker_parser

QUEUE = "bench"
TASK = "noop"

probe = Probe()


def make_app(dsn: str) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    async def noop(context: procrastinate.JobContext, n: int) -> None:
        assert context.job is not None
        probe.hit(context.job.id)

    # A call, not a decorator: mypy checks this file where procrastinate is not installed
    # (Any), and an untyped decorator would leave noop unchecked.
    app.task(name=TASK, queue=QUEUE, pass_context=True)(noop)
    return app


async def install(dsn: str) -> None:
    app = make_app(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def prefill(dsn: str, jobs: int) -> None:
    app = make_app(dsn)
    async with app.open_async():
        task = app.tasks[TASK]
        t0 = time.perf_counter()
        await task.batch_defer_async(*({"n": i} for i in range(jobs)))
        say(f"PREFILLED {time.perf_counter() - t0:.6f}")


async def drain(dsn: str, jobs: int, concurrency: int) -> None:
    probe.reset(jobs)
    app = make_app(dsn)
    async with app.open_async():
        say("READY")
        await app.run_worker_async(
            queues=[QUEUE], concurrency=concurrency, wait=False, install_signal_handlers=False
        )
    probe.done()


def main() -> None:
    p = worker_parser()
    p.add_argument("--concurrency", type=int, default=10)
    a = p.parse_args()
    if a.command == "versions":
        say_versions(["procrastinate", "psycopg", "psycopg-binary", "psycopg-pool"])
    elif a.command == "install":
        asyncio.run(install(a.dsn))
    elif a.command == "prefill":
        asyncio.run(prefill(a.dsn, a.jobs))
    else:
        asyncio.run(drain(a.dsn, a.jobs, a.concurrency))


if __name__ == "__main__":
    main()
