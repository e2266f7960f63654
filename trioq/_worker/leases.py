"""The jobs this process holds a lease on, from the claim until their outcome is written.

A `HeldJob` exists from the claim on: a prefetched job waiting for a slot has one
too, so heartbeats, lost leases and cancel requests reach it before it starts.
While its handler runs, ``scope`` is the cancel scope of the slot running it.
`HeldJobs` is the set the heartbeat extends, keyed by lease.

While a job's own transaction commits its completion (``job.transaction()``,
``job.complete_with()``: `HeldJobs.committing`), the heartbeat leaves its lease alone (one
racing the commit would find the row gone and take the lease for lost) and a cancel waits
for the commit: if it succeeds the lease is forgotten, the job is done; if it fails (the
statement, a deferred constraint, the connection), the lease is heartbeated again and a
cancel that came meanwhile stops the handler then. Before, the lease was forgotten before
the commit went out, and a commit that failed left it unheartbeated for good: it expired
under a handler that ran on (issue 22).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import trio

from .._job import Job, Lease

__all__ = ["HeldJob", "HeldJobs"]


class HeldJob:
    """A claimed job's handle: why we aborted it, if we did, and how to stop its handler."""

    __slots__ = ("committing", "finished", "job", "lease", "reason", "scope", "units")

    def __init__(self, job: Job, lease: Lease, units: int = 1) -> None:
        self.job = job
        self.lease = lease
        self.units = units  # of its queue's slots it occupies while it runs (its cost)
        self.scope: trio.CancelScope | None = None  # set while its handler runs
        self.reason: str | None = None  # "lost", "cancel" or "shutdown"
        self.finished = False  # the handler returned; only its outcome is left to write
        self.committing = False  # its own transaction commits its completion now

    def abort(self, reason: str) -> None:
        """Stop its handler (at once, or once its commit has failed: `HeldJobs.committing`)."""
        if self.reason is None:
            self.reason = reason
        if self.scope is not None and not self.committing:
            self.scope.cancel()


class HeldJobs:
    """Leases held by this process: running or buffered jobs, and outcomes not yet written."""

    def __init__(self) -> None:
        self._jobs: dict[Lease, HeldJob] = {}

    def add(self, jobs: Iterable[HeldJob]) -> None:
        held = self._jobs
        for job in jobs:
            held[job.lease] = job

    def get(self, lease: Lease) -> HeldJob | None:
        return self._jobs.get(lease)

    def forget(self, lease: Lease) -> None:
        """Its outcome is written: no more heartbeats for it."""
        self._jobs.pop(lease, None)

    @contextmanager
    def committing(self, lease: Lease) -> Iterator[None]:
        """The block commits the job's completion in its own transaction: no heartbeat for
        it meanwhile, and a cancel waits. Done: the lease is forgotten. Failed: heartbeated
        again, and a cancel that came meanwhile stops the handler now."""
        job = self._jobs.get(lease)
        if job is None:  # its outcome was written, or its lease lost
            yield
            return
        job.committing = True
        try:
            yield
        except BaseException:
            job.committing = False
            if job.reason is not None and job.scope is not None:
                job.scope.cancel()
            raise
        self._jobs.pop(lease, None)
        job.committing = False

    def is_committing(self, lease: Lease) -> bool:
        """Whether ``lease``'s job commits its completion in its own transaction now."""
        job = self._jobs.get(lease)
        return job is not None and job.committing

    def lose(self, lease: Lease) -> HeldJob | None:
        """The lease was reclaimed: forget it and cancel its handler. None if its outcome
        was written meanwhile (the heartbeat that noticed raced the completer)."""
        job = self._jobs.get(lease)
        if job is None or job.finished or job.committing:
            return None
        del self._jobs[lease]
        job.abort("lost")
        return job

    def of_job(self, job_id: int) -> list[HeldJob]:
        """The held attempts of job ``job_id`` (rare: a linear search)."""
        return [held for lease, held in self._jobs.items() if lease.job_id == job_id]

    def leases(self) -> list[Lease]:
        """The leases to heartbeat: every held one but those committing."""
        return [lease for lease, job in self._jobs.items() if not job.committing]

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[HeldJob]:
        return iter(list(self._jobs.values()))
