"""What the Prometheus metrics show, gathered without touching the hot path.

Nothing here is a Prometheus object: the runtime keeps plain counters, and a scrape takes a
`Sample` of them on the trio thread (`trioq._obs.prometheus` turns it into metric families).

- completions, retries, deaths, cancellations, execution time and queue wait per (queue,
  task) are the job history's (`trioq._obs.history.History.totals`): already summed per
  written batch for ``job_history``, they cost the metrics nothing per job;
- claims are counted per claim (`ClaimMeter`: one dict update per job claimed, one bucket
  per batch);
- gauges (slots, busy slots, prefetch depth, leases held, pools) are read at scrape time;
- queue depths come from the database (`DepthSampler`): one bounded set of statements
  (``trioq/_db/sql/status.py``), at most every ``Config.metrics_depth_interval`` per process, and
  only when someone scrapes.
"""

from __future__ import annotations

import bisect
import collections
import logging
import time
from collections.abc import Mapping

import attrs
import trio

from .._db.statements import statements
from .._job import Job
from .._pg.pool import Pool, PoolStatistics
from .depth import read_depths
from .history import Cell

__all__ = ["CLAIM_BUCKETS", "ClaimMeter", "DepthSample", "DepthSampler", "QueueGauges", "Sample"]

logger = logging.getLogger("trioq.metrics")

#: Upper bounds of the claim batch size histogram.
CLAIM_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
#: A depth sample that takes longer than this is abandoned (the last one is shown).
DEPTH_TIMEOUT = 5.0


class ClaimMeter:
    """Jobs claimed per (queue, task), and the size of every claim per queue."""

    def __init__(self) -> None:
        self.jobs: collections.Counter[tuple[str, str]] = collections.Counter()
        self.sizes: dict[str, list[int]] = {}  # per queue: one count per bucket, then +Inf
        self.size_sums: collections.Counter[str] = collections.Counter()

    def claimed(self, queue: str, jobs: list[Job]) -> None:
        if not jobs:
            return
        self.jobs.update((queue, job.task) for job in jobs)
        counts = self.sizes.get(queue)
        if counts is None:
            counts = self.sizes[queue] = [0] * (len(CLAIM_BUCKETS) + 1)
        counts[bisect.bisect_left(CLAIM_BUCKETS, len(jobs))] += 1
        self.size_sums[queue] += len(jobs)


@attrs.frozen(kw_only=True)
class QueueGauges:
    queue: str
    concurrency: int
    busy: int  # slots running a handler
    buffered: int  # claimed jobs waiting for a slot (the prefetch)


@attrs.frozen(kw_only=True)
class DepthSample:
    """Jobs per (queue, state), each count exact up to the cap (then the cap), and how
    long the job at the head of each queue (the next to be claimed) has waited."""

    taken_at: float  # time.time() of the sample; 0.0: none yet
    counts: Mapping[tuple[str, str], int]
    head_wait: Mapping[str, float]
    errors: int  # samples that failed (or ran over DEPTH_TIMEOUT)
    seconds: float  # how long the last sample took


_NO_DEPTH = DepthSample(taken_at=0.0, counts={}, head_wait={}, errors=0, seconds=0.0)


@attrs.frozen(kw_only=True)
class Sample:
    """Everything a scrape shows but the database's depths, taken at once on the trio thread."""

    worker_id: str
    schema: str
    queues: tuple[QueueGauges, ...]
    held_leases: int
    history: Mapping[tuple[str, str], Cell]  # completed, retried, dead, cancelled, times
    claimed: Mapping[tuple[str, str], int]
    claim_sizes: Mapping[str, list[int]]
    claim_size_sums: Mapping[str, int]
    claim_errors: Mapping[str, int]
    #: (event, queue, task) -> count: lease_lost, discarded, unknown_task, swept_dead, ...
    events: Mapping[tuple[str, str, str], int]
    swept: Mapping[str, int]  # returned, dead, cancelled (by this process's sweeper)
    write_errors: int
    outcomes_written: int
    listener_reconnects: int
    pools: Mapping[str, PoolStatistics]
    hooks: Mapping[str, int]  # delivered, failed, timed_out, dropped, pending


class DepthSampler:
    """The queue depths from the database, at most once per ``interval`` (`refresh`)."""

    def __init__(self, pool: Pool, schema: str, *, interval: float, cap: int) -> None:
        self._pool = pool
        self._sql = statements(schema)
        self.interval = interval
        self.cap = cap
        self.last = _NO_DEPTH
        self._lock = trio.Lock()
        self._errors = 0

    async def refresh(self) -> DepthSample:
        """The last sample if it is recent enough, else a new one (concurrent callers share
        it). A failed or slow sample is counted and logged, and the last one kept."""
        async with self._lock:
            if time.time() - self.last.taken_at < self.interval:
                return self.last
            started = time.perf_counter()
            with trio.move_on_after(DEPTH_TIMEOUT):
                try:
                    counts, heads = await self.run_once()
                except Exception as ex:  # the database, mostly; Cancelled is not an Exception
                    logger.warning("reading the queue depths failed: %s", ex)
                else:
                    self.last = DepthSample(
                        taken_at=time.time(), counts=counts, head_wait=heads, errors=self._errors,
                        seconds=time.perf_counter() - started,
                    )  # fmt: skip
                    return self.last
            self._errors += 1
            self.last = attrs.evolve(self.last, errors=self._errors)
            return self.last

    async def run_once(self) -> tuple[dict[tuple[str, str], int], dict[str, float]]:
        """One sample: (queue, state) -> count, and queue -> the head job's wait in seconds."""
        async with self._pool.connection() as conn:
            depths = await read_depths(conn, self._sql, self.cap)
        return depths.counts, depths.head_wait
