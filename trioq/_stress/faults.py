"""One-shot faults of `trioq stress`, and how long the queue took to recover from each.

Each fault is recorded as a `Fault` (wall-clock start and end, what was done, the jobs a
killed worker held); `recovery` turns them into numbers from the ledger after the run, all
measured from the fault's end (a kill: the kill; a restart: the server ready again;
starvation or a pin: its release; a graceful stop: the new workers spawned):

- ``first_completion_s``: until the first job completed after the end (a killed worker of
  two: the survivor's next completion; a Postgres restart: reconnecting);
- ``caught_up_s``: until every job enqueued before the end had completed: the backlog the
  fault caused is gone (steady mode; in a burn-down it is the rest of the drain);
- ``held_recovered_s`` (a kill): until the last job the victim held was completed elsewhere
  (this includes waiting behind the backlog that built up while the victim was gone: on a
  loaded machine the survivors may not keep up with the arrival rate, and it grows);
- ``held_released_s`` (a kill, a host kill): until none of the jobs the victims held was
  running any more (a sweeper took the processes for dead, or the leases expired: the jobs
  are back in the queue, behind what was due before them): the recovery itself;
- ``completed_during``, ``rate_during`` and ``pickup_p95_during`` for a window (starvation,
  a pinned xmin): the queue kept working, how fast, and how late jobs were picked up.

The faults themselves: `starve` (other clients hold nearly every connection slot),
`pin_xmin` (an idle-in-transaction session holds back the xmin horizon) and
`graceful_stop` (SIGTERM every worker under load, time their exits, restart them).
"""

from __future__ import annotations

import logging
import signal
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import psycopg
import trio
from psycopg import sql

from .._db.statements import qualified
from .ledger import LEDGER_TABLE
from .workers import STOP_TIMEOUT, WorkerGroup

__all__ = [
    "Fault",
    "HeldJobs",
    "graceful_stop",
    "host_kill_failures",
    "pin_xmin",
    "recovery",
    "recovery_summary",
    "starve",
]

logger = logging.getLogger("trioq.stress")

Connect = Callable[[], Awaitable[Any]]

#: SQLSTATE too_many_connections: the server refused a connection for want of a slot.
TOO_MANY_CONNECTIONS = "53300"
#: The most connections `starve` opens, whatever max_connections says.
MAX_HOGS = 5000


@attrs.define
class Fault:
    """One injected fault; times are wall-clock seconds (``time.time()``)."""

    kind: str
    started: float
    ended: float
    detail: str
    held: list[int] = attrs.field(factory=list)  # a kill: the victim's running jobs
    pids: list[int] = attrs.field(factory=list)  # a kill: the process(es) it killed
    #: A kill: seconds until none of the victims' jobs was running any more (taken back).
    released: float | None = None


# -- the jobs each worker holds ---------------------------------------------------------------

# lease_owner is "host:pid:random" (the default worker_id), so the pid is the second-to-last part.
_HELD = r"""
SELECT (regexp_match(lease_owner, ':(\d+):[^:]*$'))[1]::int, array_agg(id ORDER BY id)
  FROM {jobs} WHERE state = 'running' AND lease_owner IS NOT NULL GROUP BY 1
"""


@attrs.define
class HeldJobs:
    """Reads which running jobs each worker process holds, by pid."""

    connect: Connect
    schema: str

    async def by_pid(self) -> dict[int, list[int]]:
        """pid -> running job ids; empty if the database cannot be asked."""
        return await self.read() or {}

    async def read(self) -> dict[int, list[int]] | None:
        """pid -> running job ids; None if the database cannot be asked."""
        query = sql.SQL(_HELD.strip()).format(jobs=qualified(self.schema, "jobs"))
        try:
            async with await self.connect() as conn:
                rows = await (await conn.execute(query)).fetchall()
        except psycopg.OperationalError as ex:
            logger.debug("cannot read held jobs: %s", ex)
            return None
        return {int(pid): list(ids) for pid, ids in rows if pid is not None}

    async def running(self) -> int | None:
        """How many jobs are running (any owner); None if the database cannot be asked."""
        query = sql.SQL("SELECT count(*) FROM {} WHERE state = 'running'").format(
            qualified(self.schema, "jobs")
        )
        try:
            async with await self.connect() as conn:
                row = await (await conn.execute(query)).fetchone()
        except psycopg.OperationalError:
            return None
        return int(row[0]) if row else None


