"""The scheduler: promotes scheduled jobs when they fall due, and fires cron ticks.

It sleeps until the earliest scheduled job or cron tick (at most `MAX_SLEEP` in a fleet of
up to four workers; in a bigger one, a `fleet_gap` of it: the fleet's rounds promote every
process's due jobs, so the fleet still makes about four idle rounds every `MAX_SLEEP`), or
until woken: by a notification that a job was enqueued for later, or by the completer
after a retry or snooze.

`fire_due` enqueues each due tick of the entries exactly once across any number of
processes: the tick's ``cron_ticks`` row is inserted (``ON CONFLICT DO NOTHING``) in the
same transaction as its job, so whichever process inserts the row enqueues the job and
every other one sees the conflict. What an entry does at a given time is `trioq._cron`'s
arithmetic (`decide`).

The entries are the code's (``Config.cron``) and the database's (``cron_entries``,
`trioq._cron_store`), read at the first round, again after `cron_changed` (an ``@cron``
notification, the listener reconnected) and every ``poll_interval``. A database entry
named like a code entry is not run (the code's wins: logged once); a row trioq cannot serve
is skipped (logged once per version of the row); a disabled one is not run. A database
entry's tick is claimed only if its row is still the one read (`fire_due`'s ``versions``),
so a removal stops its ticks in every process as soon as it commits.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs
import trio

from ..._cron import (
    TICK_RETENTION,
    CronEntry,
    check_entries,
    check_now,
    decide,
    dedup_key,
    next_fire_time,
)
from ..._cron_store import MAX_STORED_ENTRIES, StoredCronEntry, read_entries
from ..._db.statements import Statements, statements
from ..._pg.conn import Conn
from ..._pg.pool import Pool
from ..._queue import Queue
from ..._unique import Unique
from ..wakeup import Wakeup
from .loop import every, fleet_gap

__all__ = ["MAX_SLEEP", "CronSet", "Fired", "ScheduleRound", "Scheduler", "fire_due", "union"]

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
    #: Whether this round read the database's entries (else it used those read before).
    read_entries: bool = False
    #: The entries it ran, by name, and the database's it skipped (broken, or named like
    #: an entry of the code).
    cron: CronSet | None = None


@attrs.frozen(kw_only=True)
class CronSet:
    """The entries a scheduler runs: the code's and the database's, by name."""

    entries: tuple[CronEntry, ...] = ()
    #: The database entries' versions (``updated_at``), which `fire_due` fences ticks by.
    versions: Mapping[str, dt.datetime] = attrs.field(factory=dict)
    #: Database entries not run: broken (name -> why), shadowed by a code entry.
    broken: Mapping[str, str] = attrs.field(factory=dict)
    shadowed: tuple[str, ...] = ()
    disabled: tuple[str, ...] = ()


def union(code: Sequence[CronEntry], stored: Sequence[StoredCronEntry]) -> CronSet:
    """The entries to run: every code entry, and each enabled, servable database entry
    whose name no code entry has."""
    names = {entry.name for entry in code}
    entries, versions, broken = list(code), {}, {}
    shadowed, disabled = [], []
    for row in stored:
        if row.name in names:
            shadowed.append(row.name)
        elif row.entry is None:
            broken[row.name] = row.error or "broken"
        elif not row.enabled:
            disabled.append(row.name)
        else:
            entries.append(row.entry)
            versions[row.name] = row.updated_at
    return CronSet(entries=tuple(sorted(entries, key=lambda e: e.name)), versions=versions,
                   broken=broken, shadowed=tuple(shadowed), disabled=tuple(disabled))  # fmt: skip


class Scheduler:
    def __init__(
        self, pool: Pool, queue: Queue, cron: Sequence[CronEntry], *, poll_interval: float,
        on_due: Callable[[str], None], fleet: Callable[[], int] = lambda: 1,
    ) -> None:  # fmt: skip
        self._pool = pool
        self._fleet = fleet  # the fleet's size, as the sweeper last counted it
        self._queue = queue
        self._cron = tuple(cron)
        self._poll_interval = poll_interval
        self._on_due = on_due  # a queue got due jobs: wake its fetcher
        self._wakeup = Wakeup()
        self._set = CronSet(entries=tuple(sorted(self._cron, key=lambda e: e.name)))
        self._read_at: float | None = None  # trio.current_time() of the last read
        self._reported: set[tuple[str, str]] = set()  # (name, what) already logged

    def wake(self) -> None:
        """Run a round now: a job may have become due sooner than the scheduler thought."""
        self._wakeup.set()

    def cron_changed(self) -> None:
        """The database's entries may have changed (``@cron``, or the listener reconnected
        and may have missed one): read them in a round now."""
        self._read_at = None
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
            sleep = fleet_gap(MAX_SLEEP, self._fleet())
            if due_in is not None:
                sleep = min(sleep, max(due_in.total_seconds(), 0.0))
            read = await self._read_entries(conn)
            cron = self._set
            if cron.entries:
                now = await self._queue.driver.clock(conn)
                fired = await fire_due(conn, self._queue, cron.entries, now=now,
                                       versions=cron.versions)  # fmt: skip
                upcoming = next_fire_time(cron.entries, now)
                if upcoming is not None:
                    sleep = min(sleep, max((upcoming - now).total_seconds(), 0.0))
        return ScheduleRound(promoted=tuple(promoted), fired=tuple(fired), sleep=sleep,
                             read_entries=read, cron=cron)  # fmt: skip

    async def _read_entries(self, conn: Conn) -> bool:
        """Read the database's entries if they may have changed or ``poll_interval`` has
        passed since the last read; whether it read them."""
        clock = trio.current_time()
        if self._read_at is not None and clock - self._read_at < self._poll_interval:
            return False
        stored = await read_entries(conn, self._queue.sql, limit=MAX_STORED_ENTRIES + 1,
                                    max_payload_bytes=self._queue.max_payload_bytes)  # fmt: skip
        self._read_at = clock
        if len(stored) > MAX_STORED_ENTRIES:
            self._report("", "too many", "cron: the database has more than %d entries: "
                         "only the first %d by name run", MAX_STORED_ENTRIES, MAX_STORED_ENTRIES)
            stored = stored[:MAX_STORED_ENTRIES]
        self._set = union(self._cron, stored)
        for name in self._set.shadowed:
            self._report(name, "shadowed", "cron entry %r of the database is not run: an entry "
                         "of this worker's code has its name (the code's wins)", name)
        for name, why in self._set.broken.items():
            version = next(r.updated_at for r in stored if r.name == name)
            self._report(name, f"broken {version.isoformat()}", "cron entry %r of the database "
                         "is skipped, it cannot be served: %s", name, why)
        return True

    def _report(self, name: str, what: str, message: str, *args: object) -> None:
        """Log a warning once per entry and finding (not every round)."""
        if (name, what) not in self._reported:
            self._reported.add((name, what))
            cron_logger.warning(message, *args)


async def fire_due(
    conn: Conn, queue: Queue, entries: Iterable[CronEntry], *, now: dt.datetime,
    versions: Mapping[str, dt.datetime] | None = None,
) -> list[Fired]:  # fmt: skip
    """Enqueue the due tick of each entry, once across all processes; return those fired here.

    ``now`` is the database clock (`trioq._db.statements.Statements.clock`). Each tick is
    decided in its own ``conn.transaction()`` (a savepoint if the caller has a
    transaction open): its ``cron_ticks`` row is inserted and, only if this
    call inserted it, the job is enqueued and its id stored in the row. ``versions``: the
    ``updated_at`` each database entry was read at; its tick is claimed only while the row
    is still there, enabled and unchanged (entries not named there are the code's).
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
    versions = versions or {}
    for entry in checked:
        decision = decide(entry, last.get(entry.name), now)
        if decision is None:
            continue
        tick, fire = decision
        version = versions.get(entry.name)
        if fire:
            if (job := await _fire(conn, queue, st, entry, tick, version=version)) is not None:
                fired.append(job)
        elif await _record(conn, st, entry.name, tick, version) and entry.name in last:
            cron_logger.info(
                "cron entry %r: tick %s missed by %s (misfire_grace %s): skipped",
                entry.name, tick.isoformat(), now - tick, entry.misfire_grace,
            )  # fmt: skip
    return fired


async def _record(
    conn: Conn, st: Statements, name: str, tick: dt.datetime, version: dt.datetime | None
) -> bool:
    """Insert the tick's row; False if some process already recorded this tick (or the
    database entry read at ``version`` was removed, disabled or replaced since)."""
    params = {"name": name, "tick": tick, "keep": TICK_RETENTION, "version": version}
    cur = await conn.execute(st.cron_record_tick, params)
    return await cur.fetchone() is not None


async def _fire(
    conn: Conn, queue: Queue, st: Statements, entry: CronEntry, tick: dt.datetime, *,
    version: dt.datetime | None,
) -> Fired | None:
    async with conn.transaction():
        if not await _record(conn, st, entry.name, tick, version):
            return None
        result = await queue.enqueue(
            conn, entry.task, entry.args, queue=entry.queue, priority=entry.priority,
            max_attempts=entry.max_attempts,
            unique=Unique(key=dedup_key(entry.name, tick), by_task=False),  # key:cron:...
        )  # fmt: skip
        params = {"job_id": result.job_id, "name": entry.name, "tick": tick}
        await conn.execute(st.cron_set_job, params)
    return Fired(name=entry.name, tick=tick, job_id=result.job_id)
