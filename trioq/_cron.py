"""Cron entries, and the arithmetic of their ticks.

A `CronEntry` is a schedule (croniter syntax, read in an IANA timezone) and the
job to enqueue at each of its ticks. `decide` says what an entry does now, given its
last recorded tick; the worker's scheduler (`trioq._worker.services.scheduler.fire_due`)
records and enqueues each due tick exactly once across any number of processes.
`next_fire_time` tells the scheduler how long it may sleep. Both take ``now`` from the
caller (the database clock), so tests move time without sleeping.

Ticks are wall-clock times in the entry's zone, mapped to instants:

- a wall time that happens twice (clocks go back) fires at its first occurrence;
- a wall time that never happens (clocks jump forward) fires at the jump, the
  first instant after the gap; several such ticks become one.

The policies (first sight, ``skip``, ``run_once``) are in `decide` and
``docs/cron.md``.
"""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from collections.abc import Iterable
from typing import Any, Literal

import attrs
from croniter import CroniterBadDateError, croniter

from ._job import (
    JSONValue,
    args_or_empty,
    check_chosen_max_attempts,
    check_payload,
    check_priority,
    check_queue_name,
    check_task_name,
    encode_args,
)
from ._rules import rule

__all__ = [
    "DEFAULT_MISFIRE_GRACE",
    "TICK_RETENTION",
    "CronEntry",
    "Misfire",
    "check_entries",
    "check_now",
    "decide",
    "dedup_key",
    "next_fire_time",
]

Misfire = Literal["skip", "run_once"]
Validator = Any  # attrs validators: (instance, attribute, value) -> None

UTC = dt.UTC
#: How late a tick may be fired under ``misfire="skip"`` before it counts as missed.
DEFAULT_MISFIRE_GRACE = dt.timedelta(minutes=1)
#: Tick rows older than this (by ``fired_at``) are pruned, except each entry's latest.
TICK_RETENTION = dt.timedelta(days=1)

_POLICIES: tuple[Misfire, ...] = ("skip", "run_once")
_ALIASES = frozenset(
    {"@midnight", "@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@annually"}
)
# Jenkins-style hashed ('H') and random ('R') fields: R differs in every process.
_HASHED_FIELD = re.compile(r"^[hr](\(\d+-\d+\))?(/\d+)?$", re.IGNORECASE)
_SECOND = dt.timedelta(seconds=1)
_PROBE = dt.datetime(2000, 1, 1)  # validation: a schedule must match after this


# -- validation ---------------------------------------------------------------------------------


def _in_entry(validator: Validator) -> Validator:
    """A field validator whose errors start with the entry's name."""

    def check(inst: CronEntry, attribute: attrs.Attribute[Any], value: Any) -> None:
        try:
            validator(inst, attribute, value)
        except TypeError as ex:
            raise TypeError(f"cron entry {inst.name!r}: {ex}") from None
        except ValueError as ex:
            raise ValueError(f"cron entry {inst.name!r}: {ex}") from None

    return check


def _name(_inst: CronEntry, _attribute: attrs.Attribute[str], value: str) -> None:
    check_task_name(value, "cron entry name")


def _schedule(inst: CronEntry, _attribute: attrs.Attribute[str], value: str) -> None:
    where = f"cron entry {inst.name!r}: schedule {value!r}"
    if not isinstance(value, str):
        raise TypeError(f"{where} must be a string")
    fields = value.split()
    if value.lower() not in _ALIASES:
        if len(fields) not in (5, 6):
            raise ValueError(
                f"{where} is invalid: use 5 fields (minute hour day-of-month month "
                "day-of-week), a 6th for seconds, or an alias such as '@daily'"
            )
        if any(_HASHED_FIELD.match(field) for field in fields):
            raise ValueError(
                f"{where} is invalid: hashed ('H') and random ('R') fields are not supported "
                "(every process must compute the same ticks)"
            )
    try:
        croniter(value, _PROBE, ret_type=dt.datetime).get_next()
    except CroniterBadDateError:
        raise ValueError(f"{where} never matches a date") from None
    except (ValueError, TypeError, KeyError, IndexError) as ex:
        reason = str(ex)  # croniter's, which quotes the schedule raw: escape what cannot print
        raise ValueError(f"{where} is invalid: "
                         f"{reason if reason.isprintable() else ascii(reason)[1:-1]}") from None


