"""``trioq.enqueue``, ``enqueue_many``, ``enqueue_bulk``: the default `Queue` (``trioq``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

import psycopg

from ._job import DEFAULT_MAX_ATTEMPTS, EnqueueResult, JobSpec, JSONValue
from ._queue import Queue

__all__ = ["DEFAULT_QUEUE", "enqueue", "enqueue_bulk", "enqueue_many"]

DEFAULT_QUEUE = Queue()


async def enqueue(
    conn: psycopg.AsyncConnection[Any],
    task: str,
    args: JSONValue = None,
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: dt.datetime | None = None,
    delay: dt.timedelta | float | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    dedup_key: str | None = None,
    unique: bool = False,
) -> EnqueueResult:
    """Enqueue one job on ``conn`` (in its open transaction, if any); see `Queue.enqueue`."""
    return await DEFAULT_QUEUE.enqueue(
        conn, task, args, queue=queue, priority=priority, run_at=run_at, delay=delay,
        max_attempts=max_attempts, dedup_key=dedup_key, unique=unique,
    )  # fmt: skip


async def enqueue_many(
    conn: psycopg.AsyncConnection[Any], jobs: Iterable[JobSpec]
) -> list[EnqueueResult]:
    """Enqueue many jobs in a few statements; see `Queue.enqueue_many`."""
    return await DEFAULT_QUEUE.enqueue_many(conn, jobs)


async def enqueue_bulk(
    conn: psycopg.AsyncConnection[Any],
    task: str,
    args: Iterable[JSONValue],
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: dt.datetime | None = None,
    delay: dt.timedelta | float | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> list[int]:
    """One job of ``task`` per item of ``args``, sharing the other fields; their ids in input
    order. The fastest way in; see `Queue.enqueue_bulk`."""
    return await DEFAULT_QUEUE.enqueue_bulk(
        conn, task, args, queue=queue, priority=priority, run_at=run_at, delay=delay,
        max_attempts=max_attempts,
    )  # fmt: skip
