"""`trioq.producer`'s calls: `Producer`, whose methods are `trioq.Queue`'s own run over the
caller's sync or asyncio connection (the module docs of `trioq.producer` say what for)."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import attrs
import psycopg

from ._batch import Batch, EnqueuedBatch
from ._db.adapters import AsyncAdapter, SyncAdapter, adapter_cache, run_sync
from ._db.statements import validate_schema_name
from ._job import DEFAULT_MAX_PAYLOAD, check_max_payload
from ._pg.conn import Conn
from ._queue import Queue
from ._rules import rule
from ._workflow import Workflow, WorkflowJobs

__all__ = [
    "Producer",
    "aenqueue",
    "aenqueue_batch",
    "aenqueue_bulk",
    "aenqueue_many",
    "aenqueue_workflow",
    "asignal",
    "enqueue",
    "enqueue_batch",
    "enqueue_bulk",
    "enqueue_many",
    "enqueue_workflow",
    "signal",
]

P = ParamSpec("P")
R = TypeVar("R")

_SYNC_KINDS = (
    "a psycopg.Connection, a SQLAlchemy Session or Connection (postgresql+psycopg), or "
    "Django's connection (its psycopg 3 backend)"
)
_ASYNC_KINDS = (
    "a psycopg.AsyncConnection, or a SQLAlchemy AsyncSession or AsyncConnection "
    "(postgresql+psycopg)"
)


async def _enqueue_workflow(
    queue: Queue, conn: Conn, workflow: Workflow, *, notify: bool = True
) -> WorkflowJobs:
    """Enqueue ``workflow`` (a `trioq.Workflow`): every job and edge in one transaction, the
    caller's if one is open (``docs/workflows.md``)."""
    if not isinstance(workflow, Workflow):
        raise TypeError(f"workflow must be a trioq.Workflow, got {workflow!r}")
    return await workflow.enqueue(conn, queue=queue, notify=notify)


async def _enqueue_batch(
    queue: Queue, conn: Conn, batch: Batch, *, notify: bool = True
) -> EnqueuedBatch:
    """Enqueue ``batch`` (a `trioq.Batch`) and its jobs in one transaction, the caller's if
    one is open; its callback runs once they have all ended (``docs/workflows.md``)."""
    if not isinstance(batch, Batch):
        raise TypeError(f"batch must be a trioq.Batch, got {batch!r}")
    return await batch.enqueue(conn, queue=queue, notify=notify)


def _signature(call: Callable[..., Any], method: Callable[..., Any], *, name: str) -> None:
    """Give the method ``call`` the parameters and docstring of `trioq.Queue`'s ``method``,
    with ``self`` a `Producer` and ``conn`` positional, for ``help()`` and the docs."""
    parameters = list(inspect.signature(method).parameters.values())
    parameters[:2] = [inspect.Parameter(p, inspect.Parameter.POSITIONAL_ONLY)
                      for p in ("self", "conn")]  # fmt: skip
    call.__signature__ = inspect.signature(method).replace(  # type: ignore[attr-defined]
        parameters=parameters
    )
    call.__name__ = name
    call.__qualname__ = f"Producer.{name}"
    call.__doc__ = method.__doc__