# -- starvation: other clients hold nearly every connection ---------------------------------


def like_prefix(prefix: str) -> str:
    """A LIKE pattern matching what starts with ``prefix``."""
    return prefix.replace("\\", "\\\\").replace("_", r"\_").replace("%", r"\%") + "%"


_MAX_CONNECTIONS = "SELECT current_setting('max_connections')::int"

# Cut the workers' connections; their pids, to wait until their slots are free.
_CUT = """
SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity
 WHERE datname = current_database() AND application_name LIKE %(pattern)s
   AND pg_terminate_backend(pid)
"""

_ALIVE = "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)"

_WORKER_CONNECTIONS = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s"

#: Rounds of "fill every slot, cut the workers' connections" before starving anyway.
SQUEEZE_ROUNDS = 20
#: How long a cut waits for the backends to exit (their slots to be free).
CUT_WAIT = 2.0
#: Hog connections opened at once.
FILL_PARALLEL = 16


@attrs.define
class Starvation:
    """What `starve` did: JSON-ready."""

    max_connections: int = 0
    leave: int = 0  # slots the workers get among them
    hogs: int = 0
    worker_connections_cut: int = 0
    worker_connections_start: int | None = None  # when the window began
    worker_connections_end: int | None = None  # when it ended
    squeeze_rounds: int = 0
    squeeze_seconds: float = 0.0  # from the first hog until the workers held at most `leave`
    seconds: float = 0.0  # the whole window, squeeze included


async def starve(
    *,
    connect: Connect,
    connect_hog: Connect,
    prefix: str,
    at: float,
    hold: float,
    leave: int,
    record: Callable[[Fault], None],
    result: Starvation,
    note: Callable[[str], None],
) -> None:
    """``at`` s in: idle "hog" connections take every connection slot, and the workers'
    connections are cut until they hold at most ``leave`` (with the free ones); ``hold`` s
    after it began (the squeeze included), the hogs go."""
    await trio.sleep(at)
    pattern = like_prefix(prefix)
    hogs: list[Any] = []
    async with await connect() as control:  # opened first: the hogs cannot lock us out
        row = await (await control.execute(_MAX_CONNECTIONS)).fetchone()
        result.max_connections, result.leave = int(row[0]), leave
        started = time.time()
        try:
            workers = await _squeeze(
                control, connect_hog, hogs, pattern, leave=leave, result=result
            )
            result.squeeze_seconds = time.time() - started
            result.hogs, result.worker_connections_start = len(hogs), workers
            note(f"starving: {len(hogs)} idle connections hold every slot of "
                 f"{result.max_connections} but {leave} for the workers, which hold {workers} "
                 f"({result.worker_connections_cut} of theirs cut in "
                 f"{result.squeeze_seconds:.1f} s)")  # fmt: skip
            await trio.sleep_until(trio.current_time() + hold - result.squeeze_seconds)
            result.worker_connections_end = await _count(control, pattern)
        finally:
            await _close(hogs)
    ended = time.time()
    result.seconds = ended - started
    detail = (
        f"{result.hogs} hogs, {leave} slots left to the workers for {hold:g} s; "
        f"{result.worker_connections_cut} worker connections cut"
    )
    record(Fault(kind="starvation", started=started, ended=ended, detail=detail))
    note("starvation over: hogs closed")


async def _squeeze(
    control: Any, connect_hog: Connect, hogs: list[Any], pattern: str, *, leave: int,
    result: Starvation,
) -> int:  # fmt: skip
    """Fill every free slot with hogs and cut all the workers' connections, again, until the
    workers hold at most ``leave``; then free the difference. The workers' connections."""
    for _ in range(SQUEEZE_ROUNDS):
        result.squeeze_rounds += 1
        await _open_hogs(connect_hog, hogs)
        workers = await _count(control, pattern)
        if workers <= leave:
            give_back = min(leave - workers, len(hogs))
            await _close(hogs[len(hogs) - give_back :])
            del hogs[len(hogs) - give_back :]
            return workers
        # Cut them all: the survivors would otherwise take the slots the cut ones free.
        pids = (await (await control.execute(_CUT, {"pattern": pattern})).fetchone())[0]
        result.worker_connections_cut += len(pids)
        with trio.move_on_after(CUT_WAIT):
            # A backend has no event to wait on: poll pg_stat_activity, bounded.
            while (await (await control.execute(_ALIVE, (pids,))).fetchone())[0]:  # noqa: ASYNC110
                await trio.sleep(0.005)
    return await _count(control, pattern)


