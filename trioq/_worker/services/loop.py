"""The one interval loop around a service's ``run_once``.

Every maintenance service keeps its work in one ``run_once()`` that returns what the round
did (tests call it directly, instead of waiting for timers: River's ``runOnce``), and runs
it through `every`: a round, then a wait, for as long as the service's owner nursery lives.
A round that fails is logged and the next one tries again; trio's ``Cancelled`` is not an
``Exception``, so a stop always goes through. A service stopped before its first round, or
twice, has nothing to undo: all it holds is this loop.

A task the whole fleet shares (any process's round does it for all) waits a `fleet_gap`
between rounds: its interval in a small fleet, a longer random one in a big fleet, so the
fleet's rounds stay about `CHECKS` an interval whatever its size.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

import psycopg
import trio

from ..._pg.errors import connection_fault
from ..wakeup import Wakeup

__all__ = ["CHECKS", "every", "fleet_gap"]

logger = logging.getLogger("trioq.runtime")

R = TypeVar("R")

#: How many times the whole fleet runs a task it shares (the dead-worker check, per
#: ``Config.liveness_interval``; the expired-lease sweep; the scheduler's idle round) per
#: interval of that task, whatever its size (`fleet_gap`).
CHECKS = 4


def fleet_gap(interval: float, workers: int, draw: Callable[[], float] = random.random) -> float:
    """How long one process waits before its next round of a task the whole fleet shares
    (the dead-worker check, the expired-lease sweep, the scheduler's idle round), in a
    fleet of ``workers``: ``interval`` while the fleet has at most `CHECKS` workers; else a
    random point (``draw()`` in [0, 1)) of a span from a half to one and a half times ``interval x
    workers / CHECKS``, so the fleet runs it `CHECKS` times an interval on average, spread
    out."""
    if workers <= CHECKS:
        return interval
    return interval * workers / CHECKS * (0.5 + draw())


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
