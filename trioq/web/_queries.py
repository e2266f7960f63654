"""What the pages show, read from the database: the library's statements (`trioq._db.statements`)
run on a connection, their rows turned into small frozen objects the templates render."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

import attrs

from .._db.statements import Statements
from .._dead import DeadJob
from .._flow import QueueSettings
from .._obs.history import percentile_ms
from .._pg.conn import Conn
from ._limits import (
    COUNT_CAP,
    LEASE_CAP,
    MAX_QUEUES,
    STALE_PING,
    WINDOW,
    WORKER_CAP,
)

__all__ = [
    "Count",
    "CronRow",
    "HistoryPoint",
    "JobDetail",
    "JobFilter",
    "JobProgress",
    "JobRow",
    "Overview",
    "QueueRow",
    "Worker",
    "cron_ticks",
    "dead_count",
    "dead_ids",
    "find_job",
    "history",
    "job_page",
    "job_progress",
    "overview",
    "paused_queues",
]

#: The most bytes of a stored result a job page reads (`JobDetail.result_stored`).
LOAD_LIMIT = 1024 * 1024
#: The longest progress text a job page decodes to draw a bar (`JobProgress.fraction`).
FRACTION_READ = 10_000


#: The states a job list can show (dead is the dead_jobs table).
STATES = ("running", "available", "scheduled", "waiting", "dead", "cancelled", "done")


@attrs.frozen
class Count:
    """A count that is exact below the cap; ``capped``: at least this many."""

    n: int
    capped: bool = False

    def __str__(self) -> str:
        return f"{self.n:,}+" if self.capped else f"{self.n:,}"


def _count(n: int, cap: int = COUNT_CAP) -> Count:
    return Count(min(n, cap), capped=n >= cap)


@attrs.frozen(kw_only=True)
class QueueRow:
    queue: str
    scheduled: Count
    available: Count
    running: Count
    dead: Count
    head_wait_seconds: float | None  # how long the next job to be claimed has waited
    paused: bool = False  # `trioq queue pause` / the dashboard's Pause: no worker claims
    paused_until: dt.datetime | None = None  # a timed pause's end (None: until resumed)


@attrs.frozen(kw_only=True)
class Worker:
    """A worker: registered in ``workers`` (every `trioq serve` since liveness), or only
    seen as the owner of running jobs' leases (``host:pid:random``)."""

    owner: str
    host: str
    pid: str
    queues: tuple[tuple[str, int, int | None], ...]  # (queue, running jobs, its slots)
    busy: int
    next_expiry_seconds: float | None  # None: it holds no lease
    last_expiry_seconds: float | None
    seen_seconds_ago: float | None = None  # its last ping; None: not registered

    @property
    def registered(self) -> bool:
        return self.seen_seconds_ago is not None

    @property
    def stale(self) -> bool:
        """Probably gone: no ping for a while, or (not registered) every lease expired."""
        if self.seen_seconds_ago is not None:
            return self.seen_seconds_ago > STALE_PING
        return self.last_expiry_seconds is not None and self.last_expiry_seconds < 0


@attrs.frozen(kw_only=True)
class Overview:
    queues: tuple[QueueRow, ...]
    workers: tuple[Worker, ...]
    scheduled_capped: bool  # more scheduled jobs than the window: per-queue counts are lower
    leases_capped: bool