async def _count(control: Any, pattern: str) -> int:
    row = await (await control.execute(_WORKER_CONNECTIONS, (pattern,))).fetchone()
    return int(row[0])


async def _open_hogs(connect_hog: Connect, hogs: list[Any]) -> None:
    """Open idle connections into ``hogs`` until the server refuses one (or `MAX_HOGS`),
    `FILL_PARALLEL` at a time: the workers reconnect concurrently, and must not win."""
    full = trio.Event()

    async def opener() -> None:
        while not full.is_set() and len(hogs) < MAX_HOGS:
            try:
                hogs.append(await connect_hog())
            except psycopg.OperationalError as ex:
                if not _refused_for_slots(ex):
                    raise
                full.set()

    async with trio.open_nursery() as nursery:
        for _ in range(FILL_PARALLEL):
            nursery.start_soon(opener)


def _refused_for_slots(ex: psycopg.OperationalError) -> bool:
    text = str(ex)
    return (
        ex.sqlstate == TOO_MANY_CONNECTIONS
        or "too many clients" in text
        or "connection slots are reserved" in text
    )


async def _close(conns: list[Any]) -> None:
    with trio.move_on_after(10, shield=True):
        for conn in conns:
            await conn.close()


# -- a pinned xmin horizon ---------------------------------------------------------------------

_TUPLES = """
SELECT n_dead_tup, n_live_tup, autovacuum_count + vacuum_count
  FROM pg_stat_user_tables WHERE schemaname = %(schema)s AND relname = 'jobs'
"""

_PIN_XMIN = "SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = pg_backend_pid()"


@attrs.define
class XminPin:
    """What `pin_xmin` saw: dead tuples of the jobs table before, at the end of the pin, and
    after the run (once a VACUUM could remove them). JSON-ready."""

    xmin: str | None = None
    seconds: float = 0.0
    dead_before: int | None = None
    dead_at_release: int | None = None
    dead_after_vacuum: int | None = None
    live_at_release: int | None = None
    vacuums_during: int | None = None


async def tuples(conn: Any, schema: str) -> tuple[int, int, int] | None:
    row = await (await conn.execute(_TUPLES, {"schema": schema})).fetchone()
    return None if row is None else (int(row[0]), int(row[1]), int(row[2]))


async def pin_xmin(
    *,
    connect: Connect,
    schema: str,
    at: float,
    hold: float,
    record: Callable[[Fault], None],
    result: XminPin,
    note: Callable[[str], None],
) -> None:
    """``at`` s in: a session opens a REPEATABLE READ transaction, takes its snapshot and sits
    idle in it for ``hold`` s, so no dead row version younger than it can be vacuumed."""
    await trio.sleep(at)
    async with await connect() as control, await connect() as pin:
        before = await tuples(control, schema)
        await pin.execute("SET idle_in_transaction_session_timeout = 0")
        await pin.set_autocommit(False)
        await pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        row = await (await pin.execute(_PIN_XMIN)).fetchone()  # takes the snapshot
        started = time.time()
        result.xmin = row[0] if row else None
        note(f"xmin pinned at {result.xmin} by an idle-in-transaction session for {hold:g} s")
        await trio.sleep(hold)
        at_release = await tuples(control, schema)
        await pin.rollback()
        ended = time.time()
    result.seconds = ended - started
    if before is not None:
        result.dead_before = before[0]
    if at_release is not None:
        result.dead_at_release, result.live_at_release = at_release[0], at_release[1]
        if before is not None:
            result.vacuums_during = at_release[2] - before[2]
    detail = (
        f"xmin {result.xmin} pinned {hold:g} s: jobs dead tuples {result.dead_before} -> "
        f"{result.dead_at_release}"
    )
    record(Fault(kind="xmin pin", started=started, ended=ended, detail=detail))
    note("xmin released")


