"""A running job's progress: ``await job.progress({"done": 40, "of": 100})`` (docs/progress.md).

A handler may report progress as often as it likes; the database sees at most one write per
job per ``Config.progress_interval``, the latest value winning. The value goes through three
hands:

- `encode_progress`: any JSON value, encoded by the rules of args and results (NUL, lone
  surrogates, NaN and what is not JSON refused with the same words, ``progress`` named),
  at most ``Config.max_progress_bytes`` of JSON (a `ValueError` naming the size);
- `ProgressBuffer`: the latest text of each running job of the process, by lease, held
  in memory until written (a dict under a lock: a sync handler reports from its thread);
- the writer (`trioq._worker.services.progress`, every interval, one fenced UPDATE for all
  of the process's pending values) and the completer (the pending value of a job whose
  outcome keeps its row, written just before the outcome).

Readers (`trioq.job_status`, ``trioq jobs show``, the dashboard) read the stored JSON text
through `read_progress`, which never fails on a row: a value Python cannot decode (nested
too deep, written by hand) or too large to read becomes an `UnreadableProgress` that says so.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence

import psycopg

from ._job import JSONValue, Lease, encode_args
from ._sanitize import UndecodableArgs, decode_args, safe_text

__all__ = [
    "DEFAULT_MAX_PROGRESS",
    "DEFAULT_PROGRESS_INTERVAL",
    "MAX_PROGRESS_BYTES",
    "REFUSED",
    "ProgressBuffer",
    "UnreadableProgress",
    "check_max_progress",
    "encode_progress",
    "read_progress",
    "shown",
]

#: ``Config.max_progress_bytes``: the most bytes of JSON one progress value may have.
DEFAULT_MAX_PROGRESS = 64 * 1024
#: The largest ``Config.max_progress_bytes`` allowed: progress is rewritten every interval and
#: read by every refresh of a job's page; a value that large belongs in a result or a table.
MAX_PROGRESS_BYTES = 1024 * 1024
#: ``Config.progress_interval``: seconds between two writes of one job's progress.
DEFAULT_PROGRESS_INTERVAL = 1.0
#: Errors of a value the schema refuses (migration 18's size check, a value Postgres cannot
#: hold): such a value is dropped, never retried (the writer and the completer). It cannot
#: happen to a value `encode_progress` took, but the schema has the last word.
REFUSED: tuple[type[BaseException], ...] = (
    psycopg.DataError, psycopg.errors.CheckViolation, psycopg.errors.ProgramLimitExceeded
)


def check_max_progress(value: object, field: str = "max_progress_bytes") -> int:
    """A progress size limit: a positive number of bytes, at most `MAX_PROGRESS_BYTES`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field} must be an int (bytes), got {value!r}")
    if not 1 <= value <= MAX_PROGRESS_BYTES:
        raise ValueError(f"{field} must be between 1 and {MAX_PROGRESS_BYTES} bytes, got {value}")
    return value


def encode_progress(value: JSONValue, max_bytes: int) -> str:
    """``value`` as compact JSON text, or a `ValueError` saying why it cannot be progress:
    not JSON (the words of `trioq._job.encode_args`, naming ``progress``), or over
    ``max_bytes`` of UTF-8 (naming both sizes)."""
    text = encode_args(value, field="progress")
    if len(text) * 4 > max_bytes and (size := len(text.encode())) > max_bytes:
        raise ValueError(
            f"progress is {size:,} bytes of JSON, over max_progress_bytes ({max_bytes:,}): "
            "report a summary (counts, a percentage, a stage) and keep the rest elsewhere"
        )
    return text


