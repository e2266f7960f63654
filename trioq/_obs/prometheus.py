"""``/metrics`` in Prometheus text format: prometheus-client's own exposition, on trio's side.

`MetricsServer` serves a private ``CollectorRegistry`` with prometheus-client's HTTP server
(``start_http_server``: the stdlib's threading WSGI server, one daemon thread, a thread per
request), started and stopped by the runtime's services nursery. No asyncio is involved,
and no HTTP is written here.

A scrape runs in the server's thread, but reads nothing there: `Collector.collect` asks the
trio thread for a `trioq._obs.metrics.Sample` (``trio.from_thread.run_sync``: a consistent
snapshot, no data race with the runtime) and for the queue depths
(``trio.from_thread.run``: `trioq._obs.metrics.DepthSampler.refresh`, cached for
``Config.metrics_depth_interval``), then builds the metric families. The names, labels and
meanings are listed in ``docs/observability.md``.
"""

from __future__ import annotations

import errno
import importlib.metadata
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import prometheus_client
import trio
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import CollectorRegistry

from .._exceptions import ListenError
from .history import BUCKETS, Cell
from .metrics import CLAIM_BUCKETS, OTHER_TASK, DepthSample, DepthSampler, Sample

__all__ = ["Collector", "MetricsServer", "trioq_version"]

logger = logging.getLogger("trioq.metrics")

#: A stop waits this long at most for the server's thread (it polls every 0.5 s).
STOP_TIMEOUT = 2.0
#: The upper bounds (seconds) of the history's buckets: 1 ms, 2 ms, ... 2^22 ms, then +Inf.
_TIME_BOUNDS = tuple(2**i / 1000 for i in range(BUCKETS - 1))

_OUTCOMES = ("completed", "retried", "dead", "cancelled")
_EVENT_COUNTERS = {
    "lease_lost": ("trioq_jobs_lease_lost", "Leases the heartbeat found taken by another "
                   "worker (their handlers were cancelled)"),
    "discarded": ("trioq_jobs_discarded", "Outcomes not written: the fenced write found the "
                  "lease no longer this worker's"),
    "unknown_task": ("trioq_jobs_unknown_task", "Jobs given back because no handler here knows "
                     "their task"),
}  # fmt: skip


class Collector:
    """Builds every trioq metric family from a `Sample` and a `DepthSample`.

    ``sample`` and ``depth`` are called from the scraping thread; they hand the work to
    the trio thread (see `MetricsServer`).
    """

    def __init__(
        self, sample: Callable[[], Sample], depth: Callable[[], DepthSample], version: str,
        cap: int,
    ) -> None:  # fmt: skip
        self._sample = sample
        self._depth = depth
        self._version = version
        self._cap = cap

    def describe(self) -> list[Metric]:
        return []  # registered without a describe-time collect (it would need the trio thread)

    def collect(self) -> Iterator[Metric]:
        sample = self._sample()
        yield from _info(sample, self._version)
        yield from _outcomes(sample)
        yield from _times(sample.history)
        yield from _claims(sample)
        yield from _gauges(sample)
        yield from _errors(sample)
        yield from _pools(sample)
        yield from _hooks(sample)
        yield from _task_labels(sample)
        yield from _depth(self._depth(), [q.queue for q in sample.queues], self._cap)


def _info(sample: Sample, version: str) -> Iterator[Metric]:
    info = InfoMetricFamily("trioq_worker", "This worker process")
    info.add_metric([], {"worker_id": sample.worker_id, "schema": sample.schema,
                         "version": version})  # fmt: skip
    yield info


