"""The one interval loop around a service's ``run_once``.

Every maintenance service keeps its work in one ``run_once()`` that returns what the round
did (tests call it directly, instead of waiting for timers: River's ``runOnce``), and runs
it through `every`: a round, then a wait, for as long as the service's owner nursery lives.
A round that fails is logged and the next one tries again; trio's ``Cancelled`` is not an
``Exception``, so a stop always goes through. A service stopped before its first round, or
twice, has nothing to undo: all it holds is this loop.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

import psycopg
import trio

from ..._pg.errors import connection_fault
from ..wakeup import Wakeup

__all__ = ["every"]

logger = logging.getLogger("trioq.runtime")

R = TypeVar("R")


async def every(
    interval: float | Callable[[R | None], float],
    run_once: Callable[[], Awaitable[R]],
    *,
    failed: str,
    wakeup: Wakeup | None = None,
    wait_first: bool = False,
    tracebacks: bool = False,
) -> NoReturn:
    """Run ``run_once`` for ever, waiting ``interval`` seconds between rounds.

    ``interval`` may be a function of the last round's result (None when it failed), for a
    service that knows when it is next needed. A ``wakeup`` ends a wait early (a
    notification, new work). ``wait_first``: wait before the first round too. A failed
    round is logged as ``"<failed>: <error>"`` (WARNING); with ``tracebacks``, errors that
    do not come from the database are logged with their traceback (ERROR): a bug in a
    service's input (a cron entry, say) must not stop the workers, nor hide.
    """
    result: R | None = None
    if wait_first:
        await _wait(interval if isinstance(interval, float | int) else interval(None), wakeup)
    while True:
        try:
            result = await run_once()
        except Exception as ex:  # the database, mostly; Cancelled is not an Exception
            result = None
            if tracebacks and not _from_the_database(ex):
                logger.exception("%s", failed)
            else:
                logger.warning("%s: %s", failed, ex)
        await _wait(interval if isinstance(interval, float | int) else interval(result), wakeup)


async def _wait(seconds: float, wakeup: Wakeup | None) -> None:
    if wakeup is None:
        await trio.sleep(seconds)
        return
    with trio.move_on_after(seconds):
        await wakeup.wait()


def _from_the_database(ex: Exception) -> bool:
    """The database failed (not the statement's input): no traceback is worth logging."""
    return isinstance(ex, psycopg.OperationalError) or connection_fault(ex) is not None
