"""The governor: which claim each served queue uses, and how its fetcher waits when limited.

It keeps the settings of the queues this process serves (``queues`` table), read at start,
on every ``@queues`` notification (a pause, a resume, a change of limits, in any process)
and every ``poll_interval`` in case a notification was lost. A queue with settings is
claimed with ``claim_limited``; the others with the plain claim, which the database makes
refuse a queue that has become controlled meanwhile, so a stale cache can delay a worker
but never let it exceed a limit.

Its round is the process's poll: one statement reads the settings of every served queue and
which of them have a job a claim could take now (`trioq._flow.poll_queues`), and wakes the
fetchers of those. A drained queue's fetcher thus waits for a notification or for this
poll, not on a timer of its own: an idle process sends one statement a ``poll_interval``,
however many queues it serves (it sent a claim per queue and the read before; the idle
fleet in docs/benchmarks.md).

A fetcher whose claim came back short waits here, for what can change the answer:

- drained (or not limited): new work (a notification for the queue, or the poll finding
  some);
- paused, or the global concurrency limit reached: a settings change, or an outcome of this
  process written (its slot is free), or ``poll_interval``;
- the rate window full: until it opens (``retry_in``, from the claim), or a settings change;
- jobs held back by per-key limits: new work, an outcome written, the first key's window.

When a queue is paused, the jobs this process claimed for it but has not started are
released at once (attempt refunded), so no handler starts after the pause is seen.

A timed pause (``paused_until``) ends on the database's clock: from then on the claims and
the settings read treat the queue as not paused, whatever the row says. Each round, after
reading, tidies the row of every served queue whose timed pause has ended (resumed, guarded
so that a newer pause stays, and ``@queues`` sent so that every worker hears of it), and the
next round comes no later than the next end of a timed pause of the served queues.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Mapping, Set
from math import inf

import attrs
import psycopg
import trio

from ..._config import QueueConfig
from ..._flow import LimitedClaim, QueueSettings, poll_queues, resume_due
from ..._pg.conn import Conn
from ..._pg.pool import Pool
from ..._queue import Queue
from ..wakeup import Wakeup
from .loop import every

__all__ = ["Governor", "GovernorRound"]

logger = logging.getLogger("trioq.runtime")

#: The shortest wait for the end of a timed pause: a round that came a hair early (the
#: database's clock against trio's) waits this long, not zero, before the next.
PAUSE_END_MIN = 0.001


@attrs.frozen(kw_only=True)
class GovernorRound:
    """What one read of the settings found."""

    settings: tuple[QueueSettings, ...]
    changed: tuple[str, ...]  # queues whose settings differ from the last round
    paused: tuple[str, ...]  # queues paused since the last round
    #: Served queues with a job a claim could take now (their fetchers were woken).
    due: tuple[str, ...] = ()
    resumed: tuple[str, ...] = ()  # timed pauses this round ended in the database
    pause_ends_in: float | None = None  # seconds until the next timed pause ends


class Governor:
    def __init__(
        self,
        pool: Pool,
        queue: Queue,
        queues: Mapping[str, QueueConfig],
        *,
        poll_interval: float,
        on_change: Callable[[str], None],
        on_paused: Callable[[str], Awaitable[None]],
    ) -> None:
        self._pool = pool
        self._queue = queue
        self._configs = dict(queues)
        self._poll = poll_interval
        self._on_change = on_change  # wake the queue's fetcher (as new work does)
        self._on_paused = on_paused  # release the queue's unstarted jobs
        self._settings = {name: QueueSettings(name=name) for name in queues}
        self._changed = Wakeup()
        self._flow = {name: Wakeup() for name in queues}
        self._blocked: dict[str, str] = {}  # queue -> the concurrency reason it waits on
        self._written = 0  # outcome batches written so far (see `wait`)
        self._pause_ends: float | None = None  # trio time of the next timed pause's end
        #: Whether the last poll found a job a claim could take in each queue (True until
        #: the first: `has_work`).
        self._work = dict.fromkeys(queues, True)
        #: The queues whose fetcher waits, drained, for new work (`wait`).
        self._drained: set[str] = set()

    # -- what the runtime asks ------------------------------------------------------------------

    def controlled(self, name: str) -> bool:
        return self._settings[name].controlled

    def settings(self, name: str) -> QueueSettings:
        return self._settings[name]

    def has_work(self, name: str) -> bool:
        """Whether the last poll found a job in ``name`` that a claim could take (aging
        skips a queue that had none: nothing in it waits)."""
        return self._work.get(name, True)

    def wake(self) -> None:
        """The settings may have changed (a notification, or the listener reconnected)."""
        self._changed.set()

    @property
    def waiting(self) -> bool:
        """Whether a fetcher waits for a slot of this process to free (see
        `outcomes_written`)."""
        return bool(self._blocked)

    def outcomes_written(self, queues: Set[str | None] | None = None) -> None:
        """The completer wrote a batch, with outcomes of ``queues`` (None: the job's queue
        is not known, e.g. completed by ``job.transaction()``): those slots are free in
        the database. The runtime gives ``queues`` only while `waiting`."""
        self._written += 1
        if not self._blocked or queues is None:
            return
        for name in [n for n in self._blocked if n in queues or None in queues]:
            if self._blocked.pop(name) == "keys":
                self._on_change(name)  # it waits for work as well: one wake-up for both
            else:
                self._flow[name].set()

    async def claim(
        self, conn: Conn, name: str, *, owner: str, limit: int, lease: dt.timedelta,
        weighted: bool = False,
    ) -> tuple[LimitedClaim, int]:  # fmt: skip
        """Claim for ``name`` with the claim its settings need; with the count of outcome
        batches written before it began (for `wait`). ``weighted``: the queue's jobs have
        costs (`trioq._db.driver.Driver.claim`)."""
        written = self._written
        if self._settings[name].controlled:
            got = await self._queue.driver.claim_limited(conn, name, owner=owner, limit=limit,
                                                  lease=lease)  # fmt: skip
        else:
            jobs = await self._queue.driver.claim(conn, name, owner=owner, limit=limit,
                                                  lease=lease, weighted=weighted)  # fmt: skip
            got = LimitedClaim(jobs=jobs)
        return got, written

    async def wait(self, name: str, got: LimitedClaim, written: int, work: Wakeup) -> None:
        """Wait until claiming from ``name`` again may give more than ``got`` did."""
        reason = got.reason
        if reason is None:
            # Drained: new work wakes the fetcher, a notification or the poll (`run_once`);
            # a poll that fails wakes it too (`_poll_round`).
            timeout = inf if got.retry_in is None else min(self._poll, got.retry_in)
            self._drained.add(name)
            try:
                with trio.move_on_after(timeout):
                    await work.wait()
            finally:
                self._drained.discard(name)
            return
        if reason == "more":
            await trio.lowlevel.checkpoint()
            return
        if reason in ("concurrency", "keys"):
            if self._written != written:
                # An outcome of ours was written while the claim ran: it may have counted a
                # slot that is free by now. Claim again rather than miss that wake-up.
                await trio.lowlevel.checkpoint()
                return
            self._blocked[name] = reason
        if reason == "rate" and got.retry_in is not None:
            timeout = got.retry_in
        elif got.retry_in is not None:
            timeout = min(self._poll, got.retry_in)
        else:
            timeout = self._poll
        wakeup = work if reason == "keys" else self._flow[name]
        try:
            with trio.move_on_after(timeout):
                await wakeup.wait()
        finally:
            self._blocked.pop(name, None)

    # -- the service ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write the limits of the config, read the settings, then refresh them on every
        notification or ``poll_interval``. ``task_status.started()`` after the first read,
        so the first claims already know; errors before it are raised."""
        await self.apply_config()
        await self.run_once()
        task_status.started()
        await every(self._interval, self._poll_round, failed="polling the queues failed",
                    wakeup=self._changed, wait_first=True)  # fmt: skip

    async def _poll_round(self) -> GovernorRound:
        """`run_once`; should it fail, the fetchers waiting drained claim (and aging runs
        everywhere), as if the poll had found work: they wait for the poll, and a poll that
        cannot answer must not leave a job whose notification was lost waiting for as long
        as the failures last. A fetcher backing off a failed claim is left to its backoff."""
        try:
            return await self.run_once()
        except Exception:
            for name in self._work:
                self._work[name] = True
            for name in sorted(self._drained):  # not a fetcher backing off a failed claim
                self._on_change(name)
            raise

    def _interval(self, _round: GovernorRound | None) -> float:
        """``poll_interval``, or less: until the next timed pause ends (no sooner than
        `PAUSE_END_MIN`, should the clocks disagree by a hair). After a failed round, or
        before the first, the poll."""
        if self._pause_ends is None:
            return self._poll
        return min(self._poll, max(self._pause_ends - trio.current_time(), PAUSE_END_MIN))

    async def apply_config(self) -> list[QueueSettings]:
        """Store the limits given in the served queues' `QueueConfig` (the database is the
        truth every process reads; a limit set here overrides one set at run time)."""
        applied = []
        names = list(self._configs)
        async with self._pool.connection() as conn:
            stored = {s.name: s for s in await self._queue.queue_settings(conn, names)}
            for name, config in self._configs.items():
                limits = config.limits()
                if not limits:
                    continue
                before = stored.get(name, QueueSettings(name=name))
                differs = {k: getattr(before, k) for k, v in limits.items()
                           if getattr(before, k) not in (None, v)}  # fmt: skip
                if differs:
                    logger.warning("queue %r: QueueConfig replaces the stored limits %s",
                                   name, differs)  # fmt: skip
                applied.append(await self._queue.set_limits(conn, name, **limits))
        return applied

    async def run_once(self) -> GovernorRound:
        """Poll the served queues: read their settings and which have work, resume those
        whose timed pause has ended (and tell every worker: this process hears it too, and
        reads again), act on what changed, and wake the fetchers of the queues with work."""
        timer, self._pause_ends = self._pause_ends, None
        names = list(self._configs)
        async with self._pool.connection() as conn:
            settings, due = await poll_queues(conn, self._queue.sql, names)
            # The fetchers first: what follows (the tidy of ended pauses, the release of a
            # paused queue's jobs) may wait or fail, and must not hold back a wake-up.
            for name in self._work:
                self._work[name] = name in due
            for name in sorted(due):
                self._on_change(name)
            found = {s.name: s for s in settings}
            # Only a timed pause needs the tidy (and its end timed): one that runs now, or
            # one whose end the last round timed within a poll (an indefinite pause times
            # an end thousands of years away). Without either (the usual case), the round
            # is the one read: an idle worker's governor sends half the statements. A
            # pause that ended unseen (no process was timing it) reads as ended everywhere
            # all the same (`trioq._db.sql.queues`).
            soon = timer is not None and timer <= trio.current_time() + self._poll
            timed = soon or any(s.paused_until is not None for s in found.values())
            try:
                resumed, ends_in = (
                    await resume_due(conn, self._queue.sql, names) if timed else ([], None)
                )
            except psycopg.errors.ReadOnlySqlTransaction as ex:
                # A standby, or default_transaction_read_only: the settings were read (an
                # ended pause reads as ended without the tidy), the claims wait anyway.
                logger.warning("resuming ended timed pauses: the database is read-only (%s)", ex)
                resumed, ends_in = [], None
        if ends_in is not None:
            self._pause_ends = trio.current_time() + ends_in
        for name in resumed:
            logger.info("queue %r: its timed pause ended", name)
        changed, paused = self._update(found)
        for name in paused:
            await self._on_paused(name)
        for name in changed:
            self._flow[name].set()
            self._on_change(name)
        kept = tuple(self._settings[name] for name in self._settings)
        return GovernorRound(settings=kept, changed=tuple(changed), paused=tuple(paused),
                             resumed=tuple(resumed), pause_ends_in=ends_in,
                             due=tuple(sorted(due)))  # fmt: skip

    def _update(self, found: Mapping[str, QueueSettings]) -> tuple[list[str], list[str]]:
        """Keep the settings ``found``; the queues whose settings changed, and those paused
        since the last round (a pause and a resume are logged)."""
        changed, paused = [], []
        for name, old in self._settings.items():
            new = found.get(name, QueueSettings(name=name))
            if new == old:
                continue
            self._settings[name] = new
            changed.append(name)
            if new.paused and not old.paused:
                paused.append(name)
                logger.info("queue %r paused", name)
            elif old.paused and not new.paused:
                logger.info("queue %r resumed", name)
        return changed, paused
