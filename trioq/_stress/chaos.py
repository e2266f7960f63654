"""Chaos for `trioq stress`: kill workers, cut their connections, restart Postgres.

Each loop runs until cancelled (the driver cancels them once the queue has drained) and
counts what it did in `ChaosLog`, with a `Fault` per act for the recovery report. None of
them touches the driver's own connections. A kill picks a worker that holds running jobs
(a kill mid-batch), and records which jobs it held. A host kill (``--kill-host-at``) is
the same for every worker process of one host at once, and nothing restarts there.
One-shot faults (``--kill-at``, the restart, and those of `trioq._stress.faults`)
register an event the run waits for.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import psycopg
import trio

from .faults import Fault, HeldJobs, like_prefix
from .workers import Host, Worker, WorkerGroup

__all__ = ["ChaosLog", "kill_at", "kill_host_at", "kill_loop", "restart_at", "terminate_loop"]

logger = logging.getLogger("trioq.stress")

_EVENTS = 20
#: Faults kept for the recovery report (a long run with --terminate-every has many).
MAX_FAULTS = 1000
#: ``--kill-at`` waits up to this long for a worker that holds running jobs.
KILL_WAIT = 30.0
_HELD_POLL = 0.05
#: A host kill waits up to this long for the dead host's running jobs to be released.
RELEASE_WAIT = 120.0

# Every backend of our workers in this database: their pool and LISTEN connections.
_TERMINATE = """
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
  FROM pg_stat_activity
 WHERE datname = current_database() AND application_name LIKE %(pattern)s
   AND pid <> pg_backend_pid()
