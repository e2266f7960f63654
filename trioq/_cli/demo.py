"""``trioq demo``: the README's first command.

Starts the embedded Postgres (unless a DSN is configured), migrates a schema of its
own (`DEMO_SCHEMA` unless ``--schema`` names another), enqueues a few jobs of the
example app (`trioq.examples.hello`) on a queue of its own (`DEMO_QUEUE`), runs a
worker for that queue only until they are all done, and prints what happened.

Pointed at an application's database it touches nothing of the application's: its
worker serves only `DEMO_QUEUE` and it counts only its own jobs, even with
``--schema`` set to the application's schema.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any

import attrs
import trio
from psycopg import sql

from .._config import Config, QueueConfig
from .._db.migrate import migrate
from .._db.statements import qualified
from .._job import JobSpec
from .._pg.connection import connect
from .._pg.dsn import configured_dsn, database
from .._pg.errors import redact_dsn
from .._queue import Queue
from .._registry import Registry

__all__ = ["DEMO_QUEUE", "DEMO_SCHEMA", "DemoReport", "demo"]

DEMO_TIMEOUT = 60.0
DEMO_SCHEMA = "trioq_demo"
DEMO_QUEUE = "trioq-demo"


@attrs.frozen(kw_only=True)
class DemoReport:
    database: str  # redacted: never a password
    embedded: bool
    server_version: str
    schema: str
    schema_version: int
    enqueued: int
    completed: int
    dead: int
    seconds: float


def demo(args: argparse.Namespace) -> int:
    embedded = configured_dsn(args.dsn) is None
    # With --json, stdout carries only the report: the example handlers' prints go to stderr.
    quiet = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    with database(args.dsn) as dsn, quiet:
        report = trio.run(_demo, dsn, args.schema, embedded, not args.json)
    if args.json:
        print(json.dumps(attrs.asdict(report)))
    else:
        print(_describe(report))
    return 0 if report.completed + report.dead == report.enqueued else 1


def _on_demo_queue(tasks: Registry) -> Registry:
    """The example's tasks on `DEMO_QUEUE`, the one queue the demo's worker serves (so the
    start-up banner has no queue without tasks, nor tasks without their queue, to warn of)."""
    moved = Registry()
    for task in tasks:
        moved.add(attrs.evolve(task, queue=DEMO_QUEUE))
    return moved


def _jobs() -> list[JobSpec]:
    names = ["ada", "grace", "barbara", "frances", "hedy", "radia", "katherine", "margaret"]
    return (
        [JobSpec(task="greet", args={"name": n}, queue=DEMO_QUEUE) for n in names]
        + [JobSpec(task="flaky", args={"chance": 0.5}, queue=DEMO_QUEUE) for _ in range(4)]
        + [JobSpec(task="crunch", args={"n": 10_000 * (i + 1)}, queue=DEMO_QUEUE) for i in range(4)]
    )


async def _demo(dsn: str, schema: str, embedded: bool, verbose: bool) -> DemoReport:
    from ..examples.hello import tasks

    async with await connect(dsn, autocommit=True) as conn:
        result = await migrate(conn, schema)
        queue = Queue(schema=schema)
        if verbose:
            print(f"trioq {schema!r} schema at version {result.version} on {redact_dsn(dsn)}")
        start = time.monotonic()
        enqueued = await queue.enqueue_many(conn, _jobs())
        ids = [r.job_id for r in enqueued]
        if verbose:
            print(f"enqueued {len(ids)} jobs; a worker with 4 slots runs them:")
        config = Config(
            dsn=dsn, registry=_on_demo_queue(tasks), schema=schema,
            queues={DEMO_QUEUE: QueueConfig(concurrency=4)}, poll_interval=0.5,
        )  # fmt: skip
        async with trio.open_nursery() as nursery:
            runtime = await nursery.start(_serve, config)
            with trio.move_on_after(DEMO_TIMEOUT):
                await _wait_until_settled(conn, schema, ids)
            runtime.stop()
        dead = await _count(conn, schema, "dead_jobs", ids)
        live = await _live(conn, schema, ids)
        return DemoReport(
            database=redact_dsn(dsn),
            embedded=embedded,
            server_version=str(conn.info.parameter_status("server_version")),
            schema=schema,
            schema_version=result.version,
            enqueued=len(ids),
            completed=len(ids) - dead - live,
            dead=dead,
            seconds=round(time.monotonic() - start, 3),
        )


async def _serve(config: Config, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    from .._worker.serve import serve

    await serve(config, task_status=task_status)


async def _wait_until_settled(conn: Any, schema: str, ids: list[int]) -> None:
    """Poll (this is a demo, not a test) until none of our jobs is waiting or running."""
    while await _live(conn, schema, ids):  # noqa: ASYNC110 - the database cannot tell us
        await trio.sleep(0.05)


async def _live(conn: Any, schema: str, ids: list[int]) -> int:
    query = sql.SQL(
        "SELECT count(*) FROM {} WHERE id = ANY(%s)"
        " AND state IN ('scheduled', 'available', 'running')"
    ).format(qualified(schema, "jobs"))
    cur = await conn.execute(query, (ids,))
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _count(conn: Any, schema: str, table: str, ids: list[int]) -> int:
    query = sql.SQL("SELECT count(*) FROM {} WHERE id = ANY(%s)").format(qualified(schema, table))
    cur = await conn.execute(query, (ids,))
    row = await cur.fetchone()
    return int(row[0]) if row else 0


def _describe(report: DemoReport) -> str:
    where = "embedded Postgres" if report.embedded else "Postgres"
    return "\n".join(
        [
            f"done: {report.completed} of {report.enqueued} jobs completed, {report.dead} dead, "
            f"in {report.seconds:.2f} s",
            f"  database: {where} {report.server_version} at {report.database}",
            f"  schema:   {report.schema} (version {report.schema_version})",
            "  next: trioq serve --app trioq.examples.hello:tasks  (see docs/getting-started.md)",
        ]
    )
