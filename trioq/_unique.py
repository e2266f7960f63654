"""Uniqueness: the key rule, `trioq.Unique`, and the keys the database compares.

A job enqueued with ``dedup_key``, ``unique=True`` or ``unique=trioq.Unique(...)`` carries a
key in ``jobs.dedup_key``; the partial unique index ``jobs_dedup_idx`` allows one live
(scheduled, available, running) job per key. A `Unique` with a ``period`` (or that counts
finished states) also keeps the key in ``unique_keys`` for the rest of its window, so it
stays taken after the job finished (``enqueue_unique`` in migration 6).

The stored keys, by what the caller gave (``docs/flow-control.md`` has the rules):

- ``task:<task>|<key>``: an explicit key, scoped by task (``dedup_key="k"``,
  ``Unique(key="k")``);
- ``key:<key>``: an explicit global key (``Unique(key="k", by_task=False)``), and cron ticks;
- ``fp:<sha256>``: ``unique=True``, task, queue and canonical args (unchanged since 0001);
- ``u:<sha256>``: any other `Unique`;
- ``w:<seconds>:<n>:<base>``: one of the above in window ``n`` of a period, composed by the
  database on its own clock.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

__all__ = [
    "DEDUP_KEY_MAX",
    "LIVE_STATES",
    "UNIQUE_STATES",
    "Debounce",
    "Unique",
    "UniqueKey",
    "canonical_json",
    "check_dedup_key",
    "to_debounce",
    "to_period",
    "unique_key",
]

DEDUP_KEY_MAX = 500
LIVE_STATES = ("scheduled", "available", "running")
#: States a `Unique` may count; the live ones always count (see `Unique.states`).
UNIQUE_STATES = (*LIVE_STATES, "done", "cancelled", "dead")
#: Longest unique window: the key's record lives this long.
MAX_PERIOD = dt.timedelta(days=366)
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_dedup_key(value: object, field: str = "dedup_key") -> str | None:
    """None, or a key: a non-empty string of at most 500 characters that Postgres can store
    (no NUL, no lone surrogate). The rule of dedup keys, `Unique.key` and concurrency keys."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a string or None, got {value!r}")
    if not value or len(value) > DEDUP_KEY_MAX:
        raise ValueError(
            f"{field} must be a non-empty string of at most {DEDUP_KEY_MAX} characters"
        )
    if "\x00" in value:
        raise ValueError(f"{field} must not contain NUL characters (Postgres text cannot)")
    if _SURROGATE.search(value):
        raise ValueError(f"{field} must not contain lone surrogates (not valid UTF-8)")
    return value


