"""Every part of a worker process, built from its `Config`: the one place that knows them all.

`Services` makes the pools, the `Queue` and its `Driver`, the handler lanes, the executor,
the completer and the maintenance services (``trioq/_worker/services/``), each with the
settings of the config and the callbacks of the `Runtime` it serves (`RuntimeHooks`); it
starts them in the runtime's services nursery (`Services.start`, in the order drawn in
``docs/architecture.md``), flushes what must be written at a stop (`Services.flush`), and
shows what they did (the banner, `Services.sample` for ``/metrics``). The runtime keeps
only its own state: the queues it serves, the jobs it holds, its stop.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

import attrs
import trio

from .._complete_with import SharedCompletions
from .._config import Config, parse_address
from .._context import JobServices
from .._db.migrate import check_current
from .._db.statements import CLEAR_CLOCK, GENERIC_PLANS, session_reset
from .._hooks import EventDispatcher
from .._job_transaction import SharedTransactions
from .._obs.history import History
from .._obs.metrics import ClaimMeter, DepthSampler, QueueGauges, Sample, TaskLabels
from .._obs.prometheus import MetricsServer, trioq_version
from .._outcome import Outcome
from .._pg.pool import Pool
from .._pg.times import TOLERANT
from .._progress import ProgressBuffer
from .._queue import Queue
from .banner import banner
from .completer import Completer
from .execute import Executor
from .leases import HeldJobs
from .pooling import OWN_PREPARE_THRESHOLD, prepare_threshold, session_dsn
from .services.aging import Aging
from .services.governor import Governor
from .services.heartbeat import Heartbeat
from .services.history_writer import HistoryWriter
from .services.lifecycle import Lifecycle
from .services.listener import Listener
from .services.liveness import Liveness
from .services.progress import ProgressWriter
from .services.pruner import Pruner
from .services.scheduler import Scheduler
from .services.stranded import Stranded
from .services.sweeper import Sweeper
from .services.vacuumer import Vacuumer
from .tracing import Tracing
from .tracing import enabled as tracing_enabled
from .watchdog import Watchdog

__all__ = ["FLUSH_TIMEOUT", "RuntimeHooks", "Services"]

logger = logging.getLogger("trioq.runtime")

#: Bound on each shielded cleanup at shutdown (outcomes, history, events).
FLUSH_TIMEOUT = 10.0


@attrs.frozen(kw_only=True)
class RuntimeHooks:
    """What the services call back in the `Runtime` they serve."""

    #: Every job the process holds a lease on (the heartbeat extends them).
    held: HeldJobs
    #: A notification's payload: a queue got work, a job for later, a cancel, settings.
    wake: Callable[[str], None]
    #: Claim everywhere (the listener reconnected, jobs were returned).
    wake_all: Callable[[], None]
    #: How many handlers run now (the liveness ping reports it).
    running: Callable[[], int]
    #: The completer wrote these outcomes.
    written: Callable[[Sequence[Outcome]], None]
    #: A queue was paused: give back what was claimed for it and not started.
    release_buffered: Callable[[str], Awaitable[None]]
    #: Each served queue's slots, busy and buffered (``/metrics``).
    gauges: Callable[[], tuple[QueueGauges, ...]]


class Services:
    """The parts of one worker process (see the module docs)."""

    def __init__(self, config: Config, dsn: str, runtime: RuntimeHooks) -> None:
        self.config = config
        self.dsn = dsn
        owner = config.worker_id
        served = config.served_queues()
        #: LISTEN and the liveness lock: never through a transaction pooler
        #: (`trioq._worker.pooling`).
        self.session_dsn = session_dsn(config, dsn)
        threshold = prepare_threshold(config, dsn, self.session_dsn)
        self.prepared = threshold is not None
        pooled = {"autocommit": True, "prepare_threshold": threshold}
        #: trioq's own statements read times Python cannot hold as the ends of its range, and
        #: are prepared at their first run (`OWN_PREPARE_THRESHOLD`).
        own_threshold = None if threshold is None else OWN_PREPARE_THRESHOLD
        own = {**pooled, "prepare_threshold": own_threshold, "context": TOLERANT}
        #: Claims, outcomes, heartbeats and maintenance: never starved by handlers. Neither
        #: pool's clock can be moved (``trioq.now`` unset on every connection they open).
        #: On a direct connection, trioq's statements are planned once (`GENERIC_PLANS`).
        direct = self.prepared and self.session_dsn == dsn
        self.pool = Pool(dsn, max_size=config.pool_size, connect_kwargs=own,
                         setup=[CLEAR_CLOCK, *([GENERIC_PLANS] if direct else [])])  # fmt: skip
        #: For handlers (``job.connection()``, ``job.transaction()``, ``job.enqueue()``):
        #: each user gets a session as clean as a new one, but for its prepared statements
        #: (`session_reset`, which unsets ``trioq.now`` too).
        self.app_pool = Pool(dsn, max_size=config.app_pool_size, connect_kwargs=pooled,
                             reset=session_reset(config.schema))  # fmt: skip
        self.queue = Queue(schema=config.schema, max_payload_bytes=config.max_payload_bytes)
        driver = self.queue.driver
        lanes = {"lanes": config.shared_transactions, "max_jobs": config.shared_transaction_jobs}
        self.shared = SharedTransactions(self.app_pool, self.queue, owner, **lanes)
        self.completions = SharedCompletions(self.app_pool, self.queue, owner, **lanes)
        #: What ``job.progress()`` recorded and the progress writer has not written yet.
        self.progress = ProgressBuffer()
        self.executor = Executor(
            config.registry,
            JobServices(app_pool=self.app_pool, queue=self.queue, owner=owner,
                        committing=runtime.held.committing, shared=self.shared,
                        shared_by_default=config.group_commit,
                        completions=self.completions,
                        max_result_bytes=config.max_result_bytes, progress=self.progress,
                        max_progress_bytes=config.max_progress_bytes),
            sync_threads=config.sync_threads,
            tracing=Tracing() if tracing_enabled(config.tracing) else None,
            max_result_bytes=config.max_result_bytes,
        )  # fmt: skip
        self.completer = Completer(
            self.pool, driver, owner, capacity=sum(q.concurrency for q in served.values()),
            written=runtime.written,
            unknown_task_timeout=dt.timedelta(seconds=config.unknown_task_timeout),
            progress=self.progress,
        )  # fmt: skip
        self.events = EventDispatcher(
            config.registry.hooks.callbacks, timeout=config.hook_timeout,
            concurrency=config.hook_concurrency, buffer=config.hook_buffer,
        )  # fmt: skip
        #: The task label values of every counter (``/metrics``): bounded, whatever the rows say.
        self.task_labels = TaskLabels(task.name for task in config.registry)
        self.lifecycle = Lifecycle(self.events, self.pool, config.schema, self.task_labels)
        self.heartbeat = Heartbeat(
            self.pool, driver, runtime.held, owner=owner, lease=config.lease,
            interval=config.heartbeat_interval, on_lost=self.lifecycle.lease_lost,
        )  # fmt: skip
        self.progress_writer = ProgressWriter(
            self.pool, driver, self.progress, owner=owner, interval=config.progress_interval,
            committing=runtime.held.is_committing,
        )  # fmt: skip
        self.sweeper = Sweeper(
            self.pool, driver, interval=config.sweep_interval,
            reclaim_interval=config.liveness_interval, grace=config.liveness_grace,
            on_returned=runtime.wake_all, on_swept=self.lifecycle.swept,
        )  # fmt: skip
        held = runtime.held
        self.liveness = Liveness(
            self.session_dsn, self.pool, driver, name=owner,
            queues={name: q.concurrency for name, q in served.items()},
            interval=config.liveness_interval, running=runtime.running,
            holding=lambda: len(held) > 0,
            on_taken_for_dead=self.heartbeat.wake,  # which leases are lost: cancel those now
            connect_kwargs={"prepare_threshold": own_threshold},
        )  # fmt: skip
        sweeper = self.sweeper
        self.scheduler = Scheduler(self.pool, self.queue, config.cron,
                                   poll_interval=config.poll_interval, on_due=runtime.wake,
                                   fleet=lambda: sweeper.workers)  # fmt: skip
        self.watchdog = Watchdog(threshold=config.loop_blocked_warning)
        self.listener = Listener(self.session_dsn, driver, on_notify=runtime.wake,
                                 on_listening=self._listening)  # fmt: skip
        #: Fed by the runtime's `written`, written by its own service.
        self.history = History(self.task_labels)
        self.history_writer = HistoryWriter(
            self.pool, config.schema, self.history, interval=config.history_interval,
            retention=config.history_retention,
        )  # fmt: skip
        self.pruner = None if config.prune_interval is None else Pruner(
            self.pool, self.queue.sql, interval=config.prune_interval, batch=config.prune_batch,
            retain_done=config.retain_done, retain_cancelled=config.retain_cancelled,
            retain_dead=config.retain_dead,
        )  # fmt: skip
        self.stranded = None if config.stranded_interval is None else Stranded(
            self.pool, self.queue.sql, interval=config.stranded_interval
        )
        completer = self.completer
        self.vacuumer = None if config.vacuum_interval is None else Vacuumer(
            self.pool, self.queue.sql, interval=config.vacuum_interval,
            threshold=config.vacuum_threshold, churn=lambda: completer.outcomes,
        )  # fmt: skip
        self.governor = Governor(
            self.pool, self.queue, served, poll_interval=config.poll_interval,
            on_change=runtime.wake, on_paused=runtime.release_buffered,
        )  # fmt: skip
        self.aging = Aging(self.pool, self.queue, list(served),
                           has_work=self.governor.has_work)  # fmt: skip
        #: Claims per queue and task, and their sizes (only when metrics are served).
        self.meter = None if config.metrics is None else ClaimMeter(self.task_labels)
        #: Failed claims per queue (the fetchers count them; ``/metrics`` shows them).
        self.claim_errors: collections.Counter[str] = collections.Counter()
        self.metrics_url: str | None = None  # where /metrics is served, once serving
        self._runtime = runtime
        self._schema_version = 0  # checked at start

    def _listening(self) -> None:
        """LISTEN is (again) active: a notification may have been missed meanwhile, so
        claim everywhere and read the database's cron entries again."""
        self._runtime.wake_all()
        self.scheduler.cron_changed()

    @asynccontextmanager
    async def pools(self) -> AsyncIterator[None]:
        """The two pools, open for the life of the worker."""
        async with self.pool, self.app_pool:
            yield

    async def check_schema(self) -> None:
        """Refuse to start on a schema of another version (raised)."""
        async with self.pool.connection() as conn:
            self._schema_version = await check_current(conn, self.config.schema)

    async def start(self, nursery: trio.Nursery) -> None:
        """Start every service in ``nursery``: the liveness lock, LISTEN and the queue
        settings first (each is ready when this returns; an error is raised), then the
        rest, and the metrics server last."""
        await nursery.start(self.liveness.run)
        await nursery.start(self.listener.run)
        await nursery.start(self.governor.run)
        for run in (self.completer.run, self.heartbeat.run, self.progress_writer.run,
                    self.sweeper.run,
                    self.scheduler.run, self.watchdog.run, self.history_writer.run,
                    self.events.run, self.lifecycle.run, self.aging.run):  # fmt: skip
            nursery.start_soon(run)
        if self.pruner is not None:
            nursery.start_soon(self.pruner.run)
        if self.stranded is not None:
            nursery.start_soon(self.stranded.run)
        if self.vacuumer is not None:
            nursery.start_soon(self.vacuumer.run)
        if self.config.metrics is not None:
            self.metrics_url = await nursery.start(self._serve_metrics)

    async def flush(self) -> None:
        """At a stop, after the last job: write every outcome submitted, the job history,
        and the events (each shielded and bounded)."""
        # A cancel from outside (after a graceful stop began) ends the services too: each
        # sets `finished` then, undrained, and the flush goes on at once.
        with trio.move_on_after(FLUSH_TIMEOUT, shield=True):
            await self.completer.close()
            await self.completer.finished.wait()
        if not self.completer.drained:
            logger.warning("%d job outcomes not written at shutdown: their leases will expire",
                           len(self._runtime.held))  # fmt: skip
        with trio.move_on_after(FLUSH_TIMEOUT, shield=True):
            try:
                await self.history_writer.run_once()
            except Exception as ex:  # history is for charts: it must not fail the shutdown
                logger.warning("writing job history at shutdown failed: %s", ex)
        with trio.move_on_after(FLUSH_TIMEOUT, shield=True):
            await self.events.close()
            await self.events.finished.wait()
        if not self.events.drained:
            logger.warning("event callbacks had not finished at shutdown: %d events not "
                           "delivered", self.events.statistics().pending)  # fmt: skip

    def log_banner(self) -> None:
        """The start-up lines (`trioq._worker.banner`): where, what, and what looks wrong."""
        config = self.config
        for line in banner(
            dsn=self.dsn, schema=config.schema, version=self._schema_version,
            worker_id=config.worker_id, queues=config.served_queues(),
            registry=config.registry, metrics_url=self.metrics_url,
            session_dsn=self.session_dsn, prepared=self.prepared,
        ):  # fmt: skip
            logger.log(line.level, "%s", line.message, extra=dict(line.extra))

    async def _serve_metrics(self, *, task_status: trio.TaskStatus[str]) -> None:
        assert self.config.metrics is not None
        host, first, last = parse_address(self.config.metrics)
        depth = DepthSampler(self.pool, self.config.schema,
                             interval=self.config.metrics_depth_interval,
                             cap=self.config.metrics_depth_cap)  # fmt: skip
        server = MetricsServer(host, range(first, last + 1), sample=self.sample,
                               depth=depth, version=trioq_version())  # fmt: skip
        await server.run(task_status=task_status)

    def sample(self) -> Sample:
        """What a scrape shows (`trioq._obs.metrics`), taken at once on the trio thread."""
        meter = self.meter or ClaimMeter(self.task_labels)
        gauges = self._runtime.gauges()
        errors = self.claim_errors
        return Sample(
            worker_id=self.config.worker_id, schema=self.config.schema, queues=gauges,
            held_leases=len(self._runtime.held), history=self.history.totals(),
            claimed=dict(meter.jobs), claim_sizes={q: list(c) for q, c in meter.sizes.items()},
            claim_size_sums=dict(meter.size_sums),
            claim_errors={g.queue: errors.get(g.queue, 0) for g in gauges},
            events=dict(self.lifecycle.counts),
            swept={"returned": self.sweeper.returned, "dead": self.sweeper.dead,
                   "cancelled": self.sweeper.cancelled},
            write_errors=self.completer.write_errors,
            outcomes_written=self.completer.outcomes,
            listener_reconnects=self.listener.reconnects,
            pools={"runtime": self.pool.statistics(), "app": self.app_pool.statistics()},
            hooks=attrs.asdict(self.events.statistics()),
            task_labels_folded=self.task_labels.folded, task_label_cap=self.task_labels.cap,
        )  # fmt: skip