"""


@attrs.define
class ChaosLog:
    kills: int = 0
    host_kills: int = 0
    terminate_rounds: int = 0
    terminated_connections: int = 0
    postgres_restarts: int = 0
    restart_skipped: str | None = None
    #: One event per one-shot fault: the run does not end before they have all happened.
    one_shots: list[trio.Event] = attrs.field(factory=list)
    #: The last few events, as "t+SECONDS what".
    events: deque[str] = attrs.field(factory=lambda: deque(maxlen=_EVENTS))
    #: Every act, for the recovery report (the first `MAX_FAULTS`).
    faults: list[Fault] = attrs.field(factory=list)
    _t0: float = attrs.field(factory=trio.current_time)

    def note(self, what: str) -> None:
        self.events.append(f"t+{trio.current_time() - self._t0:.1f}s {what}")

    def fault(self, fault: Fault) -> None:
        if len(self.faults) < MAX_FAULTS:
            self.faults.append(fault)

    def one_shot(self) -> trio.Event:
        """An event the run waits for before it may end."""
        done = trio.Event()
        self.one_shots.append(done)
        return done

    @property
    def any(self) -> bool:
        return bool(
            self.kills
            or self.host_kills
            or self.terminated_connections
            or self.postgres_restarts
            or self.faults
        )


async def kill_loop(group: WorkerGroup, held: HeldJobs, every: float, log: ChaosLog) -> None:
    """SIGKILL a worker every ``every`` seconds, one holding running jobs if any does; its
    replacement starts at once."""
    async with trio.open_nursery() as nursery:  # the releases are timed beside the kills
        while True:
            await trio.sleep(every)
            if (fault := await kill_one(group, held, log, wait=0.0)) is not None:
                nursery.start_soon(_time_release, held, fault)


async def kill_at(
    at: float, group: WorkerGroup, held: HeldJobs, log: ChaosLog, done: trio.Event
) -> None:
    """Once, ``at`` seconds in: SIGKILL a worker mid-batch (waiting up to `KILL_WAIT` for one
    that holds running jobs), and start its replacement."""
    await trio.sleep(at)
    if (fault := await kill_one(group, held, log, wait=KILL_WAIT)) is not None:
        await _time_release(held, fault)
    done.set()


#: Bound on reading what a killed worker held (shielded: see `kill_one`).
_RECORD_TIMEOUT = 5.0


async def kill_one(
    group: WorkerGroup, held: HeldJobs, log: ChaosLog, *, wait: float
) -> Fault | None:
    """SIGKILL a live worker that holds running jobs (polling up to ``wait`` s for one; then
    any), start its replacement, and record the jobs it held (the fault; None: no worker)."""
    deadline = trio.current_time() + wait
    while True:
        holding = await held.by_pid()
        holders = [w for w in group.live() if holding.get(w.pid)]
        if holders or trio.current_time() >= deadline:
            break
        await trio.sleep(_HELD_POLL)
    live = group.live()
    if not live:
        return None
    victim: Worker = random.choice(holders or live)
    jobs = holding.get(victim.pid, [])
    at = time.time()
    group.kill(victim)
    # What it held when it died: it may have claimed (or finished) jobs since `holding` was
    # read. Its rows stay running until a sweeper takes it for dead, which waits out the
    # liveness grace (a second by default), so this read, milliseconds after, sees them all.
    # (When the database cannot be asked, the read before the kill stands.) Shielded and
    # bounded: the kill has happened (and its replacement started) even if the run ends now,
    # so it must be recorded; a cancelled read here left the kill uncounted.
    after = None
    with trio.move_on_after(_RECORD_TIMEOUT, shield=True):
        after = await held.read()
    if after is not None:
        jobs = after.get(victim.pid, [])
    log.kills += 1
    log.note(f"SIGKILL worker pid {victim.pid} (slot {victim.slot}) holding {len(jobs)} jobs")
    detail = f"SIGKILL pid {victim.pid} holding {len(jobs)} running jobs"
    fault = Fault(kind="kill", started=at, ended=at, detail=detail, held=jobs, pids=[victim.pid])
    log.fault(fault)
    return fault


async def _time_release(held: HeldJobs, fault: Fault) -> None:
    """How long until none of the jobs a killed worker held runs under it any more."""
    if fault.held:
        fault.released = await _released(held, fault.pids, fault.started)


async def kill_host_at(
    at: float, group: WorkerGroup, held: HeldJobs, log: ChaosLog, done: trio.Event
) -> None:
    """Once, ``at`` seconds in: SIGKILL every worker of one host whose workers hold running
    jobs (waiting up to `KILL_WAIT` for one), and start nothing there again."""
    await trio.sleep(at)
    deadline = trio.current_time() + KILL_WAIT
    while True:
        holding = await held.by_pid()
        holders = _hosts_holding(group, holding)
        if holders or trio.current_time() >= deadline:
            break
        await trio.sleep(_HELD_POLL)
    alive = {w.host for w in group.live()}
    if len(alive) < 2:  # the last host standing: nobody would be left to finish the work
        log.note("host kill skipped: fewer than two hosts have live workers")
        done.set()
        return
    victim = random.choice(sorted(holders or alive, key=lambda h: h.name))
    at_wall = time.time()
    workers = group.kill_host(victim)
    pids = [w.pid for w in workers]
    # As in kill_one: the rows stay running until a sweeper of another host takes the
    # processes for dead, so this read, milliseconds after, sees all they held.
    if (after := await held.read()) is not None:
        holding = after
    jobs = sorted(j for pid in pids for j in holding.get(pid, []))
    log.host_kills += 1
    log.kills += len(workers)
    what = f"host {victim.name}: SIGKILL {len(workers)} workers {pids} holding {len(jobs)} jobs"
    log.note(what)
    fault = Fault(kind="host kill", started=at_wall, ended=at_wall, detail=what, held=jobs,
                  pids=pids)  # fmt: skip
    log.fault(fault)
    fault.released = await _released(held, pids, at_wall)
    log.note(f"host {victim.name}: its running jobs released after {fault.released} s")
    done.set()


async def _released(held: HeldJobs, pids: list[int], since: float) -> float | None:
    """Wall-clock seconds from ``since`` until no job runs under any of ``pids`` (a sweeper
    of another host took them for dead, or their lease expired); None after `RELEASE_WAIT`."""
    with trio.move_on_after(RELEASE_WAIT):
        while True:
            holding = await held.read()
            if holding is not None and not any(holding.get(pid) for pid in pids):
                return round(time.time() - since, 3)
            await trio.sleep(_HELD_POLL)
    return None


def _hosts_holding(group: WorkerGroup, holding: dict[int, list[int]]) -> set[Host]:
    return {w.host for w in group.live() if holding.get(w.pid)}


async def terminate_loop(
    connect: Callable[[], Awaitable[Any]], prefix: str, every: float, log: ChaosLog
) -> None:
    """``pg_terminate_backend`` every connection of the workers every ``every`` seconds."""
    pattern = like_prefix(prefix)
    while True:
        await trio.sleep(every)
        at = time.time()
        try:
            async with await connect() as conn:
                cur = await conn.execute(_TERMINATE, {"pattern": pattern})
                row = await cur.fetchone()
        except psycopg.OperationalError as ex:
            log.note(f"terminate round failed: {ex}")
            continue
        count = int(row[0]) if row else 0
        log.terminate_rounds += 1
        log.terminated_connections += count
        log.note(f"terminated {count} worker connections")
        detail = f"pg_terminate_backend of {count} worker connections"
        log.fault(Fault(kind="terminate", started=at, ended=time.time(), detail=detail))


async def restart_at(
    at: float, restart: Callable[[], Awaitable[None]], log: ChaosLog, done: trio.Event
) -> None:
    """Stop and start the Postgres server once, ``at`` seconds into the workload."""
    await trio.sleep(at)
    log.note("restarting Postgres")
    started = time.time()
    await restart()
    ended = time.time()
    log.postgres_restarts += 1
    done.set()
    log.note(f"Postgres back after {ended - started:.2f} s")
    detail = f"stopped (fast shutdown) and started again: down {ended - started:.2f} s"
    log.fault(Fault(kind="postgres restart", started=started, ended=ended, detail=detail))
