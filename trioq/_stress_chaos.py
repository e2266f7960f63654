"""Chaos for `trioq stress`: kill workers, cut their connections, restart Postgres.

Each loop runs until cancelled (the driver cancels them once the queue has drained) and
counts what it did in `ChaosLog`. None of them touches the driver's own connections.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import psycopg
import trio

from ._stress_workers import WorkerGroup

__all__ = ["ChaosLog", "kill_loop", "restart_at", "terminate_loop"]

logger = logging.getLogger("trioq.stress")

_EVENTS = 20

# Every backend of our workers in this database: their pool and LISTEN connections.
_TERMINATE = """
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
  FROM pg_stat_activity
 WHERE datname = current_database() AND application_name LIKE %(pattern)s
   AND pid <> pg_backend_pid()
"""


@attrs.define
class ChaosLog:
    kills: int = 0
    terminate_rounds: int = 0
    terminated_connections: int = 0
    postgres_restarts: int = 0
    restart_skipped: str | None = None
    #: Set once a scheduled restart has happened: the run does not end before it.
    restart_done: trio.Event = attrs.field(factory=trio.Event)
    #: The last few events, as "t+SECONDS what".
    events: deque[str] = attrs.field(factory=lambda: deque(maxlen=_EVENTS))
    _t0: float = attrs.field(factory=trio.current_time)

    def note(self, what: str) -> None:
        self.events.append(f"t+{trio.current_time() - self._t0:.1f}s {what}")

    @property
    def any(self) -> bool:
        return bool(self.kills or self.terminated_connections or self.postgres_restarts)


async def kill_loop(group: WorkerGroup, every: float, log: ChaosLog) -> None:
    """SIGKILL a random worker every ``every`` seconds; its replacement starts at once."""
    while True:
        await trio.sleep(every)
        victim = group.kill_random()
        if victim is not None:
            log.kills += 1
            log.note(f"SIGKILL worker pid {victim.pid} (slot {victim.slot})")


async def terminate_loop(
    connect: Callable[[], Awaitable[Any]], prefix: str, every: float, log: ChaosLog
) -> None:
    """``pg_terminate_backend`` every connection of the workers every ``every`` seconds."""
    pattern = prefix.replace("_", r"\_").replace("%", r"\%") + "%"
    while True:
        await trio.sleep(every)
        try:
            async with await connect() as conn:
                cur = await conn.execute(_TERMINATE, {"pattern": pattern})
                row = await cur.fetchone()
        except psycopg.OperationalError as ex:
            log.note(f"terminate round failed: {ex}")
            continue
        count = int(row[0]) if row else 0
        log.terminate_rounds += 1
        log.terminated_connections += count
        log.note(f"terminated {count} worker connections")


async def restart_at(at: float, restart: Callable[[], Awaitable[None]], log: ChaosLog) -> None:
    """Stop and start the Postgres server once, ``at`` seconds into the workload."""
    await trio.sleep(at)
    log.note("restarting Postgres")
    started = trio.current_time()
    await restart()
    log.postgres_restarts += 1
    log.restart_done.set()
    log.note(f"Postgres back after {trio.current_time() - started:.2f} s")
