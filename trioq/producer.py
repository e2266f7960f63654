"""Enqueue from code that is not trio: Django, Flask, FastAPI, SQLAlchemy, a script.

Each call runs in the caller's own transaction on the caller's own connection, so a job
commits, or rolls back, with the caller's rows (``docs/producers.md``)::

    from trioq import producer

    with transaction.atomic():                      # Django
        order = Order.objects.create(total=total)
        producer.enqueue(connection, "send_receipt", {"order": order.id})

    async with pool.connection() as conn:           # asyncio psycopg (FastAPI)
        await producer.aenqueue(conn, "send_receipt", {"order": 7})

The sync calls (`enqueue`, `enqueue_many`, `enqueue_bulk`, `enqueue_workflow`,
`enqueue_batch`, `signal`) take a ``psycopg.Connection``, a SQLAlchemy ``Session`` or
``Connection`` on the ``postgresql+psycopg`` driver, or Django's ``connection`` on its
psycopg 3 backend. The async ones (``a`` + the same name, as Django names its async
methods) take a ``psycopg.AsyncConnection`` (asyncio's, or trioq's own), or SQLAlchemy's
``AsyncSession`` or ``AsyncConnection``.

There is one implementation of the rules: every call is `trioq.Queue`'s own (the trio
path), run over the caller's connection (`trioq._db.adapters`). So validation and its
messages, dedup keys, unique windows, ``after=``, payload limits, the schema version check,
trace context and the workers' wake-up notification are the trio path's, word for word.
`Producer` binds them to a schema other than ``trioq``.
"""

from ._metadata import fixup_module_metadata
from ._producer import Producer as Producer
from ._producer import aenqueue as aenqueue
from ._producer import aenqueue_batch as aenqueue_batch
from ._producer import aenqueue_bulk as aenqueue_bulk
from ._producer import aenqueue_many as aenqueue_many
from ._producer import aenqueue_workflow as aenqueue_workflow
from ._producer import asignal as asignal
from ._producer import enqueue as enqueue
from ._producer import enqueue_batch as enqueue_batch
from ._producer import enqueue_bulk as enqueue_bulk
from ._producer import enqueue_many as enqueue_many
from ._producer import enqueue_workflow as enqueue_workflow
from ._producer import signal as signal

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

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
