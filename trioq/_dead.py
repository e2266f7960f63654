"""The dead-letter table: jobs that ran out of attempts, failed fatally, or lost their
last lease. They can be listed, retried (back to available with fresh attempts)
and purged, filtered by id, queue and task.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from ._db.statements import Statements
from ._job import JSONValue
from ._pg.conn import Conn
from ._pg.times import tolerant
from ._sanitize import decode_args

__all__ = ["DeadFilter", "DeadJob", "list_dead", "purge_dead", "retry_dead"]



def _ids(value: Iterable[int] | None) -> list[int] | None:
    return None if value is None else list(value)


@attrs.frozen(kw_only=True)
class DeadFilter:
    """Which dead jobs: all of those matching every given field (None matches anything)."""

    ids: list[int] | None = attrs.field(default=None, converter=_ids)
    queue: str | None = None
    task: str | None = None

    def params(self) -> dict[str, Any]:
        return {"ids": self.ids, "queue": self.queue, "task": self.task}


@attrs.frozen(kw_only=True)
class DeadJob:
    id: int
    queue: str
    task: str
    args: JSONValue
    priority: int
    attempt: int
    max_attempts: int
    dedup_key: str | None
    reason: str
    last_error: str | None
    traceback: str | None
    enqueued_at: dt.datetime
    died_at: dt.datetime

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> DeadJob:
        """From `trioq._db.statements`'s dead_list columns; args come as JSON text, decoded here
        (an `UndecodableArgs` if Python cannot decode them: listing never fails on a row)."""
        fields = dict(zip([f.name for f in attrs.fields(cls)], row, strict=True))
        if isinstance(fields["args"], str):
            fields["args"] = decode_args(fields["args"])
        return cls(**fields)


async def list_dead(
    conn: Conn, sql: Statements, where: DeadFilter, *, limit: int = 100
) -> list[DeadJob]:
    cur = await tolerant(conn).execute(sql.dead_list, {**where.params(), "limit": limit})
    return [DeadJob.from_row(row) for row in await cur.fetchall()]


async def retry_dead(
    conn: Conn, sql: Statements, where: DeadFilter, *, dry_run: bool = False
) -> list[int]:
    """Move matching dead jobs back to available with fresh attempts; their ids. With
    ``dry_run``, only the ids it would move now, and nothing moves.

    A dead job whose dedup twin is live stays dead (retrying it would duplicate).
    """
    cur = await conn.execute(sql.dead_retryable if dry_run else sql.dead_retry, where.params())
    return sorted(row[0] for row in await cur.fetchall())


async def purge_dead(
    conn: Conn,
    sql: Statements,
    where: DeadFilter,
    *,
    before: dt.datetime | None = None,
    older_than: dt.timedelta | None = None,
    dry_run: bool = False,
) -> list[int]:
    """Delete matching dead jobs (optionally only those that died before ``before``, or
    more than ``older_than`` ago on the database's clock); their ids. With ``dry_run``, only
    the ids it would delete now, and nothing is deleted."""
    if before is not None and before.utcoffset() is None:
        raise ValueError(f"before {before.isoformat()} is a naive datetime: give it a time zone")
    if older_than is not None and not (
        isinstance(older_than, dt.timedelta) and older_than >= dt.timedelta(0)
    ):
        raise ValueError(f"older_than must be a timedelta, not negative, got {older_than!r}")
    params = {**where.params(), "before": before, "older_than": older_than}
    cur = await conn.execute(sql.dead_purgeable if dry_run else sql.dead_purge, params)
    return sorted(row[0] for row in await cur.fetchall())