async def overview(
    conn: Conn, st: Statements, *, now: float,
    paused: Mapping[str, dt.datetime | None] | None = None,
) -> Overview:
    """Every queue's counts, and the workers seen through their leases.

    The queues are those with jobs waiting, running or dead, those with history in the
    last day (so a queue that just drained still shows, with zeros), and the ``paused``
    ones (so they can be resumed; each with the end of its timed pause, or None).
    """
    paused = paused or {}
    caps = {"cap": COUNT_CAP, "max_queues": MAX_QUEUES, "lease_cap": LEASE_CAP}
    recent = await history_queues(conn, st, since=int(now) - 86400)
    cur = await conn.execute(st.depth_available, caps)
    available = {q: (n, wait) for q, n, wait in await cur.fetchall()}
    cur = await conn.execute(st.depth_dead, caps)
    dead = dict(await cur.fetchall())
    cur = await conn.execute(st.queues_scheduled, caps)
    scheduled_rows = await cur.fetchall()
    scheduled = {q: n for q, n, _ in scheduled_rows}
    scheduled_capped = any(full for _, _, full in scheduled_rows)
    cur = await conn.execute(st.lease_rows, caps)
    lease_rows = await cur.fetchall()
    cur = await conn.execute(st.worker_rows, {"worker_cap": WORKER_CAP})
    worker_rows = await cur.fetchall()
    running: dict[str, int] = {}
    for _, queue, n, _, _ in lease_rows:
        running[queue] = running.get(queue, 0) + n
    leases_capped = sum(running.values()) >= LEASE_CAP
    names = sorted({*available, *dead, *scheduled, *running, *recent, *paused})[:MAX_QUEUES]
    queues = tuple(
        QueueRow(
            queue=name,
            scheduled=Count(scheduled.get(name, 0), capped=scheduled_capped),
            available=_count(available.get(name, (0, None))[0]),
            running=Count(running.get(name, 0), capped=leases_capped),
            dead=_count(dead.get(name, 0)),
            head_wait_seconds=_float(available.get(name, (0, None))[1]),
            paused=name in paused,
            paused_until=paused.get(name),
        )
        for name in names
    )
    return Overview(
        queues=queues, workers=_workers(worker_rows, lease_rows),
        scheduled_capped=scheduled_capped,
        leases_capped=leases_capped,
    )  # fmt: skip


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _workers(
    registered: Sequence[tuple[Any, ...]], leases: Sequence[tuple[Any, ...]]
) -> tuple[Worker, ...]:
    """The registered workers with their slots and the jobs they run, then the lease owners
    that are not registered (an older trioq, or a worker taken for dead that runs on)."""
    by_owner: dict[str, list[tuple[Any, ...]]] = {}
    for row in leases:
        by_owner.setdefault(row[0], []).append(row)
    workers = []
    for name, host, pid, slots, _running, seen_ago in registered:
        mine = by_owner.pop(name, [])
        running = {queue: int(n) for _, queue, n, _, _ in mine}
        queues = {**{q: (running.get(q, 0), int(s)) for q, s in dict(slots).items()},
                  **{q: (n, None) for q, n in running.items() if q not in slots}}  # fmt: skip
        workers.append(Worker(
            owner=name, host=str(host), pid=str(pid),
            queues=tuple((q, n, s) for q, (n, s) in sorted(queues.items())),
            busy=sum(running.values()),
            next_expiry_seconds=min((float(r[3]) for r in mine), default=None),
            last_expiry_seconds=max((float(r[4]) for r in mine), default=None),
            seen_seconds_ago=float(seen_ago),
        ))  # fmt: skip
    for owner, mine in by_owner.items():
        parts = owner.split(":")
        host, pid = (parts[0], parts[1]) if len(parts) == 3 else (owner, "")
        workers.append(Worker(
            owner=owner, host=host, pid=pid,
            queues=tuple((queue, int(n), None) for _, queue, n, _, _ in mine),
            busy=sum(int(n) for _, _, n, _, _ in mine),
            next_expiry_seconds=min(float(r[3]) for r in mine),
            last_expiry_seconds=max(float(r[4]) for r in mine),
        ))  # fmt: skip
    return tuple(sorted(workers, key=lambda w: (w.host, w.pid, w.owner)))


# -- history ------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class HistoryPoint:
    minute: int  # seconds since the epoch
    completed: int
    retried: int
    dead: int
    cancelled: int
    exec_p50_ms: float | None
    exec_p95_ms: float | None
    exec_max_ms: float | None
    wait_p50_ms: float | None
    wait_p95_ms: float | None
    wait_max_ms: float | None