def canonical_json(value: Any) -> str:
    """Key order does not matter: ``{"a": 1, "b": 2}`` and ``{"b": 2, "a": 1}`` are one text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _by_args(value: object) -> bool | tuple[str, ...]:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(f"by_args must be True, False or a sequence of field names, got {value!r}")
    fields = tuple(value)
    for name in fields:
        if not isinstance(name, str) or not name:
            raise TypeError(f"by_args: field names must be non-empty strings, got {name!r}")
    if not fields:
        raise ValueError("by_args must name at least one field (or be True for all args)")
    return fields


def to_period(value: object, field: str = "period") -> dt.timedelta:
    """A period of 1 ms to 366 days, given as a timedelta or seconds (unique windows and
    rate limits)."""
    if isinstance(value, dt.timedelta):
        period = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError(f"{field} must be a finite number of seconds, got {value!r}")
        period = dt.timedelta(seconds=value)
    else:
        raise TypeError(f"{field} must be a timedelta or seconds, got {value!r}")
    if not dt.timedelta(milliseconds=1) <= period <= MAX_PERIOD:
        raise ValueError(f"{field} must be between 1 ms and 366 days, got {period}")
    return period


def _debounce_period(value: object) -> dt.timedelta:
    return to_period(value, "debounce period")


def _debounce_max_wait(value: object) -> dt.timedelta | None:
    return None if value is None else to_period(value, "debounce max_wait")


@attrs.frozen
class Debounce:
    """A burst of enqueues with one key makes one job, run ``period`` after the last of
    them, with the last args (``docs/flow-control.md``, "Debounce"). With ``max_wait``, the
    job runs at the latest that long after the first enqueue of the burst, however long the
    burst goes on (at least ``period``). Both are timedeltas or seconds, 1 ms to 366 days.
    """

    period: dt.timedelta = attrs.field(converter=_debounce_period)
    max_wait: dt.timedelta | None = attrs.field(
        default=None, kw_only=True, converter=_debounce_max_wait
    )

    def __attrs_post_init__(self) -> None:
        if self.max_wait is not None and self.max_wait < self.period:
            raise ValueError(
                f"debounce max_wait ({self.max_wait}) must be at least its period "
                f"({self.period})"
            )


def to_debounce(value: object, field: str = "debounce") -> Debounce | None:
    """None, a `Debounce`, or its period alone (a timedelta or seconds)."""
    if value is None or isinstance(value, Debounce):
        return value
    if isinstance(value, dt.timedelta | int | float) and not isinstance(value, bool):
        return Debounce(value)
    raise TypeError(f"{field} must be a timedelta, seconds or a trioq.Debounce, got {value!r}")


def _period(value: object) -> dt.timedelta | None:
    return None if value is None else to_period(value)


def _states(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Sequence | frozenset | set):
        raise TypeError(f"states must be a collection of state names, got {value!r}")
    states = set(value)
    unknown = sorted(str(s) for s in states - set(UNIQUE_STATES))
    if unknown:
        raise ValueError(f"states: unknown {unknown}; use some of {list(UNIQUE_STATES)}")
    missing = sorted(set(LIVE_STATES) - states, key=LIVE_STATES.index)
    if missing:
        raise ValueError(
            f"states must include every live state ({', '.join(LIVE_STATES)}); missing "
            f"{missing}: a job returning to a live state must never meet a twin there"
        )
    return tuple(s for s in UNIQUE_STATES if s in states)


@attrs.frozen(kw_only=True)
class Unique:
    """Which jobs count as the same job, and for how long (River's ``UniqueOpts``).

    - ``key``: an explicit key (a string); ``by_task`` (default True) scopes it to the task;
    - ``by_args``: True for all args, or the names of the fields that count;
    - ``by_queue``: jobs in different queues are different;
    - ``period``: at most one job per key in each window of this length (windows are
      aligned to the Unix epoch on the database's clock), finished jobs included;
    - ``states``: which states of the holder keep the key taken: always the live ones
      (scheduled, available, running); with a ``period`` also ``done`` by default, and
      ``cancelled`` or ``dead`` if named. Finished states need a ``period``: finished rows
      are deleted, so trioq remembers the key only for the window.
    """

    key: str | None = attrs.field(default=None)
    by_args: bool | tuple[str, ...] = attrs.field(default=False, converter=_by_args)
    by_queue: bool = False
    by_task: bool = True
    period: dt.timedelta | None = attrs.field(default=None, converter=_period)
    states: tuple[str, ...] | None = attrs.field(default=None, converter=_states)

    def __attrs_post_init__(self) -> None:
        check_dedup_key(self.key, "Unique.key")
        for name in ("by_queue", "by_task"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Unique.{name} must be a bool, got {getattr(self, name)!r}")
        states = self.counted_states()
        if self.period is None and states != LIVE_STATES:
            raise ValueError(
                "Unique.states: counting finished jobs needs a period (finished rows are "
                "deleted: trioq keeps a key taken for one window)"
            )

    def counted_states(self) -> tuple[str, ...]:
        if self.states is not None:
            return self.states
        return (*LIVE_STATES, "done") if self.period is not None else LIVE_STATES

    def base_key(self, *, task: str, queue: str, args: Any) -> str:
        """The key of a job of ``task`` in ``queue`` with ``args`` (without the window)."""
        if self.key is None and self.by_args is True and self.by_queue and self.by_task:
            return _fingerprint(task, queue, args)  # what unique=True has always stored
        if self.key is not None and not (self.by_args or self.by_queue):
            return f"task:{task}|{self.key}" if self.by_task else f"key:{self.key}"
        digest = hashlib.sha256(canonical_json(self._parts(task, queue, args)).encode())
        return f"u:{digest.hexdigest()}"

    def _parts(self, task: str, queue: str, args: Any) -> dict[str, Any]:
        """What counts, by name: the key, the task, the queue, the args or some of them."""
        given = {"key": self.key, "task": task if self.by_task else None,
                 "queue": queue if self.by_queue else None}  # fmt: skip
        parts: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
        if self.by_args is True:
            parts["args"] = args
        elif self.by_args:
            parts["args"] = _fields(args, self.by_args, task)
        return parts


def _fingerprint(task: str, queue: str, args: Any) -> str:
    digest = hashlib.sha256(f"{task}\0{queue}\0{canonical_json(args)}".encode()).hexdigest()
    return f"fp:{digest}"


def _fields(args: Any, fields: tuple[str, ...], task: str) -> dict[str, Any]:
    if not isinstance(args, Mapping):
        raise ValueError(
            f"task {task!r}: Unique(by_args={list(fields)}) needs args that are a JSON "
            f"object, got {args!r}"
        )
    return {name: args[name] for name in fields if name in args}  # missing fields: absent


@attrs.frozen
class UniqueKey:
    """What the enqueue compares: the key, its window and the states that keep it taken."""

    key: str
    period: dt.timedelta | None = None
    states: tuple[str, ...] = LIVE_STATES

    @property
    def windowed(self) -> bool:
        """Whether the key outlives its job (needs the ``unique_keys`` table)."""
        return self.period is not None or self.states != LIVE_STATES


def unique_key(
    *, task: str, queue: str, args: Any, dedup_key: str | None, unique: bool | Unique
) -> UniqueKey | None:
    """The key a job is enqueued with: ``dedup_key`` (scoped by task), ``unique=True``
    (the fingerprint), a `Unique`, or None."""
    if dedup_key is not None:
        if isinstance(unique, Unique):
            raise ValueError("give dedup_key or unique=Unique(...), not both")
        return UniqueKey(f"task:{task}|{dedup_key}")
    if unique is False:
        return None
    if unique is True:
        return UniqueKey(_fingerprint(task, queue, args))
    if not isinstance(unique, Unique):
        raise TypeError(f"unique must be a bool or a trioq.Unique, got {unique!r}")
    key = unique.base_key(task=task, queue=queue, args=args)
    return UniqueKey(key, unique.period, unique.counted_states())
