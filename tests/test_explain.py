"""Query plans of the hot statements on a big table: no sequential scan on jobs.

The database gets a realistic weight before anything is explained: 1,000,000 available jobs
in other queues, 1,000,000 finished rows (``done`` / ``cancelled``, many of them in the target
queue, so the planner sees it as a busy queue), 1,000 running and 10,000 scheduled jobs,
1,000,000 dead jobs, and a handful of available jobs in the target queue, enqueued through
`Queue.enqueue_many`.

The fill is server side (``INSERT ... SELECT FROM generate_series``). To keep it fast on a
small machine the non-unique indexes are dropped first and rebuilt afterwards from their own
``pg_get_indexdef`` text (a sorted build is several times cheaper than a million b-tree
insertions); the test asserts the rebuilt definitions are byte for byte the migration's.

Each statement is explained twice, with the parameter values a worker sends:

* custom plan: the statement with its values bound client side (``psycopg.AsyncClientCursor``),
  which is what the planner sees for the first executions of a prepared statement;
* generic plan: ``PREPARE`` with the parameter types psycopg sends (``unknown`` for str,
  ``int2`` for a small int, ``interval`` for a timedelta), then ``EXPLAIN EXECUTE`` under
  ``plan_cache_mode = force_generic_plan``. psycopg prepares a statement after 5 executions
  (``prepare_threshold``) and the server may switch to the generic plan after 5 more, so a
  long-running worker mostly runs this one.

The statements inside ``claim_limited`` (a plpgsql function, flow control) are explained by
``auto_explain`` as they run, seven times so plpgsql's generic plans are among them.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
import pytest
from bigtable import Step, chunks, run_all
from psycopg import sql
from psycopg.adapt import PyFormat, Transformer

import trioq
from trioq import JobSpec, Queue
from trioq._db.sql.lists import WINDOW as LIST_WINDOW
from trioq._db.sql.status import DEPTH_CAP
from trioq._db.sql.status import MAX_DEPTH_QUEUES as MAX_QUEUES
from trioq._db.statements import statements

pytestmark = pytest.mark.slow

N_AVAILABLE = 1_000_000  # available (due) jobs in other queues
N_SCHEDULED = 10_000  # future jobs in other queues
N_FINISHED = 1_000_000  # done / cancelled rows, 1 in 5 of them in the target queue
N_RUNNING = 1_000  # running jobs in other queues, half with an expired lease
N_DEAD = 1_000_000  # rows of dead_jobs
N_TARGET = 5  # available jobs in the target queue
OTHER_QUEUES = 20
TARGET = "target"
OWNER = "worker-1:4242:0"
LEASE = dt.timedelta(seconds=30)
FILL_CHUNKS = 2  # parallel connections per big insert (the test machine has 2 cores)

SQL = statements("trioq")

# Non-unique secondary indexes (claim, lease, scheduled, dead_jobs queue...): dropped before
# the fill, rebuilt after it. Primary keys and unique indexes stay.
SECONDARY_INDEXES = """
SELECT c.relname
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'trioq' AND NOT i.indisunique ORDER BY 1
"""

FILL_AVAILABLE = """
INSERT INTO trioq.jobs (id, queue, task, args, state, priority, run_at, attempt, max_attempts,
                        enqueued_at)
SELECT g, 'queue_' || (g %% {queues}), 'task_' || (g %% 13), jsonb_build_object('user_id', g),
       'available', (g %% 3) - 1, now() - interval '2 hours' + (g %% 7200) * interval '1 second',
       0, 25, now() - interval '3 hours'
  FROM generate_series(%(lo)s::int8, %(hi)s::int8) AS g
"""

FILL_SCHEDULED = """
INSERT INTO trioq.jobs (id, queue, task, state, run_at, max_attempts, enqueued_at)
SELECT g, 'queue_' || (g %% {queues}), 'task_' || (g %% 13), 'scheduled',
       now() + (g %% 86400) * interval '1 second', 25, now()
  FROM generate_series(%(lo)s::int8, %(hi)s::int8) AS g
"""

FILL_FINISHED = """
INSERT INTO trioq.jobs (id, queue, task, args, state, priority, run_at, attempt, max_attempts,
                        result, enqueued_at, finished_at)
