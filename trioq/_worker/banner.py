"""What a worker says when it starts: where it runs, what it serves, and what looks wrong.

`banner` returns the records `trioq.Runtime` logs (on ``trioq.runtime``) just before
``serve`` reports itself started: one INFO line with the database (its DSN without a
password), the session database when it is another one (``Config.session_dsn``: the
listener and the liveness lock, e.g. past a PgBouncer in transaction mode) and whether
statements are prepared, the schema and its version, the worker id, every served queue
with its slots, the metrics address; then a WARNING for each served queue that no
registered task uses (its jobs would wait for another worker's tasks, or be unknown here)
and for each task whose queue this worker does not serve (its jobs wait for another
worker).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import attrs

from .._config import QueueConfig
from .._pg.errors import redact_dsn
from .._registry import Registry

__all__ = ["Line", "banner"]


@attrs.frozen(kw_only=True)
class Line:
    level: int
    message: str
    extra: Mapping[str, object]


def banner(
    *, dsn: str, schema: str, version: int, worker_id: str, queues: Mapping[str, QueueConfig],
    registry: Registry, metrics_url: str | None, session_dsn: str | None = None,
    prepared: bool = True,
) -> list[Line]:  # fmt: skip
    served = ", ".join(f"{name} ({cfg.concurrency} slots)" for name, cfg in queues.items())
    database = redact_dsn(dsn)
    session = None if session_dsn in (None, dsn) else redact_dsn(session_dsn)
    where = f"database {database}" if session is None else (
        f"database {database} (session database {session}: listener, liveness lock)"
    )
    if not prepared:
        where += ", statements not prepared"
    metrics = metrics_url or "off"
    lines = [
        Line(
            level=logging.INFO,
            message=f"trioq worker {worker_id} started: {where}, schema {schema} "
            f"(version {version}), queues {served}, {len(registry)} tasks, metrics {metrics}",
            extra={
                "worker_id": worker_id, "database": database, "session_database": session,
                "prepared_statements": prepared, "schema": schema,
                "schema_version": version, "metrics": metrics_url,
                "queues": {n: c.concurrency for n, c in queues.items()},
            },
        )
    ]
    return [*lines, *_mismatches(queues, registry)]


def _mismatches(queues: Mapping[str, QueueConfig], registry: Registry) -> list[Line]:
    """What looks wrong: a served queue no task uses, tasks whose queue is not served."""
    used = registry.queues()
    unused = [name for name in queues if name not in used and len(registry)]
    lines = [Line(
        level=logging.WARNING,
        message=f"queue {name!r} is served but no registered task uses it (tasks use "
        f"{', '.join(sorted(used)) or 'no queue'}): is it misspelt?",
        extra={"queue": name},
    ) for name in unused]  # fmt: skip
    for queue, tasks in sorted(used.items()):
        if queue not in queues:
            lines.append(Line(
                level=logging.WARNING,
                message=f"task{'s' if len(tasks) > 1 else ''} {', '.join(sorted(tasks))} use "
                f"queue {queue!r}, which this worker does not serve: their jobs wait for "
                "another worker",
                extra={"queue": queue, "task": sorted(tasks)[0]},
            ))  # fmt: skip
    return lines