async def vacuum_after(conn: Any, schema: str, result: XminPin) -> None:
    """After the run: VACUUM the jobs table and read its dead tuples (the pin is gone)."""
    await conn.execute(sql.SQL("VACUUM {}").format(qualified(schema, "jobs")))
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    after = await tuples(conn, schema)
    result.dead_after_vacuum = None if after is None else after[0]


# -- a graceful stop of every worker under load ---------------------------------------------


@attrs.define
class GracefulStop:
    """What `graceful_stop` measured: JSON-ready."""

    grace: float = 0.0
    workers: int = 0
    held_at_signal: int | None = None  # running jobs when SIGTERM was sent
    exit_seconds: list[float] = attrs.field(factory=list)
    exit_codes: list[int | None] = attrs.field(factory=list)
    killed: int = 0  # did not exit within grace + STOP_TIMEOUT: SIGKILLed
    running_after: int | None = None  # rows still 'running' once every worker had exited

    def failures(self) -> list[str]:
        problems = []
        if self.killed:
            problems.append(f"graceful stop: {self.killed} workers did not exit in time")
        if any(code != 0 for code in self.exit_codes):
            problems.append(f"graceful stop: exit codes {self.exit_codes}")
        if self.running_after:
            problems.append(f"graceful stop: {self.running_after} jobs left running")
        return problems


async def graceful_stop(
    *,
    group: WorkerGroup,
    held: HeldJobs,
    at: float,
    grace: float,
    record: Callable[[Fault], None],
    result: GracefulStop,
    note: Callable[[str], None],
) -> None:
    """``at`` s in: SIGTERM every worker, time each exit against ``grace``, check that no job
    is left running, then start new workers (the load goes on meanwhile)."""
    await trio.sleep(at)
    result.grace = grace
    result.held_at_signal = await held.running()
    live = group.live()
    result.workers = len(live)
    started = time.time()
    t0 = trio.current_time()
    for worker in live:
        worker.stopping = True
        group.signal(worker, signal.SIGTERM)
    note(f"SIGTERM to {len(live)} workers holding {result.held_at_signal} running jobs")
    async with trio.open_nursery() as nursery:
        for worker in live:
            nursery.start_soon(_time_exit, worker, t0, grace + STOP_TIMEOUT, group, result)
    result.running_after = await held.running()
    group.start_all()
    ended = time.time()
    slowest = max(result.exit_seconds, default=0.0)
    detail = (
        f"{result.workers} workers exited in {slowest:.2f} s (grace {grace:g} s), "
        f"codes {result.exit_codes}, {result.running_after} left running"
    )
    record(Fault(kind="graceful stop", started=started, ended=ended, detail=detail))
    note(detail)


async def _time_exit(
    worker: Any, t0: float, wait: float, group: WorkerGroup, result: GracefulStop
) -> None:
    with trio.move_on_after(wait):
        await worker.exited.wait()
    if not worker.exited.is_set():
        result.killed += 1
        group.signal(worker, signal.SIGKILL)
        await worker.exited.wait()
    result.exit_seconds.append(round(trio.current_time() - t0, 3))
    result.exit_codes.append(worker.returncode)


# -- recovery, from the ledger --------------------------------------------------------------

_RECOVERY = """
SELECT
  (SELECT extract(epoch FROM min(finished_at)) FROM {ledger}
    WHERE finished_at > to_timestamp(%(e)s)) - %(e)s,
  (SELECT extract(epoch FROM finished_at) FROM {caught}
    WHERE enqueued_at <= to_timestamp(%(e)s) ORDER BY enqueued_at DESC LIMIT 1) - %(e)s,
  (SELECT count(*) FROM {ledger}
    WHERE finished_at BETWEEN to_timestamp(%(s)s) AND to_timestamp(%(e)s)),
  (SELECT percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - run_at))
     FROM {ledger} WHERE started_at BETWEEN to_timestamp(%(s)s) AND to_timestamp(%(e)s)),
  (SELECT extract(epoch FROM max(finished_at)) FROM {ledger} WHERE job_id = ANY(%(held)s::int8[]))
    - %(s)s,
  (SELECT count(*) FROM {ledger} WHERE job_id = ANY(%(held)s::int8[])),
  (SELECT count(*) FROM {ledger}
    WHERE job_id = ANY(%(held)s::int8[]) AND worker_pid = ANY(%(pids)s::int4[]))
"""