def _json_args(value: JSONValue, field: str) -> None:
    encode_args(value, field=field)


def _misfire(inst: CronEntry, attribute: attrs.Attribute[str], value: str) -> None:
    if value not in _POLICIES:
        raise ValueError(
            f"cron entry {inst.name!r}: {attribute.name} must be 'skip' or 'run_once', "
            f"got {value!r}"
        )


def _to_grace(value: dt.timedelta | float) -> dt.timedelta:
    if isinstance(value, dt.timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"misfire_grace must be a timedelta or seconds, got {value!r}")
    return dt.timedelta(seconds=value)


def _positive(inst: CronEntry, attribute: attrs.Attribute[Any], value: dt.timedelta) -> None:
    if value <= dt.timedelta(0):
        raise ValueError(
            f"cron entry {inst.name!r}: {attribute.name} must be positive, got {value}"
        )


def _zone(name: str) -> dt.tzinfo:
    return UTC if name == "UTC" else zoneinfo.ZoneInfo(name)


def _timezone(inst: CronEntry, attribute: attrs.Attribute[str], value: str) -> None:
    try:
        _zone(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError) as ex:
        raise ValueError(
            f"cron entry {inst.name!r}: {attribute.name} {value!r} is not a known IANA zone "
            f"name such as 'UTC' or 'Europe/Paris' ({ex})"
        ) from None


# -- entries ------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CronEntry:
    """A job to enqueue at every tick of ``schedule``, validated at construction."""

    #: Unique among the entries: the key of its rows in ``cron_ticks``.
    name: str = attrs.field(validator=_name)
    #: croniter syntax: 5 fields, a 6th (last) for seconds, or an alias such as ``@daily``.
    schedule: str = attrs.field(validator=_schedule)
    task: str = attrs.field(validator=_in_entry(rule(check_task_name)))
    args: JSONValue = attrs.field(
        default=None, converter=args_or_empty, validator=_in_entry(rule(_json_args))
    )
    queue: str = attrs.field(default="default", validator=_in_entry(rule(check_queue_name)))
    priority: int = attrs.field(default=0, validator=_in_entry(rule(check_priority)))
    #: None: the task's, resolved by the worker that claims each job (``docs/tasks.md``).
    max_attempts: int | None = attrs.field(
        default=None, validator=_in_entry(rule(check_chosen_max_attempts))
    )
    #: After downtime: drop the missed ticks (``skip``) or run one job for them (``run_once``).
    misfire: Misfire = attrs.field(default="skip", validator=_misfire)
    #: Under ``skip``, a tick fired later than this after its time counts as missed.
    misfire_grace: dt.timedelta = attrs.field(
        default=DEFAULT_MISFIRE_GRACE, converter=_to_grace, validator=_positive
    )
    #: The IANA zone the schedule's wall-clock times are read in.
    timezone: str = attrs.field(default="UTC", validator=_timezone)

    @property
    def zone(self) -> dt.tzinfo:
        return _zone(self.timezone)

    def next_tick(self, after: dt.datetime) -> dt.datetime | None:
        """The first tick strictly after ``after`` (aware), in UTC; None if there is none."""
        zone = self.zone
        wall, repeated = _wall(check_now("after", after), zone)
        # In the second pass of a repeated interval its wall times are spent: resume at its end.
        start = _repeat_end(wall, after, zone) - _SECOND if repeated else wall
        ticks = croniter(self.schedule, start, ret_type=dt.datetime)
        try:
            while (tick := _instant(ticks.get_next(), zone)) <= after:
                pass  # defensive: the mapping is monotonic, so this loop runs once
        except CroniterBadDateError:
            return None
        return tick

    def latest_tick(self, at: dt.datetime) -> dt.datetime | None:
        """The last tick at or before ``at`` (aware), in UTC; None if there is none."""
        zone = self.zone
        wall, repeated = _wall(check_now("at", at), zone)
        # In the second pass of a repeated interval, its wall times all fired in the first.
        bound = _repeat_end(wall, at, zone) if repeated else wall + _SECOND
        try:
            previous = croniter(self.schedule, bound, ret_type=dt.datetime).get_prev()
        except CroniterBadDateError:
            return None
        return _instant(previous, zone)


