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

from .._config import Config, QueueConfig, parse_address
from .._db.migrate import migrate
from .._pg.connection import connect
from .._pg.dsn import DSN_ENV_VARS, configured_dsn
from .._pg.embedded import EmbeddedPostgres
from .._pg.errors import check_dsn
from .._registry import Registry
from .._worker.pooling import SESSION_DSN_VAR, session_dsn
from .logs import LOG_FORMAT, LOG_LEVELS, RedactingFormatter, setup_logging
from .options import Commands, command
from .supervisor import parent_fd_from_env, stop_when_orphaned, supervise

__all__ = ["LOG_FORMAT", "RedactingFormatter", "add_serve_parser", "load_app"]

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
    sub.add_argument("--queues", help="comma-separated queues to serve (default: the app's)")
    sub.add_argument("--concurrency", type=int, help="slots per queue (default 10)")
    sub.add_argument("--migrate", action="store_true", help="run `trioq migrate` first")
    sub.add_argument(
        "--session-dsn", metavar="URL",
        help="when --dsn is a transaction-mode pooler (PgBouncer): a DSN straight to Postgres "
        "for LISTEN, the liveness lock and --migrate; the pooled connections then prepare no "
        f"statements (default: the app's Config.session_dsn, ${SESSION_DSN_VAR}, else --dsn)",
    )  # fmt: skip
    sub.add_argument(
        "--no-prepared-statements", action="store_true",
        help="never prepare statements on the server (Config.prepared_statements=False)",
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
        "--metrics", metavar="HOST:PORT", help="serve Prometheus metrics on http://HOST:PORT"
        "/metrics (port 0: any free one; with --processes N, N consecutive ports)",
    )  # fmt: skip
    sub.add_argument(
        "--log-format", choices=("text", "json"), default="text",
        help="text lines (default) or one JSON object per line",
    )  # fmt: skip
    sub.add_argument("--log-level", choices=LOG_LEVELS, default="info", help="default info")
    # --schema: given, it wins over the app's Config.schema, as --queues, --metrics and the
    # other options do; not given, the app's (a Registry's: trioq). So no default here (on
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


def _config(args: argparse.Namespace, app: Config | Registry, dsn: str) -> Config:
    config = app if isinstance(app, Config) else Config(registry=app)
    if args.schema is not None:
        config = attrs.evolve(config, schema=args.schema)
    queues = (
        [q.strip() for q in args.queues.split(",") if q.strip()]
        if args.queues
        else list(config.served_queues())
    )
    base = config.queues or {}
    slots = {name: base.get(name, QueueConfig()) for name in queues}
    if args.concurrency:  # the slots change; the app's limits (global_concurrency, ...) stay
        slots = {n: attrs.evolve(q, concurrency=args.concurrency) for n, q in slots.items()}
    metrics = args.metrics or config.metrics
    if args.metrics:
        parse_address(args.metrics, "--metrics")  # the option named in the error
    pooling: dict[str, Any] = {}
    if args.session_dsn:
        pooling["session_dsn"] = check_dsn(args.session_dsn, what="--session-dsn")
    if args.no_prepared_statements:
        pooling["prepared_statements"] = False
    return attrs.evolve(
        config, dsn=dsn, queues=slots, handle_signals=True, metrics=metrics, **pooling
    )


def _serve(args: argparse.Namespace) -> int:
    # The parent of --processes passes its choice in the environment; take it out at once.
    from_parent = os.environ.pop(CHILD_DSN_VAR, None)
    args.parent_fd = parent_fd_from_env()
    args.session_dsn = os.environ.pop(CHILD_SESSION_DSN_VAR, None) or args.session_dsn
    formatter = setup_logging(args.log_format, args.log_level)
    given = [from_parent, args.dsn, args.session_dsn]
    formatter.add_dsns([*given, *(os.environ.get(v) for v in (*DSN_ENV_VARS, SESSION_DSN_VAR))])
    sys.path.insert(0, "")  # --app modules from the current directory, like python -m
    if args.processes < 1:
        raise ValueError(f"--processes must be at least 1, got {args.processes}")
    app = load_app(args.app)
    # --dsn, then the app's Config.dsn, then TRIOQ_DSN / DATABASE_URL, then embedded.
    dsn = configured_dsn(from_parent or args.dsn or (app.dsn if isinstance(app, Config) else None))
    formatter.add_dsns([dsn, app.session_dsn if isinstance(app, Config) else None])
    if dsn is not None:
        return _serve_on(args, app, dsn, args.migrate)
    with EmbeddedPostgres.from_env().running() as status:
        # The embedded database is trioq's own: keep its schema current without asking.
        return _serve_on(args, app, status.dsn, True)


def _serve_on(
    args: argparse.Namespace, app: Config | Registry, dsn: str, run_migrations: bool
) -> int:
    config = _config(args, app, dsn)
    if args.processes == 1:
        trio.run(_run, config, run_migrations, args.parent_fd)
        return 0
    if run_migrations:
        trio.run(_migrate, session_dsn(config, dsn), config.schema)
    with _environment(CHILD_DSN_VAR, dsn), _environment(CHILD_SESSION_DSN_VAR, args.session_dsn):
        return trio.run(supervise, _child_argv(args), args.processes)


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


def _child_argv(args: argparse.Namespace) -> list[str]:
    """The workers' command line: no DSN (it is in their environment, `CHILD_DSN_VAR`)."""
    argv = ["serve", "--app", args.app,
            "--log-format", args.log_format, "--log-level", args.log_level]  # fmt: skip
    if args.schema is not None:
        argv += ["--schema", args.schema]
    if args.queues:
        argv += ["--queues", args.queues]
    if args.concurrency:
        argv += ["--concurrency", str(args.concurrency)]
    if args.no_prepared_statements:
        argv.append("--no-prepared-statements")
    if args.metrics:  # one port each: the first free one of as many as there are workers
        host, first, last = parse_address(args.metrics, "--metrics")
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
