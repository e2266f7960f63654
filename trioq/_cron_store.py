"""Cron entries stored in the database: add, replace, remove and read them.

A row of ``cron_entries`` (migration 19) is a `trioq.CronEntry` that every worker's
scheduler runs beside the entries of its code (``Config.cron``), so a periodic job does not
depend on each node's code or configuration. The rules of an entry are `CronEntry`'s,
applied once: `add_entry` takes a built (so validated) entry and stores it, and the reader
builds a `CronEntry` from each row again, so an entry that passed is the same entry
everywhere. A row that trioq cannot serve (written by hand: a schedule croniter refuses, a
zone Python does not know, args over the worker's payload limit) is read as a
`StoredCronEntry` whose ``entry`` is None and ``error`` says why; the scheduler skips it and
`trioq cron list` shows it. `trioq.Queue` exposes this (``add_cron``, ``remove_cron``,
``cron_entries``); ``docs/cron.md`` ("Entries in the database") has the decisions.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

import attrs

from ._cron import CronEntry
from ._db.statements import Statements
from ._job import check_payload, check_task_name, encode_args
from ._pg.conn import Conn

__all__ = [
    "MAX_GRACE",
    "MAX_SCHEDULE_CHARS",
    "MAX_STORED_ENTRIES",
    "StoredCronEntry",
    "add_entry",
    "read_entries",
    "remove_entry",
]

#: The longest schedule the table stores (its CHECK): far more than any real one.
MAX_SCHEDULE_CHARS = 1000
#: The longest misfire grace the table stores (its CHECK).
MAX_GRACE = dt.timedelta(days=36500)
#: The most entries of the database a scheduler runs (the first, by name); more are logged.
MAX_STORED_ENTRIES = 1000
#: Why a row is broken, cut to this many characters (a message may quote a long value).
_ERROR_CHARS = 500
#: A fixed instant at which a row's schedule is tried once when it is read (see `_probe`).
_PROBE_AT = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


@attrs.frozen(kw_only=True)
class StoredCronEntry:
    """A cron entry of the database, as read: its `CronEntry`, or (``entry`` None) why the
    row cannot be served (``error``: the same words `CronEntry` would have raised)."""

    name: str
    entry: CronEntry | None
    enabled: bool
    created_at: dt.datetime
    #: Changes with every replace: the scheduler fires a tick only if the row it read is
    #: still the row in the table (``docs/cron.md``).
    updated_at: dt.datetime
    error: str | None = None

    @property
    def broken(self) -> bool:
        return self.entry is None

    @classmethod
    def from_row(cls, row: Sequence[Any], *, max_payload_bytes: int) -> StoredCronEntry:
        """A row of `Statements.cron_entries`, judged by `CronEntry`'s rules and the payload
        limit; never raises for what the row holds."""
        name, schedule, task, args, queue, priority, max_attempts, misfire, grace = row[:9]
        timezone, enabled, created_at, updated_at = row[9:13]
        entry: CronEntry | None = None
        error: str | None = None
        try:
            entry = CronEntry(
                name=name, schedule=schedule, task=task, args=_decoded(name, args), queue=queue,
                priority=priority, max_attempts=max_attempts, misfire=misfire,
                misfire_grace=dt.timedelta(seconds=float(grace)), timezone=timezone,
            )  # fmt: skip
            check_payload(encode_args(entry.args), task=None, max_bytes=max_payload_bytes,
                          where=f"cron entry {name!r}: args")  # fmt: skip
            _probe(entry)
        except (TypeError, ValueError, OverflowError) as ex:
            entry, error = None, _cut(str(ex))
        return cls(name=name, entry=entry, enabled=bool(enabled), created_at=created_at,
                   updated_at=updated_at, error=error)  # fmt: skip


def _decoded(name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"cron entry {name!r}: args are JSON nested too deeply") from None
    except ValueError as ex:
        raise ValueError(f"cron entry {name!r}: args are not JSON: {ex}") from None


def _probe(entry: CronEntry) -> None:
    """Compute one tick each way, so a schedule that construction took but croniter cannot
    step through is found here, once, and not in every scheduler round."""
    try:
        entry.next_tick(_PROBE_AT)
        entry.latest_tick(_PROBE_AT)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError) as ex:
        raise ValueError(f"cron entry {entry.name!r}: schedule {entry.schedule!r} cannot be "
                         f"computed: {type(ex).__name__}: {ex}") from None  # fmt: skip


def _cut(text: str) -> str:
    return text if len(text) <= _ERROR_CHARS else text[: _ERROR_CHARS - 3] + "..."


def _storable(entry: CronEntry, max_payload_bytes: int) -> None:
    """What the table bounds beyond `CronEntry`'s rules, and the payload limit."""
    where = f"cron entry {entry.name!r}"
    if len(entry.schedule) > MAX_SCHEDULE_CHARS:
        raise ValueError(f"{where}: schedule is {len(entry.schedule)} characters, over the "
                         f"{MAX_SCHEDULE_CHARS} the database stores")  # fmt: skip
    if entry.misfire_grace > MAX_GRACE:
        raise ValueError(f"{where}: misfire_grace {entry.misfire_grace} is over the 100 years "
                         "the database stores")  # fmt: skip
    check_payload(encode_args(entry.args), task=None, max_bytes=max_payload_bytes,
                  where=f"{where}: args")  # fmt: skip


async def add_entry(
    conn: Conn, sql: Statements, entry: CronEntry, *, replace: bool, enabled: bool,
    max_payload_bytes: int,
) -> StoredCronEntry:  # fmt: skip
    """Store ``entry`` (an existing name only with ``replace``) and notify every worker."""
    if not isinstance(entry, CronEntry):
        raise TypeError(f"entry must be a trioq.CronEntry, got {entry!r}")
    for flag, value in (("replace", replace), ("enabled", enabled)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be a bool, got {value!r}")
    _storable(entry, max_payload_bytes)
    params = {
        "name": entry.name, "schedule": entry.schedule, "task": entry.task,
        "args": encode_args(entry.args), "queue": entry.queue, "priority": entry.priority,
        "max_attempts": entry.max_attempts, "misfire": entry.misfire,
        "misfire_grace": entry.misfire_grace, "timezone": entry.timezone, "enabled": enabled,
        "replace": replace, "channel": sql.channel,
    }  # fmt: skip
    cur = await conn.execute(sql.cron_entry_add, params)
    row = await cur.fetchone()
    if row is None:
        raise ValueError(f"cron entry {entry.name!r} is already in the database: give "
                         "replace=True (trioq cron add --replace) to change it")  # fmt: skip
    return StoredCronEntry.from_row(row, max_payload_bytes=max_payload_bytes)


async def remove_entry(conn: Conn, sql: Statements, name: str) -> bool:
    """Delete the entry ``name`` and notify every worker; False if there was none. Its
    ticks stay in ``cron_ticks`` (as a code entry's do when it leaves the configuration)."""
    check_task_name(name, "cron entry name")
    cur = await conn.execute(sql.cron_entry_remove, {"name": name, "channel": sql.channel})
    return await cur.fetchone() is not None


async def read_entries(
    conn: Conn, sql: Statements, *, max_payload_bytes: int, limit: int | None = None
) -> list[StoredCronEntry]:
    """Every entry of the database by name (at most ``limit``), each judged by
    `StoredCronEntry.from_row`."""
    cur = await conn.execute(sql.cron_entries, {"limit": limit})
    return [StoredCronEntry.from_row(row, max_payload_bytes=max_payload_bytes)
            for row in await cur.fetchall()]  # fmt: skip
