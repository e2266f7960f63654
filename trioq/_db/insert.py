"""Every way rows get in: one job, many, many alike, a unique window, a graph of jobs.

Each function runs on the caller's connection, in the caller's transaction if one is open
(several statements in one of their own in autocommit: `own_transaction`), and takes
validated `JobSpec` s: `trioq.Queue` checks the payloads and the schema's version first,
and passes the enqueuing span's trace context (``trace``; None outside a span).

- `one`: the insert, ``ON CONFLICT DO NOTHING`` on the dedup key, then the live twin's id
  when it conflicted (inserted again when the twin ended between the two);
- `windowed`: a job whose key outlives it (a `Unique` with a period): the database
  function ``enqueue_unique`` of migration 6;
- `many`: jobs that share every field but args go in one statement (as `bulk`); others
  without dedup keys reserve their ids and go through COPY; those with keys through one
  ``INSERT ... SELECT FROM unnest`` with ``ON CONFLICT DO NOTHING``; unique windows one by
  one; jobs with dependencies through `graph`; all in one transaction;
- `bulk`: one job per args, all else shared: one statement per 20,000 jobs;
- `graph`: jobs that may wait for each other and for existing jobs (`trioq._dependencies`
  has the steps: locks, flags, ids, edges, the dependencies that had ended).

Ids are reserved by `reserve_ids` (so a caller knows which spec got which id), and every
path notifies once per queue that got a job it can run now, and ``@scheduled`` once for
jobs due later (`notify_payloads`), whatever the number of jobs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any

import attrs
import psycopg
from psycopg.pq import TransactionStatus

from .._exceptions import UnknownDependencyError
from .._job import ENCODE_CHUNK, SEQUENTIAL_ALONE, START_BY_BEFORE_RUN_AT, EnqueueResult, JobSpec
from .._pg.conn import Conn, first_row
from .params import columns
from .sql.common import SCHEDULED_PAYLOAD
from .statements import Statements, rendered, statements

__all__ = [
    "GraphJob",
    "bulk",
    "debounced",
    "graph",
    "many",
    "notify_payloads",
    "one",
    "own_transaction",
    "refusals",
    "reserve_ids",
    "windowed",
]

# One bulk-insert statement carries at most this many jobs, or this many characters of JSON.
_BULK_STATEMENT_JOBS = 20_000
_BULK_STATEMENT_CHARS = 16 * 1024 * 1024
_TWIN_LOOKUPS = 5  # a twin can finish between the conflict and the lookup: insert again
#: What became of a dependency that had ended before the enqueue (the names of `jobs_ended`).
_ENDED = {"done": "done", "cancelled": "cancelled", "dead": "dead"}


@attrs.frozen(kw_only=True)
class GraphJob:
    """One job of a graph to insert: its spec (``spec.after``: existing jobs it waits for),
    the positions in the graph of the jobs it waits for, and its batch."""

    spec: JobSpec
    waits_for: tuple[int, ...] = ()
    batch_id: int | None = None


@contextlib.asynccontextmanager
async def own_transaction(conn: Conn) -> AsyncIterator[None]:
    """A transaction of its own around several statements when ``conn`` is in autocommit and
    idle; else the caller's transaction (or the caller's choice to have none) holds them."""
    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        async with conn.transaction():
            yield
    else:
        yield


@contextlib.contextmanager
def refusals() -> Iterator[None]:
    """The schema's refusal of a deadline to start before the run time, in the words of
    every other path: where one is a time and the other an offset from now, only the insert
    can compare them (with the database's clock), and its check says no."""
    try:
        yield
    except psycopg.errors.CheckViolation as ex:
        if ex.diag.constraint_name == "jobs_start_by_after_run_at":
            raise ValueError(START_BY_BEFORE_RUN_AT) from None
        raise


def notify_payloads(
    jobs: Iterable[tuple[JobSpec, dt.datetime]], now: dt.datetime
) -> list[str]:
    """The notifications for jobs inserted to run at these times: each queue with a job due
    now, and ``@scheduled`` once for any due later."""
    return sorted({spec.queue if run_at <= now else SCHEDULED_PAYLOAD for spec, run_at in jobs})


async def _notify(conn: Conn, sql: Statements, payloads: Sequence[str]) -> None:
    if payloads:
        await conn.execute(sql.notify, {"channel": sql.channel, "queues": list(payloads)})


async def reserve_ids(conn: Conn, sql: Statements, n: int) -> tuple[dt.datetime, list[int]]:
    """The database's clock and ``n`` job ids drawn from the jobs' sequence."""
    cur = await conn.execute(sql.reserve_ids, {"jobs": f"{sql.schema}.jobs", "n": n})
    row = await cur.fetchone()
    assert row is not None
    return row[0], list(row[1])


# -- one job ------------------------------------------------------------------------------------


def _one_job(sql: Statements, spec: JobSpec, notify: bool) -> dict[str, Any]:
    """The parameters of one job's insert (``INSERT``, ``enqueue_unique``)."""
    return {
        "queue": spec.queue,
        "task": spec.task,
        "args": spec.args_json,
        "priority": spec.priority,
        "run_at": spec.run_at,
        "delay": spec.delay,
        "max_attempts": spec.stored_max_attempts,
        "max_attempts_unset": spec.max_attempts_unset,
        "chosen_max_attempts": spec.max_attempts,
        "concurrency_key": spec.concurrency_key,
        "start_by_at": spec.start_by_at,
        "start_by_in": spec.start_by_in,
        "cost": spec.cost,
        "sequence_key": spec.sequence_key,
        "notify": notify,
        "channel": sql.channel,
    }


async def one(
    conn: Conn, sql: Statements, spec: JobSpec, *, notify: bool, trace: str | None
) -> EnqueueResult:
    """One job without dependencies or a unique window; a duplicate's result carries its
    live twin's id."""
    found = spec.uniqueness()
    key = None if found is None else found.key
    params = {**_one_job(sql, spec, notify), "dedup_key": key, "trace": trace}
    insert = rendered(sql.schema, "insert", traced=trace is not None)
    for _ in range(_TWIN_LOOKUPS):
        row = await first_row(conn, insert, params)
        if row is not None:
            return EnqueueResult(int(row[0]))
        twins = await _live_twins(conn, sql, [key])
        if key in twins:
            return EnqueueResult(twins[key], duplicate=True)
    raise RuntimeError(f"dedup key {key!r} keeps conflicting with jobs that finish at once")


async def windowed(conn: Conn, sql: Statements, spec: JobSpec, *, notify: bool) -> EnqueueResult:
    """A job whose key outlives it (a `Unique` with a period): ``enqueue_unique``."""
    found = spec.uniqueness()
    assert found is not None
    params = {**_one_job(sql, spec, notify), "key": found.key, "period": found.period,
              "states": list(found.states)}  # fmt: skip
    later = spec.start_by is not None or spec.cost is not None  # columns the function predates
    async with own_transaction(conn) if later else contextlib.nullcontext():
        cur = await conn.execute(sql.enqueue_unique, params)
        row = await cur.fetchone()
        assert row is not None
        result = EnqueueResult(int(row[0]), duplicate=bool(row[1]))
        if spec.start_by is not None and not result.duplicate:
            await conn.execute(sql.set_start_by, {**params, "id": result.job_id})
        if spec.cost is not None and not result.duplicate:
            await conn.execute(sql.set_cost, {**params, "id": result.job_id})
    return result


async def debounced(
    conn: Conn, sql: Statements, spec: JobSpec, *, notify: bool, trace: str | None
) -> EnqueueResult:
    """A debounced job (``spec.debounce``): the key's job that has not started takes the
    args and a later run time (``duplicate``: it was there), or a new one is inserted."""
    found, debounce = spec.uniqueness(), spec.debounce
    assert found is not None and debounce is not None
    params = {**_one_job(sql, spec, notify), "key": found.key, "period": debounce.period,
              "max_wait": debounce.max_wait, "trace": trace}  # fmt: skip
    cur = await conn.execute(rendered(sql.schema, "debounce", traced=trace is not None), params)
    row = await cur.fetchone()
    assert row is not None
    return EnqueueResult(int(row[0]), duplicate=bool(row[1]))


async def _live_twins(conn: Conn, sql: Statements, keys: Sequence[str | None]) -> dict[str, int]:
    cur = await conn.execute(sql.live_twins, {"keys": list(keys)})
    return {key: job_id for key, job_id in await cur.fetchall()}


# -- many jobs ----------------------------------------------------------------------------------


async def many(
    conn: Conn, sql: Statements, specs: Sequence[JobSpec], *, notify: bool, trace: str | None
) -> list[EnqueueResult]:
    """Jobs of any kind, in one transaction; results in input order (see the module docs).
    The jobs with dependencies, and those with unique windows (in input order, so the first
    of two twins wins), go after the others."""
    kinds = _Kinds.of(specs)
    if not kinds.after and not kinds.windows:
        return await _plain(conn, sql, specs, notify, trace)
    results: dict[int, EnqueueResult] = {}
    async with own_transaction(conn):
        if kinds.rest:
            done = await _plain(conn, sql, [specs[i] for i in kinds.rest], notify, trace)
            results.update(zip(kinds.rest, done, strict=True))
        for i in kinds.windows:
            spec = specs[i]
            if spec.debounce is not None:
                results[i] = await debounced(conn, sql, spec, notify=notify, trace=trace)
            else:
                results[i] = await windowed(conn, sql, spec, notify=notify)
        if kinds.after:
            jobs = [GraphJob(spec=specs[i]) for i in kinds.after]
            ids = await graph(conn, sql, jobs, notify=notify, trace=trace)
            results.update(zip(kinds.after, map(EnqueueResult, ids), strict=True))
    return [results[i] for i in range(len(specs))]


@attrs.frozen
class _Kinds:
    """Positions of the jobs with dependencies, those with unique windows, and the rest."""

    after: list[int]
    windows: list[int]
    rest: list[int]

    @classmethod
    def of(cls, specs: Sequence[JobSpec]) -> _Kinds:
        kinds = cls([], [], [])
        for i, spec in enumerate(specs):
            found = spec.uniqueness()  # a job with dependencies has none
            if spec.after:
                kinds.after.append(i)
            elif (found is not None and found.windowed) or spec.debounce is not None:
                kinds.windows.append(i)
            else:
                kinds.rest.append(i)
        return kinds


async def _plain(
    conn: Conn, sql: Statements, specs: Sequence[JobSpec], notify: bool, trace: str | None
) -> list[EnqueueResult]:
    """Jobs without dependencies or unique windows: one statement when only their args
    differ, else their ids reserved, then COPY (no keys) or unnest (dedup or concurrency
    keys); conflicts answered with the live twins' ids."""
    keys = [spec.effective_dedup_key() for spec in specs]
    keyed = _keyed(specs, keys)
    if not keyed and _only_args_differ(specs):
        ids = await bulk(conn, sql, specs[0], _args_runs(specs), notify=notify, trace=trace)
        return [EnqueueResult(job_id) for job_id in ids]
    now, ids = await reserve_ids(conn, sql, len(specs))
    run_ats = [spec.run_at or now + spec.delay for spec in specs]
    start_bys = [spec.start_by_from(now, r) for spec, r in zip(specs, run_ats, strict=True)]
    if keyed:
        inserted = await _insert_unnest(conn, sql, specs, ids=ids, run_ats=run_ats, keys=keys,
                                        start_bys=start_bys, trace=trace)  # fmt: skip
    else:
        await _copy(conn, sql, specs, ids=ids, run_ats=run_ats, now=now, trace=trace)
        inserted = set(ids)
    results = await _with_twins(conn, sql, ids, inserted, keys)
    if notify:
        await _notify(conn, sql, notify_payloads(_inserted(specs, run_ats, ids, inserted), now))
    return results


def _keyed(specs: Sequence[JobSpec], keys: Sequence[str | None]) -> bool:
    """Whether any job has a dedup key, a concurrency key, a deadline to start or a cost
    (COPY does not write them)."""
    return any(keys) or any(spec.concurrency_key or spec.start_by is not None
                            or spec.cost is not None or spec.sequence_key is not None
                            for spec in specs)  # fmt: skip


def _inserted(
    specs: Sequence[JobSpec], run_ats: Sequence[dt.datetime], ids: Sequence[int],
    inserted: set[int],
) -> list[tuple[JobSpec, dt.datetime]]:  # fmt: skip
    """The specs that went in (not duplicates), each with its run time."""
    return [(s, r) for s, r, i in zip(specs, run_ats, ids, strict=True) if i in inserted]


async def _with_twins(
    conn: Conn, sql: Statements, ids: Sequence[int], inserted: set[int],
    keys: Sequence[str | None],
) -> list[EnqueueResult]:  # fmt: skip
    """The results of an insert of ``ids``: a job that was not inserted is a duplicate of
    its live twin."""
    missing = [i for i, job_id in enumerate(ids) if job_id not in inserted]
    twins = await _live_twins(conn, sql, [keys[i] for i in missing]) if missing else {}
    results = [EnqueueResult(job_id) for job_id in ids]
    for i in missing:
        twin = twins.get(keys[i] or "")
        if twin is None:
            raise RuntimeError(f"dedup key {keys[i]!r}: conflict with a job that finished")
        results[i] = EnqueueResult(twin, duplicate=True)
    return results


async def _insert_unnest(
    conn: Conn, sql: Statements, specs: Sequence[JobSpec], *, ids: Sequence[int],
    run_ats: Sequence[dt.datetime], keys: Sequence[str | None],
    start_bys: Sequence[dt.datetime | None], trace: str | None,
) -> set[int]:  # fmt: skip
    params = {
        "ids": list(ids),
        **columns(specs, queues="queue", tasks="task", args="args_json", priorities="priority",
                   max_attempts="stored_max_attempts", max_attempts_unset="max_attempts_unset",
                   concurrency_keys="concurrency_key"),
        "run_ats": list(run_ats),
        "dedup_keys": list(keys),
        "start_bys": list(start_bys),
        "costs": [spec.cost for spec in specs],
        "sequence_keys": [spec.sequence_key for spec in specs],
        "trace": trace,
    }  # fmt: skip
    cur = await conn.execute(statements(sql.schema, traced=trace is not None).insert_many, params)
    return {row[0] for row in await cur.fetchall()}


async def _copy(
    conn: Conn, sql: Statements, specs: Sequence[JobSpec], *, ids: Sequence[int],
    run_ats: Sequence[dt.datetime], now: dt.datetime, trace: str | None,
) -> None:  # fmt: skip
    """COPY in text format, rows built by hand: names are validated, args escaped."""
    # the trace context, as the last field of every row (JSON text, escaped like args)
    end = "\n" if trace is None else f"\t{_copy_escape(trace)}\n"
    stamps: dict[dt.datetime, str] = {}  # isoformat() once per distinct run_at
    lines = []
    for job_id, s, run_at in zip(ids, specs, run_ats, strict=True):
        stamp = stamps.get(run_at)
        if stamp is None:
            stamp = stamps[run_at] = run_at.isoformat()
        args = _copy_escape(s.args_json) if "\\" in s.args_json else s.args_json
        lines.append(
            f"{job_id}\t{s.queue}\t{s.task}\t{args}\t{s.priority}\t{stamp}\t"
            f"{'scheduled' if run_at > now else 'available'}\t{s.stored_max_attempts}\t"
            f"{'t' if s.max_attempts is None else 'f'}{end}"
        )
    copy_jobs = statements(sql.schema, traced=trace is not None).copy_jobs
    async with conn.cursor() as cur, cur.copy(copy_jobs) as copy:
        await copy.write("".join(lines).encode())


def _copy_escape(text: str) -> str:
    """Escape for COPY text format. JSON text has no raw control characters."""
    return text.replace("\\", "\\\\")


def _only_args_differ(specs: Sequence[JobSpec]) -> bool:
    """Whether all ``specs`` share the first one's fields but args (one bulk statement fits)."""
    f = specs[0]
    shared = (f.task, f.queue, f.priority, f.run_at, f.delay, f.max_attempts, f.start_by,
              f.cost, f.sequence_key)  # fmt: skip
    return all((s.task, s.queue, s.priority, s.run_at, s.delay, s.max_attempts, s.start_by,
                s.cost, s.sequence_key) == shared for s in specs)  # fmt: skip


def _args_runs(specs: Sequence[JobSpec]) -> list[tuple[int, str]]:
    """The specs' (already encoded) args as runs, like `encode_args_runs` returns them: up to
    `ENCODE_CHUNK` jobs per run, or one per run where that would make a run too long for one
    statement (``max_payload_bytes`` allows 1 MiB per job)."""
    runs: list[tuple[int, str]] = []
    for start in range(0, len(specs), ENCODE_CHUNK):
        texts = [spec.args_json for spec in specs[start : start + ENCODE_CHUNK]]
        if sum(map(len, texts)) <= _BULK_STATEMENT_CHARS:
            runs.append((len(texts), ",".join(texts)))
        else:
            runs.extend((1, text) for text in texts)
    return runs


# -- many alike ---------------------------------------------------------------------------------


async def bulk(
    conn: Conn, sql: Statements, spec: JobSpec, runs: Sequence[tuple[int, str]], *,
    notify: bool, trace: str | None,
) -> list[int]:  # fmt: skip
    """Jobs like ``spec`` with the args in ``runs`` (see `encode_args_runs`): their ids."""
    chunks = _bulk_statements(runs)
    ids: list[int] = []
    async with own_transaction(conn) if len(chunks) > 1 else contextlib.nullcontext():
        for jobs, text in chunks:
            ids += await _bulk_one(conn, sql, spec, jobs=jobs, args_array=text, notify=notify,
                                   trace=trace)  # fmt: skip
    return ids


async def _bulk_one(
    conn: Conn, sql: Statements, spec: JobSpec, *, jobs: int, args_array: str, notify: bool,
    trace: str | None,
) -> list[int]:  # fmt: skip
    params = {
        "jobs": f"{sql.schema}.jobs",
        "args": args_array,
        "queue": spec.queue,
        "task": spec.task,
        "priority": spec.priority,
        "run_at": spec.run_at,
        "delay": spec.delay,
        "max_attempts": spec.stored_max_attempts,
        "max_attempts_unset": spec.max_attempts_unset,
        "start_by_at": spec.start_by_at,
        "start_by_in": spec.start_by_in,
        "cost": spec.cost,
        "sequence_key": spec.sequence_key,
        "channel": sql.channel,
        "notify": notify,
        "trace": trace,
    }
    cur = await conn.execute(statements(sql.schema, traced=trace is not None).insert_bulk, params)
    row = await cur.fetchone()
    assert row is not None and row[0] == jobs, (row, jobs)
    if row[2] is not None:  # ids not consecutive (another session drew ids meanwhile)
        return list(row[2])
    return list(range(row[1] + 1, row[1] + 1 + jobs))


def _bulk_statements(runs: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
    """Runs of comma-separated JSON args grouped into statements: (jobs, JSON array text)."""
    grouped: list[tuple[int, str]] = []
    parts: list[str] = []
    jobs = chars = 0
    for n, text in runs:
        if parts and (jobs + n > _BULK_STATEMENT_JOBS or chars + len(text) > _BULK_STATEMENT_CHARS):
            grouped.append((jobs, f"[{','.join(parts)}]"))
            parts, jobs, chars = [], 0, 0
        parts.append(text)
        jobs += n
        chars += len(text)
    if parts:
        grouped.append((jobs, f"[{','.join(parts)}]"))
    return grouped


# -- a graph of jobs ----------------------------------------------------------------------------


async def graph(
    conn: Conn, sql: Statements, jobs: Sequence[GraphJob], *, notify: bool, trace: str | None
) -> list[int]:
    """Insert ``jobs`` and their edges; their ids, in order (`trioq._dependencies` has the
    steps). Jobs that wait notify nobody: the ending that frees them does."""
    if any(job.spec.sequence_key is not None for job in jobs):
        raise ValueError(SEQUENTIAL_ALONE)
    async with own_transaction(conn):
        ended = await _lock_existing(conn, sql, jobs, notify)
        now, ids = await reserve_ids(conn, sql, len(jobs))
        run_ats = [job.spec.run_at or now + job.spec.delay for job in jobs]
        start_bys = [j.spec.start_by_from(now, r) for j, r in zip(jobs, run_ats, strict=True)]
        await conn.execute(sql.insert_graph, _graph_rows(jobs, ids, run_ats, start_bys, trace))
        edges = _edges(jobs, ids)
        if edges:
            await conn.execute(sql.insert_edges, {"jobs": [e[0] for e in edges],
                                                  "depends_on": [e[1] for e in edges]})  # fmt: skip
        if ended:
            await _resolve_ended(conn, sql, ended, ids)
        if notify:
            free = [(j.spec, r) for j, r in zip(jobs, run_ats, strict=True) if not _waits(j)]
            await _notify(conn, sql, notify_payloads(free, now))
    return ids


def _waits(job: GraphJob) -> bool:
    return bool(job.waits_for or job.spec.after)


def _edges(jobs: Sequence[GraphJob], ids: Sequence[int]) -> list[tuple[int, int]]:
    """(job id, id of a job it waits for): positions in the graph, then existing ids."""
    inner = [(ids[i], ids[j]) for i, job in enumerate(jobs) for j in job.waits_for]
    return inner + [(ids[i], j) for i, job in enumerate(jobs) for j in job.spec.after]


async def _lock_existing(
    conn: Conn, sql: Statements, jobs: Sequence[GraphJob], notify: bool
) -> list[tuple[int, str, str | None, str | None]]:
    """Lock and flag the existing jobs the graph waits for; those that had ended already,
    as (id, outcome, task, detail). Raises `UnknownDependencyError` for ids that do not
    exist."""
    wanted = sorted({job_id for job in jobs for job_id in job.spec.after})
    if not wanted:
        return []
    cur = await conn.execute(sql.dependencies_lock, {"ids": wanted})
    rows = await cur.fetchall()
    unknown = [r[0] for r in rows if r[1] == "unknown"]
    if unknown:
        # A dependency moving to dead_jobs as we locked it: the lock waited for that
        # transaction, found the row gone, and the statement's snapshot (taken before the
        # death committed) did not see its dead row. A new statement does.
        cur = await conn.execute(sql.dependencies_lock, {"ids": unknown})
        again = {r[0]: r for r in await cur.fetchall()}
        rows = [again.get(r[0], r) for r in rows]
    _check_known(tuple(r[0] for r in rows if r[1] == "unknown"))
    flag = [r[0] for r in rows if r[1] != "dead" and not r[5]]  # no dependant yet
    if flag:
        await conn.execute(sql.dependencies_flag,
                           {"ids": flag, "channel": sql.channel, "notify": notify})  # fmt: skip
    return _ended(rows)


def _ended(rows: Sequence[tuple[Any, ...]]) -> list[tuple[int, str, str | None, str | None]]:
    """The locked dependencies that had ended: (id, outcome, task, detail)."""
    return [(r[0], _ENDED[r[1]], r[2], r[3]) for r in rows if r[1] in _ENDED]


def _check_known(unknown: tuple[int, ...]) -> None:
    if not unknown:
        return
    many = len(unknown) > 1
    shown = ", ".join(map(str, unknown[:10])) + (", ..." if len(unknown) > 10 else "")
    raise UnknownDependencyError(
        f"after lists {'jobs' if many else 'job'} {shown}, which "
        f"{'do' if many else 'does'} not exist: never enqueued, completed "
        "without keep_result=True (its row is gone), or pruned; enqueue a dependant "
        "before its dependency can end (in one transaction, or a trioq.Workflow)",
        job_ids=unknown,
    )


async def _resolve_ended(
    conn: Conn, sql: Statements, ended: list[tuple[int, str, str | None, str | None]],
    ids: list[int],
) -> None:  # fmt: skip
    ids_, outcomes, tasks, details = (list(column) for column in zip(*ended, strict=True))
    params = {"ids": ids_, "outcomes": outcomes, "tasks": tasks, "details": details,
              "batches": [None] * len(ended), "channel": sql.channel, "only": ids}  # fmt: skip
    await conn.execute(sql.resolve_ended, params)


def _graph_rows(
    jobs: Sequence[GraphJob], ids: list[int], run_ats: list[dt.datetime],
    start_bys: list[dt.datetime | None], trace: str | None,
) -> dict[str, Any]:  # fmt: skip
    depended: set[int] = {j for job in jobs for j in job.waits_for}
    specs = [job.spec for job in jobs]
    return {
        "ids": ids,
        **columns(specs, queues="queue", tasks="task", args="args_json", priorities="priority",
                   max_attempts="stored_max_attempts", max_attempts_unset="max_attempts_unset",
                   concurrency_keys="concurrency_key", policies="on_dependency_failure"),
        **columns(jobs, batches="batch_id"),
        "run_ats": run_ats,
        "start_bys": start_bys,
        "costs": [spec.cost for spec in specs],
        "dependants": [i in depended for i in range(len(jobs))],
        "waits": [len(job.waits_for) + len(job.spec.after) for job in jobs],
        "trace": trace,  # the enqueuing span's context, as every enqueue stores it
    }  # fmt: skip
