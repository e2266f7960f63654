"""Serving the dashboard: Hypercorn's trio worker in the caller's nursery.

`serve` reports the addresses it listens on through ``task_status`` (with port 0 the
kernel picks one) and returns when ``stop`` is set, after at most `GRACEFUL_TIMEOUT`
seconds for open connections: Hypercorn waits that long for any keep-alive connection
(a browser keeps one to each page it polls), so it is kept short. The dashboard's pool
is closed on the way out.
"""

from __future__ import annotations

import logging

import hypercorn.config
import hypercorn.trio
import trio

from ._app import Dashboard

__all__ = ["GRACEFUL_TIMEOUT", "parse_bind", "serve"]

GRACEFUL_TIMEOUT = 1.0

logger = logging.getLogger("trioq.web")


def parse_bind(bind: str) -> tuple[str, int | None]:
    """(host, port) of ``host:port`` or ``[v6]:port``; (path, None) of ``unix:/path``."""
    if bind.startswith("unix:"):
        if len(bind) == len("unix:"):
            raise ValueError("--bind unix: needs a socket path, e.g. unix:/run/trioq-web.sock")
        return bind[len("unix:") :], None
    host, sep, port = bind.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--bind must look like HOST:PORT (e.g. 127.0.0.1:8089), got {bind!r}")
    return host.strip("[]"), int(port)


async def serve(
    dashboard: Dashboard,
    bind: str,
    stop: trio.Event,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``dashboard`` on ``bind`` until ``stop`` is set."""
    parse_bind(bind)
    config = hypercorn.config.Config()
    config.bind = [bind]
    config.accesslog = None
    config.errorlog = logger  # through the process's logging, once (not a handler of its own)
    config.graceful_timeout = GRACEFUL_TIMEOUT
    try:
        await hypercorn.trio.serve(
            dashboard, config, shutdown_trigger=stop.wait, task_status=task_status
        )
    finally:
        with trio.move_on_after(GRACEFUL_TIMEOUT, shield=True):
            await dashboard.aclose()
