"""One rule per kind of field: a value of the wrong type is a ``TypeError`` everywhere.

The walk below builds every configuration and policy class with a string in each field
that does not take strings (``"5"``: the sneakiest, it looks like a number) and expects a
``TypeError`` naming the field; then a number out of range, expecting a ``ValueError``
with the same message (``trioq._rules``: one message per rule, whichever the error).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
import pytest

import trioq
import trioq.retry
import trioq.web
from trioq import _rules

#: Each class, with what it needs to be built at all.
CLASSES: dict[type, dict[str, Any]] = {
    trioq.Config: {"registry": trioq.Registry()},
    trioq.QueueConfig: {},
    trioq.retry.Constant: {"seconds": 1},
    trioq.retry.Linear: {"seconds": 1},
    trioq.retry.Exponential: {},
    trioq.retry.Sidekiq: {},
    trioq.RateLimit: {"limit": 1, "period": 1},
    trioq.CronEntry: {"name": "c", "schedule": "* * * * *", "task": "t"},
    trioq.Unique: {},
    trioq.JobSpec: {"task": "t"},
    trioq.web.DashboardConfig: {"dsn": "postgresql://app@db/app"},
}

#: Fields that take a string by design: names, DSNs, addresses, JSON args, and the text
#: forms of a rate limit (``"10/s"``), a misfire policy and a queue list.
TAKES_TEXT = {
    "dsn", "session_dsn", "schema", "worker_id", "metrics", "queues", "name", "schedule",
    "task", "queue", "timezone", "misfire", "args", "key", "dedup_key", "concurrency_key",
    "sequence_key",
    "on_dependency_failure", "rate_limit", "key_rate_limit", "token", "registry",
}  # fmt: skip


def fields() -> list[tuple[type, str]]:
    return [
        (cls, f.name)
        for cls in CLASSES
        for f in attrs.fields(cls)
        if f.init and f.name not in TAKES_TEXT
    ]


@pytest.mark.parametrize(("cls", "field"), fields(), ids=lambda v: getattr(v, "__name__", v))
def test_a_string_where_a_value_of_another_type_belongs_is_a_type_error(
    cls: type, field: str
) -> None:
    with pytest.raises(TypeError, match=field):
        cls(**{**CLASSES[cls], field: "5"})


def test_the_walk_covers_every_numeric_field_of_the_config() -> None:
    walked = {name for cls, name in fields() if cls is trioq.Config}
    numeric = {f.name for f in attrs.fields(trioq.Config) if str(f.type) in ("float", "int")}
    assert numeric <= walked
    assert {"lease", "poll_interval", "pool_size", "retain_done", "handle_signals"} <= walked


@pytest.mark.parametrize(
    ("check", "bad"),
    [
        (_rules.positive, [0, -1, float("inf"), float("nan")]),
        (_rules.non_negative, [-1, float("inf")]),
        (_rules.at_least_one, [0.5, float("nan")]),
        (_rules.positive_or_none, [0, float("-inf")]),
        (_rules.positive_int, [0, -3]),
    ],
)
def test_one_message_per_rule_whatever_the_error(check: Any, bad: list[Any]) -> None:
    messages = set()
    for error, values in ((ValueError, bad), (TypeError, ["5", True, b"1"])):
        for value in values:
            with pytest.raises(error) as raised:
                check(value, "field")
            messages.add(str(raised.value).rpartition(", got ")[0])
    assert len(messages) == 1, messages


def test_the_numbers_of_the_issue() -> None:
    """The two that raised ValueError for a string before (issue 21)."""
    with pytest.raises(TypeError, match="poll_interval must be a positive finite number"):
        trioq.Config(registry=trioq.Registry(), poll_interval="1")
    with pytest.raises(TypeError, match="seconds must be a finite number, not negative"):
        trioq.retry.Constant(seconds="5")  # type: ignore[arg-type]
    config = trioq.Config(registry=trioq.Registry(), poll_interval=dt.timedelta(seconds=3))
    assert config.poll_interval == 3


def test_a_default_is_skipped_only_as_the_very_object() -> None:
    """JobSpec's validators skip a field left at its default (``is``), not a value that
    only equals it: False is not priority 0, nor 0.0."""
    for bad in (False, 0.0, True):
        with pytest.raises(TypeError, match="priority must be an int"):
            trioq.JobSpec(task="t", priority=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be True or False"):  # a default the rule refuses
        _rules.rule(_rules.boolean, default=1)


def test_names_found_valid_are_remembered_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from trioq import _job

    monkeypatch.setattr(_job, "_KNOWN_TASKS", set())
    monkeypatch.setattr(_job, "_KNOWN_NAMES_CAP", 3)
    for i in range(5):
        trioq.JobSpec(task=f"task_{i}")
    assert {"task_0", "task_1", "task_2"} == _job._KNOWN_TASKS

    class Sneaky(str):
        pass

    with pytest.raises(ValueError, match="is invalid"):
        trioq.JobSpec(task=Sneaky("bad name"))
    with pytest.raises(ValueError, match="is invalid"):
        trioq.JobSpec(task="task 0")
    with pytest.raises(TypeError, match="must be a string"):
        trioq.JobSpec(task=["task_0"])  # type: ignore[arg-type]
