"""The scheduler: promotes scheduled jobs when they fall due, and fires cron ticks.

It sleeps until the earliest scheduled job or cron tick (at most `MAX_SLEEP`), or
until woken: by a notification that a job was enqueued for later, or by the
completer after a retry or snooze.

`fire_due` enqueues each due tick of the entries exactly once across any number of
processes: the tick's ``cron_ticks`` row is inserted (``ON CONFLICT DO NOTHING``) in the
same transaction as its job, so whichever process inserts the row enqueues the job and
every other one sees the conflict. What an entry does at a given time is `trioq._cron`'s
arithmetic (`decide`).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Sequence

import attrs

from ..._cron import (
    TICK_RETENTION,
    CronEntry,
    check_entries,
    check_now,
    decide,
    dedup_key,
    next_fire_time,
)
from ..._db.statements import Statements, statements
from ..._pg.conn import Conn
from ..._pg.pool import Pool
from ..._queue import Queue
from ..._unique import Unique
from ..wakeup import Wakeup
from .loop import every

__all__ = ["MAX_SLEEP", "Fired", "ScheduleRound", "Scheduler", "fire_due"]

logger = logging.getLogger("trioq.runtime")
cron_logger = logging.getLogger("trioq.cron")

#: Longest the scheduler sleeps without a reason to wake.
MAX_SLEEP = 5.0


@attrs.frozen(kw_only=True)
class Fired:
    """A tick this call of `fire_due` enqueued: the entry, the tick (UTC), and the job."""

    name: str
    tick: dt.datetime
    job_id: int


@attrs.frozen(kw_only=True)
class ScheduleRound:
    """What one round did, and how long the scheduler may sleep after it."""

    promoted: tuple[str, ...]  # the queues that got due jobs
    fired: tuple[Fired, ...]  # cron ticks this process enqueued
    sleep: float  # seconds until the next due job or tick, at most MAX_SLEEP


class Scheduler:
    def __init__(
        self, pool: Pool, queue: Queue, cron: Sequence[CronEntry], *, poll_interval: float,
        on_due: Callable[[str], None],
    ) -> None:  # fmt: skip
        self._pool = pool
        self._queue = queue
        self._cron = tuple(cron)
        self._poll_interval = poll_interval
        self._on_due = on_due  # a queue got due jobs: wake its fetcher
        self._wakeup = Wakeup()

    def wake(self) -> None:
        """Run a round now: a job may have become due sooner than the scheduler thought."""
        self._wakeup.set()

    async def run(self) -> None:
        """Rounds until cancelled, each followed by the sleep it asks for (or woken); a
        failed round is logged, the next one follows a poll interval later. A bad cron
        entry must not stop the workers (its error is logged with its traceback)."""

        def sleep(round_: ScheduleRound | None) -> float:
            return self._poll_interval if round_ is None else round_.sleep

        await every(sleep, self.run_once, failed="scheduler failed", wakeup=self._wakeup,
                    tracebacks=True)  # fmt: skip

    async def run_once(self) -> ScheduleRound:
        """Promote due jobs, fire due cron ticks."""
        fired: list[Fired] = []
        async with self._pool.connection() as conn:
            promoted = await self._queue.driver.promote_due(conn)
            for queue in promoted:
                self._on_due(queue)
            due_in = await self._queue.driver.next_due(conn)
            sleep = MAX_SLEEP
            if due_in is not None:
                sleep = min(sleep, max(due_in.total_seconds(), 0.0))
            if self._cron:
                now = await self._queue.driver.clock(conn)
                fired = await fire_due(conn, self._queue, self._cron, now=now)
                upcoming = next_fire_time(self._cron, now)
                if upcoming is not None:
                    sleep = min(sleep, max((upcoming - now).total_seconds(), 0.0))
        return ScheduleRound(promoted=tuple(promoted), fired=tuple(fired), sleep=sleep)


async def fire_due(
    conn: Conn, queue: Queue, entries: Iterable[CronEntry], *, now: dt.datetime
) -> list[Fired]:
    """Enqueue the due tick of each entry, once across all processes; return those fired here.

    ``now`` is the database clock (`trioq._db.statements.Statements.clock`). Each tick is
    decided in its own ``conn.transaction()`` (a savepoint if the caller has a
    transaction open): its ``cron_ticks`` row is inserted and, only if this
    call inserted it, the job is enqueued and its id stored in the row.
    """
    check_now("now", now)
    checked = check_entries(entries, max_payload_bytes=queue.max_payload_bytes)
    if not checked:
        return []
    st = statements(queue.schema)
    async with conn.transaction():
        cur = await conn.execute(st.cron_last_ticks, {"names": [e.name for e in checked]})
        last: dict[str, dt.datetime] = dict(await cur.fetchall())
    fired: list[Fired] = []
    for entry in checked:
        decision = decide(entry, last.get(entry.name), now)
        if decision is None:
            continue
        tick, fire = decision
        if fire:
            if (job := await _fire(conn, queue, st, entry, tick)) is not None:
                fired.append(job)
        elif await _record(conn, st, entry.name, tick) and entry.name in last:
            cron_logger.info(
                "cron entry %r: tick %s missed by %s (misfire_grace %s): skipped",
                entry.name, tick.isoformat(), now - tick, entry.misfire_grace,
            )  # fmt: skip
    return fired


async def _record(conn: Conn, st: Statements, name: str, tick: dt.datetime) -> bool:
    """Insert the tick's row; False if some process already recorded this tick."""
    params = {"name": name, "tick": tick, "keep": TICK_RETENTION}
    cur = await conn.execute(st.cron_record_tick, params)
    return await cur.fetchone() is not None


async def _fire(
    conn: Conn, queue: Queue, st: Statements, entry: CronEntry, tick: dt.datetime
) -> Fired | None:
    async with conn.transaction():
        if not await _record(conn, st, entry.name, tick):
            return None
        result = await queue.enqueue(
            conn, entry.task, entry.args, queue=entry.queue, priority=entry.priority,
            max_attempts=entry.max_attempts,
            unique=Unique(key=dedup_key(entry.name, tick), by_task=False),  # key:cron:...
        )  # fmt: skip
        params = {"job_id": result.job_id, "name": entry.name, "tick": tick}
        await conn.execute(st.cron_set_job, params)
    return Fired(name=entry.name, tick=tick, job_id=result.job_id)
