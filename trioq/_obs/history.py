"""Per-minute job history: what the outcomes a worker wrote add up to, for charts.

Finished jobs are deleted, so a dashboard cannot count them afterwards. Each worker
process keeps a `History`: per (minute, queue, task), how many runs completed, were
retried (a failed attempt that will run again), died, or were cancelled, and for every
run that executed its handler the execution time and the queue wait (from the moment
the attempt was due, ``max(enqueued_at, run_at)``, to the moment its slot started it),
as sums, maxima and a fixed log-bucket histogram (`bucket`). The runtime feeds it the
outcomes the completer has just written; `trioq._worker.services.history_writer` upserts it into
``job_history`` every few seconds, merging the histograms element-wise, and prunes rows
older than the retention.

What a batch adds up to is decided here, from the outcome and the job (`classify`):

- completed: the handler returned (the row was deleted or kept as done), or it
  completed the job in its own ``job.transaction()``;
- retried / dead: a failure, dead when it was fatal or the attempt was the last one;
- cancelled: a cancel request stopped the handler (or reached the job before it ran);
- not counted: a lost lease (not ours: the worker that has it counts the run), a
  release at shutdown or a snooze (the job is neither done nor failed).

Times: the slot takes ``time.monotonic()`` when it starts a handler and when the handler
returns (two calls per job); `record` turns them into wall-clock time once per batch.
The minute of a run is the minute its handler returned, in UTC.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import attrs

from .._job import Job
from .._outcome import CANCELLED as _CANCELLED
from .._outcome import DEAD as _DEAD
from .._outcome import DISCARDED as _DISCARDED
from .._outcome import RETRIED as _RETRIED
from .._outcome import Kind, Outcome

__all__ = [
    "BUCKETS",
    "Cell",
    "CellKey",
    "History",
    "bucket",
    "bucket_bounds_ms",
    "classify",
    "percentile_ms",
]

#: Histogram buckets: 0 is below 1 ms, bucket i (1..BUCKETS-2) from 2^(i-1) ms to 2^i ms,
#: the last from 2^(BUCKETS-2) ms (about 70 minutes) up.
BUCKETS = 24
_LAST = BUCKETS - 1
_CAP_MS = 2 ** (_LAST - 1)  # from here on: the last bucket
_COMPLETE, _KEEP = Kind.COMPLETE, Kind.KEEP
_NO_HIST: list[int] = []

#: (minute as seconds since the epoch, queue, task)
CellKey = tuple[int, str, str]

COMPLETED, RETRIED, DEAD, CANCELLED = "completed", "retried", "dead", "cancelled"


def bucket(us: int) -> int:
    """The histogram bucket of a duration of ``us`` microseconds."""
    if us < 1000:
        return 0
    return min((us // 1000).bit_length(), _LAST)


def bucket_bounds_ms(i: int) -> tuple[float, float]:
    """The range of bucket ``i`` in milliseconds: [low, high); the last one's high is inf."""
    if i == 0:
        return 0.0, 1.0
    high = float("inf") if i == _LAST else float(2**i)
    return float(2 ** (i - 1)), high


def percentile_ms(hist: Sequence[int], q: float, *, max_ms: float | None = None) -> float | None:
    """The ``q`` quantile (0..1) of a histogram, in ms; None if it is empty.

    Interpolated linearly inside the bucket it falls in, and never above ``max_ms``
    (the largest value seen) when that is given: the last bucket has no upper bound.
    """
    total = sum(hist)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(hist):
        if n and seen + n >= rank:
            low, high = bucket_bounds_ms(i)
            if high == float("inf"):
                high = max(max_ms or low, low)
            value = low + (high - low) * max(0.0, rank - seen) / n
            return value if max_ms is None else min(value, max_ms)
        seen += n
    return max_ms


_FATES = {_RETRIED: RETRIED, _DEAD: DEAD, _CANCELLED: CANCELLED}


def _classify_fate(kind: Kind, fate: str) -> str | None:
    if fate == _DISCARDED or (kind is Kind.UNKNOWN and fate == _RETRIED):
        return None
    return _FATES[fate]


