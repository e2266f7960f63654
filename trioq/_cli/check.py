"""``trioq check``: a health probe (a Kubernetes readiness or startup probe, a deploy gate).

It connects to the configured database, within ``--timeout`` seconds, and checks that the
schema is at the version this trioq needs, complete, and writable (what ``trioq serve``
checks before it starts). It never starts the embedded Postgres: with no DSN configured it
checks the embedded server only if it is already running.

Exit codes (docs/cli.md#trioq-check):

- 0: the database answered and the schema is current;
- 1: the database did not answer (refused, unreachable, bad credentials, ``--timeout``
  passed, or no DSN and no embedded server running);
- 2: usage (from argparse);
- 3: it answered, but the schema is not what this trioq needs: missing (run ``trioq
  migrate``), older (run ``trioq migrate``), newer (upgrade trioq), incomplete, or the
  database refuses writes.

One line of text, or with ``--json`` one object: ``{"ok": true, "database", "schema",
"version"}`` or ``{"ok": false, "error", "message", ...}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import psycopg
import trio

from .._db.migrate import check_current, latest_version
from .._exceptions import SchemaError
from .._pg.connection import connect
from .._pg.dsn import configured_dsn
from .._pg.embedded import EmbeddedPostgres
from .._pg.errors import redact_dsn
from .options import Commands, bounded, command

__all__ = ["EXIT_SCHEMA", "EXIT_UNREACHABLE", "add_check_parser"]

EXIT_OK, EXIT_UNREACHABLE, EXIT_SCHEMA = 0, 1, 3


def add_check_parser(commands: Commands, common: argparse.ArgumentParser) -> None:
    sub = command(
        commands, "check", parents=[common],
        help="health probe: exit 0 if the database answers and the schema is current "
        "(1 unreachable, 3 schema missing, outdated, newer or read-only)",
        description="Health probe: exit 0 if the database answers within --timeout and "
        "trioq's schema is current and writable; 1 if it does not answer; 3 if the schema is "
        "missing, outdated, newer than this trioq, incomplete, or read-only.",
        epilog="examples:\n  trioq check\n  trioq check --timeout 2 --json\n"
        "  # Kubernetes: readinessProbe: {exec: {command: [trioq, check]}}",
    )  # fmt: skip
    sub.add_argument("--timeout", type=_timeout, default=5.0, help="seconds (default 5)")
    sub.set_defaults(handler=_check)


_timeout = bounded(float, 0, 3600, above=True)  # seconds


def _check(args: argparse.Namespace) -> int:
    dsn = configured_dsn(args.dsn)
    if dsn is None:
        status = EmbeddedPostgres.from_env().status()
        if not status.running:
            return _report(args, EXIT_UNREACHABLE, {
                "error": "unreachable", "database": redact_dsn(status.dsn),
                "message": "no DSN is configured (--dsn, $TRIOQ_DSN, $DATABASE_URL) and the "
                f"embedded Postgres is {status.state}",
            })  # fmt: skip
        dsn = status.dsn
    code, payload = trio.run(_probe, dsn, args.schema, args.timeout)
    return _report(args, code, payload)


async def _probe(dsn: str, schema: str, seconds: float) -> tuple[int, dict[str, Any]]:
    where = {"database": redact_dsn(dsn), "schema": schema, "expected_version": latest_version()}
    try:
        with trio.fail_after(seconds):
            async with await connect(dsn, autocommit=True) as conn:
                version = await check_current(conn, schema)
    except trio.TooSlowError:
        message = f"the database did not answer within {seconds:g} s"
        return EXIT_UNREACHABLE, {"error": "unreachable", "message": message, **where}
    except SchemaError as ex:
        return EXIT_SCHEMA, {"error": type(ex).__name__, "message": _line(ex), **where}
    except (psycopg.Error, OSError) as ex:
        return EXIT_UNREACHABLE, {"error": "unreachable", "message": _line(ex), **where}
    return EXIT_OK, {**where, "version": version}


def _report(args: argparse.Namespace, code: int, payload: dict[str, Any]) -> int:
    ok = code == EXIT_OK
    if args.json:
        print(json.dumps({"ok": ok, **payload}))
    elif ok:
        print(f"ok: {payload['database']}, schema {payload['schema']} at version "
              f"{payload['version']} (current)")  # fmt: skip
    else:
        print(f"trioq check: {payload['message']}", file=sys.stderr)
    return code


def _line(ex: BaseException) -> str:
    lines = str(ex).strip().splitlines()
    return lines[0] if lines else type(ex).__name__