SELECT g, CASE WHEN g %% 5 = 0 THEN '{target}' ELSE 'queue_' || (g %% {queues}) END,
       'task_' || (g %% 13), jsonb_build_object('user_id', g),
       CASE WHEN g %% 10 = 0 THEN 'cancelled' ELSE 'done' END, 0,
       now() - interval '1 day' + (g %% 86400) * interval '1 second',
       1 + (g %% 3), 25, CASE WHEN g %% 2 = 0 THEN '{{"ok": true}}'::jsonb END,
       now() - interval '2 days', now() - interval '1 hour'
  FROM generate_series(%(lo)s::int8, %(hi)s::int8) AS g
"""

FILL_RUNNING = """
INSERT INTO trioq.jobs (id, queue, task, state, run_at, attempt, max_attempts, lease_owner,
                        lease_expires_at, enqueued_at)
SELECT g, 'queue_' || (g %% {queues}), 'task_' || (g %% 13), 'running', now(), 1, 25,
       'worker-' || (g %% 8), now() + CASE WHEN g %% 2 = 0 THEN interval '-1 minute'
                                           ELSE interval '1 minute' END, now()
  FROM generate_series(%(lo)s::int8, %(hi)s::int8) AS g
"""

FILL_DEAD = """
INSERT INTO trioq.dead_jobs (id, queue, task, args, priority, attempt, max_attempts, reason,
                             last_error, traceback, enqueued_at, died_at)
SELECT g, CASE WHEN g %% 5 = 0 THEN '{target}' ELSE 'queue_' || (g %% {queues}) END,
       'task_' || (g %% 13), jsonb_build_object('user_id', g), 0, 25, 25,
       'attempts exhausted', 'RuntimeError: boom', 'Traceback (most recent call last): ...',
       now() - interval '30 days', now() - interval '30 days' + (g %% 2592000) * interval '1 s'
  FROM generate_series(%(lo)s::int8, %(hi)s::int8) AS g
