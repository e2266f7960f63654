"""Exceptions a handler raises to steer its job, and those the runtime raises.

::

    Exception
     ├── FatalError        raised by a handler: no retry, the job goes to dead_jobs
     ├── Snooze            raised by a handler (job.snooze()): run again later, attempt refunded
     └── LeaseLostError    the job's lease was reclaimed: its result is not ours to write
"""

from __future__ import annotations

import datetime as dt

__all__ = ["FatalError", "LeaseLostError", "Snooze"]


class FatalError(Exception):
    """Raise from a handler to fail the job at once, skipping its remaining attempts."""


class Snooze(Exception):
    """Raised by ``JobContext.snooze``: put the job back for later, refunding the attempt."""

    def __init__(self, delay: dt.timedelta) -> None:
        super().__init__(f"snoozed for {delay}")
        self.delay = delay


class LeaseLostError(RuntimeError):
    """The job's lease is no longer ours (expired and reclaimed); nothing was written."""


def leaves(ex: BaseException) -> list[BaseException]:
    """``ex`` with every (nested) exception group flattened: its plain exceptions, in order.

    trio's nurseries wrap the errors of their tasks in groups; callers that decide what an
    error means look at these.
    """
    if isinstance(ex, BaseExceptionGroup):
        return [leaf for inner in ex.exceptions for leaf in leaves(inner)]
    return [ex]
