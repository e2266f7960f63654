"""``trioq serve --app MODULE:ATTRIBUTE``: run a worker process."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import trio

from .._config import Config, parse_address
from .._db.migrate import migrate
from .._pg.connection import connect
from .._pg.dsn import DSN_ENV_VARS
from .._pg.embedded import EmbeddedPostgres
from .._registry import Registry
from .._worker.pooling import SESSION_DSN_VAR, session_dsn
from .logs import LOG_FORMAT, LOG_LEVELS, RedactingFormatter, setup_logging
from .options import Commands, command
from .settings import SETTINGS, add_settings, build_config, given_settings
from .supervisor import parent_fd_from_env, stop_when_orphaned, supervise

__all__ = ["LOG_FORMAT", "RedactingFormatter", "add_serve_parser", "load_app", "log_format"]

_EPILOG = """\
examples:
  trioq serve --app trioq.examples.hello:tasks
  trioq serve --app myapp.jobs:config --dsn postgresql://app@db/app --queues email,sms
  trioq serve --app myapp.jobs:tasks --concurrency 50 --migrate
  trioq serve --app myapp.jobs:tasks --dsn postgresql://app@pgbouncer:6432/app \
      --session-dsn postgresql://app@db:5432/app     # through PgBouncer: docs/pooling.md

