"""A level-triggered wake-up flag for one waiter: a set() before wait() is not lost."""

from __future__ import annotations

import trio

__all__ = ["Wakeup"]


class Wakeup:
    def __init__(self) -> None:
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        """Wait until set, then clear it. Bound it with ``trio.move_on_after``."""
        await self._event.wait()
        self._event = trio.Event()