def classify(outcome: Outcome) -> str | None:
    """What an outcome counts as (see the module docstring); None: not counted.

    Where the completer recorded what its write did (`Outcome.fate`), that decides: a
    discarded outcome is not counted, a failure that found a cancel request counts as
    cancelled, an unknown task counts only once it died (or was cancelled).
    """
    kind = outcome.kind
    if outcome.fate is not None:
        return _classify_fate(kind, outcome.fate)
    if kind is Kind.COMPLETE or kind is Kind.KEEP or (kind is Kind.NOTHING and outcome.committed):
        return COMPLETED
    if kind is Kind.FAIL:
        return DEAD if _dies(outcome) else RETRIED
    return CANCELLED if kind is Kind.CANCELLED else None


def _dies(outcome: Outcome) -> bool:
    """A failure that ends the job: fatal, or on its last attempt."""
    failure, job = outcome.failure, outcome.job
    if failure is None:
        return False
    return failure.fatal or (job is not None and failure.lease.attempt >= job.max_attempts)


@attrs.define
class Cell:
    """The aggregates of one (minute, queue, task)."""

    completed: int = 0
    retried: int = 0
    dead: int = 0
    cancelled: int = 0
    runs: int = 0  # runs whose handler executed: the histograms' total
    exec_us_sum: int = 0
    exec_us_max: int = 0
    exec_hist: list[int] = attrs.field(factory=lambda: [0] * BUCKETS)
    wait_us_sum: int = 0
    wait_us_max: int = 0
    wait_hist: list[int] = attrs.field(factory=lambda: [0] * BUCKETS)

    def count(self, what: str) -> None:
        if what is COMPLETED:
            self.completed += 1
        elif what is RETRIED:
            self.retried += 1
        elif what is DEAD:
            self.dead += 1
        else:
            self.cancelled += 1

    def time(self, exec_us: int, wait_us: int) -> None:
        self.runs += 1
        self.exec_us_sum += exec_us
        self.exec_us_max = max(self.exec_us_max, exec_us)
        self.exec_hist[bucket(exec_us)] += 1
        self.wait_us_sum += wait_us
        self.wait_us_max = max(self.wait_us_max, wait_us)
        self.wait_hist[bucket(wait_us)] += 1

    def add_runs(self, n: int, x_sum: float, x_max: float, w_sum: float, w_max: float) -> None:
        """``n`` completed runs already counted in the histograms: add their counts, sums
        and maxima (given in seconds)."""
        self.completed += n
        self.runs += n
        self.exec_us_sum += int(x_sum * 1_000_000)
        self.exec_us_max = max(self.exec_us_max, int(x_max * 1_000_000))
        self.wait_us_sum += int(w_sum * 1_000_000)
        self.wait_us_max = max(self.wait_us_max, int(w_max * 1_000_000))

    def merge(self, other: Cell) -> None:
        self.completed += other.completed
        self.retried += other.retried
        self.dead += other.dead
        self.cancelled += other.cancelled
        self.runs += other.runs
        self.exec_us_sum += other.exec_us_sum
        self.exec_us_max = max(self.exec_us_max, other.exec_us_max)
        self.exec_hist = [a + b for a, b in zip(self.exec_hist, other.exec_hist, strict=True)]
        self.wait_us_sum += other.wait_us_sum
        self.wait_us_max = max(self.wait_us_max, other.wait_us_max)
        self.wait_hist = [a + b for a, b in zip(self.wait_hist, other.wait_hist, strict=True)]