"""

INDEX_DEFS = """
SELECT c.relname, pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'trioq' ORDER BY 1
"""


# -- the fill ----------------------------------------------------------------------------------


async def _fill(dsn: str, conn: Any) -> dict[str, float]:
    """Fill the tables; returns the timings (seconds) of each step."""
    timings: dict[str, float] = {}
    t_all = time.perf_counter()
    cur = await conn.execute(INDEX_DEFS)
    defs_before = dict(await cur.fetchall())
    cur = await conn.execute(SECONDARY_INDEXES)
    rebuilt = [name for (name,) in await cur.fetchall()]
    assert "jobs_claim_idx" in rebuilt and "jobs_lease_idx" in rebuilt
    for name in rebuilt:
        await conn.execute(sql.SQL("DROP INDEX trioq.{}").format(sql.Identifier(name)))

    fmt = {"queues": OTHER_QUEUES, "target": TARGET}
    fills: list[Step] = []
    ranges = {
        "available": (FILL_AVAILABLE, 1, N_AVAILABLE),
        "finished": (FILL_FINISHED, N_AVAILABLE + 1, N_FINISHED),
        "dead": (FILL_DEAD, 10 * N_AVAILABLE + 1, N_DEAD),
    }
    for label, (statement, lo, n) in ranges.items():
        for a, b in chunks(lo, n, FILL_CHUNKS):
            fills.append((f"insert {label}", statement.format(**fmt), {"lo": a, "hi": b}))
    lo = N_AVAILABLE + N_FINISHED + 1
    for label, statement, n in (
        ("insert running", FILL_RUNNING, N_RUNNING),
        ("insert scheduled", FILL_SCHEDULED, N_SCHEDULED),
    ):
        fills.append((label, statement.format(**fmt), {"lo": lo, "hi": lo + n - 1}))
        lo += n
    t0 = time.perf_counter()
    timings.update(await run_all(dsn, fills))
    timings["inserts (parallel, wall)"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    rebuild: list[Step] = [(f"index {name}", defs_before[name], None) for name in rebuilt]
    timings.update(await run_all(dsn, rebuild))
    timings["index rebuilds (parallel, wall)"] = time.perf_counter() - t0
    cur = await conn.execute(INDEX_DEFS)
    assert dict(await cur.fetchall()) == defs_before  # the migration's indexes, exactly

    await conn.execute(
        "SELECT setval(pg_get_serial_sequence('trioq.jobs', 'id'), max(id)) FROM trioq.jobs"
    )
    t0 = time.perf_counter()
    specs = [JobSpec(task="send_email", args={"user_id": i}, queue=TARGET) for i in range(N_TARGET)]
    await Queue().enqueue_many(conn, specs, notify=False)
    timings["enqueue target jobs"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    await conn.execute("ANALYZE trioq.jobs, trioq.dead_jobs")
    timings["analyze"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_all
    return timings


# -- plans -------------------------------------------------------------------------------------


def _nodes(plan: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def _describe(plan: Mapping[str, Any], depth: int = 0) -> Iterator[str]:
    """An indented one-line-per-node rendering, for failure messages and the printout."""
    parts = [plan["Node Type"]]
    if "Index Name" in plan:
        parts.append(f"using {plan['Index Name']}")
    if "Relation Name" in plan:
        parts.append(f"on {plan['Relation Name']} {plan.get('Alias', '')}".rstrip())
    rows = f"(rows={plan.get('Plan Rows')}"
    if "Actual Rows" in plan:
        rows += f" actual={plan['Actual Rows']} time={plan['Actual Total Time']}ms"
    parts.append(rows + ")")
    for key in ("Index Cond", "Filter"):
        if key in plan:
            parts.append(f"{key}: {plan[key]}")
    yield "  " * depth + "-> " + " ".join(parts)
    for child in plan.get("Plans", ()):
        yield from _describe(child, depth + 1)


def _render(plan: Mapping[str, Any]) -> str:
    return "\n".join(_describe(plan))


def _assert_uses(plan: Mapping[str, Any], index: str, scan_types: tuple[str, ...]) -> None:
    text = _render(plan)
    nodes = list(_nodes(plan))
    seq = [n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs"]
    assert not seq, f"sequential scan on jobs:\n{text}"
    used = [n["Node Type"] for n in nodes if n.get("Index Name") == index]
    assert used, f"{index} not used:\n{text}"
    assert set(used) <= set(scan_types), f"{index} used as {used}, expected {scan_types}:\n{text}"


async def _custom_plan(conn: Any, statement: sql.Composed, params: Mapping[str, Any]) -> Any:
    """EXPLAIN with the values bound client side, as literals."""
    cur = psycopg.AsyncClientCursor(conn)
    await cur.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + statement, params)
    row = await cur.fetchone()
    assert row is not None
    return row[0][0]["Plan"]


_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


async def _generic_plan(
    conn: Any, name: str, statement: sql.Composed, params: Mapping[str, Any]
) -> Any:
    """PREPARE with the types psycopg would send, then EXPLAIN EXECUTE the generic plan."""
    text = statement.as_string(conn)
    order: list[str] = []
    for found in _PLACEHOLDER.findall(text):
        if found not in order:
            order.append(found)
    positional = _PLACEHOLDER.sub(lambda m: f"${order.index(m[1]) + 1}", text)
    assert "%" not in positional.replace("%%", "")
    values = [params[key] for key in order]
    tx = Transformer(conn)
    tx.dump_sequence(values, [PyFormat.AUTO] * len(values))
    types = []
    for oid in tx.types or ():
        cur = await conn.execute("SELECT %s::regtype::text", (oid,))
        types.append("unknown" if oid == 0 else (await cur.fetchone())[0])
    prepare = f"PREPARE {name} ({', '.join(types)}) AS {positional.replace('%%', '%')}"
    await conn.execute(prepare)
    cur = psycopg.AsyncClientCursor(conn)
    marks = ", ".join(["%s"] * len(values))
    await cur.execute(f"EXPLAIN (FORMAT JSON) EXECUTE {name} ({marks})", values)
    row = await cur.fetchone()
    assert row is not None
    return row[0][0]["Plan"]


async def _both_plans(
    conn: Any, name: str, statement: sql.Composed, params: Mapping[str, Any]
) -> dict[str, Any]:
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    try:
        generic = await _generic_plan(conn, name, statement, params)
    finally:
        await conn.execute("RESET plan_cache_mode")
    return {"custom": await _custom_plan(conn, statement, params), "generic": generic}


async def _assert_the_poll_probes_each_queue(conn: Any) -> None:
    """The poll of a worker's queues probes each queue's work through the claim's index,
    from the queue's name, and stops at the first job: never one scan of every queue's due
    jobs (a hashed subplan over the whole index: an EXISTS did that), nor a sequential scan
    until a first match (a LIMIT without the claim's order did that)."""
    served = [TARGET, *(f"queue_{i}" for i in range(5)), "no_such_queue"]
    poll = await _both_plans(conn, "trioq_poll", SQL.queue_poll, {"names": served})
    for kind, plan in poll.items():
        print(f"\npoll, {kind} plan:\n{_render(plan)}")
        _assert_uses(plan, "jobs_claim_idx", ("Index Scan", "Index Only Scan"))
        for node in _nodes(plan):
            if node.get("Index Name") == "jobs_claim_idx":
                assert "queue = n.queue" in node.get("Index Cond", ""), _render(plan)
                assert node.get("Parent Relationship") != "SubPlan", _render(plan)
    cur = await conn.execute(SQL.queue_poll, {"names": served})
    assert [(r[0], r[11]) for r in await cur.fetchall()] == sorted(
        [(name, name != "no_such_queue") for name in served]
    )


async def _analyzed_claim(conn: Any, params: Mapping[str, Any]) -> Any:
    """EXPLAIN (ANALYZE, BUFFERS) of a real claim, rolled back."""
    cur = psycopg.AsyncClientCursor(conn)
    await conn.set_autocommit(False)
    try:
        await cur.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + SQL.claim, params)
        row = await cur.fetchone()
        assert row is not None
        return row[0][0]
    finally:
        await conn.rollback()
        await conn.set_autocommit(True)


