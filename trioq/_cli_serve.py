"""``trioq serve --app MODULE:ATTRIBUTE``: run a worker process."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

import attrs
import trio

from ._config import Config, QueueConfig
from ._dsn import configured_dsn
from ._embedded import EmbeddedPostgres
from ._migrate import migrate
from ._pg import connect
from ._registry import Registry

__all__ = ["add_serve_parser", "load_app"]

_EPILOG = """\
examples:
  trioq serve --app trioq.examples.hello:tasks
  trioq serve --app myapp.jobs:config --dsn postgresql://app@db/app --queues email,sms
  trioq serve --app myapp.jobs:tasks --concurrency 50 --migrate

MODULE:ATTRIBUTE names a trioq.Config or a trioq.Registry (then every queue its
tasks use is served with --concurrency slots). SIGINT/SIGTERM stop gracefully
(waiting up to the shutdown grace); a second signal stops at once. Exit code 0
after a clean stop, 1 on an error.
"""


class AppError(ValueError):
    """``--app`` does not name a Config or a Registry."""


def add_serve_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    sub = commands.add_parser(
        "serve",
        parents=[common],
        help="run a worker process for an app's tasks",
        description="Run a worker process: claim jobs, run their handlers, record outcomes.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub.add_argument("--app", required=True, help="MODULE:ATTRIBUTE of a Config or Registry")
    sub.add_argument("--queues", help="comma-separated queues to serve (default: the app's)")
    sub.add_argument("--concurrency", type=int, help="slots per queue (default 10)")
    sub.add_argument("--migrate", action="store_true", help="run `trioq migrate` first")
    sub.set_defaults(handler=_serve)


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


def _config(args: argparse.Namespace, dsn: str) -> Config:
    app = load_app(args.app)
    config = app if isinstance(app, Config) else Config(registry=app, schema=args.schema)
    queues = (
        [q.strip() for q in args.queues.split(",") if q.strip()]
        if args.queues
        else list(config.served_queues())
    )
    base = config.queues or {}
    override = QueueConfig(concurrency=args.concurrency) if args.concurrency else None
    slots = {name: override or base.get(name, QueueConfig()) for name in queues}
    return attrs.evolve(config, dsn=dsn, queues=slots, handle_signals=True)


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sys.path.insert(0, "")  # --app modules from the current directory, like python -m
    dsn = configured_dsn(args.dsn)
    if dsn is not None:
        trio.run(_run, _config(args, dsn), args.migrate)
        return 0
    with EmbeddedPostgres.from_env().running() as status:
        # The embedded database is trioq's own: keep its schema current without asking.
        trio.run(_run, _config(args, status.dsn), True)
    return 0


async def _run(config: Config, run_migrations: bool) -> None:
    from ._serve import serve

    if run_migrations:
        assert config.dsn is not None
        async with await connect(config.dsn, autocommit=True) as conn:
            await migrate(conn, config.schema)
    await serve(config)
