"""What became of one run of a job, as the completer writes it."""

from __future__ import annotations

import datetime as dt
import enum

from ._job import Failure, Job, JSONValue, Lease

__all__ = ["CANCELLED", "DEAD", "DISCARDED", "RETRIED", "Kind", "Outcome"]

_NO_DELAY = dt.timedelta(0)

#: `Outcome.fate`: what the completer's write did, where the kind does not say.
RETRIED, DEAD, CANCELLED, DISCARDED = "retried", "dead", "cancelled", "discarded"


class Kind(enum.Enum):
    COMPLETE = "complete"  # delete the row
    KEEP = "keep"  # keep the row as done, with the result
    FAIL = "fail"  # retry with backoff, or dead
    RELEASE = "release"  # aborted by us (shutdown) or snoozed: attempt refunded
    CANCELLED = "cancelled"  # cancel requested and the handler was stopped
    UNKNOWN = "unknown"  # no handler here: given back, attempt refunded (dead after a while)
    NOTHING = "nothing"  # already written (job.transaction()) or the lease was lost


class Outcome:
    """One per job run, built on the hot path: a plain slotted class, not attrs (~1 µs less).

    The runtime adds what the job's history needs (`trioq._obs.history`): the job it ran, and
    ``time.monotonic()`` when its handler started and returned (0.0: it did not run).
    ``committed``: the handler completed the job in its own transaction (kind NOTHING).

    ``fate`` is set by the completer once it has written the outcome, where the kind alone
    does not say what the database did: `RETRIED`, `DEAD` or `CANCELLED` for a failure or an
    unknown task, and `DISCARDED` for any outcome the fenced write found no longer ours.
    None: written as its kind says (or not written yet).
    """

    __slots__ = ("committed", "delay", "ended", "failure", "fate", "job", "kind", "lease",
                 "result", "started")  # fmt: skip

    def __init__(
        self,
        *,
        kind: Kind,
        lease: Lease,
        result: JSONValue = None,
        failure: Failure | None = None,
        delay: dt.timedelta = _NO_DELAY,  # for RELEASE (snooze)
        committed: bool = False,
    ) -> None:
        self.kind = kind
        self.lease = lease
        self.result = result
        self.failure = failure
        self.delay = delay
        self.committed = committed
        self.job: Job | None = None
        self.started = 0.0
        self.ended = 0.0
        self.fate: str | None = None

    def __repr__(self) -> str:
        return f"Outcome(kind={self.kind}, lease={self.lease!r}, delay={self.delay!r})"