async def test_hot_statements_use_their_indexes_on_a_big_table(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        timings = await _fill(dsn, conn)
        print("\nfill timings (s):")
        for label, seconds in timings.items():
            print(f"  {label:34} {seconds:7.2f}")
        cur = await conn.execute("SELECT state, count(*) FROM trioq.jobs GROUP BY 1 ORDER BY 1")
        counts = dict(await cur.fetchall())
        assert counts == {
            "available": N_AVAILABLE + N_TARGET,
            "cancelled": N_FINISHED // 10,
            "done": N_FINISHED - N_FINISHED // 10,
            "running": N_RUNNING,
            "scheduled": N_SCHEDULED,
        }

        claim_params = {"queue": TARGET, "owner": OWNER, "limit": 10, "lease": LEASE}
        claim = await _both_plans(conn, "trioq_claim", SQL.claim, claim_params)
        for kind, plan in claim.items():
            print(f"\nclaim, {kind} plan:\n{_render(plan)}")
            _assert_uses(plan, "jobs_claim_idx", ("Index Scan", "Index Only Scan"))
            assert not [n for n in _nodes(plan) if n["Node Type"] == "Sort"], _render(plan)

        # Weighted slots: the claim that counts units in SQL sorts only its own batch (the
        # window over the CTE), never the jobs it scans.
        weighted = await _both_plans(conn, "trioq_claim_w", SQL.claim_weighted, claim_params)
        for kind, plan in weighted.items():
            print(f"\nweighted claim, {kind} plan:\n{_render(plan)}")
            _assert_uses(plan, "jobs_claim_idx", ("Index Scan", "Index Only Scan"))
            for node in _nodes(plan):
                if node["Node Type"] == "Sort":
                    assert [n["Node Type"] for n in _nodes(node)][1:] == ["CTE Scan"], (
                        _render(plan))

        await _assert_the_poll_probes_each_queue(conn)
        analyzed = await _analyzed_claim(conn, claim_params)
        plan = analyzed["Plan"]
        print(f"\nclaim, EXPLAIN ANALYZE (rolled back), {analyzed['Execution Time']:.3f} ms:")
        print(_render(plan))
        _assert_uses(plan, "jobs_claim_idx", ("Index Scan", "Index Only Scan"))
        assert plan["Actual Rows"] == N_TARGET
        buffers = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
        assert buffers < 200, f"the claim touched {buffers} buffers"

        outcomes = {"dead_reason": "r", "lost_error": "e"}
        sweep = await _both_plans(conn, "trioq_sweep", SQL.sweep, {"limit": 1000, **outcomes})
        for kind, plan in sweep.items():
            print(f"\nsweep, {kind} plan:\n{_render(plan)}")
            _assert_uses(
                plan, "jobs_lease_idx", ("Index Scan", "Index Only Scan", "Bitmap Index Scan")
            )

        # a dead worker (stale, suspected, nobody holds its lock) owning some running jobs
        await conn.execute(
            "INSERT INTO trioq.workers (name, host, pid, queues, seen_at, suspected_at)"
            " VALUES (%s, 'h', 1, '{}', now() - interval '1 hour', now() - interval '1 hour')",
            (OWNER,),
        )  # fmt: skip
        await conn.execute("ANALYZE trioq.workers")
        reclaim_params = {"grace": dt.timedelta(seconds=2), "space": SQL.lock_space,
                          "restart_grace": dt.timedelta(seconds=5), **outcomes}  # fmt: skip
        reclaim = await _both_plans(conn, "trioq_reclaim", SQL.reclaim, reclaim_params)
        for kind, plan in reclaim.items():
            print(f"\nreclaim, {kind} plan:\n{_render(plan)}")
            _assert_uses(
                plan, "jobs_lease_idx", ("Index Scan", "Index Only Scan", "Bitmap Index Scan")
            )

        ids = list(range(N_AVAILABLE + 1, N_AVAILABLE + 11))
        complete_params = {"ids": ids, "attempts": [1] * len(ids), "owner": OWNER}
        complete = await _both_plans(conn, "trioq_complete", SQL.complete, complete_params)
        for kind, plan in complete.items():
            print(f"\ncomplete, {kind} plan:\n{_render(plan)}")
            _assert_uses(plan, "jobs_pkey", ("Index Scan", "Index Only Scan"))

        # The pruner (retention): the oldest finished rows, in a bounded batch.
        prune_params = {"age": dt.timedelta(minutes=30), "limit": 1000}
        for name, statement, index in (
            ("prune_done", SQL.prune_done, "jobs_finished_idx"),
            ("prune_cancelled", SQL.prune_cancelled, "jobs_finished_idx"),
            ("prune_dead", SQL.prune_dead, "dead_jobs_died_idx"),
        ):
            for kind, plan in (await _both_plans(conn, name, statement, prune_params)).items():
                print(f"\n{name}, {kind} plan:\n{_render(plan)}")
                _assert_uses(plan, index, ("Index Scan", "Index Only Scan"))

        await _observability_statements(conn)
        await _check_limited_claim(conn)  # last: it changes the target queue's jobs


async def _analyzed(conn: Any, statement: sql.Composed, params: Mapping[str, Any]) -> Any:
    """EXPLAIN (ANALYZE, BUFFERS) of a read-only statement."""
    cur = psycopg.AsyncClientCursor(conn)
    await cur.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + statement, params)
    row = await cur.fetchone()
    assert row is not None
    return row[0][0]


