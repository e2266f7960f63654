"""`trioq.Registry` and `trioq.Task`: registration, lookup, and the job field rules they share
with `JobSpec` and `CronEntry` (one error type per rule, wherever it is checked)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import attrs
import pytest

import trioq


def test_registry_validates() -> None:
    tasks = trioq.Registry()

    @tasks.task
    async def one(job: trioq.JobContext) -> None: ...

    with pytest.raises(ValueError, match="already registered"):
        tasks.task(name="one")(one.fn)
    with pytest.raises(ValueError, match="timeout"):
        tasks.task(name="two", timeout=0)(one.fn)
    with pytest.raises(ValueError, match="queue"):
        tasks.task(name="three", queue="no spaces")(one.fn)
    with pytest.raises(TypeError, match="retry must be a retry policy"):
        tasks.task(name="four", retry=5)(one.fn)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="task name must not be empty"):
        tasks.task(name="")
    with pytest.raises(TypeError, match="must decorate a callable"):
        tasks.task(5)  # type: ignore[call-overload]
    assert tasks.task(name="five", timeout=dt.timedelta(seconds=2))(one.fn).timeout == 2.0
    assert trioq.Config(registry=tasks, queues="email").queues == {"email": trioq.QueueConfig()}
    first = tasks.get("one")
    assert first is not None
    assert attrs.evolve(first, queue="q").queue == "q"


def test_registry_refuses_a_trailing_newline() -> None:
    """``re.match`` with ``$`` accepts ``"q\\n"``: these validators use ``fullmatch``."""
    with pytest.raises(ValueError, match="queue 'q\\\\n' is invalid"):
        trioq.Registry().task(name="t", queue="q\n")(lambda job: None)
    with pytest.raises(ValueError, match="task name 't\\\\n' is invalid"):
        trioq.Registry().task(name="t\n")(lambda job: None)


def test_tasks_are_found_by_name_and_grouped_by_queue() -> None:
    tasks = trioq.Registry()

    @tasks.task(queue="mail", max_attempts=3, keep_result=True)
    def send(job: trioq.JobContext) -> None: ...

    @tasks.task(name="other.name", queue="mail")
    async def second(job: trioq.JobContext) -> None: ...

    assert tasks.get("send") is send and tasks.get("missing") is None
    assert (send.queue, send.max_attempts, send.keep_result, send.is_async) == (
        "mail",
        3,
        True,
        False,
    )
    assert tasks.get("other.name") is second and second.is_async
    assert dict(tasks.queues()) == {"mail": ["send", "other.name"]}
    assert len(tasks) == 2 and list(tasks) == [send, second]
    assert send(None) is None  # calling a Task calls its handler


def handler(job: trioq.JobContext) -> None: ...


RULES: list[tuple[str, Any, type[Exception], str]] = [
    ("max_attempts", "3", TypeError, "max_attempts must be an int"),
    ("max_attempts", 0, ValueError, "max_attempts must be between 1 and 10000"),
    ("queue", 5, TypeError, "queue must be a string"),
    ("queue", "a b", ValueError, "queue 'a b' is invalid"),
    ("priority", 1.5, TypeError, "priority must be an int"),
    ("priority", 101, ValueError, "priority must be between -100 and 100"),
]

BUILDERS: dict[str, Callable[[str, Any], object]] = {
    "JobSpec": lambda field, value: trioq.JobSpec(task="t", **{field: value}),
    "Task": lambda field, value: trioq.Task(name="t", fn=handler, **{field: value}),
    "CronEntry": lambda field, value: trioq.CronEntry(
        name="c", schedule="@hourly", task="t", **{field: value}
    ),
}


@pytest.mark.parametrize(
    ("where", "field", "value", "error", "message"),
    [
        (where, *rule)
        for where in sorted(BUILDERS)
        for rule in RULES
        if not (where == "Task" and rule[0] == "priority")  # a Task has no priority
    ],
)
def test_one_error_type_per_rule_everywhere(
    where: str, field: str, value: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        BUILDERS[where](field, value)


@pytest.mark.parametrize(
    ("name", "error", "message"),
    [
        (5, TypeError, "task name must be a string"),
        ("a b", ValueError, "task name 'a b' is invalid"),
    ],
)
def test_task_names(name: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        trioq.Task(name=name, fn=handler)
