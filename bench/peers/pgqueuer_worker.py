"""pgqueuer's side of `bench/bench_peers.py`, run by the Python of a throwaway venv.

    pgqueuer_worker.py install  --dsn DSN
    pgqueuer_worker.py prefill  --dsn DSN --jobs N
    pgqueuer_worker.py drain    --dsn DSN --jobs N --batch B [--concurrency C] [--loop L]
                                [--managers M]
    pgqueuer_worker.py versions

``drain`` runs ``--managers`` (default 1) ``QueueManager`` s in the process, each on its own
asyncpg connection (``AsyncpgDriver``, as in pgqueuer's own benchmark and docs: its
benchmark runs several managers per process for throughput), concurrently, each in
``QueueExecutionMode.drain``, which returns once the queue is empty. ``--concurrency`` is
``max_concurrent_tasks`` (0: unlimited, pgqueuer's default; pgqueuer requires it to be at
least twice the batch size). ``--loop uvloop`` (the default) is what ``pgq run`` uses when
uvloop is installed, and pgqueuer depends on it.
Its stdout follows the protocol in `_probe`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Coroutine
from typing import Any

import asyncpg
from _probe import Probe, say, say_versions, worker_parser
from pgqueuer import AsyncpgDriver, Queries, QueueManager
from pgqueuer.domain.types import QueueExecutionMode
from pgqueuer.models import Job

TASK = "noop"


async def install(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def prefill(dsn: str, jobs: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        payloads: list[bytes | None] = [json.dumps({"n": i}).encode() for i in range(jobs)]
        t0 = time.perf_counter()
        await queries.enqueue([TASK] * jobs, payloads, [0] * jobs)
        say(f"PREFILLED {time.perf_counter() - t0:.6f}")
    finally:
        await conn.close()


async def drain(
    dsn: str, jobs: int, batch: int, concurrency: int, managers: int, *, share: bool = False
) -> None:
    probe = Probe(0 if share else jobs)
    conns = [await asyncpg.connect(dsn) for _ in range(managers)]
    try:

        async def noop(job: Job) -> None:
            probe.hit(job.id)

        runs = []
        for conn in conns:
            qm = QueueManager(Queries(AsyncpgDriver(conn)))
            # A call, not a decorator: mypy checks this file where pgqueuer is not installed
            # (Any), and an untyped decorator would leave noop unchecked.
            qm.entrypoint(TASK)(noop)
            runs.append(
                qm.run(
                    batch_size=batch,
                    mode=QueueExecutionMode.drain,
                    max_concurrent_tasks=concurrency or None,
                )
            )
        say("READY")
        await asyncio.gather(*runs)  # drain mode: until its queue is empty
        if share:
            probe.all_done()
    finally:
        for conn in conns:
            await conn.close()
    probe.done()


def run(coro: Coroutine[Any, Any, None], loop: str) -> None:
    if loop == "uvloop":
        import uvloop

        uvloop.run(coro)
    else:
        asyncio.run(coro)


def main() -> None:
    p = worker_parser()
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=0, help="max_concurrent_tasks; 0: none")
    p.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    p.add_argument("--managers", type=int, default=1, help="QueueManagers, one connection each")
    a = p.parse_args()
    if a.command == "versions":
        say_versions(["pgqueuer", "asyncpg", "uvloop"])
    elif a.command == "install":
        run(install(a.dsn), a.loop)
    elif a.command == "prefill":
        run(prefill(a.dsn, a.jobs), a.loop)
    else:
        run(drain(a.dsn, a.jobs, a.batch, a.concurrency, a.managers, share=a.share), a.loop)


if __name__ == "__main__":
    main()
