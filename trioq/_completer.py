"""The completer: batches job outcomes into one fenced statement per kind.

The runtime's slots hand each job's `Outcome` to `Completer.submit` (a bounded
channel, so a slow database slows the claiming down instead of piling up memory). The run
loop takes whatever is waiting, up to `MAX_BATCH`, and writes it: complete,
keep, fail, release and cancelled each in one statement. A database error
keeps the batch and retries it with backoff: outcomes are never dropped (if the
process dies first, the leases expire and the sweeper returns the jobs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import trio

from ._job import Lease
from ._outcome import Kind, Outcome
from ._pool import Pool
from ._queue import Queue

__all__ = ["Completer"]

logger = logging.getLogger("trioq.runtime")

MAX_BATCH = 500
RETRY_MIN, RETRY_MAX = 0.05, 2.0


class Completer:
    def __init__(
        self,
        pool: Pool,
        queue: Queue,
        owner: str,
        *,
        capacity: int,
        written: Callable[[Sequence[Outcome]], None],
    ) -> None:
        self._pool = pool
        self._queue = queue
        self._owner = owner
        self._written = written
        self._send, self._receive = trio.open_memory_channel[Outcome](capacity)
        self.batches = 0
        self.outcomes = 0
        self.finished = trio.Event()  # set when run() has written everything and returned

    async def submit(self, outcome: Outcome) -> None:
        """Hand over one outcome; waits only while the channel is full.

        No checkpoint when there is room: the caller (a slot, once per job)
        checkpoints when it takes its next job, and a yield here would cost
        one more trip through trio's scheduler per job.
        """
        try:
            self._send.send_nowait(outcome)
        except trio.WouldBlock:
            await self._send.send(outcome)

    async def close(self) -> None:
        """No more outcomes: `run` returns once everything submitted is written."""
        await self._send.aclose()

    async def run(self) -> None:
        async with self._receive:
            async for first in self._receive:
                batch = [first]
                while len(batch) < MAX_BATCH:
                    try:
                        batch.append(self._receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                await self._write_until_done(batch)
        self.finished.set()

    async def _write_until_done(self, batch: list[Outcome]) -> None:
        delay = RETRY_MIN
        while True:
            try:
                await self._write(batch)
            except psycopg.Error as ex:
                logger.warning("writing %d job outcomes failed, retrying: %s", len(batch), ex)
                await trio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                continue
            self.batches += 1
            self.outcomes += len(batch)
            self._written(batch)
            return

    async def _write(self, batch: list[Outcome]) -> None:
        by_kind: dict[Kind, list[Outcome]] = {}
        for outcome in batch:
            by_kind.setdefault(outcome.kind, []).append(outcome)
        q, owner = self._queue, self._owner
        async with self._pool.connection() as conn:
            for kind, items in by_kind.items():
                await _write_kind(conn, q, owner, kind, items)


async def _write_kind(conn: Any, q: Queue, owner: str, kind: Kind, items: list[Outcome]) -> None:
    leases: list[Lease] = [o.lease for o in items]
    if kind is Kind.COMPLETE:
        await q.complete_many(conn, owner=owner, leases=leases)
    elif kind is Kind.KEEP:
        await q.complete_many(conn, owner=owner, leases=leases, results=[o.result for o in items])
    elif kind is Kind.FAIL:
        failures = [o.failure for o in items if o.failure is not None]
        await q.fail_many(conn, owner=owner, failures=failures)
    elif kind is Kind.RELEASE:
        await q.release_many(conn, owner=owner, leases=leases, delays=[o.delay for o in items])
    elif kind is Kind.CANCELLED:
        await q.cancel_running_many(conn, owner=owner, leases=leases)