def _assert_no_seq_scan(plan: Mapping[str, Any]) -> None:
    seq = [n for n in _nodes(plan) if n["Node Type"] == "Seq Scan"
           and n.get("Relation Name") in ("jobs", "dead_jobs")]  # fmt: skip
    assert not seq, f"sequential scan:\n{_render(plan)}"


async def _observability_statements(conn: Any) -> None:
    """The metrics' depth sample and `trioq jobs list` (``trioq/_db/sql/status.py``, ``lists.py``):
    indexes only, and the depth sample's cost on this table (printed: docs/observability.md
    quotes it)."""
    st = statements("trioq")
    depth = {"depth_available": st.depth_available, "depth_dead": st.depth_dead,
             "depth_scheduled_running": st.depth_scheduled_running,
             "depth_waiting": st.depth_waiting}  # fmt: skip
    for cap in (DEPTH_CAP, 10 * DEPTH_CAP):  # the default, and ten times it
        total = 0.0
        for name, statement in depth.items():
            analyzed = await _analyzed(conn, statement, {"cap": cap, "max_queues": MAX_QUEUES})
            total += analyzed["Execution Time"]
            plan = analyzed["Plan"]
            print(f"\n{name}, cap {cap}, EXPLAIN ANALYZE, {analyzed['Execution Time']:.1f} ms:"
                  f"\n{_render(plan)}")  # fmt: skip
            _assert_no_seq_scan(plan)
            if name != "depth_scheduled_running":  # the counts stop at the cap: no sort, no
                kinds = {n["Node Type"] for n in _nodes(plan)}  # bitmap of a whole queue
                assert not kinds & {"Sort", "Bitmap Heap Scan"}, _render(plan)
        print(f"\nthe depth sample (4 statements, cap {cap}): {total:.1f} ms")
    # `trioq status`'s leases: through the lease index, not the whole table.
    leases = await _analyzed(conn, statements("trioq").status_leases, {})
    _assert_no_seq_scan(leases["Plan"])
    filters: list[dict[str, str | None]] = [
        {"queue": None, "task": None}, {"queue": TARGET, "task": None},
        {"queue": None, "task": "task_3"},
    ]  # fmt: skip
    for state, statement in st.job_lists.items():
        for where in filters:
            list_params = {**where, "contains": None, "text": None, "window": LIST_WINDOW,
                           "limit": 50, "offset": 0}  # what `trioq jobs list` sends
            analyzed = await _analyzed(conn, statement, list_params)
            _assert_no_seq_scan(analyzed["Plan"])
            assert analyzed["Execution Time"] < 2000, (state, where, _render(analyzed["Plan"]))


