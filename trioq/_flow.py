"""Flow control as a library: queue settings, pause and resume, and the limited claim.

A queue's settings are a row of the ``queues`` table (migration 6): paused, a global
concurrency limit, a rate limit, and per-key limits of both kinds. They hold across every
process because the claim enforces them in the database (``claim_limited`` in the
migration, explained in ``docs/flow-control.md``). This module turns arguments into
parameters and rows into `QueueSettings` and `LimitedClaim`; `trioq.Queue` exposes it.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
import re
from collections.abc import Sequence
from typing import Any

import attrs

from ._db.statements import Statements
from ._job import PRIORITY_MAX, PRIORITY_MIN, Job, check_aware, check_queue_name
from ._pg.conn import Conn
from ._rules import boolean
from ._unique import to_period

__all__ = [
    "DEFAULT_AGING",
    "UNSET",
    "LimitedClaim",
    "QueueSettings",
    "RateLimit",
    "Unset",
    "age_queue",
    "change_settings",
    "check_limit",
    "poll_queues",
    "read_settings",
    "resume_due",
    "to_aging",
    "to_pause_until",
    "to_rate_limit",
]


#: Limits are int4 in the database.
LIMIT_MAX = 2**31 - 1

#: The furthest a timed pause may end, from the database's clock (the command line's
#: durations stop there too; a pause longer than that is one until resumed).
PAUSE_MAX = dt.timedelta(days=36525)
PAUSE_MAX_TEXT = "100 years"

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
#: The aging of a queue that set none: a waiting job climbs one priority level a minute
#: (docs/flow-control.md, "Aging").
DEFAULT_AGING = dt.timedelta(minutes=1)
#: The range of an aging setting (the schema's CHECK says the same).
AGING_MIN, AGING_MAX = dt.timedelta(seconds=1), dt.timedelta(days=366)
#: At most this many jobs of one priority level climb in one round of one queue.
AGE_BATCH = 1000

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE_RE = re.compile(r"\s*(\d{1,10})\s*/\s*(\d{0,10}(?:\.\d{1,9})?)\s*(ms|s|m|h|d)\s*")


class Unset(enum.Enum):
    """The default of `trioq.Queue.set_limits`: leave the setting as it is."""

    UNSET = "unset"

    def __repr__(self) -> str:
        return "UNSET"


UNSET = Unset.UNSET


def _setting_values(changes: dict[str, Any]) -> dict[str, Any]:
    """The parameters of the given settings, each checked (None: cleared, or not given)."""
    paused = changes.get("paused")
    if paused is not None and not isinstance(paused, bool):
        raise TypeError(f"paused must be a bool, got {paused!r}")
    values: dict[str, Any] = {"paused": paused}
    for field in ("global_concurrency", "key_concurrency"):
        values[field] = check_limit(changes.get(field), field)
    for field, prefix in (("rate_limit", "rate"), ("key_rate_limit", "key_rate")):
        rate = to_rate_limit(changes.get(field), field)
        values[f"{prefix}_limit"] = None if rate is None else rate.limit
        values[f"{prefix}_period"] = None if rate is None else rate.period
    aging = to_aging(changes.get("aging"), "aging")
    values["aging"] = dt.timedelta(0) if aging is None and "aging" in changes else aging
    values["fair"] = boolean(changes["fair"], "fair") if "fair" in changes else None
    return values


def to_aging(value: object, field: str = "aging") -> dt.timedelta | None:
    """None (aging off), or the wait that earns a job one priority level: a timedelta or
    seconds, 1 s to 366 days."""
    if value is None:
        return None
    if isinstance(value, dt.timedelta):
        aging = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError(f"{field} must be a finite number of seconds, got {value!r}")
        if not AGING_MIN.total_seconds() <= value <= AGING_MAX.total_seconds():
            raise ValueError(f"{field} must be between 1 s and 366 days, got {value!r} s")
        aging = dt.timedelta(seconds=value)
    else:
        raise TypeError(f"{field} must be a timedelta, seconds or None (off), got {value!r}")
    if not AGING_MIN <= aging <= AGING_MAX:
        raise ValueError(f"{field} must be between 1 s and 366 days, got {aging}")
    return aging


def check_limit(value: object, field: str) -> int | None:
    """None (no limit), or a positive int that fits the database."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field} must be a positive int or None, got {value!r}")
    if not 1 <= value <= LIMIT_MAX:
        raise ValueError(f"{field} must be between 1 and {LIMIT_MAX}, got {value}")
    return value


