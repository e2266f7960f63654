"""``trioq.enqueue``, ``enqueue_many``, ``enqueue_bulk``, ``job_status``, ``result``,
``dependencies``, ``signal``: `Queue`'s methods on the default queue.

Each is the `Queue` method itself, bound to `DEFAULT_QUEUE` (schema ``trioq``) by
`on_default_queue`: its signature, types and docstring are written once, in
`trioq._queue`. `trioq.JobContext.enqueue` is bound the same way (`trioq._context`).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from ._pg.conn import Conn
from ._queue import Queue

__all__ = [
    "DEFAULT_QUEUE",
    "dependencies",
    "enqueue",
    "enqueue_bulk",
    "enqueue_many",
    "job_status",
    "result",
    "signal",
    "without_first",
]

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_QUEUE = Queue()


def without_first(
    wrapper: Callable[..., Any], method: Callable[..., Any], *, name: str, first: str = ""
) -> None:
    """Give ``wrapper`` the name, docstring and signature of ``method`` less its first
    parameter (``self``), for ``help()`` and the docs. With ``first``, the next parameter
    (``conn``) is replaced by a positional one of that name."""
    parameters = list(inspect.signature(method).parameters.values())[1:]
    if first:
        parameters[0] = inspect.Parameter(first, inspect.Parameter.POSITIONAL_ONLY)
    wrapper.__signature__ = inspect.signature(method).replace(  # type: ignore[attr-defined]
        parameters=parameters
    )
    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__doc__ = method.__doc__


def on_default_queue(
    method: Callable[Concatenate[Queue, Conn, P], Awaitable[R]],
) -> Callable[Concatenate[Conn, P], Awaitable[R]]:
    """``method`` of `DEFAULT_QUEUE`, as a function taking the connection first."""

    async def call(conn: Conn, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await method(DEFAULT_QUEUE, conn, *args, **kwargs)

    without_first(call, method, name=method.__name__)
    return call


enqueue = on_default_queue(Queue.enqueue)
enqueue_many = on_default_queue(Queue.enqueue_many)
enqueue_bulk = on_default_queue(Queue.enqueue_bulk)
job_status = on_default_queue(Queue.job_status)
result = on_default_queue(Queue.result)
dependencies = on_default_queue(Queue.dependencies)
signal = on_default_queue(Queue.signal)