async def history(
    conn: Conn, st: Statements, *, since: int, queue: str | None = None
) -> tuple[float, list[HistoryPoint]]:
    """The database's clock and the per-minute points since ``since`` (epoch seconds)."""
    cur = await conn.execute(st.clock_epoch)
    row = await cur.fetchone()
    now = float(row[0]) if row else 0.0
    cur = await conn.execute(st.history_minutes, {"since": since, "queue": queue})
    points = []
    for (
        minute,
        done,
        retried,
        dead,
        cancelled,
        runs,
        _,
        xmax,
        _,
        wmax,
        xh,
        wh,
    ) in await cur.fetchall():
        exec_max = xmax / 1000 if runs else None
        wait_max = wmax / 1000 if runs else None
        points.append(
            HistoryPoint(
                minute=int(minute),
                completed=done,
                retried=retried,
                dead=dead,
                cancelled=cancelled,
                exec_p50_ms=percentile_ms(xh, 0.5, max_ms=exec_max),
                exec_p95_ms=percentile_ms(xh, 0.95, max_ms=exec_max),
                exec_max_ms=exec_max,
                wait_p50_ms=percentile_ms(wh, 0.5, max_ms=wait_max),
                wait_p95_ms=percentile_ms(wh, 0.95, max_ms=wait_max),
                wait_max_ms=wait_max,
            )
        )
    return now, points


async def paused_queues(conn: Conn, st: Statements) -> dict[str, dt.datetime | None]:
    """The paused queues (at most `MAX_QUEUES`, by name), each with the end of its timed
    pause or None: only those, not every queue's settings (10,000 tenants' queues)."""
    cur = await conn.execute(st.paused_settings, {"limit": MAX_QUEUES})
    found = (QueueSettings.from_row(row) for row in await cur.fetchall())
    return {s.name: s.paused_until for s in found}


async def history_queues(conn: Conn, st: Statements, *, since: int) -> list[str]:
    cur = await conn.execute(st.history_queues, {"since": since})
    return [q for (q,) in await cur.fetchall()]


# -- job lists ----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class JobFilter:
    """What a job list shows: a state, optional queue and task, an optional args search
    (a JSON value the args contain, or a text the args' JSON contains)."""

    state: str = "running"
    queue: str | None = None
    task: str | None = None
    search: str | None = None  # as typed
    contains: str | None = None  # JSON, when the search parsed as an object or array
    text: str | None = None  # else the search as text
    offset: int = 0
    limit: int = 50

    def params(self) -> dict[str, Any]:
        return {
            "queue": self.queue, "task": self.task, "contains": self.contains,
            "text": self.text, "window": WINDOW, "limit": self.limit + 1,
            "offset": self.offset,
        }  # fmt: skip

    @property
    def filtered(self) -> bool:
        return any(v is not None for v in (self.queue, self.task, self.contains, self.text))


def search_terms(search: str | None) -> tuple[str | None, str | None]:
    """(contains, text): a JSON object or array searches by containment, the rest as text."""
    if not search:
        return None, None
    try:
        value = json.loads(search)
    except (ValueError, RecursionError):
        return None, search
    if isinstance(value, dict | list):
        return json.dumps(value), None
    return None, search


@attrs.frozen(kw_only=True)
class JobRow:
    id: int
    queue: str
    task: str
    state: str
    priority: int
    attempt: int
    max_attempts: int
    run_at: dt.datetime | None
    enqueued_at: dt.datetime
    lease_owner: str | None
    lease_expires_at: dt.datetime | None
    finished_at: dt.datetime | None
    error: str | None
    args: str

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> JobRow:
        names = [f.name for f in attrs.fields(cls)]
        return cls(**dict(zip(names, row, strict=True)))


async def job_page(conn: Conn, st: Statements, where: JobFilter) -> tuple[list[JobRow], bool]:
    """One page of jobs, and whether there is a next one."""
    cur = await conn.execute(st.job_lists[where.state], where.params())
    rows = [JobRow.from_row(r) for r in await cur.fetchall()]
    return rows[: where.limit], len(rows) > where.limit


# -- one job ------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class JobDetail:
    id: int
    queue: str
    task: str
    state: str
    args: str
    priority: int
    run_at: dt.datetime
    attempt: int
    max_attempts: int
    lease_owner: str | None
    lease_expires_at: dt.datetime | None
    dedup_key: str | None
    #: Its sequence (docs/flow-control.md, "Sequences"), None without one.
    sequence_key: str | None
    cancel_requested: bool
    last_error: str | None
    result: str | None
    enqueued_at: dt.datetime
    finished_at: dt.datetime | None
    now: dt.datetime
    #: Bytes the result takes where it is stored; over `LOAD_LIMIT`, ``result`` is None.
    result_stored: int | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> JobDetail:
        names = [f.name for f in attrs.fields(cls)]
        return cls(**dict(zip(names, row, strict=True)))

    @property
    def cancellable(self) -> bool:
        live = ("waiting", "scheduled", "available", "running")
        return self.state in live and not self.cancel_requested