def to_pause_until(
    value: object, field: str = "until"
) -> tuple[dt.datetime | None, dt.timedelta | None]:
    """The end of a timed pause: an aware datetime, or a timedelta counted from the
    database's clock when the pause is written (None: until resumed). The database checks
    that the end lies after its clock and at most `PAUSE_MAX` ahead (`change_settings`)."""
    if value is None:
        return None, None
    if isinstance(value, dt.datetime):
        return check_aware(value, field), None
    if isinstance(value, dt.timedelta):
        if value <= dt.timedelta(0):
            raise ValueError(f"{field} must be a timedelta of more than 0, got {value!r}")
        if value > PAUSE_MAX:
            raise ValueError(f"{field} must be at most {PAUSE_MAX_TEXT} ahead, got {value!r}")
        return None, value
    raise TypeError(
        f"{field} must be an aware datetime.datetime, a datetime.timedelta or None, got {value!r}"
    )


def _from_epoch_us(value: int | None) -> dt.datetime | None:
    return None if value is None else _EPOCH + dt.timedelta(microseconds=value)


def _period(value: object) -> dt.timedelta:
    return to_period(value, "rate period")


def _limit(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if check_limit(value, f"rate {attribute.name}") is None:
        raise TypeError(f"rate {attribute.name} must be a positive int, got None")


@attrs.frozen
class RateLimit:
    """At most ``limit`` starts in any ``period`` (a sliding window): ``RateLimit(100, 60)``
    is 100 a minute. ``RateLimit.parse("100/1m")`` reads the command line's form."""

    limit: int = attrs.field(validator=_limit)
    period: dt.timedelta = attrs.field(converter=_period)

    @classmethod
    def parse(cls, text: str, field: str = "rate") -> RateLimit:
        """``N/PERIOD``: ``100/1m``, ``5/s``, ``10/500ms``, ``1000/1h``, ``50/1d``."""
        match = _RATE_RE.fullmatch(text) if isinstance(text, str) else None
        shown = text if len(text) <= 40 else f"{text[:40]}..."
        if match is None:
            raise ValueError(
                f"{field} {shown!r} is invalid: use N/PERIOD, e.g. 100/1m, 5/s, 10/500ms, 1000/1h"
            )
        amount = float(match[2]) if match[2] else 1.0
        seconds = amount * _UNITS[match[3]]
        try:
            return cls(int(match[1]), dt.timedelta(seconds=seconds))
        except (TypeError, ValueError) as ex:
            raise ValueError(f"{field} {shown!r}: {ex}") from None

    def __str__(self) -> str:
        seconds = self.period.total_seconds()
        for unit in ("d", "h", "m", "s"):
            amount = seconds / _UNITS[unit]
            if amount >= 1 and amount == int(amount):
                return f"{self.limit}/{int(amount)}{unit}"
        return f"{self.limit}/{round(seconds * 1000)}ms"


def to_rate_limit(value: object, field: str = "rate_limit") -> RateLimit | None:
    """None, a `RateLimit`, or its text form (``"100/1m"``)."""
    if value is None or isinstance(value, RateLimit):
        return value
    if isinstance(value, str):
        return RateLimit.parse(value, field)
    raise TypeError(f"{field} must be a trioq.RateLimit, a string like '100/1m' or None, "
                    f"got {value!r}")  # fmt: skip


@attrs.frozen(kw_only=True)
class QueueSettings:
    """A queue's flow control, as stored (every process reads the same)."""

    name: str
    paused: bool = False
    global_concurrency: int | None = None
    rate_limit: RateLimit | None = None
    key_concurrency: int | None = None
    key_rate_limit: RateLimit | None = None
    #: When a timed pause ends (UTC, the database's clock); None while not paused, or paused
    #: until resumed. A timed pause that has ended reads as not paused, even before a
    #: worker's governor has tidied its row.
    paused_until: dt.datetime | None = None
    #: The wait that earns a waiting job one priority level (None: aging is off).
    aging: dt.timedelta | None = DEFAULT_AGING
    #: Claims go round-robin across the jobs' keys (docs/flow-control.md, "Fair share").
    fair: bool = False

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> QueueSettings:
        name, paused, gc, rl, rp, kc, krl, krp, until, aging, fair = row[:11]
        return cls(
            name=name,
            paused=bool(paused),  # NULL: a name without a row (`poll_queues`)
            global_concurrency=gc,
            rate_limit=None if rl is None else RateLimit(rl, rp),
            key_concurrency=kc,
            key_rate_limit=None if krl is None else RateLimit(krl, krp),
            paused_until=_from_epoch_us(until),
            aging=DEFAULT_AGING if aging is None else (aging or None),
            fair=bool(fair),
        )

    @property
    def controlled(self) -> bool:
        """Whether claims go through the limited claim (a limit, fair share, or paused)."""
        return self.paused or self.limited or self.fair

    @property
    def limited(self) -> bool:
        return any(
            v is not None
            for v in (self.global_concurrency, self.rate_limit, self.key_concurrency,
                      self.key_rate_limit)
        )  # fmt: skip


@attrs.frozen(kw_only=True)
class LimitedClaim:
    """What a limited claim took, and why it took fewer than asked (if it did).

    ``reason``: ``paused``; ``concurrency`` (the global limit is reached); ``rate`` (the
    queue's rate window is full: it opens in ``retry_in`` seconds); ``keys`` (jobs were held
    back by per-key limits; ``retry_in``: when the first key's rate window opens, if one
    is full); ``more`` (the claim stopped scanning: claim again now); None (drained).
    """

    jobs: list[Job]
    reason: str | None = None
    retry_in: float | None = None

    @property
    def concurrency_bound(self) -> bool:
        """A concurrency limit (global or per key) decided how many jobs came back."""
        return self.reason in ("concurrency", "keys")


async def read_settings(
    conn: Conn, sql: Statements, names: Sequence[str] | None = None
) -> list[QueueSettings]:
    """The settings of ``names`` (every queue that has a row, when None), by name."""
    if names is not None:
        names = [check_queue_name(n) for n in names]
    cur = await conn.execute(sql.queue_settings, {"names": names})
    return [QueueSettings.from_row(row) for row in await cur.fetchall()]


async def poll_queues(
    conn: Conn, sql: Statements, names: Sequence[str]
) -> tuple[list[QueueSettings], frozenset[str]]:
    """A worker's poll (one statement): the settings of ``names`` (the defaults for a name
    without a row), by name, and those of ``names`` that have a job a claim could take now
    (limits and pauses aside)."""
    cur = await conn.execute(sql.queue_poll, {"names": [check_queue_name(n) for n in names]})
    rows = await cur.fetchall()
    return [QueueSettings.from_row(row) for row in rows], frozenset(r[0] for r in rows if r[11])


#: The settings `change_settings` takes, in the order of the statement's parameters.
SETTINGS = ("paused", "global_concurrency", "rate_limit", "key_concurrency", "key_rate_limit",
            "aging", "fair")  # fmt: skip


async def change_settings(
    conn: Conn, sql: Statements, name: str, changes: dict[str, Any]
) -> QueueSettings:
    """Set the given settings of ``name`` (the others stay), in one statement, and notify
    every worker. ``changes`` keys: paused, global_concurrency, rate_limit,
    key_concurrency, key_rate_limit (None clears a limit), aging (None turns it off), fair, and
    with paused, until (the end of the pause, `to_pause_until`; a pause without it, or a
    resume, clears it)."""
    check_queue_name(name)
    unknown = sorted(set(changes) - {*SETTINGS, "until"})
    if unknown:
        raise TypeError(f"unknown queue settings {unknown}")
    until = changes.get("until")
    if until is not None and changes.get("paused") is not True:
        raise ValueError("until goes with a pause (paused=True)")
    paused_until, paused_for = to_pause_until(until)
    params: dict[str, Any] = {
        "name": name, "channel": sql.channel,
        **{f"set_{field}": field in changes for field in SETTINGS},
        **_setting_values({k: v for k, v in changes.items() if k != "until"}),
        "paused_until": paused_until, "paused_for": paused_for,
    }  # fmt: skip
    cur = await conn.execute(sql.change_queue, params)
    row = await cur.fetchone()
    assert row is not None
    if row[0] is None:  # the end of the pause was refused: nothing was written
        now, end = row[12], row[13]
        raise ValueError(
            f"until {end.isoformat()} must lie after the database's clock ({now.isoformat()}) "
            f"and at most {PAUSE_MAX_TEXT} ahead of it"
        )
    return QueueSettings.from_row(row)


async def resume_due(
    conn: Conn, sql: Statements, names: Sequence[str]
) -> tuple[list[str], float | None]:
    """Resume the queues among ``names`` whose timed pause has ended on the database's
    clock, and notify every worker if there were any (a newer pause is left alone): the
    queues resumed, and in how many seconds the next timed pause of ``names`` ends."""
    cur = await conn.execute(sql.resume_due, {"names": list(names), "channel": sql.channel})
    row = await cur.fetchone()
    assert row is not None
    resumed, ends_in, _ = row
    return list(resumed), None if ends_in is None else max(float(ends_in), 0.0)


async def age_queue(conn: Conn, sql: Statements, queue: str, *, limit: int = AGE_BATCH) -> int:
    """One round of aging for ``queue`` (docs/flow-control.md, "Aging"): how many waiting
    jobs climbed. At most ``limit`` jobs of each priority level; rows a claim holds are
    skipped (the next round takes them)."""
    params = {"queue": check_queue_name(queue), "default": DEFAULT_AGING, "limit": limit,
              "lowest": PRIORITY_MIN, "highest": PRIORITY_MAX,
              "most": PRIORITY_MAX - PRIORITY_MIN}  # fmt: skip
    cur = await conn.execute(sql.age, params)
    return max(cur.rowcount, 0)
