"""Group-commit enqueue for trio apps with many concurrent producers (``docs/producers.md``).

``async with trioq.open_group_producer(pool) as producer:`` starts ``flushers`` tasks in a
nursery of its own. ``await producer.enqueue(task, args, ...)`` (`trioq.enqueue`'s
parameters, less the connection) checks the job in the caller's task, exactly as
`trioq.enqueue` does, hands it over a bounded channel and waits. A flusher takes every job
waiting (up to ``max_batch``), inserts them in one transaction on one of the pool's
connections through `trioq._db.insert.many` (the rules of `enqueue_many`: one statement when
only args differ, COPY or unnest otherwise, dedup twins, one notification per queue), commits,
and wakes each caller with its own result. While one flusher commits, the next batch gathers:
a round trip and an fsync serve a whole batch, not one job.

Each caller's job is its own:

- A job that fails in the database (a trigger, a constraint) fails only its caller: a batch
  whose statement fails rolled back as a whole, so its jobs go again one transaction each.
- A connection that breaks before the COMMIT was sent committed nothing: the batch goes
  again, once, on another connection.
- A connection that breaks during the COMMIT leaves the outcome unknown: each of that
  batch's callers gets `trioq.CommitUnknownError` (a ``dedup_key`` makes a retry safe).
- A caller cancelled before a flusher took its job withdraws it; one cancelled after may
  still see its job commit (as when any COMMIT is in flight).

Leaving the block stops taking jobs and lets the flushers finish what they hold.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar

import attrs
import psycopg
import trio

from ._db import insert
from ._enqueue import DEFAULT_QUEUE
from ._exceptions import CommitUnknownError
from ._job import EnqueueResult, JobSpec, check_payload
from ._obs.carrier import carrier
from ._pg.conn import Conn
from ._pg.pool import Pool
from ._queue import Queue
from ._rules import int_at_most

__all__ = ["GroupProducer", "GroupProducerStatistics", "open_group_producer"]

P = ParamSpec("P")
R = TypeVar("R")

#: Jobs one batch takes at most, by default.
DEFAULT_MAX_BATCH = 1000
#: Batches in flight at once, by default (each on a connection of the pool).
DEFAULT_FLUSHERS = 4
MAX_BATCH = 100_000
MAX_FLUSHERS = 256


@attrs.define(eq=False)
class _Request:
    spec: JobSpec
    trace: str | None
    notify: bool
    done: trio.Event = attrs.field(factory=trio.Event)
    result: EnqueueResult | None = None
    error: BaseException | None = None
    taken: bool = False
    abandoned: bool = False


@attrs.frozen(kw_only=True)
class GroupProducerStatistics:
    """What a `GroupProducer` has done so far."""

    jobs: int  # enqueued (committed), duplicates included
    batches: int  # transactions committed
    largest_batch: int
    retried_alone: int  # jobs sent again in a transaction of their own after a batch failed
    waiting: int  # jobs handed over and not yet taken by a flusher


def _spec_parameters(
    method: Callable[Concatenate[Queue, Conn, P], Awaitable[R]],
) -> Callable[Concatenate[GroupProducer, P], Awaitable[R]]:
    """`GroupProducer.enqueue`, with the parameters (and docs) of `Queue.enqueue` less its
    connection."""
    signature = inspect.signature(method)
    positional = ("task", "args")
    keywords = frozenset(signature.parameters) - {"self", "conn"}

    async def call(self: GroupProducer, /, *args: P.args, **kwargs: P.kwargs) -> R:
        # JobSpec's defaults are enqueue's (tests/test_group_producer.py checks), so only
        # what the caller gave goes in; `bind` (slow: a third of a job's CPU) only to word
        # a wrong call as `trioq.enqueue` would.
        given: dict[str, Any] = dict(kwargs)
        given.update(zip(positional, args, strict=False))
        if (len(args) > 2 or not keywords.issuperset(kwargs) or "task" not in given
                or kwargs.keys() & positional[: len(args)]):  # fmt: skip
            _wrong_call(method, self._queue, args, kwargs)
        notify = bool(given.pop("notify", True))
        result: R = await self._submit(JobSpec(**given), notify)  # type: ignore[assignment]
        return result

    parameters = list(signature.parameters.values())
    parameters[:2] = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)]
    call.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    call.__name__ = method.__name__
    call.__qualname__ = f"GroupProducer.{method.__name__}"
    call.__doc__ = (
        "Enqueue one job (`trioq.enqueue`'s parameters, less the connection) in a batch with\n"
        "the other callers' jobs; returns once it committed (see `trioq.open_group_producer`)."
    )
    return call


def _wrong_call(method: Callable[..., Any], queue: Queue, args: Any, kwargs: Any) -> None:
    """Raise the `TypeError` that calling ``method`` with ``args`` raises (the trio path's
    words: ``Queue.enqueue() got an unexpected keyword argument ...``)."""
    # The method itself, not `Queue`'s wrapper (which binds its arguments only when awaited).
    coro = inspect.unwrap(method)(queue, None, *args, **kwargs)
    coro.close()  # pragma: no cover - only if the fast path's check and Python disagree
    raise TypeError(f"enqueue() cannot take {args!r}, {kwargs!r}")


class GroupProducer:
    """Concurrent enqueues coalesced into one transaction per batch; made by
    `open_group_producer`."""

    def __init__(self, pool: Pool, queue: Queue, max_batch: int, flushers: int) -> None:
        self._pool = pool
        self._queue = queue
        self._max_batch = max_batch
        self._send, self._receive = trio.open_memory_channel[_Request](max_batch * flushers)
        self._jobs = self._batches = self._largest = self._alone = 0

    enqueue = _spec_parameters(Queue.enqueue)

    def statistics(self) -> GroupProducerStatistics:
        return GroupProducerStatistics(
            jobs=self._jobs, batches=self._batches, largest_batch=self._largest,
            retried_alone=self._alone,
            waiting=self._receive.statistics().current_buffer_used,
        )  # fmt: skip

    async def _submit(self, spec: JobSpec, notify: bool) -> EnqueueResult:
        check_payload(spec.args_json, task=spec.task, max_bytes=self._queue.max_payload_bytes)
        request = _Request(spec=spec, trace=carrier(), notify=notify)
        try:
            await self._send.send(request)
        except trio.ClosedResourceError:
            raise RuntimeError("this group producer's block has ended: it takes no jobs") from None
        try:
            await request.done.wait()
        except trio.Cancelled:
            if not request.taken:
                request.abandoned = True
            raise
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    # -- the flushers --------------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        async for first in self._receive:
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    batch.append(self._receive.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            batch = [request for request in batch if not request.abandoned]
            for request in batch:
                request.taken = True
            if batch:
                await self._flush(batch)

    async def _flush(self, batch: Sequence[_Request]) -> None:
        try:
            await self._commit(batch, retries=1)
        except BaseException as exc:  # handed to each caller still waiting, then re-raised
            for request in batch:
                if not request.done.is_set():
                    request.error = RuntimeError(
                        "the group producer stopped before this job's batch committed"
                    )
                    request.error.__cause__ = exc
                    request.done.set()
            raise

    async def _commit(self, batch: Sequence[_Request], *, retries: int) -> None:
        """Insert and commit ``batch``, then wake its callers; see the module docs for what
        a failure does."""
        committing = False
        try:
            async with self._pool.connection() as conn:
                async with conn.transaction():
                    results = await self._insert(conn, batch)
                    committing = True
                committing = False
        except psycopg.Error as exc:
            await self._failed(batch, exc, retries=retries, during_commit=committing)
            return
        self._jobs += len(batch)
        self._batches += 1
        self._largest = max(self._largest, len(batch))
        for request, result in zip(batch, results, strict=True):
            request.result = result
            request.done.set()

    async def _insert(self, conn: Conn, batch: Sequence[_Request]) -> list[EnqueueResult]:
        """The batch through `enqueue_many`'s statements: one call per run of jobs with the
        same trace context and notify flag (without tracing, one call)."""
        results: list[EnqueueResult] = []
        for (trace, notify), run in itertools.groupby(batch, lambda r: (r.trace, r.notify)):
            specs = [request.spec for request in run]
            results += await insert.many(conn, self._queue.sql, specs, notify=notify,
                                         trace=trace)  # fmt: skip
        return results

    async def _failed(
        self, batch: Sequence[_Request], exc: psycopg.Error, *, retries: int, during_commit: bool
    ) -> None:
        broken = isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
        if during_commit and broken:
            for request in batch:
                request.error = CommitUnknownError(
                    f"the connection broke during the COMMIT of this job's batch ({exc}): it "
                    "may or may not be enqueued"
                )
                request.error.__cause__ = exc
                request.done.set()
        elif broken and retries > 0:
            await self._commit(batch, retries=retries - 1)  # nothing committed: again
        elif len(batch) > 1:
            self._alone += len(batch)
            for request in batch:  # rolled back as a whole: each on its own
                await self._commit([request], retries=retries)
        else:
            batch[0].error = exc
            batch[0].done.set()


@asynccontextmanager
async def open_group_producer(
    pool: Pool,
    *,
    queue: Queue | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    flushers: int = DEFAULT_FLUSHERS,
) -> AsyncIterator[GroupProducer]:
    """A `GroupProducer` on ``pool`` (``queue``: the schema and payload limit, the default
    `trioq.Queue` if not given), with ``flushers`` batches of up to ``max_batch`` jobs in
    flight; its flushers run until the block ends (see the module docs)."""
    if not isinstance(pool, Pool):
        raise TypeError(f"pool must be a trioq.pg.Pool, got {pool!r}")
    max_batch = int_at_most(MAX_BATCH, " (one transaction's jobs)")(max_batch, "max_batch")
    flushers = int_at_most(MAX_FLUSHERS, " (each holds a connection)")(flushers, "flushers")
    producer = GroupProducer(pool, queue if queue is not None else DEFAULT_QUEUE, max_batch,
                             flushers)  # fmt: skip
    async with trio.open_nursery() as nursery:
        for _ in range(flushers):
            nursery.start_soon(producer._flush_loop)
        try:
            yield producer
        finally:
            producer._send.close()  # the flushers finish what is waiting, then end
