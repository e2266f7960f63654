"""``trioq db start | stop | status | url``: manage the embedded Postgres from the shell.

Each subcommand's handler is stored as ``args.handler`` and returns the exit code:
0 success, 1 error (message on stderr); ``status`` returns 0 if the server is running and 3 if
it is not (the LSB ``status`` convention). ``url`` prints only the DSN, for
``psql "$(trioq db url)"``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from trioq._exceptions import EmbeddedPostgresError
from trioq._pg.embedded import EmbeddedPostgres, EmbeddedStatus

from .options import command, data_dir

__all__ = ["EXIT_ERROR", "EXIT_NOT_RUNNING", "EXIT_OK", "add_db_parser"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_NOT_RUNNING = 3

_DB_EPILOG = """\
The embedded server is used when no DSN is configured (TRIOQ_DSN, DATABASE_URL or --dsn).
Data lives in ~/.local/share/trioq/pg<major> (/var/lib/trioq/pg<major> as root), or in
$TRIOQ_EMBEDDED_DIR. See docs/embedded.md.

examples:
  trioq db start
  psql "$(trioq db url)"
  trioq db status --json
  trioq db stop
"""

_HELP = {
    "start": (
        "start the embedded Postgres in the background (it outlives this command)",
        "example:\n  trioq db start && psql \"$(trioq db url)\" -c 'select 1'",
    ),
    "stop": (
        "stop the embedded Postgres (fast shutdown), whoever started it",
        "example:\n  trioq db stop",
    ),
    "status": (
        "show whether the embedded Postgres is running; exit code 0 running, 3 not running",
        "examples:\n  trioq db status\n  trioq db status --json | jq -r .pid\n"
        "  trioq db status >/dev/null || trioq db start",
    ),
    "url": (
        "print the DSN of the embedded Postgres (only the DSN; does not start it)",
        'example:\n  psql "$(trioq db url)"\n'
        '  TRIOQ_DSN="$(trioq db url)" trioq serve --app myapp.jobs:tasks',
    ),
}


def add_db_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``db`` and its subcommands on the top-level ``trioq`` subparsers."""
    db = command(
        subparsers, "db", help="manage the embedded Postgres server",
        description="Manage the embedded Postgres server trioq uses when no DSN is configured.",
        epilog=_DB_EPILOG,
    )  # fmt: skip
    commands = db.add_subparsers(dest="db_command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir",
        type=data_dir,
        default=None,
        help="data directory (default: $TRIOQ_EMBEDDED_DIR or the per-user default)",
    )
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "start": _start,
        "stop": _stop,
        "status": _status,
        "url": _url,
    }
    for name, handler in handlers.items():
        summary, example = _HELP[name]
        parser = command(commands, name, parents=[common], help=summary, epilog=example)
        parser.set_defaults(handler=_reporting_errors(name, handler))
        if name == "status":
            parser.add_argument("--json", action="store_true", help="print the status as JSON")


def _reporting_errors(
    name: str, handler: Callable[[argparse.Namespace], int]
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except EmbeddedPostgresError as exc:
            if getattr(args, "json", False):
                print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
            print(f"trioq db {name}: error: {exc}", file=sys.stderr)
            return EXIT_ERROR

    return run


def _server(args: argparse.Namespace) -> EmbeddedPostgres:
    data_dir: Path | None = args.data_dir
    return EmbeddedPostgres.from_env(data_dir=data_dir.absolute() if data_dir else None)


def _start(args: argparse.Namespace) -> int:
    server = _server(args)
    before = server.status()
    status = before if before.running else server.start_detached()
    verb = "already running" if before.running else "started"
    print(f"embedded Postgres {status.version} {verb} (pid {status.pid})")
    print(f"  data: {status.data_dir}\n  log:  {status.log_file}\n  url:  {status.dsn}")
    return EXIT_OK


def _stop(args: argparse.Namespace) -> int:
    server = _server(args)
    pid = server.status().pid
    print(f"stopped (pid {pid})" if server.stop() else "not running")
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    status = _server(args).status()
    print(json.dumps(status.to_json(), indent=2) if args.json else _describe(status))
    return EXIT_OK if status.running else EXIT_NOT_RUNNING


def _describe(status: EmbeddedStatus) -> str:
    state = f"{status.state} (pid {status.pid})" if status.pid else status.state
    return "\n".join(
        [
            f"state:    {state}",
            f"version:  {status.version}",
            f"data dir: {status.data_dir}",
            f"socket:   {status.socket_dir}",
            f"log:      {status.log_file}",
            f"url:      {status.dsn}",
        ]
    )


def _url(args: argparse.Namespace) -> int:
    print(_server(args).dsn())
    return EXIT_OK