MODULE:ATTRIBUTE names a trioq.Config or a trioq.Registry (then every queue its
tasks use is served with --concurrency slots). SIGINT/SIGTERM stop gracefully
(waiting up to the shutdown grace); a second signal stops at once. Exit code 0
after a clean stop, 1 on an error.
"""


#: How ``serve --processes N`` hands its DSN to the workers: in their environment, never
#: on their command lines (which every local user can read in /proc/<pid>/cmdline).
CHILD_DSN_VAR = "TRIOQ_SERVE_CHILD_DSN"
#: The same for ``--session-dsn``.
CHILD_SESSION_DSN_VAR = "TRIOQ_SERVE_CHILD_SESSION_DSN"



class AppError(ValueError):
    """``--app`` does not name a Config or a Registry."""


def add_serve_parser(commands: Commands, common: argparse.ArgumentParser) -> None:
    sub = command(commands, "serve", parents=[common], epilog=_EPILOG,
                  help="run a worker process for an app's tasks",
                  description="Run a worker process: claim jobs, run their handlers, record "
                  "outcomes.")  # fmt: skip
    sub.add_argument("--app", required=True, help="MODULE:ATTRIBUTE of a Config or Registry")
    sub.add_argument("--migrate", action="store_true", help="run `trioq migrate` first")
    sub.add_argument(
        "--no-prepared-statements", dest="prepared_statements", action="store_const",
        const="off", help="--prepared-statements off",
    )  # fmt: skip
    sub.add_argument(
        "--processes",
        type=int,
        default=1,
        help="worker processes, one per core (default 1). Above 1, a supervisor restarts a "
        "worker that dies (and gives up on one that keeps dying as it starts); 1 runs the "
        "worker in this process, unsupervised: a crash exits (use a process manager)",
    )
    sub.add_argument(
        "--log-format", choices=("text", "json"),
        help="text lines (default) or one JSON object per line (--json says json too)",
    )  # fmt: skip
    sub.add_argument("--log-level", choices=LOG_LEVELS, default="info", help="default info")
    add_settings(sub)
    # --schema: given, it wins over the app's Config.schema, as every setting does; not
    # given, $TRIOQ_SCHEMA, else the app's (a Registry's: trioq). So no default here (on
    # options of serve's own: set_defaults changes the default of the parent's actions).
    sub.set_defaults(handler=_serve, schema=None)


def load_app(spec: str) -> Config | Registry:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise AppError(f"--app must look like MODULE:ATTRIBUTE, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as ex:
        raise AppError(f"--app {spec!r}: cannot import {module_name!r}: {ex}") from None
    app = getattr(module, attribute, None)
    if not isinstance(app, Config | Registry):
        raise AppError(f"--app {spec!r} is {type(app).__name__}, not a trioq.Config or Registry")
    return app


def log_format(args: argparse.Namespace) -> str:
    """``--log-format``, or ``json`` for ``--json`` (the option every command takes says
    JSON: for serve, whose output is its log, that is JSON lines)."""
    if args.json and args.log_format == "text":
        raise ValueError("--json asks for JSON log lines, --log-format text for text: give one")
    return "json" if args.json else args.log_format or "text"


def _serve(args: argparse.Namespace) -> int:
    # The parent of --processes passes its choice in the environment; take it out at once.
    args.dsn = os.environ.pop(CHILD_DSN_VAR, None) or args.dsn
    args.parent_fd = parent_fd_from_env()
    args.session_dsn = os.environ.pop(CHILD_SESSION_DSN_VAR, None) or args.session_dsn
    args.log_format = log_format(args)
    formatter = setup_logging(args.log_format, args.log_level)
    given = [args.dsn, args.session_dsn]
    formatter.add_dsns([*given, *(os.environ.get(v) for v in (*DSN_ENV_VARS, SESSION_DSN_VAR))])
    if args.processes < 1:
        raise ValueError(f"--processes must be at least 1, got {args.processes}")
    settings = given_settings(args, os.environ)  # a bad one stops here: nothing started yet
    sys.path.insert(0, "")  # --app modules from the current directory, like python -m
    # Each setting: the flag, its variable, the app's Config, the default. The database:
    # --dsn, $TRIOQ_DSN, $DATABASE_URL, the app's Config.dsn, else the embedded server.
    config = build_config(settings, load_app(args.app))
    formatter.add_dsns([config.dsn, config.session_dsn])
    if config.dsn is not None:
        return _serve_on(args, config, args.migrate)
    with EmbeddedPostgres.from_env().running() as status:
        # The embedded database is trioq's own: keep its schema current without asking.
        return _serve_on(args, attrs.evolve(config, dsn=status.dsn), True)


def _serve_on(args: argparse.Namespace, config: Config, run_migrations: bool) -> int:
    assert config.dsn is not None
    if args.processes == 1:
        trio.run(_run, config, run_migrations, args.parent_fd)
        return 0
    if run_migrations:
        trio.run(_migrate, session_dsn(config, config.dsn), config.schema)
    with _environment(CHILD_DSN_VAR, config.dsn), \
            _environment(CHILD_SESSION_DSN_VAR, args.session_dsn):  # fmt: skip
        return trio.run(supervise, _child_argv(args, config), args.processes)


@contextmanager
def _environment(name: str, value: str | None) -> Iterator[None]:
    """``os.environ[name] = value`` for the block (children started in it inherit it)."""
    if value is None:
        yield
        return
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _child_argv(args: argparse.Namespace, config: Config) -> list[str]:
    """The workers' command line: the settings given as flags (the variables they inherit),
    no DSN (it is in their environment, `CHILD_DSN_VAR`), and each its metrics port."""
    argv = ["serve", "--app", args.app,
            "--log-format", args.log_format, "--log-level", args.log_level]  # fmt: skip
    for setting in SETTINGS:
        text = getattr(args, setting.dest, None)
        if text is not None and setting.field not in ("dsn", "session_dsn", "metrics"):
            argv += [setting.flag, text]
    if config.metrics:  # one port each: the first free one of as many as there are workers
        host, first, last = parse_address(config.metrics, "--metrics")
        if first == last and first:
            last = min(first + args.processes - 1, 65535)
        span = str(first) if first == last else f"{first}-{last}"
        argv += ["--metrics", f"[{host}]:{span}" if ":" in host else f"{host}:{span}"]
    return argv


async def _migrate(dsn: str, schema: str) -> None:
    async with await connect(dsn, autocommit=True) as conn:
        await migrate(conn, schema)


async def _run(config: Config, run_migrations: bool, parent_fd: int | None = None) -> None:
    from .._worker.serve import serve

    if run_migrations:  # on the session DSN: never through a transaction pooler
        assert config.dsn is not None
        await _migrate(session_dsn(config, config.dsn), config.schema)
    if parent_fd is None:
        await serve(config)
        return
    async with trio.open_nursery() as nursery:  # a worker of `serve --processes N`
        runtime = await nursery.start(_serve_then_cancel, config, nursery.cancel_scope)
        nursery.start_soon(stop_when_orphaned, runtime, parent_fd)


async def _serve_then_cancel(
    config: Config, scope: trio.CancelScope, task_status: trio.TaskStatus[Any]
) -> None:
    """`serve`, then cancel ``scope`` (the supervisor watch beside it: nothing left to do)."""
    from .._worker.serve import serve

    await serve(config, task_status=task_status)
    scope.cancel()