class ProgressBuffer:
    """The latest unwritten progress of each running job of a process, by lease.

    `record` keeps only the latest text of a lease. A writer takes a `snapshot`, writes it,
    and calls `written` with that snapshot: each value it wrote (or that its fence refused)
    is dropped, unless a newer one was recorded meanwhile (that one waits for the next
    write). A write that failed leaves everything pending for the next one. Thread-safe:
    a sync handler records from its worker thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[Lease, str] = {}
        self._last: dict[Lease, str] = {}  # what each live lease reported last (written or not)
        #: Values recorded, and values a newer one replaced before they were written.
        self.recorded = 0
        self.coalesced = 0

    def record(self, lease: Lease, text: str) -> None:
        """``text`` (encoded by `encode_progress`) is ``lease``'s progress now."""
        with self._lock:
            if lease in self._pending:
                self.coalesced += 1
            self._pending[lease] = text
            self._last[lease] = text
            self.recorded += 1

    def last(self, lease: Lease) -> str | None:
        """The text ``lease`` recorded last (written or not), None if none."""
        with self._lock:
            return self._last.get(lease)

    def snapshot(self, leases: Iterable[Lease] | None = None) -> list[tuple[Lease, str]]:
        """The pending values (of ``leases`` only, if given), left pending."""
        with self._lock:
            if leases is None:
                return list(self._pending.items())
            pending = self._pending
            return [(lease, pending[lease]) for lease in leases if lease in pending]

    def written(self, snapshot: Sequence[tuple[Lease, str]]) -> None:
        """``snapshot``'s values reached the database (or its fence): no longer pending,
        unless a newer value was recorded since."""
        with self._lock:
            pending = self._pending
            for lease, text in snapshot:
                if pending.get(lease) is text:
                    del pending[lease]

    def forget(self, lease: Lease) -> None:
        """``lease``'s outcome is written: whatever it reported is dropped."""
        with self._lock:
            self._pending.pop(lease, None)
            self._last.pop(lease, None)

    def __len__(self) -> int:
        """How many leases have a value pending."""
        return len(self._pending)


class UnreadableProgress:
    """Stored progress a reader cannot show as a value: too large to read, or JSON Python
    cannot decode (nested thousands deep, written by hand). Its ``str`` says which."""

    __slots__ = ("reason", "stored", "text")

    def __init__(self, reason: str, *, stored: int | None = None, text: str = "") -> None:
        self.reason = reason
        self.stored = stored  # bytes where it is stored, when known
        self.text = text

    def __repr__(self) -> str:
        return f"UnreadableProgress({self.reason!r})"

    def __str__(self) -> str:
        preview = safe_text(self.text[:80], 80) + ("..." if len(self.text) > 80 else "")
        return f"<unreadable progress ({self.reason})" + (f": {preview}>" if preview else ">")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, UnreadableProgress):
            return NotImplemented
        return (self.reason, self.stored, self.text) == (other.reason, other.stored, other.text)

    def __hash__(self) -> int:
        return hash((self.reason, self.stored))


def read_progress(text: str | None, stored: int | None) -> JSONValue | UnreadableProgress:
    """Stored progress as a reader gets it (`trioq._db.sql.common.PROGRESS_COLUMNS`): None
    when there is none, the decoded value, or an `UnreadableProgress`."""
    if text is None:
        if stored is None:
            return None
        return UnreadableProgress(f"too large to read: {stored:,} bytes stored", stored=stored)
    value = decode_args(text)
    if isinstance(value, UndecodableArgs):
        return UnreadableProgress(value.reason, stored=stored, text=text)
    return value


def shown(value: JSONValue | UnreadableProgress, limit: int) -> str:
    """One line of text for ``value``, cut at about ``limit`` characters (``trioq jobs show``):
    compact JSON, escaped like args (control characters and non-ASCII as ``\\uXXXX``)."""
    try:
        text = str(value) if isinstance(value, UnreadableProgress) else json.dumps(value)
    except (ValueError, RecursionError) as ex:  # decoded at the edge of the recursion limit
        text = f"<progress that cannot be shown: {type(ex).__name__}>"
    if len(text) > limit:
        text = f"{text[:limit]}... [{len(text) - limit:,} more characters]"
    return text
