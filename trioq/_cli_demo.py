"""``trioq demo``: the README's first command.

Starts the embedded Postgres (unless a DSN is configured), migrates trioq's
schema, and prints what is there. Later it will also run a worker and show
jobs flowing through it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import attrs
import trio
from psycopg import sql

from ._dsn import configured_dsn, database
from ._migrate import migrate
from ._pg import connect
from ._pg_errors import redact_dsn
from ._schema import qualified

__all__ = ["DemoReport", "demo"]


@attrs.frozen(kw_only=True)
class DemoReport:
    database: str  # redacted: never a password
    embedded: bool
    server_version: str
    schema: str
    schema_version: int
    applied: tuple[int, ...]
    jobs: int
    dead_jobs: int


def demo(args: argparse.Namespace) -> int:
    embedded = configured_dsn(args.dsn) is None
    with database(args.dsn) as dsn:
        report = trio.run(_demo, dsn, args.schema, embedded)
    if args.json:
        print(json.dumps({**attrs.asdict(report), "applied": list(report.applied)}))
    else:
        print(_describe(report))
    return 0


async def _demo(dsn: str, schema: str, embedded: bool) -> DemoReport:
    async with await connect(dsn, autocommit=True) as conn:
        result = await migrate(conn, schema)
        return DemoReport(
            database=redact_dsn(dsn),
            embedded=embedded,
            server_version=str(conn.info.parameter_status("server_version")),
            schema=schema,
            schema_version=result.version,
            applied=result.applied,
            jobs=await _count(conn, schema, "jobs"),
            dead_jobs=await _count(conn, schema, "dead_jobs"),
        )


async def _count(conn: Any, schema: str, table: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {}").format(qualified(schema, table))
    cur = await conn.execute(query)
    row = await cur.fetchone()
    return int(row[0]) if row else 0


def _describe(report: DemoReport) -> str:
    where = "embedded Postgres" if report.embedded else "Postgres"
    applied = ", ".join(map(str, report.applied)) or "none, already current"
    return "\n".join(
        [
            f"trioq is ready on {where} {report.server_version}",
            f"  database: {report.database}",
            f"  schema:   {report.schema} (version {report.schema_version}; applied: {applied})",
            f"  jobs:     {report.jobs} waiting or running, {report.dead_jobs} dead",
        ]
    )