# -- wall clock <-> instants --------------------------------------------------------------------


def check_now(what: str, value: dt.datetime) -> dt.datetime:
    if not isinstance(value, dt.datetime) or value.utcoffset() is None:
        raise ValueError(f"{what} must be an aware datetime, got {value!r}")
    return value


def _wall(instant: dt.datetime, zone: dt.tzinfo) -> tuple[dt.datetime, bool]:
    """The naive wall time of ``instant`` in ``zone`` (to the second), and whether it is
    the second pass of a repeated interval (clocks went back)."""
    local = instant.astimezone(zone)
    return local.replace(tzinfo=None, microsecond=0, fold=0), bool(local.fold)


def _instant(wall: dt.datetime, zone: dt.tzinfo) -> dt.datetime:
    """The instant a wall-clock tick fires: the first occurrence of a repeated wall time,
    the jump itself for a wall time skipped by clocks moving forward."""
    first = wall.replace(tzinfo=zone).astimezone(UTC)  # fold=0: first occurrence, or past a gap
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return first
    return _transition(wall.replace(tzinfo=zone, fold=1).astimezone(UTC), first, zone)


def _transition(before: dt.datetime, after: dt.datetime, zone: dt.tzinfo) -> dt.datetime:
    """The first whole second in (before, after] already at ``after``'s UTC offset."""
    target = after.astimezone(zone).utcoffset()
    lo, hi = int(before.timestamp()), int(after.timestamp())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if dt.datetime.fromtimestamp(mid, zone).utcoffset() == target:
            hi = mid
        else:
            lo = mid
    return dt.datetime.fromtimestamp(hi, UTC)


def _repeat_end(wall: dt.datetime, instant: dt.datetime, zone: dt.tzinfo) -> dt.datetime:
    """Where the repeated interval ends, in wall time, for ``instant`` in its second pass."""
    first_pass = wall.replace(tzinfo=zone)
    start = _transition(first_pass.astimezone(UTC), instant.replace(microsecond=0), zone)
    start_wall = start.astimezone(zone).replace(tzinfo=None, fold=0)
    return start_wall + (_offset(first_pass) - _offset(instant.astimezone(zone)))


def _offset(local: dt.datetime) -> dt.timedelta:
    offset = local.utcoffset()
    assert offset is not None
    return offset


# -- firing -------------------------------------------------------------------------------------


def next_fire_time(entries: Iterable[CronEntry], now: dt.datetime) -> dt.datetime | None:
    """The earliest tick of any entry strictly after ``now`` (UTC), or None."""
    check_now("now", now)
    ticks = [tick for entry in entries if (tick := entry.next_tick(now)) is not None]
    return min(ticks, default=None)


def check_entries(entries: Iterable[CronEntry], *, max_payload_bytes: int) -> list[CronEntry]:
    """The entries in name order (one lock order for every process), checked before any SQL:
    names unique, args within the payload limit."""
    checked = sorted(entries, key=lambda e: e.name)
    names = [e.name for e in checked]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"cron entry names must be unique, repeated: {duplicates}")
    for entry in checked:
        check_payload(
            encode_args(entry.args), task=None, max_bytes=max_payload_bytes,
            where=f"cron entry {entry.name!r}: args",
        )  # fmt: skip
    return checked


def decide(
    entry: CronEntry, last: dt.datetime | None, now: dt.datetime
) -> tuple[dt.datetime, bool] | None:
    """What ``entry`` does at ``now`` given its last recorded tick: nothing (None), or
    ``(tick, True)`` to fire ``tick``, or ``(tick, False)`` to record it without a job.

    Only the latest tick at or before ``now`` is ever considered: any older unrecorded
    ticks are dropped, under both policies.
    """
    latest = entry.latest_tick(now)
    if last is None:
        return latest or now, False  # first sight: a baseline, the past never fires
    if latest is None or latest <= last:
        return None  # nothing new since the last recorded tick
    if entry.misfire == "run_once" or now - latest <= entry.misfire_grace:
        return latest, True
    return latest, False  # skip: missed by more than the grace


def dedup_key(name: str, tick: dt.datetime) -> str:
    return f"cron:{name}@{tick.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
