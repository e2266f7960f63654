"""The ``trioq`` command line.

Exit codes: 0 success; 1 an error, explained on stderr in one line (no
traceback; with ``--json`` also one object on stdout); 2 a usage error (from argparse);
3 ``trioq db status``: not running, ``trioq check``: the schema is not current; 141
stdout was a pipe whose reader had gone (`EXIT_BROKEN_PIPE`).
Every command honours ``--dsn``, then ``TRIOQ_DSN``, then ``DATABASE_URL``, and
uses the embedded Postgres when none is set.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import psycopg
import trio

from .. import __version__
from .._db.migrate import migrate
from .._exceptions import EmbeddedPostgresError, ListenError, SchemaError, leaves
from .._pg.connection import connect
from .._pg.dsn import DSN_ENV_VARS
from .._pg.errors import dsn_secrets, redact
from .check import add_check_parser
from .cron import add_cron_parser
from .db import add_db_parser
from .demo import DEMO_QUEUE, DEMO_SCHEMA, demo
from .jobs import add_jobs_parser
from .ops import add_ops_parsers
from .options import command, database_options
from .queues import add_queue_parser
from .serve import add_serve_parser
from .stress import add_stress_parser
from .web import add_web_parser

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

__all__ = ["main"]

EXIT_OK = 0
EXIT_ERROR = 1

#: Errors that are the user's to fix: printed as one line, no traceback.
_EXPECTED_ERRORS = (psycopg.Error, SchemaError, EmbeddedPostgresError, ValueError, ListenError)


def _parser_class(json_errors: bool) -> type[argparse.ArgumentParser]:
    """argparse's parser, whose usage errors (exit code 2) are also one JSON object on
    stdout when the command line asks for ``--json``."""

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            if json_errors:
                print(json.dumps({"error": "usage", "message": f"{self.prog}: {message}"}))
            super().error(message)

        def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
            # argparse's swallows every OSError: unbuffered (PYTHONUNBUFFERED), ``--help``
            # into a closed pipe would exit 0 while other output exits EXIT_BROKEN_PIPE.
            if message:
                (file or sys.stderr).write(message)

    return Parser


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``trioq`` parser; ``argv`` (default: ``sys.argv``) only decides whether usage
    errors are also printed as JSON (``--json`` anywhere on it)."""
    words = sys.argv[1:] if argv is None else argv
    parser = _parser_class("--json" in words)(
        prog="trioq",
        description="A Postgres-backed job queue and worker runtime for trio.",
        epilog="examples:\n  trioq demo\n  trioq migrate --dsn postgresql://app@db/app\n"
        "  trioq db start",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"trioq {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = database_options()
    _add(
        commands,
        "migrate",
        _migrate,
        common,
        help="create or upgrade trioq's tables (idempotent, safe to run concurrently)",
        example="trioq migrate\n  trioq migrate --dsn postgresql://app@db/app --schema jobs",
    )
    _add(
        commands,
        "demo",
        demo,
        database_options(),  # its own: set_defaults below changes the shared actions' default
        help="run the example app: start the embedded Postgres (unless a DSN is set), make a "
        f"schema of its own ({DEMO_SCHEMA} unless --schema says otherwise), enqueue 16 jobs "
        f"on its own queue ({DEMO_QUEUE}) and run them with a worker",
        example="trioq demo\n  trioq demo --json",
    ).set_defaults(schema=DEMO_SCHEMA)
    serve_options = database_options(  # its own: see set_defaults there
        schema_help="trioq's schema (default: $TRIOQ_SCHEMA, the app's Config.schema, else "
        "trioq)",
        dsn_help="Postgres DSN (default: $TRIOQ_DSN, $DATABASE_URL, the app's Config.dsn, else "
        "the embedded Postgres)",
        json_help="log JSON lines (--log-format json); an error is one JSON object on stdout too",
    )
    add_serve_parser(commands, serve_options)
    add_stress_parser(commands, common)
    add_ops_parsers(commands, common)
    add_jobs_parser(commands, common)
    add_cron_parser(commands, common)
    add_check_parser(commands, common)
    add_queue_parser(commands, common)
    add_db_parser(commands)
    add_web_parser(commands, common)
    return parser


def _add(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    handler: Callable[[argparse.Namespace], int],
    common: argparse.ArgumentParser,
    *,
    help: str,
    example: str,
) -> argparse.ArgumentParser:
    sub = command(commands, name, parents=[common], help=help, epilog=f"example:\n  {example}")
    sub.set_defaults(handler=handler)
    return sub


def _migrate(args: argparse.Namespace) -> int:
    from .._pg.dsn import database

    with database(args.dsn) as dsn:
        result = trio.run(_migrate_async, dsn, args.schema)
    if args.json:
        print(json.dumps({**_asdict(result), "applied": list(result.applied)}))
    elif result.applied:
        applied = ", ".join(str(v) for v in result.applied)
        print(
            f"schema {result.schema!r}: version {result.previous_version} -> "
            f"{result.version} (applied {applied})"
        )
    else:
        print(f"schema {result.schema!r} is up to date at version {result.version}")
    return EXIT_OK


async def _migrate_async(dsn: str, schema: str) -> Any:
    async with await connect(dsn, autocommit=True) as conn:
        return await migrate(conn, schema, on_wait=_say_waiting)


def _say_waiting(message: str) -> None:
    """Another session migrates the same schema: say whom we wait for (stderr, not the
    output: ``--json`` keeps stdout to the result)."""
    print(f"trioq migrate: {message}", file=sys.stderr, flush=True)


def _asdict(obj: Any) -> dict[str, Any]:
    import attrs

    return attrs.asdict(obj)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code. Output into a pipe that closed (``trioq db status |
    head -1``) ends the command quietly with `EXIT_BROKEN_PIPE`: the reader has gone, so
    there is nobody to tell, and a traceback on stderr would only hide the output that was
    read."""
    try:
        try:
            return _command(argv)
        finally:
            sys.stdout.flush()  # what is buffered meets the closed pipe here, not at exit
    except BrokenPipeError:
        return _stdout_closed()
    except BaseExceptionGroup as group:  # raised inside trio.run
        if not all(isinstance(leaf, BrokenPipeError) for leaf in leaves(group)):
            raise
        return _stdout_closed()


#: The exit code of a command whose stdout closed: 128 + SIGPIPE, what a shell shows for a
#: process the signal killed (Python ignores SIGPIPE, so the write fails instead).
EXIT_BROKEN_PIPE = 141


def _stdout_closed() -> int:
    """Point stdout at /dev/null, so the interpreter's last flush at exit (what is still
    buffered) does not fail again and print "Exception ignored ... BrokenPipeError"."""
    with contextlib.suppress(OSError, ValueError):  # no file descriptor: not a real stdout
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return EXIT_BROKEN_PIPE


def _command(argv: Sequence[str] | None) -> int:
    args = build_parser(argv).parse_args(argv)
    try:
        code: int = args.handler(args)
    except _EXPECTED_ERRORS as ex:
        return _fail(args, ex)
    except BaseExceptionGroup as group:
        leaf = _expected_leaf(group)
        if leaf is None:
            raise
        return _fail(args, leaf)
    except KeyboardInterrupt:
        return 130
    return code


def _fail(args: argparse.Namespace, ex: BaseException) -> int:
    """One line on stderr, with any password of the configured DSNs scrubbed (belt and
    braces: the messages are built not to contain one); with ``--json``, also one object on
    stdout: ``{"error": <the exception's type>, "message": <that line>}``."""
    lines = str(ex).strip().splitlines() or [type(ex).__name__]
    given = [getattr(args, name, None) for name in ("dsn", "session_dsn", "pooler_dsn")]
    dsns = [*given, *(os.environ.get(name) for name in (*DSN_ENV_VARS, "TRIOQ_SESSION_DSN"))]
    message = redact(lines[0], dsn_secrets(dsns))
    if getattr(args, "json", False):
        print(json.dumps({"error": type(ex).__name__, "message": message}))
    print(f"trioq: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def _expected_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The first error of a group (trio nurseries raise groups) if every one is expected."""
    found = leaves(group)
    if all(isinstance(ex, _EXPECTED_ERRORS) for ex in found):
        return found[0]
    return None