def _outcomes(sample: Sample) -> Iterator[Metric]:
    by_outcome = {
        name: CounterMetricFamily(
            f"trioq_jobs_{name}", f"Jobs {name} by this worker (written to the database)",
            labels=["queue", "task"],
        )
        for name in _OUTCOMES
    }  # fmt: skip
    swept = {"dead": "swept_dead", "cancelled": "swept_cancelled"}
    extra: dict[tuple[str, str, str], int] = {}
    for (event, queue, task), n in sample.events.items():
        extra[event, queue, task] = extra.get((event, queue, task), 0) + n
    keys = set(sample.history) | {(q, t) for (e, q, t) in extra if e in swept.values()}
    for queue, task in sorted(keys):
        cell = sample.history.get((queue, task)) or Cell()
        values = {"completed": cell.completed, "retried": cell.retried, "dead": cell.dead,
                  "cancelled": cell.cancelled}  # fmt: skip
        for name, event in swept.items():
            values[name] += extra.get((event, queue, task), 0)
        for name, family in by_outcome.items():
            family.add_metric([queue, task], values[name])
    yield from by_outcome.values()
    for event, (name, help_text) in _EVENT_COUNTERS.items():
        family = CounterMetricFamily(name, help_text, labels=["queue", "task"])
        for (e, queue, task), n in sorted(extra.items()):
            if e == event:
                family.add_metric([queue, task], n)
        yield family
    yield _family(CounterMetricFamily, "trioq_jobs_swept",
                  "Jobs of dead workers or expired leases this process's sweeper returned, "
                  "moved to dead_jobs or cancelled", ["outcome"],
                  sorted(sample.swept.items()))  # fmt: skip
    yield CounterMetricFamily(
        "trioq_outcomes_written", "Job outcomes the completer wrote", value=sample.outcomes_written
    )


def _histogram(
    name: str, help_text: str, cells: Mapping[tuple[str, str], Cell], attr: str, sum_attr: str
) -> Metric:
    family = HistogramMetricFamily(name, help_text, labels=["queue", "task"])
    for (queue, task), cell in sorted(cells.items()):
        buckets = _buckets(_TIME_BOUNDS, getattr(cell, attr))
        family.add_metric([queue, task], buckets, getattr(cell, sum_attr) / 1e6)
    return family


def _times(cells: Mapping[tuple[str, str], Cell]) -> Iterator[Metric]:
    timed = {key: cell for key, cell in cells.items() if cell.runs}
    yield _histogram("trioq_job_execution_seconds", "Handler run time, start to return or "
                     "raise (runs that ran to the end)", timed, "exec_hist",
                     "exec_us_sum")  # fmt: skip
    yield _histogram("trioq_job_queue_wait_seconds", "From when the attempt was due "
                     "(max(enqueued_at, run_at)) to when its slot started it", timed,
                     "wait_hist", "wait_us_sum")  # fmt: skip


def _le(bound: float) -> str:
    """A bucket bound as Prometheus writes it (``0.001``, ``1.0``, ``+Inf``)."""
    return repr(float(bound)) if bound != float("inf") else "+Inf"


