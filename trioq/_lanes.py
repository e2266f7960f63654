"""The lanes both kinds of shared transaction run in (``docs/transactions.md``).

A worker keeps ``Config.shared_transactions`` lanes for ``job.transaction(shared=True)``
(`trioq._job_transaction.SharedTransactions`) and as many for
``job.complete_with(..., shared=True)`` (`trioq._complete_with.SharedCompletions`): each
lane is one transaction at a time on a connection of the app pool, holding at most
``Config.shared_transaction_jobs`` jobs, fenced and completed for the worker that owns
their leases. A job joins the least busy lane.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from ._pg.pool import Pool
from ._queue import Queue

__all__ = ["Lanes"]

L = TypeVar("L")


class Lanes(Generic[L]):
    """``lanes`` lanes (each a `LANE`) on ``pool``, for the jobs ``owner`` leases in
    ``queue``'s schema, at most ``max_jobs`` in one transaction."""

    #: What one lane holds (a subclass's own class).
    LANE: Callable[[], L]

    def __init__(
        self, pool: Pool, queue: Queue, owner: str, *, lanes: int, max_jobs: int
    ) -> None:
        self._pool = pool
        self._queue = queue
        self._owner = owner
        self._lanes = [self.LANE() for _ in range(lanes)]
        self.max_jobs = max_jobs

    def _least_busy(self, load: Callable[[L], int]) -> L:
        return min(self._lanes, key=load)