# Per enqueue time, when everything enqueued up to then had completed (a running maximum).
_CAUGHT_UP = """
CREATE TEMP TABLE {caught} ON COMMIT DROP AS
SELECT enqueued_at, max(finished_at) OVER (ORDER BY enqueued_at) AS finished_at FROM {ledger}
"""


async def recovery(
    conn: Any, schema: str, faults: list[Fault], offset: float
) -> list[dict[str, Any]]:
    """Each fault with its recovery numbers (see the module docs); ``offset`` is the database
    clock less the wall clock, in seconds."""
    if not faults:
        return []
    ledger = qualified(schema, LEDGER_TABLE)
    caught = sql.Identifier("stress_caught_up")
    results = []
    async with conn.transaction():
        await conn.execute(sql.SQL(_CAUGHT_UP).format(caught=caught, ledger=ledger))
        await conn.execute(sql.SQL("CREATE INDEX ON {} (enqueued_at)").format(caught))
        for index in ("finished_at", "started_at", "job_id"):
            await conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({})").format(
                sql.Identifier(f"stress_ledger_{index}"), ledger, sql.Identifier(index)
            ))  # fmt: skip
        query = sql.SQL(_RECOVERY.strip()).format(ledger=ledger, caught=caught)
        for fault in faults:
            s, e = fault.started + offset, fault.ended + offset
            params = {"s": s, "e": e, "held": fault.held, "pids": fault.pids}
            cur = await conn.execute(query, params)
            row = await cur.fetchone()
            results.append(_recovered(fault, row))
    return results


def _recovered(fault: Fault, row: Any) -> dict[str, Any]:
    first, caught_up, during, pickup_p95, held_done, held_completed, by_victim = row
    window = fault.ended - fault.started
    out: dict[str, Any] = {
        "kind": fault.kind,
        "at": round(fault.started, 3),
        "seconds": round(window, 3),
        "detail": fault.detail,
        "first_completion_s": _r(first),
        "caught_up_s": _r(caught_up),
    }
    if caught_up is not None:  # all done before the end: no backlog to catch up with
        caught_up = max(caught_up, 0.0)
    if window >= 1:
        out["completed_during"] = int(during)
        out["rate_during"] = round(during / window, 1)
        out["pickup_p95_during_s"] = _r(pickup_p95)
    if fault.kind in ("kill", "host kill"):
        out["held"] = len(fault.held)
        out["held_completed"] = int(held_completed)
        out["held_recovered_s"] = _r(held_done) if fault.held else None
        out["held_released_s"] = fault.released if fault.held else None
    if fault.kind == "host kill":
        out["pids"] = list(fault.pids)
        out["held_ids"] = list(fault.held)  # at most the host's job slots
        # Completions of the held jobs by the killed processes: a SIGKILLed process cannot
        # complete anything, so anything but 0 means the held jobs were misread.
        out["held_completed_by_victim"] = int(by_victim)
    return out


def host_kill_failures(faults: list[dict[str, Any]]) -> list[str]:
    """A host kill whose held jobs were not all completed, once, by the other hosts."""
    problems = []
    for fault in faults:
        if fault["kind"] != "host kill":
            continue
        held, done, by_victim = (
            fault["held"],
            fault["held_completed"],
            fault["held_completed_by_victim"],
        )
        if done != held or by_victim:
            problems.append(
                f"host kill: of {held} jobs the killed host held, {done - by_victim} were "
                f"completed by the other hosts ({by_victim} by the killed processes)"
            )
    return problems


def _r(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


def recovery_summary(faults: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kind of fault: how many, and the median and worst of each recovery time."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for fault in faults:
        kinds.setdefault(fault["kind"], []).append(fault)
    summary: dict[str, dict[str, Any]] = {}
    for kind, items in kinds.items():
        entry: dict[str, Any] = {"count": len(items)}
        for key in ("first_completion_s", "caught_up_s", "held_recovered_s", "held_released_s"):
            values = [x[key] for x in items if x.get(key) is not None]
            if values:
                entry[key] = {"median": round(statistics.median(values), 3), "max": max(values)}
        if kind in ("kill", "host kill"):
            entry["held"] = [x["held"] for x in items][:20]
        summary[kind] = entry
    return summary