async def find_job(conn: Conn, st: Statements, job_id: int) -> JobDetail | DeadJob | None:
    """The job with this id, live (or kept) in jobs, or in dead_jobs; None if neither."""
    cur = await conn.execute(st.job, {"id": job_id, "load": LOAD_LIMIT})
    row = await cur.fetchone()
    if row is not None:
        return JobDetail.from_row(row)
    cur = await conn.execute(st.dead_job, {"id": job_id})
    row = await cur.fetchone()
    return None if row is None else DeadJob.from_row(row)


@attrs.frozen(kw_only=True)
class JobProgress:
    """What a job page shows of a job's progress (``job.progress()``, docs/progress.md)."""

    #: Its JSON text, None when it is over `LOAD_LIMIT` where it is stored (``stored`` says).
    text: str | None
    #: Bytes it takes where it is stored.
    stored: int
    at: dt.datetime | None

    @property
    def fraction(self) -> float | None:
        """``done / of`` (0 to 1) when the value is an object with those two numbers, for a
        bar; None otherwise (any other value is shown as JSON only)."""
        if self.text is None or len(self.text) > FRACTION_READ:
            return None
        try:
            value = json.loads(self.text)
        except (ValueError, RecursionError):
            return None
        if not isinstance(value, dict):
            return None
        done, of = value.get("done"), value.get("of")
        if not (_number(done) and _number(of)) or of <= 0:
            return None
        try:
            return min(max(float(done / of), 0.0), 1.0)
        except (OverflowError, ZeroDivisionError):  # a huge int over a tiny float
            return None


def _number(value: object) -> TypeGuard[int | float]:
    """A finite JSON number (not a boolean)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or math.isfinite(value)


async def job_progress(conn: Conn, st: Statements, job_id: int) -> JobProgress | None:
    """The job's progress, from jobs or dead_jobs; None if it has none (or no such job)."""
    cur = await conn.execute(st.job_progress, {"id": job_id, "load": LOAD_LIMIT})
    row = await cur.fetchone()
    if row is None or row[1] is None:
        return None
    return JobProgress(text=row[0], stored=row[1], at=row[2])


# -- dead-job actions ---------------------------------------------------------------------------


async def dead_count(
    conn: Conn, st: Statements, *, queue: str | None, task: str | None,
    ids: list[int] | None,
) -> Count:  # fmt: skip
    if ids is not None:
        cur = await conn.execute(st.dead_count_ids, {"ids": ids})
    else:
        cur = await conn.execute(st.dead_count, {"queue": queue, "task": task, "cap": COUNT_CAP})
    row = await cur.fetchone()
    return _count(int(row[0]) if row else 0)


async def dead_ids(
    conn: Conn, st: Statements, *, queue: str | None, task: str | None, after: int,
    batch: int,
) -> list[int]:  # fmt: skip
    params = {"queue": queue, "task": task, "after": after, "batch": batch}
    cur = await conn.execute(st.dead_ids, params)
    return [job_id for (job_id,) in await cur.fetchall()]


# -- cron ---------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CronRow:
    name: str
    schedule: str | None  # None: not in the app the dashboard was given (or no app)
    timezone: str | None
    queue: str | None
    task: str | None
    last_tick: dt.datetime | None
    last_job_id: int | None
    last_fired_at: dt.datetime | None
    next_tick: dt.datetime | None
    #: "app" (the app the dashboard was given), "database" (``cron_entries``), or None (only
    #: ticks are known).
    source: str | None = "app"
    #: "ok", "disabled", "broken" (``error`` says why) or "shadowed" (an app entry has its
    #: name, and the workers run that one).
    status: str = "ok"
    error: str | None = None


async def cron_ticks(
    conn: Conn, st: Statements
) -> dict[str, tuple[dt.datetime, int | None, dt.datetime]]:
    """Each cron entry's latest fired tick: (tick, job id, fired at), by name."""
    cur = await conn.execute(st.cron_last)
    return {name: (tick, job_id, fired) for name, tick, job_id, fired in await cur.fetchall()}
