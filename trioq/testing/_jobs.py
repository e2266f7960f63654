"""Assertions on enqueued jobs: `enqueued_jobs`, `assert_enqueued`, `refute_enqueued`.

"Enqueued" means waiting to run: ``scheduled`` or ``available`` (pass ``states`` for
others). ``args`` matches by JSON containment (Postgres ``@>``), as Oban's
``assert_enqueued`` does: ``{"user_id": 1}`` matches ``{"user_id": 1, "lang": "fr"}``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .._job import JSONValue, check_priority, check_queue_name, check_task_name, encode_args
from .._pg.conn import Conn
from .._queue import Queue
from .._registry import Task
from .._result import JobStatus

__all__ = ["assert_enqueued", "enqueued_jobs", "refute_enqueued"]


WAITING = ("scheduled", "available")
_SHOWN = 20  # jobs listed in a failed assertion's message


async def enqueued_jobs(
    conn: Conn,
    task: str | Task | None = None,
    *,
    queue: str | None = None,
    args: JSONValue = None,
    priority: int | None = None,
    states: Sequence[str] = WAITING,
    schema: str = "trioq",
) -> list[JobStatus]:
    """The jobs matching every given filter, oldest first (None matches anything)."""
    params = _filters(task, queue, args, priority, states)
    cur = await conn.execute(Queue(schema=schema).sql.list_jobs, params)
    return [JobStatus.from_row(row) for row in await cur.fetchall()]


async def assert_enqueued(
    conn: Conn,
    task: str | Task | None = None,
    *,
    queue: str | None = None,
    args: JSONValue = None,
    priority: int | None = None,
    count: int | None = None,
    states: Sequence[str] = WAITING,
    schema: str = "trioq",
) -> list[JobStatus]:
    """Fail (AssertionError) unless a matching job is enqueued (exactly ``count`` of them,
    if given); the matching jobs."""
    found = await enqueued_jobs(conn, task, queue=queue, args=args, priority=priority,
                                states=states, schema=schema)  # fmt: skip
    if (count is None and not found) or (count is not None and len(found) != count):
        wanted = "a job" if count is None else f"{count} job{'' if count == 1 else 's'}"
        everything = await enqueued_jobs(conn, states=states, schema=schema)
        raise AssertionError(
            f"expected {wanted} {_describe(task, queue, args, priority)}, found {len(found)}; "
            f"{_listing(everything)}"
        )
    return found


async def refute_enqueued(
    conn: Conn,
    task: str | Task | None = None,
    *,
    queue: str | None = None,
    args: JSONValue = None,
    priority: int | None = None,
    states: Sequence[str] = WAITING,
    schema: str = "trioq",
) -> None:
    """Fail (AssertionError) if a matching job is enqueued."""
    found = await enqueued_jobs(conn, task, queue=queue, args=args, priority=priority,
                                states=states, schema=schema)  # fmt: skip
    if found:
        raise AssertionError(
            f"expected no job {_describe(task, queue, args, priority)}, found {len(found)}; "
            f"{_listing(found)}"
        )


def _filters(
    task: str | Task | None, queue: str | None, args: JSONValue, priority: int | None,
    states: Sequence[str],
) -> dict[str, Any]:  # fmt: skip
    name = task.name if isinstance(task, Task) else task
    if name is not None:
        check_task_name(name)
    if queue is not None:
        check_queue_name(queue)
    if priority is not None:
        check_priority(priority)
    if isinstance(states, str) or not all(isinstance(s, str) for s in states):
        raise TypeError(f"states must be a sequence of state names, got {states!r}")
    return {
        "task": name, "queue": queue, "priority": priority, "states": list(states),
        "args": None if args is None else encode_args(args),
    }  # fmt: skip


def _describe(
    task: str | Task | None, queue: str | None, args: JSONValue, priority: int | None
) -> str:
    parts = []
    if task is not None:
        parts.append(f"of task {task.name if isinstance(task, Task) else task!r}")
    if queue is not None:
        parts.append(f"on queue {queue!r}")
    if args is not None:
        parts.append(f"with args containing {json.dumps(args)}")
    if priority is not None:
        parts.append(f"with priority {priority}")
    return " ".join(parts) or "at all"


def _listing(jobs: Sequence[JobStatus]) -> str:
    if not jobs:
        return "nothing is enqueued"
    lines = [
        f"id {j.id} {j.task} on {j.queue} {json.dumps(j.args)} ({j.state})" for j in jobs[:_SHOWN]
    ]
    more = f"; and {len(jobs) - _SHOWN} more" if len(jobs) > _SHOWN else ""
    return "enqueued: " + "; ".join(lines) + more
