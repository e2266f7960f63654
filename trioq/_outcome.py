"""What became of one run of a job, as the completer writes it."""

from __future__ import annotations

import datetime as dt
import enum

from ._job import Failure, JSONValue, Lease

__all__ = ["Kind", "Outcome"]

_NO_DELAY = dt.timedelta(0)


class Kind(enum.Enum):
    COMPLETE = "complete"  # delete the row
    KEEP = "keep"  # keep the row as done, with the result
    FAIL = "fail"  # retry with backoff, or dead
    RELEASE = "release"  # aborted by us (shutdown) or snoozed: attempt refunded
    CANCELLED = "cancelled"  # cancel requested and the handler was stopped
    UNKNOWN = "unknown"  # no handler here: given back, attempt refunded (dead after a while)
    NOTHING = "nothing"  # already written (job.transaction()) or the lease was lost


class Outcome:
    """One per job run, built on the hot path: a plain slotted class, not attrs (~1 µs less)."""

    __slots__ = ("delay", "failure", "kind", "lease", "result")

    def __init__(
        self,
        *,
        kind: Kind,
        lease: Lease,
        result: JSONValue = None,
        failure: Failure | None = None,
        delay: dt.timedelta = _NO_DELAY,  # for RELEASE (snooze)
    ) -> None:
        self.kind = kind
        self.lease = lease
        self.result = result
        self.failure = failure
        self.delay = delay

    def __repr__(self) -> str:
        return f"Outcome(kind={self.kind}, lease={self.lease!r}, delay={self.delay!r})"