class History:
    """A worker's not yet written aggregates: `record` adds, `take` hands them over.

    ``label`` gives the task label value of the totals (`trioq._obs.metrics.TaskLabels`: the
    totals are kept for the life of the process, so they are kept per label value); the
    cells for ``job_history`` keep the task names as they are."""

    def __init__(self, label: Callable[[str], str] = str) -> None:
        self._label = label
        self._cells: dict[CellKey, Cell] = {}
        #: Taken, their write failed, put back: written next round, already in `_totals`.
        self._restored: dict[CellKey, Cell] = {}
        #: Everything taken so far, per (queue, task label): with `_cells`, the totals.
        self._totals: dict[tuple[str, str], Cell] = {}

    def __len__(self) -> int:
        return len(self._cells) + len(self._restored)

    def record(self, batch: Iterable[Outcome]) -> None:
        """Add the outcomes the completer has just written (outcomes without a job, which
        the runtime did not run, are skipped).

        Runs once per written batch on the worker's hot path. A batch is mostly completed
        runs of one queue and task in one minute, so those take a fast path: each run of
        them is summed in local variables (seconds, as floats) and added to its `Cell` once
        (`Cell.time` is the readable form of the same arithmetic). Everything else goes
        through `_record_one`.
        """
        cells = self._cells
        now = time.time()
        offset = now - time.monotonic()  # monotonic -> epoch seconds
        cell: Cell | None = None
        queue = task = ""
        low = high = 0.0  # the current cell's minute: [low, high) in epoch seconds
        n = 0
        x_sum = x_max = w_sum = w_max = 0.0
        x_hist = w_hist = _NO_HIST
        cap, last = _CAP_MS, _LAST
        for outcome in batch:
            job = outcome.job
            ended = outcome.ended
            if (
                job is None
                or not ended
                or not (outcome.kind is _COMPLETE or outcome.kind is _KEEP)
                or outcome.fate is not None  # discarded: not counted
            ):
                if job is not None:
                    self._record_one(outcome, job, offset, now)
                continue
            job_queue, job_task, due_us = job.history_fields()
            end = ended + offset
            if job_task != task or job_queue != queue or not low <= end < high:
                if cell is not None:
                    cell.add_runs(n, x_sum, x_max, w_sum, w_max)
                queue, task = job_queue, job_task
                low = end // 60 * 60
                high = low + 60
                key = (int(low), queue, task)
                cell = cells.get(key)
                if cell is None:
                    cell = cells[key] = Cell()
                x_hist, w_hist = cell.exec_hist, cell.wait_hist
                n = 0
                x_sum = x_max = w_sum = w_max = 0.0
            started = outcome.started
            x = ended - started
            w = started + offset - due_us * 1e-6
            if w < 0.0:  # noqa: PLR1730
                w = 0.0  # the clocks of this worker and of the database differ
            n += 1
            x_sum += x
            w_sum += w
            if x > x_max:  # noqa: PLR1730 - max() is a call: slower
                x_max = x
            if w > w_max:  # noqa: PLR1730
                w_max = w
            ms = int(x * 1000.0)
            x_hist[ms.bit_length() if ms < cap else last] += 1
            ms = int(w * 1000.0)
            w_hist[ms.bit_length() if ms < cap else last] += 1
        if cell is not None:
            cell.add_runs(n, x_sum, x_max, w_sum, w_max)

    def _record_one(self, outcome: Outcome, job: Job, offset: float, now: float) -> None:
        """An outcome off the fast path: not a completion, or not timed."""
        if (what := classify(outcome)) is None:
            return
        ended = outcome.ended  # 0.0: stopped before its handler started
        end = ended + offset if ended else now
        queue, task, due_us = job.history_fields()
        key = (int(end // 60 * 60), queue, task)
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = Cell()
        cell.count(what)
        if ended:
            started_us = int((outcome.started + offset) * 1_000_000)
            cell.time(int((ended - outcome.started) * 1_000_000), max(0, started_us - due_us))

    def take(self) -> dict[CellKey, Cell]:
        """Everything recorded (or restored) so far; the history is empty afterwards."""
        cells, self._cells = self._cells, {}
        _merge_into(self._totals, self._labelled(cells))
        if self._restored:
            restored, self._restored = self._restored, {}
            _merge_into(cells, restored.items())
        return cells

    def restore(self, cells: dict[CellKey, Cell]) -> None:
        """Put back what `take` returned (its write failed), for the next `take`."""
        _merge_into(self._restored, cells.items())

    def totals(self) -> dict[tuple[str, str], Cell]:
        """Per (queue, task label), everything recorded since the process started (whether
        written to ``job_history`` yet or not): what the Prometheus counters and histograms
        show."""
        out: dict[tuple[str, str], Cell] = {}
        _merge_into(out, self._totals.items())
        _merge_into(out, self._labelled(self._cells))
        return out

    def _labelled(self, cells: dict[CellKey, Cell]) -> Iterator[tuple[tuple[str, str], Cell]]:
        label = self._label
        return (((queue, label(task)), cell) for (_, queue, task), cell in cells.items())


def _merge_into(
    target: dict[Any, Cell], cells: Iterable[tuple[Any, Cell]]
) -> None:
    """Add each cell to ``target[key]`` (a copy where the key is new: the source stays as
    it was)."""
    for key, cell in cells:
        mine = target.get(key)
        if mine is None:
            mine = target[key] = Cell()
        mine.merge(cell)
