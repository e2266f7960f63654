"""The listener: one LISTEN connection of its own, turning notifications into wake-ups.

Notifications are only a hint (polling is the fallback), so after every (re)connect
everything is woken once: whatever was notified while nobody listened is fetched.
A lost connection is re-made with backoff.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import psycopg
import trio

from ..._db.driver import Driver
from ..._pg.connection import connect

__all__ = ["ListenRound", "Listener"]

logger = logging.getLogger("trioq.runtime")

#: Reconnect backoff: capped low, so the first claim after a Postgres restart follows the
#: server within half a second (a refused connection costs the server nothing).
RECONNECT_MIN, RECONNECT_MAX = 0.05, 0.5


@attrs.frozen(kw_only=True)
class ListenRound:
    """One connection's life: how many notifications it carried, and why it ended."""

    notifications: int
    error: str


class Listener:
    def __init__(
        self, dsn: str, driver: Driver, *, on_notify: Callable[[str], None],
        on_listening: Callable[[], None],
    ) -> None:  # fmt: skip
        self._dsn = dsn
        self._listen = driver.sql.listen
        self._on_notify = on_notify  # a notification's payload
        self._on_listening = on_listening  # (re)connected: wake everything once
        self.reconnects = 0  # connections lost (and re-made) since the first (the metrics)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled. ``task_status.started()`` once LISTEN is active; a
        failure before that is raised (``serve`` refuses to start), later ones are retried."""
        round_ = await self.run_once(task_status=task_status)
        backoff = RECONNECT_MIN
        while True:
            self.reconnects += 1
            logger.warning("listener lost its connection, reconnecting: %s", round_.error)
            await trio.sleep(backoff)
            try:
                round_ = await self.run_once()
            except psycopg.OperationalError as ex:
                round_ = ListenRound(notifications=0, error=str(ex))
                backoff = min(backoff * 2, RECONNECT_MAX)
            else:
                backoff = RECONNECT_MIN

    async def run_once(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> ListenRound:
        """Connect and LISTEN (errors are raised), then dispatch notifications until the
        connection is lost (returned, with the reason)."""
        count = 0
        listening = False
        try:
            async with await connect(self._dsn, autocommit=True) as conn:
                await conn.execute(self._listen)
                listening = True
                task_status.started()
                self._on_listening()
                async for note in conn.notifies():
                    count += 1
                    self._on_notify(note.payload)
        except psycopg.OperationalError as ex:
            if not listening:
                raise
            return ListenRound(notifications=count, error=str(ex))
        return ListenRound(notifications=count, error="the connection was closed")