def _buckets(bounds: Iterable[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """Cumulative buckets from per-bucket ``counts`` (the last one above every bound)."""
    cumulative = 0
    buckets: list[tuple[str, float]] = []
    for bound, n in zip(bounds, counts, strict=False):
        cumulative += n
        buckets.append((_le(float(bound)), cumulative))
    buckets.append(("+Inf", cumulative + counts[-1]))
    return buckets


def _values(
    *metrics: tuple[type[CounterMetricFamily | GaugeMetricFamily], str, str, float],
) -> Iterator[Metric]:
    """Families of one value each: (kind, name, help, value)."""
    for kind, name, doc, value in metrics:
        yield kind(name, doc, value=value)


def _family(
    kind: type[CounterMetricFamily | GaugeMetricFamily], name: str, doc: str, labels: list[str],
    values: Iterable[tuple[Any, float]],
) -> Metric:  # fmt: skip
    """A family with one metric per (label value or values, value)."""
    family = kind(name, doc, labels=labels)
    for key, value in values:
        family.add_metric(list(key) if isinstance(key, tuple) else [key], value)
    return family


def _claims(sample: Sample) -> Iterator[Metric]:
    yield _family(CounterMetricFamily, "trioq_jobs_claimed", "Jobs claimed by this worker",
                  ["queue", "task"], sorted(sample.claimed.items()))  # fmt: skip
    sizes = HistogramMetricFamily(
        "trioq_claim_batch_size", "Jobs per claim statement that returned any",
        labels=["queue"],
    )  # fmt: skip
    for queue, counts in sorted(sample.claim_sizes.items()):
        sizes.add_metric([queue], _buckets(CLAIM_BUCKETS, counts),
                         float(sample.claim_size_sums.get(queue, 0)))  # fmt: skip
    yield sizes


def _gauges(sample: Sample) -> Iterator[Metric]:
    for name, doc, attr in (
        ("trioq_slots", "Slots (concurrency) per served queue", "concurrency"),
        ("trioq_slots_busy", "Slots running a handler", "busy"),
        ("trioq_prefetch_depth", "Claimed jobs waiting for a slot", "buffered"),
    ):
        yield _family(GaugeMetricFamily, name, doc, ["queue"],
                      ((q.queue, getattr(q, attr)) for q in sample.queues))  # fmt: skip
    yield GaugeMetricFamily(
        "trioq_leases_held", "Leases this worker holds: running, buffered, or outcome not "
        "written yet", value=sample.held_leases,
    )  # fmt: skip


def _errors(sample: Sample) -> Iterator[Metric]:
    yield _family(CounterMetricFamily, "trioq_claim_errors",
                  "Claim statements that failed (retried with backoff)", ["queue"],
                  sorted(sample.claim_errors.items()))  # fmt: skip
    yield from _values(
        (CounterMetricFamily, "trioq_outcome_write_errors",
         "Outcome writes that failed and were retried", sample.write_errors),
        (CounterMetricFamily, "trioq_listener_reconnects",
         "Times the LISTEN connection was lost and re-made", sample.listener_reconnects),
    )  # fmt: skip


def _pools(sample: Sample) -> Iterator[Metric]:
    pools = sorted(sample.pools.items())
    for kind, name, doc, attr in (
        (CounterMetricFamily, "trioq_pool_waits",
         "Checkouts that waited for a connection (all were in use)", "waits"),
        (CounterMetricFamily, "trioq_pool_wait_seconds",
         "Time checkouts spent waiting for a connection", "wait_seconds"),
    ):  # fmt: skip
        yield _family(kind, name, doc, ["pool"], ((p, getattr(s, attr)) for p, s in pools))
    yield _family(GaugeMetricFamily, "trioq_pool_connections", "Open connections",
                  ["pool", "state"], [((p, state), getattr(s, state)) for p, s in pools
                                      for state in ("idle", "in_use")])  # fmt: skip
    for name, doc, attr in (
        ("trioq_pool_waiting", "Tasks waiting for a connection now", "tasks_waiting"),
        ("trioq_pool_max_size", "Connections at most", "max_size"),
    ):
        yield _family(GaugeMetricFamily, name, doc, ["pool"],
                      ((p, getattr(s, attr)) for p, s in pools))  # fmt: skip


def _hooks(sample: Sample) -> Iterator[Metric]:
    results = (("ok", "delivered"), ("error", "failed"), ("timeout", "timed_out"))
    yield _family(CounterMetricFamily, "trioq_hook_callbacks",
                  "Event callbacks run, by how they ended", ["result"],
                  ((result, sample.hooks.get(key, 0)) for result, key in results))  # fmt: skip
    yield from _values(
        (CounterMetricFamily, "trioq_hook_events_dropped",
         "Events dropped because the callbacks fell behind", sample.hooks.get("dropped", 0)),
        (GaugeMetricFamily, "trioq_hook_events_pending", "Events waiting for their callbacks",
         sample.hooks.get("pending", 0)),
    )  # fmt: skip


def _task_labels(sample: Sample) -> Iterator[Metric]:
    yield from _values(
        (GaugeMetricFamily, "trioq_task_label_cap",
         f"Task names no registered task has that get a task label value of their own (the "
         f"first seen); the others are counted under task=\"{OTHER_TASK}\"",
         sample.task_label_cap),
        (GaugeMetricFamily, "trioq_task_labels_folded",
         f"Distinct task names counted under task=\"{OTHER_TASK}\"", sample.task_labels_folded),
    )  # fmt: skip


_STATES = ("waiting", "scheduled", "available", "running", "dead")


def _depth(depth: DepthSample, served: list[str], cap: int) -> Iterator[Metric]:
    """Every state of every queue seen (and of the queues this worker serves), 0 included:
    an alert on a depth needs the series to exist when it is 0."""
    counts = GaugeMetricFamily(
        "trioq_queue_depth", f"Jobs per queue and state in the database (all workers'), exact "
        f"up to {cap} (then {cap}: trioq_queue_depth_cap); scheduled: among the next {cap} due",
        labels=["queue", "state"],
    )  # fmt: skip
    queues = sorted({queue for queue, _ in depth.counts} | set(served))
    if depth.taken_at:  # no sample yet: no series (rather than zeros that are not true)
        for queue in queues:
            for state in _STATES:
                counts.add_metric([queue, state], depth.counts.get((queue, state), 0))
    yield counts
    parked = GaugeMetricFamily(
        "trioq_durable_parked", f"Durable jobs parked per queue (exact up to {cap}), of the "
        "scheduled ones: waiting for a signal or a child, or sleeping (a retry's backoff too)",
        labels=["queue", "kind"],
    )  # fmt: skip
    if depth.taken_at:
        for queue in queues:
            for kind in ("sleeping", "waiting"):
                parked.add_metric([queue, kind], depth.parked.get((queue, kind), 0))
    yield parked
    yield _family(GaugeMetricFamily, "trioq_queue_oldest_wait_seconds",
                  "How long the next job to be claimed has been due", ["queue"],
                  sorted(depth.head_wait.items()))  # fmt: skip
    yield from _values(
        (GaugeMetricFamily, "trioq_queue_depth_cap",
         "Depth counts stop at this (Config.metrics_depth_cap)", cap),
        (GaugeMetricFamily, "trioq_queue_depth_sampled_at",
         "When the depths were read (Unix time; 0: never)", depth.taken_at),
        (GaugeMetricFamily, "trioq_queue_depth_sample_seconds",
         "How long reading the depths took", depth.seconds),
        (CounterMetricFamily, "trioq_queue_depth_errors",
         "Depth samples that failed or ran over their timeout", depth.errors),
    )  # fmt: skip


def trioq_version() -> str:
    try:
        return importlib.metadata.version("trioq")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


class MetricsServer:
    """Serves ``/metrics`` on ``host:port`` while `run` runs (a service of the runtime)."""

    def __init__(
        self, host: str, ports: range, *, sample: Callable[[], Sample], depth: DepthSampler,
        version: str,
    ) -> None:  # fmt: skip
        self.host = host
        self.ports = ports  # the first free one is taken (``range(0, 1)``: any free port)
        self._sample = sample
        self._depth = depth
        self._version = version
        self.url: str | None = None

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind (an error here is raised: ``serve`` fails to start), serve until cancelled,
        then stop the server's thread (shielded, bounded)."""
        token = trio.lowlevel.current_trio_token()

        def sample() -> Sample:
            return trio.from_thread.run_sync(self._sample, trio_token=token)

        def depth() -> DepthSample:
            return trio.from_thread.run(self._depth.refresh, trio_token=token)

        registry = CollectorRegistry(auto_describe=False)
        registry.register(Collector(sample, depth, self._version, self._depth.cap))
        server, thread = await trio.to_thread.run_sync(self._start, registry)
        host = self.host if ":" not in self.host else f"[{self.host}]"
        self.url = f"http://{host}:{server.server_port}/metrics"
        try:
            task_status.started(self.url)
            await trio.sleep_forever()
        finally:
            with trio.move_on_after(STOP_TIMEOUT, shield=True):
                await trio.to_thread.run_sync(_stop, server, thread, abandon_on_cancel=True)


    def _start(self, registry: CollectorRegistry) -> tuple[Any, threading.Thread]:
        """prometheus-client's server on the first free port of `ports` (in a thread: it
        resolves the host)."""
        for port in self.ports:
            try:
                return prometheus_client.start_http_server(port, self.host, registry)
            except OSError as ex:
                if ex.errno != errno.EADDRINUSE or port == self.ports[-1]:
                    span = (f"{self.ports[0]}-{self.ports[-1]}" if len(self.ports) > 1
                            else str(self.ports[0]))  # fmt: skip
                    error = ListenError(f"metrics: cannot listen on {self.host}:{span}: "
                                        f"{ex.strerror or ex}")  # fmt: skip
                    error.errno = ex.errno
                    raise error from None
        raise AssertionError("unreachable: ports is never empty")


def _stop(server: Any, thread: threading.Thread) -> None:
    server.shutdown()  # returns once serve_forever has (it polls every 0.5 s)
    server.server_close()
    thread.join(STOP_TIMEOUT)
