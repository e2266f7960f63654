"""``trio.run(trioq.serve, config)``: the worker process entry point."""

from __future__ import annotations

import trio

from .._config import Config
from .._pg.dsn import configured_dsn
from .._pg.embedded import EmbeddedPostgres
from .runtime import Runtime

__all__ = ["serve"]


async def serve(
    config: Config, *, task_status: trio.TaskStatus[Runtime] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run workers until stopped (``Runtime.stop()`` or a signal, with ``handle_signals``).

    ``task_status.started(runtime)`` is called once LISTEN is active and the
    schema version is checked; ``await nursery.start(trioq.serve, config)``
    returns the `Runtime`, whose ``stop()`` asks for a graceful shutdown. Stopped during its
    start-up (a signal, with ``handle_signals``), it returns the runtime already stopped. With no
    DSN configured (``Config.dsn``, ``TRIOQ_DSN``, ``DATABASE_URL``) the embedded
    Postgres runs for the duration (it must already be migrated: ``trioq migrate``).
    """
    dsn = configured_dsn(config.dsn)
    if dsn is not None:
        await Runtime(config, dsn).run(task_status=task_status)
        return
    async with EmbeddedPostgres.from_env().running_async() as status:
        await Runtime(config, status.dsn).run(task_status=task_status)