def _sync(
    method: Callable[Concatenate[Queue, Conn, P], Awaitable[R]],
) -> Callable[Concatenate[Producer, Any, P], R]:
    """``method`` of `trioq.Queue`, run to its end over a sync connection."""

    def call(self: Producer, conn: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        adapter = self._sync_adapter(_sync_connection(conn))
        coro = method(self.queue, cast(Conn, adapter), *args, **kwargs)
        return run_sync(cast("Coroutine[Any, Any, R]", coro))

    _signature(call, method, name=method.__name__)
    return call


def _async(
    method: Callable[Concatenate[Queue, Conn, P], Awaitable[R]],
) -> Callable[Concatenate[Producer, Any, P], Awaitable[R]]:
    """``method`` of `trioq.Queue` over an async connection, in the caller's event loop."""

    async def call(self: Producer, conn: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        adapter = self._async_adapter(await _async_connection(conn))
        return await method(self.queue, cast(Conn, adapter), *args, **kwargs)

    _signature(call, method, name=f"a{method.__name__}")
    return call


@attrs.frozen(kw_only=True)
class Producer:
    """Enqueue into trioq's tables in ``schema`` from sync or asyncio code, in the caller's
    transaction. The module's functions are the methods of ``Producer()``."""

    schema: str = attrs.field(default="trioq", validator=rule(validate_schema_name))
    max_payload_bytes: int = attrs.field(
        default=DEFAULT_MAX_PAYLOAD, validator=rule(check_max_payload)
    )
    queue: Queue = attrs.field(init=False, repr=False, eq=False)
    _sync_adapter: adapter_cache[SyncAdapter] = attrs.field(
        factory=lambda: adapter_cache(SyncAdapter), init=False, repr=False, eq=False
    )
    _async_adapter: adapter_cache[AsyncAdapter] = attrs.field(
        factory=lambda: adapter_cache(AsyncAdapter), init=False, repr=False, eq=False
    )

    @queue.default
    def _queue(self) -> Queue:
        return Queue(schema=self.schema, max_payload_bytes=self.max_payload_bytes)

    enqueue = _sync(Queue.enqueue)
    enqueue_many = _sync(Queue.enqueue_many)
    enqueue_bulk = _sync(Queue.enqueue_bulk)
    enqueue_workflow = _sync(_enqueue_workflow)
    enqueue_batch = _sync(_enqueue_batch)
    signal = _sync(Queue.signal)

    aenqueue = _async(Queue.enqueue)
    aenqueue_many = _async(Queue.enqueue_many)
    aenqueue_bulk = _async(Queue.enqueue_bulk)
    aenqueue_workflow = _async(_enqueue_workflow)
    aenqueue_batch = _async(_enqueue_batch)
    asignal = _async(Queue.signal)


# -- the caller's connection ------------------------------------------------------------------


def _sync_connection(conn: object) -> psycopg.Connection[Any]:
    """The sync psycopg connection behind ``conn``, or a `TypeError` saying what is taken."""
    raw: object = conn
    if isinstance(conn, psycopg.AsyncConnection):
        raise TypeError(
            f"{conn!r} is an async connection: await the a-prefixed call (aenqueue, ...)"
        )
    module = type(conn).__module__
    if module.startswith("sqlalchemy."):
        raw = _sqlalchemy_sync(conn)
    elif module.startswith("django."):
        raw = _django(conn)
    if not isinstance(raw, psycopg.Connection):
        raise TypeError(f"conn must be {_SYNC_KINDS}, got {conn!r}")
    return raw


def _sqlalchemy_sync(conn: object) -> object:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

    if isinstance(conn, AsyncSession | AsyncConnection):
        raise TypeError(
            f"{conn!r} is an async connection: await the a-prefixed call (aenqueue, ...)"
        )
    if isinstance(conn, Session):
        conn = conn.connection()  # the session's transaction begins, if it had not
    if isinstance(conn, Connection):
        # As any statement on it would: else its commit() would commit nothing, and its
        # pool would roll the job back.
        if not conn.in_transaction():
            conn.begin()
        return conn.connection.dbapi_connection
    return conn


def _django(conn: Any) -> object:
    if getattr(conn, "vendor", None) != "postgresql":
        raise TypeError(f"conn must be {_SYNC_KINDS}, got a Django {conn.vendor!r} connection")
    conn.ensure_connection()
    return conn.connection


async def _async_connection(conn: object) -> psycopg.AsyncConnection[Any]:
    """The async psycopg connection behind ``conn``, or a `TypeError`."""
    raw: object = conn
    if isinstance(conn, psycopg.Connection):
        raise TypeError(f"{conn!r} is a sync connection: call enqueue (no a- prefix)")
    if type(conn).__module__.startswith("sqlalchemy.") and "sqlalchemy.ext.asyncio" in sys.modules:
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

        if isinstance(conn, AsyncSession):
            conn = await conn.connection()
        if isinstance(conn, AsyncConnection):
            if not conn.in_transaction():
                await conn.begin()
            raw = (await conn.get_raw_connection()).driver_connection
    if not isinstance(raw, psycopg.AsyncConnection):
        raise TypeError(f"conn must be {_ASYNC_KINDS}, got {conn!r}")
    return raw


DEFAULT_PRODUCER = Producer()

enqueue = DEFAULT_PRODUCER.enqueue
enqueue_many = DEFAULT_PRODUCER.enqueue_many
enqueue_bulk = DEFAULT_PRODUCER.enqueue_bulk
enqueue_workflow = DEFAULT_PRODUCER.enqueue_workflow
enqueue_batch = DEFAULT_PRODUCER.enqueue_batch
signal = DEFAULT_PRODUCER.signal
aenqueue = DEFAULT_PRODUCER.aenqueue
aenqueue_many = DEFAULT_PRODUCER.aenqueue_many
aenqueue_bulk = DEFAULT_PRODUCER.aenqueue_bulk
aenqueue_workflow = DEFAULT_PRODUCER.aenqueue_workflow
aenqueue_batch = DEFAULT_PRODUCER.aenqueue_batch
asignal = DEFAULT_PRODUCER.asignal
