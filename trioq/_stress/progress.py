"""The live progress line of `trioq stress`, on stderr.

On a terminal the line is redrawn in place at every snapshot (twice a second); otherwise
(a log file, a test) a full line is printed at most once a second.
"""

from __future__ import annotations

import math
from typing import TextIO

import attrs

__all__ = ["Progress", "ProgressLine"]

FILE_EVERY = 1.0


@attrs.frozen(kw_only=True)
class Progress:
    elapsed: float
    enqueued: int
    completed: int
    rate: float
    available: int
    running: int
    scheduled: int
    dead: int
    workers: int
    processes: int
    kills: int
    terminated: int
    restarts: int
    errors: int
    db_down: bool

    def render(self) -> str:
        rate = "-" if math.isnan(self.rate) else f"{self.rate:,.0f}"
        line = (
            f"[{self.elapsed:6.1f}s] done {self.completed:,}/{self.enqueued:,} | {rate} jobs/s | "
            f"avail {self.available:,} run {self.running:,} sched {self.scheduled:,} "
            f"dead {self.dead:,} | workers {self.workers}/{self.processes}"
        )
        if self.kills or self.terminated or self.restarts:
            line += f" | chaos {self.kills} kills {self.terminated} cut {self.restarts} restarts"
        line += f" | errors {self.errors}"
        return line + (" | DATABASE DOWN" if self.db_down else "")


class ProgressLine:
    """Writes `Progress` lines to ``stream``; does nothing when disabled."""

    def __init__(self, stream: TextIO, *, enabled: bool) -> None:
        self._stream = stream
        self._enabled = enabled
        self._tty = enabled and stream.isatty()
        self._last_print = -math.inf
        self._width = 0
        self._unprinted: Progress | None = None  # the newest line a file has not seen

    def show(self, progress: Progress) -> None:
        if not self._enabled:
            return
        text = progress.render()
        if self._tty:
            self._stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
        elif progress.elapsed - self._last_print >= FILE_EVERY:
            self._stream.write(text + "\n")
            self._last_print = progress.elapsed
            self._unprinted = None
        else:
            self._unprinted = progress
        self._stream.flush()

    def message(self, text: str) -> None:
        """A line of its own (a chaos note, a skipped option), also when not enabled."""
        self._clear()
        self._stream.write(text + "\n")
        self._stream.flush()

    def close(self) -> None:
        """Clear a terminal's line; give a file the final state if it has not seen it."""
        self._clear()
        if self._unprinted is not None:
            self._stream.write(self._unprinted.render() + "\n")
            self._unprinted = None
            self._stream.flush()

    def _clear(self) -> None:
        if self._tty and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._width = 0
