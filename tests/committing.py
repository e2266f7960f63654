"""A `trioq.JobServices.committing` for the tests that build job contexts by hand.

It is a list of the leases whose own transaction committed (what the runtime forgets then),
and ``events`` says what became of every commit: ``committing`` (no heartbeat meanwhile),
then ``committed`` or ``heartbeated again`` (the commit failed: the runtime's heartbeats
go on, `trioq._worker.leases.HeldJobs.committing`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from trioq import Lease


class Commits(list[Lease]):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, Lease]] = []

    @contextmanager
    def __call__(self, lease: Lease) -> Iterator[None]:
        self.events.append(("committing", lease))
        try:
            yield
        except BaseException:
            self.events.append(("heartbeated again", lease))
            raise
        self.events.append(("committed", lease))
        self.append(lease)
