"""Retry policies: how long a failed job waits before its next attempt.

Each policy is a frozen attrs class validated at construction, with
``delay(attempt)`` giving the wait after failed attempt number ``attempt``
(1 for the first try). The default is `Sidekiq`, the formula neoq and
Sidekiq use: ``attempt**4 + 15 + random(0..29) * (attempt + 1)`` seconds.
"""

from __future__ import annotations

import datetime as dt
import random
from typing import Protocol

import attrs

from ._rules import at_least_one, non_negative, rule

__all__ = ["Constant", "Exponential", "Linear", "RetryPolicy", "Sidekiq"]


class RetryPolicy(Protocol):
    def delay(self, attempt: int) -> dt.timedelta: ...


_non_negative = rule(non_negative)
_at_least_one = rule(at_least_one)


@attrs.frozen(kw_only=True)
class Sidekiq:
    """``attempt**4 + 15 + random(0..29) * (attempt + 1)`` seconds (about 20 days over 25)."""

    jitter: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))

    def delay(self, attempt: int) -> dt.timedelta:
        spread = random.randrange(30) if self.jitter else 0
        return dt.timedelta(seconds=attempt**4 + 15 + spread * (attempt + 1))


@attrs.frozen(kw_only=True)
class Constant:
    """The same wait every time."""

    seconds: float = attrs.field(validator=_non_negative)

    def delay(self, attempt: int) -> dt.timedelta:
        return dt.timedelta(seconds=self.seconds)


@attrs.frozen(kw_only=True)
class Linear:
    """``seconds * attempt``."""

    seconds: float = attrs.field(validator=_non_negative)

    def delay(self, attempt: int) -> dt.timedelta:
        return dt.timedelta(seconds=self.seconds * attempt)


@attrs.frozen(kw_only=True)
class Exponential:
    """``base * factor**(attempt - 1)``, capped at ``cap`` seconds."""

    base: float = attrs.field(default=1.0, validator=_non_negative)
    factor: float = attrs.field(default=2.0, validator=_at_least_one)
    cap: float = attrs.field(default=3600.0, validator=_non_negative)

    def delay(self, attempt: int) -> dt.timedelta:
        exponent = min(attempt - 1, 64)  # beyond this the cap wins anyway
        try:
            seconds = min(self.cap, self.base * self.factor**exponent)
        except OverflowError:
            seconds = self.cap
        return dt.timedelta(seconds=seconds)
