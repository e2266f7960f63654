"""What became of one run of a job, as the completer writes it."""

from __future__ import annotations

import datetime as dt
import enum

import attrs

from ._job import JSONValue
from ._queue import Failure, Lease

__all__ = ["Kind", "Outcome"]


class Kind(enum.Enum):
    COMPLETE = "complete"  # delete the row
    KEEP = "keep"  # keep the row as done, with the result
    FAIL = "fail"  # retry with backoff, or dead
    RELEASE = "release"  # aborted by us (shutdown) or snoozed: attempt refunded
    CANCELLED = "cancelled"  # cancel requested and the handler was stopped
    NOTHING = "nothing"  # already written (job.transaction()) or the lease was lost


@attrs.frozen(kw_only=True)
class Outcome:
    kind: Kind
    lease: Lease
    result: JSONValue = None
    failure: Failure | None = None
    delay: dt.timedelta = dt.timedelta(0)  # for RELEASE (snooze)
