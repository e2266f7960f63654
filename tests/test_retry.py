"""Retry policies: the delay each one gives after each attempt, and what each refuses."""

from __future__ import annotations

import datetime as dt

import pytest

import trioq
from trioq.retry import Constant, Exponential, Linear, Sidekiq


def seconds(policy: trioq.retry.RetryPolicy, attempts: range) -> list[float]:
    return [policy.delay(attempt).total_seconds() for attempt in attempts]


def test_constant() -> None:
    assert seconds(Constant(seconds=7.5), range(1, 5)) == [7.5, 7.5, 7.5, 7.5]
    assert seconds(Constant(seconds=0), range(1, 3)) == [0, 0]


def test_linear() -> None:
    assert seconds(Linear(seconds=2), range(1, 6)) == [2, 4, 6, 8, 10]


def test_exponential_doubles_from_base_up_to_the_cap() -> None:
    assert seconds(Exponential(), range(1, 6)) == [1, 2, 4, 8, 16]
    assert seconds(Exponential(base=0.5, factor=3, cap=10), range(1, 6)) == [0.5, 1.5, 4.5, 10, 10]
    assert Exponential().delay(10_000) == dt.timedelta(seconds=3600)  # the default cap


def test_exponential_survives_overflow() -> None:
    assert Exponential(base=1e300, factor=1e10, cap=60).delay(50).total_seconds() == 60


def test_sidekiq_without_jitter_is_attempt_to_the_fourth_plus_15() -> None:
    assert seconds(Sidekiq(jitter=False), range(1, 5)) == [16, 31, 96, 271]
    assert Sidekiq(jitter=False).delay(25) == dt.timedelta(seconds=25**4 + 15)


@pytest.mark.parametrize("attempt", [1, 2, 10, 25])
def test_sidekiq_jitter_stays_within_its_spread(attempt: int) -> None:
    """``attempt**4 + 15 + random(0..29) * (attempt + 1)``: every draw within the bounds."""
    low = attempt**4 + 15
    high = low + 29 * (attempt + 1)
    drawn = {Sidekiq().delay(attempt).total_seconds() for _ in range(500)}
    assert min(drawn) >= low and max(drawn) <= high
    assert len(drawn) > 1  # it does jitter (500 draws of 30 values)
    assert all((value - low) % (attempt + 1) == 0 for value in drawn)


def test_sidekiq_spends_about_20_days_over_25_attempts() -> None:
    total = sum(seconds(Sidekiq(jitter=False), range(1, 25)), 0.0)
    assert dt.timedelta(days=19) < dt.timedelta(seconds=total) < dt.timedelta(days=21)


def test_retry_policies_refuse_infinite_numbers() -> None:
    with pytest.raises(ValueError, match="seconds must be a finite number"):
        Constant(seconds=float("inf"))
    with pytest.raises(ValueError, match="factor must be a finite number of at least 1"):
        trioq.retry.Exponential(factor=float("nan"))
    assert trioq.retry.Exponential(base=1e300, factor=1e10, cap=60).delay(50).total_seconds() == 60


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Constant(seconds=-1), "seconds must be a finite number, not negative"),
        (lambda: Linear(seconds=float("nan")), "seconds must be a finite number"),
        (lambda: Exponential(base=-1), "base must be a finite number, not negative"),
        (lambda: Exponential(factor=0.5), "factor must be a finite number of at least 1"),
        (lambda: Exponential(cap=float("inf")), "cap must be a finite number"),
    ],
)
def test_policies_validate_at_construction(build: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()  # type: ignore[operator]