async def _nested_plans(conn: Any, statement: sql.Composed, params: Mapping[str, Any],
                        times: int) -> list[tuple[str, Any]]:  # fmt: skip
    """(query text, plan) of every statement run inside ``statement`` (a plpgsql function),
    from ``auto_explain``; each run is rolled back. After 5 runs plpgsql may switch a
    statement to its generic plan: ``times`` > 5 sees both."""
    messages: list[str] = []
    conn.add_notice_handler(lambda d: messages.append(d.message_primary or ""))
    for setting in (
        "LOAD 'auto_explain'",
        "SET auto_explain.log_min_duration = 0",
        "SET auto_explain.log_nested_statements = on",
        "SET auto_explain.log_format = json",
        "SET client_min_messages = log",
    ):
        await conn.execute(setting)
    try:
        for _ in range(times):
            await conn.execute("BEGIN")
            await conn.execute(statement, params)
            await conn.execute("ROLLBACK")
    finally:
        await conn.execute("SET client_min_messages = notice")
    plans = []
    for message in messages:
        if "plan:" in message:
            found = json.loads(message.split("plan:", 1)[1])
            plans.append((found["Query Text"], found["Plan"]))
    return plans


async def _check_limited_claim(conn: Any) -> None:
    """claim_limited with every limit set (global, rate, per-key both), on the big table:
    no statement inside it scans jobs sequentially."""
    await conn.execute("UPDATE trioq.jobs SET concurrency_key = 'k' || (id %% 3)"
                       " WHERE queue = %s", (TARGET,))  # fmt: skip
    await Queue().set_limits(conn, TARGET, global_concurrency=100, rate_limit="1000/1m",
                             key_concurrency=5, key_rate_limit="100/1m")  # fmt: skip
    params = {"queue": TARGET, "owner": OWNER, "limit": 10, "lease": LEASE}
    plans = await _nested_plans(conn, SQL.claim_limited, params, times=7)
    on_jobs = [(q, p) for q, p in plans if "jobs" in q and "claim_limited" not in q]
    assert len(on_jobs) >= 7 * 4, [q for q, _ in plans]
    for text, plan in on_jobs:
        nodes = list(_nodes(plan))
        seq = [n for n in nodes if n["Node Type"] == "Seq Scan"
               and n.get("Relation Name") == "jobs"]  # fmt: skip
        assert not seq, f"sequential scan on jobs in:\n{text}\n{_render(plan)}"
    print("\nclaim_limited, its statements on jobs:")
    for text, plan in on_jobs[-5:]:
        print(f"  {' '.join(text.split())[:90]}\n{_render(plan)}")


async def test_complete_uses_pkey_when_statistics_saw_no_running_job(dsn: str) -> None:
    """Statistics taken while the queue was idle, then a burst: 3,000 jobs running.

    Regression test: with jobs_lease_idx partial on ``state = 'running'`` the fenced
    writes matched its predicate and the planner scanned every running job.
    """
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        await conn.execute(
            "INSERT INTO trioq.jobs (queue, task, run_at)"
            " SELECT 'q', 't', now() - interval '1 s' FROM generate_series(1, 20000)"
        )
        await conn.execute("VACUUM ANALYZE trioq.jobs")  # no job is running yet
        jobs = await Queue().claim(conn, "q", owner=OWNER, limit=3000, lease=LEASE)
        assert len(jobs) == 3000
        params = {"ids": [j.id for j in jobs[:10]], "attempts": [1] * 10, "owner": OWNER}
        plans = await _both_plans(conn, "trioq_complete", SQL.complete, params)
        for kind, plan in plans.items():
            print(f"\ncomplete after a burst, {kind} plan:\n{_render(plan)}")
        for plan in plans.values():
            _assert_uses(plan, "jobs_pkey", ("Index Scan", "Index Only Scan"))
