"""``trioq web``: serve the dashboard (``trioq.web``) with Hypercorn on trio.

It listens on 127.0.0.1:8089 unless told otherwise; any other address needs a token
(``--token`` or ``$TRIOQ_WEB_TOKEN``), since every page shows job args and the actions
change jobs. The first line on stdout says where it listens. SIGINT/SIGTERM stop it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from .._config import Config
from .._cron import CronEntry
from .._db.migrate import latest_version
from .._db.version import check_schema
from .._pg.connection import connect
from .._pg.dsn import DSN_ENV_VARS, database
from .options import Commands, command
from .serve import LOG_FORMAT, RedactingFormatter, load_app

if TYPE_CHECKING:
    from ..web import Dashboard

__all__ = ["TOKEN_ENV_VAR", "add_web_parser"]

TOKEN_ENV_VAR = "TRIOQ_WEB_TOKEN"

_EPILOG = """\
examples:
  trioq web                                   # http://127.0.0.1:8089, this machine only
  trioq web --read-only --app myapp.jobs:config
  TRIOQ_WEB_TOKEN=$(cat /etc/trioq/web-token) trioq web --bind 0.0.0.0:8089

Binding beyond 127.0.0.1 needs a token (--token, or $TRIOQ_WEB_TOKEN, which keeps it off
the command line): open the page once with ?token=... and the browser keeps a cookie.
Behind a reverse proxy that authenticates, keep the default bind. See docs/web.md.
"""


def add_web_parser(commands: Commands, common: argparse.ArgumentParser) -> None:
    sub = command(
        commands, "web", parents=[common],
        help="serve the live dashboard (needs pip install 'trioq[web]')",
        description="Serve the live dashboard: queues, jobs, dead jobs, cron, history.",
        epilog=_EPILOG,
    )  # fmt: skip
    sub.add_argument(
        "--bind", default="127.0.0.1:8089", help="HOST:PORT or unix:PATH (default 127.0.0.1:8089)"
    )
    sub.add_argument("--read-only", action="store_true", help="hide and refuse every action")
    sub.add_argument(
        "--token", help=f"required on every request (default ${TOKEN_ENV_VAR}); needed to "
        "bind beyond 127.0.0.1",
    )  # fmt: skip
    sub.add_argument(
        "--app", help="MODULE:ATTRIBUTE of a trioq.Config: the cron page shows its schedules"
    )
    sub.add_argument(
        "--allowed-host", action="append", default=[], metavar="NAME",
        help="a name the dashboard is served as, beside localhost, the --bind name and IP "
        "addresses (a reverse proxy's; '*' for any): requests for other names get 421",
    )  # fmt: skip
    sub.set_defaults(handler=_web)


def _web(args: argparse.Namespace) -> int:
    try:
        import trioq.web
        from trioq.web._security import is_loopback
        from trioq.web._serve import parse_bind
    except ImportError as ex:
        print(f"trioq: error: trioq web needs the web extra: pip install 'trioq[web]' "
              f"({ex})", file=sys.stderr)  # fmt: skip
        return 1
    token = args.token or os.environ.get(TOKEN_ENV_VAR) or None
    host, port = parse_bind(args.bind)
    if port is not None and not is_loopback(host) and token is None:
        raise ValueError(
            f"--bind {args.bind} reaches beyond this machine: give a token (--token or "
            f"${TOKEN_ENV_VAR}), or keep 127.0.0.1 behind a reverse proxy that authenticates"
        )
    cron = _cron(args.app) if args.app else ()
    # The names it is served as: localhost, the --bind name (an address needs none), and
    # the proxy's.
    allowed = ["localhost", *([host] if port is not None and host else []), *args.allowed_host]
    _log(args)
    with database(args.dsn) as dsn:
        dashboard = trioq.web.app(
            dsn, schema=args.schema, read_only=args.read_only, token=token, cron=cron,
            allowed_hosts=allowed,
        )  # fmt: skip
        trio.run(_run, dashboard, dsn, args)
    return 0


def _cron(spec: str) -> Sequence[CronEntry]:
    sys.path.insert(0, "")  # like trioq serve: --app modules from the current directory
    app = load_app(spec)
    if not isinstance(app, Config):
        raise ValueError(f"--app {spec!r} is a Registry: the cron page needs a trioq.Config")
    return app.cron


def _log(args: argparse.Namespace) -> None:
    formatter = RedactingFormatter(LOG_FORMAT)
    formatter.add_dsns([args.dsn, *(os.environ.get(v) for v in DSN_ENV_VARS)])
    handler = logging.StreamHandler()
    handler.setFormatter(formatter)
    logging.basicConfig(level=logging.INFO, handlers=[handler])


async def _run(dashboard: Dashboard, dsn: str, args: argparse.Namespace) -> None:
    from trioq.web._serve import serve

    async with await connect(dsn, autocommit=True) as conn:
        await check_schema(conn, args.schema, latest_version(), writable=False)
    stop = trio.Event()
    async with trio.open_nursery() as signals:
        signals.start_soon(_stop_on_signal, stop)
        async with trio.open_nursery() as server:  # returns once `stop` is set
            binds: list[str] = await server.start(serve, dashboard, args.bind, stop)
            flags = {"read-only": args.read_only, "token required": dashboard.config.token}
            notes = [note for note, on in flags.items() if on]
            extra = f" ({', '.join(notes)})" if notes else ""
            print(f"trioq web: serving {binds[0]}/{extra}", flush=True)
        signals.cancel_scope.cancel()


async def _stop_on_signal(stop: trio.Event, *_: Any) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _signum in signals:
            stop.set()
