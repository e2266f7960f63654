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

Task names are data (a row inserted by hand, an enqueue by name): every counter keyed by a
task takes its label value from `TaskLabels`, so the series stay bounded whatever the rows
say (docs/observability.md#task-names).
"""

from __future__ import annotations

import bisect
import collections
import logging
import time
from collections.abc import Iterable, Mapping

import attrs
import trio

from .._db.statements import statements
from .._job import Job
from .._pg.pool import Pool, PoolStatistics
from .depth import Depths, read_depths
from .history import Cell

__all__ = [
    "CLAIM_BUCKETS",
    "MAX_TASK_LABELS",
    "OTHER_TASK",
    "ClaimMeter",
    "DepthSample",
    "DepthSampler",
    "QueueGauges",
    "Sample",
    "TaskLabels",
]

logger = logging.getLogger("trioq.metrics")

#: Upper bounds of the claim batch size histogram.
CLAIM_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
#: A depth sample that takes longer than this is abandoned (the last one is shown).
DEPTH_TIMEOUT = 5.0
#: Task names no registered task has that get a label value of their own (the first seen),
#: as the depth sample shows 500 queues at most (`MAX_DEPTH_QUEUES`); the others are counted
#: under `OTHER_TASK`.
MAX_TASK_LABELS = 500
#: The task label value of the names beyond the cap: no task can be named so (a task name
#: starts with a letter or '_').
OTHER_TASK = "(other)"
#: Folded names are counted exactly up to this many (one hash each), then stay at it.
MAX_FOLDED_COUNTED = 100_000


class TaskLabels:
    """The task label value of a task name: the name itself when a registered task has it
    or when it is one of the first `cap` other names seen; else `OTHER_TASK`, and the name
    is counted in `folded`. Memory stays bounded: the names with a label of their own, and
    one hash per folded name (up to `MAX_FOLDED_COUNTED`)."""

    def __init__(self, registered: Iterable[str], cap: int = MAX_TASK_LABELS) -> None:
        self._own = set(registered)  # the names whose label value is themselves
        self._room = self.cap = cap  # how many unregistered names may still join them
        self._folded: set[int] = set()

    def __call__(self, task: str) -> str:
        return task if task in self._own else self._other(task)

    def _other(self, task: str) -> str:
        if self._room > 0 and task != OTHER_TASK:
            self._room -= 1
            self._own.add(task)
            return task
        if len(self._folded) < MAX_FOLDED_COUNTED:
            self._folded.add(hash(task))
        return OTHER_TASK

    @property
    def folded(self) -> int:
        """How many distinct task names are shown as `OTHER_TASK`."""
        return len(self._folded)


class ClaimMeter:
    """Jobs claimed per (queue, task), and the size of every claim per queue."""

    def __init__(self, labels: TaskLabels) -> None:
        self._label = labels
        self.jobs: collections.Counter[tuple[str, str]] = collections.Counter()
        self.sizes: dict[str, list[int]] = {}  # per queue: one count per bucket, then +Inf
        self.size_sums: collections.Counter[str] = collections.Counter()

    def claimed(self, queue: str, jobs: list[Job]) -> None:
        if not jobs:
            return
        label = self._label  # once per task name of the batch, not per job
        if len(jobs) == 1:
            self.jobs[queue, label(jobs[0].task)] += 1
        else:
            for task, n in collections.Counter(job.task for job in jobs).items():
                self.jobs[queue, label(task)] += n
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
    #: (queue, "sleeping" | "waiting") -> durable jobs parked (a subset of "scheduled")
    parked: Mapping[tuple[str, str], int] = attrs.field(factory=dict)


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
    task_labels_folded: int  # distinct task names shown as OTHER_TASK
    task_label_cap: int  # unregistered task names with a label value of their own, at most


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
                    depths = await self.run_once()
                except Exception as ex:  # the database, mostly; Cancelled is not an Exception
                    logger.warning("reading the queue depths failed: %s", ex)
                else:
                    self.last = DepthSample(
                        taken_at=time.time(), counts=depths.counts, head_wait=depths.head_wait,
                        errors=self._errors, seconds=time.perf_counter() - started,
                        parked=depths.parked,
                    )  # fmt: skip
                    return self.last
            self._errors += 1
            self.last = attrs.evolve(self.last, errors=self._errors)
            return self.last

    async def run_once(self) -> Depths:
        """One sample: (queue, state) -> count, queue -> the head job's wait in seconds, and
        the parked durable jobs."""
        async with self._pool.connection() as conn:
            return await read_depths(conn, self._sql, self.cap)
