"""The rules every validated field shares: the attrs adapter, and the numbers.

Each rule is one function with one message, used by every class that has such a field
(`trioq.Config`, `trioq.QueueConfig`, the retry policies, `trioq.Task`, the dashboard's
config). As everywhere in trioq, a value of the wrong type (a string, a bool, None where a
number is wanted) is a ``TypeError``, a number out of range a ``ValueError``; the message
names the field and is the same for both, so one ``match=`` finds either.

- `positive`: a finite number > 0 (seconds, mostly); `non_negative`: finite, >= 0;
  `at_least_one`: finite, >= 1; `positive_or_none`: `positive`, or None;
- `boolean`: ``True`` or ``False``;
- `positive_int`: an ``int`` > 0 (``bool`` is not one), `int_at_most` adds a ceiling;
- `name`: a string of a given form (task, queue and schema names);
- `seconds`: the converter of a field given in seconds or as a ``timedelta`` (a timedelta
  becomes float seconds; anything else is left for the validator to judge).

`rule` turns a check ``(value, field)`` into an attrs validator.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable
from typing import Any

import attrs

__all__ = [
    "Validator",
    "at_least_one",
    "boolean",
    "int_at_most",
    "is_number",
    "name",
    "non_negative",
    "positive",
    "positive_int",
    "positive_or_none",
    "rule",
    "seconds",
    "seconds_or_none",
]

Validator = Callable[[object, "attrs.Attribute[Any]", Any], None]


_NOTHING: Any = object()


def rule(check: Callable[[Any, str], object], *, default: Any = _NOTHING) -> Validator:
    """An attrs validator applying ``check(value, field)`` with the attribute's name.

    ``default``: the field's default, which ``check`` accepts; the very object (``is``) is
    not checked again (a JobSpec has a dozen fields, most of them left at their default).
    """
    if default is not _NOTHING:
        check(default, "default")  # accepted, or the skip would hide a bad default

        def validate_unless_default(
            _inst: object, attribute: attrs.Attribute[Any], value: Any
        ) -> None:
            if value is not default:
                check(value, attribute.name)

        return validate_unless_default

    def validate(_inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        check(value, attribute.name)

    return validate


def is_number(value: object) -> bool:
    """An int or float, not a bool (``True`` is not a number of seconds)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(value: object, message: str, ok: Callable[[float], bool]) -> float:
    if not is_number(value):
        raise TypeError(message)
    assert isinstance(value, int | float)
    if not (math.isfinite(value) and ok(value)):
        raise ValueError(message)
    return value


def positive(value: object, field: str) -> float:
    """A finite number > 0."""
    return _number(value, f"{field} must be a positive finite number, got {value!r}",
                   lambda v: v > 0)  # fmt: skip


def non_negative(value: object, field: str) -> float:
    """A finite number >= 0."""
    return _number(value, f"{field} must be a finite number, not negative, got {value!r}",
                   lambda v: v >= 0)  # fmt: skip


def at_least_one(value: object, field: str) -> float:
    """A finite number >= 1."""
    return _number(value, f"{field} must be a finite number of at least 1, got {value!r}",
                   lambda v: v >= 1)  # fmt: skip


def positive_or_none(value: object, field: str) -> float | None:
    """None, or a finite number > 0."""
    if value is None:
        return None
    return _number(value, f"{field} must be a positive finite number or None, got {value!r}",
                   lambda v: v > 0)  # fmt: skip


def boolean(value: object, field: str) -> bool:
    """True or False (not 1, not "yes")."""
    if not isinstance(value, bool):
        raise TypeError(f"{field} must be True or False, got {value!r}")
    return value


def name(value: object, field: str, pattern: re.Pattern[str], form: str) -> str:
    """A string that matches ``pattern`` whole (``fullmatch``: ``$`` would also take a trailing
    newline); ``form`` says what the name may be, in the error."""
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a string, got {value!r}")
    if not pattern.fullmatch(value):
        raise ValueError(f"{field} {value!r} is invalid: use {form}")
    return value


def positive_int(value: object, field: str) -> int:
    """An int > 0."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field} must be a positive int, got {value!r}")
    if value < 1:
        raise ValueError(f"{field} must be a positive int, got {value!r}")
    return value


def int_at_most(maximum: int, why: str = "") -> Callable[[object, str], int]:
    """`positive_int`, and at most ``maximum`` (``why`` says why, after the number)."""

    def check(value: object, field: str) -> int:
        positive_int(value, field)
        assert isinstance(value, int)
        if value > maximum:
            raise ValueError(f"{field} must be at most {maximum:,}{why}, got {value}")
        return value

    return check


def seconds(value: Any) -> Any:
    """A timedelta as float seconds; anything else as it is (its validator judges it)."""
    return value.total_seconds() if isinstance(value, dt.timedelta) else value


def seconds_or_none(value: Any) -> Any:
    """`seconds`, and None as None."""
    return None if value is None else seconds(value)
