"""trioq's side of `bench/bench_peers.py`, run by /work/venv/bin/python in its own process.

    trioq_worker.py install  --dsn DSN
    trioq_worker.py prefill  --dsn DSN --jobs N
    trioq_worker.py drain    --dsn DSN --jobs N --concurrency C [--cprofile FILE] [--stats]
                             [--prototype NAME[+NAME]] [--global-concurrency G]
    trioq_worker.py versions

``drain`` runs one worker (``trioq.serve`` under ``trio.run``, default settings except the
queue's concurrency) until every job's outcome is written, then stops it. Its stdout follows
the protocol in `_probe`.

``--stats`` wraps ``Queue.claim``, ``Queue.complete_many`` and ``Completer.submit`` (in this
process only; nothing under trioq/ is changed) and prints ``STATS {json}`` at exit: how many
statements, how many rows each, how long they took, how long job tasks waited to hand over
their outcome, and how much of the drain had a claim or a complete in flight. It costs a few
microseconds per job: use it to explain a number, not to measure one.

``--prototype`` applies changes sketched in `trioq_prototypes` (monkeypatched here only).
``--global-concurrency`` sets that limit on the queue (``QueueConfig``): the limited claim.
"""

from __future__ import annotations

import cProfile
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from _probe import Probe, say, say_versions, worker_parser

import trioq

QUEUE = "bench"
TASK = "noop"

tasks = trioq.Registry()
probe = Probe()
all_seen: list[trio.Event] = []  # drain() puts one here, inside trio.run


@tasks.task(name=TASK, queue=QUEUE)
async def noop(job: trioq.JobContext, n: int) -> None:
    probe.hit(job.id)
    if probe.all_seen:
        all_seen[0].set()


async def install(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)


async def prefill(dsn: str, jobs: int) -> None:
    specs = [trioq.JobSpec(task=TASK, queue=QUEUE, args={"n": i}) for i in range(jobs)]
    async with await trioq.connect(dsn, autocommit=True) as conn:
        t0 = time.perf_counter()
        await trioq.enqueue_many(conn, specs)
        say(f"PREFILLED {time.perf_counter() - t0:.6f}")


#: Whether any job is left: with --share, a process stops once none is.
LEFT = "SELECT EXISTS (SELECT 1 FROM trioq.jobs)"


async def drain(
    dsn: str, jobs: int, concurrency: int, limit: int | None = None, share: bool = False
) -> None:
    probe.reset(0 if share else jobs)
    all_seen[:] = [trio.Event()]
    queue = trioq.QueueConfig(concurrency=concurrency)
    if limit is not None:  # only then: a baseline trioq has no such field
        queue = trioq.QueueConfig(concurrency=concurrency, global_concurrency=limit)
    config = trioq.Config(registry=tasks, dsn=dsn, queues={QUEUE: queue})
    async with trio.open_nursery() as nursery:
        runtime = await nursery.start(trioq.serve, config)
        say("READY")
        if share:  # one of several processes: until no job is left (polled every 5 ms)
            async with await trioq.connect(dsn, autocommit=True) as conn:
                while await (await conn.execute(LEFT)).fetchone() != (False,):  # noqa: ASYNC110
                    await trio.sleep(0.005)
            probe.all_done()
        else:
            await all_seen[0].wait()
            # the runtime has no event for "outcomes written": poll its counter (1 ms, tail)
            while runtime.statistics().outcomes_written < jobs:  # noqa: ASYNC110
                await trio.sleep(0.001)
        runtime.stop()
    probe.done()


class Stats:
    """Intervals of the runtime's claim / complete statements and outcome hand-overs."""

    def __init__(self) -> None:
        self.spans: dict[str, list[tuple[float, float, int]]] = {
            "claim": [], "complete": [], "submit": []
        }  # fmt: skip

    def wrap(self, owner: Any, method: str, kind: str, rows: Callable[..., int]) -> None:
        original: Callable[..., Awaitable[Any]] = getattr(owner, method)
        spans = self.spans[kind]

        async def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            result = await original(*args, **kwargs)
            spans.append((t0, time.perf_counter(), rows(result, *args, **kwargs)))
            return result

        setattr(owner, method, timed)

    def install(self) -> None:
        from trioq._db.driver import Driver  # private: what the runtime claims and completes with
        from trioq._worker.completer import Completer  # private: no public name for it

        self.wrap(Driver, "claim", "claim", lambda result, *a, **k: len(result))
        self.wrap(Driver, "complete_many", "complete", lambda r, *a, **k: len(k["leases"]))
        self.wrap(Completer, "submit", "submit", lambda r, *a, **k: 1)

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        first = min((s[0] for spans in self.spans.values() for s in spans), default=0.0)
        last = max((s[1] for spans in self.spans.values() for s in spans), default=0.0)
        out["wall_s"] = last - first
        for kind, spans in self.spans.items():
            durations = sorted(e - s for s, e, _ in spans)
            rows = [n for _, _, n in spans]
            out[kind] = {
                "calls": len(spans),
                "rows": sum(rows),
                "rows_per_call": sum(rows) / len(spans) if spans else 0,
                "total_s": sum(durations),
                "median_ms": durations[len(durations) // 2] * 1e3 if durations else 0,
                "busy_s": _union(spans),
            }
        out["claim_or_complete_busy_s"] = _union(self.spans["claim"] + self.spans["complete"])
        out["claim_and_complete_overlap_s"] = (
            out["claim"]["busy_s"] + out["complete"]["busy_s"] - out["claim_or_complete_busy_s"]
        )
        sizes = sorted(n for _, _, n in self.spans["claim"])
        out["claim_sizes_pct"] = {
            str(q): sizes[min(len(sizes) - 1, len(sizes) * q // 100)] for q in (10, 50, 90)
        } if sizes else {}  # fmt: skip
        return out


def _union(spans: list[tuple[float, float, int]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e, _ in sorted(spans):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def main() -> None:
    p = worker_parser()
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--cprofile", help="drain: write a cProfile of the whole process here")
    p.add_argument("--stats", action="store_true", help="drain: print statement statistics")
    p.add_argument("--prototype", help="drain: trioq_prototypes to apply, joined with +")
    p.add_argument("--global-concurrency", type=int, help="drain: a global concurrency limit")
    a = p.parse_args()
    if a.prototype:
        import trioq_prototypes

        trioq_prototypes.apply(a.prototype.split("+"))
    stats = Stats() if a.stats else None
    if stats is not None:
        stats.install()
    if a.command == "versions":
        say_versions(["trioq", "trio", "psycopg", "psycopg-binary"])
    elif a.command == "install":
        trio.run(install, a.dsn)
    elif a.command == "prefill":
        trio.run(prefill, a.dsn, a.jobs)
    elif a.cprofile:
        profiler = cProfile.Profile()
        profiler.runcall(trio.run, drain, a.dsn, a.jobs, a.concurrency, a.global_concurrency,
                         a.share)
        profiler.dump_stats(a.cprofile)
    else:
        trio.run(drain, a.dsn, a.jobs, a.concurrency, a.global_concurrency, a.share)
    if stats is not None:
        say("STATS " + json.dumps(stats.report()))


if __name__ == "__main__":
    main()
