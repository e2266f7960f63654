"""A big, realistic trioq database, filled fast: for query plans and page timings.

`fill` writes, server side (``INSERT ... SELECT FROM generate_series``, several
connections at once): available jobs spread over `Sizes.queues` queues, finished rows
(done with a result, cancelled), running jobs with worker-shaped lease owners
(``host:pid:random``, some expired), scheduled jobs, dead jobs with tracebacks, a week of
per-minute history for `Sizes.history_pairs` (queue, task) pairs, and cron ticks. As in
``tests/test_explain.py`` the non-unique indexes are dropped first and rebuilt from their
own definitions afterwards (a sorted build is several times cheaper than a million b-tree
insertions), then everything is analyzed. Used by ``tests/test_web_explain.py`` and
``bench/bench_web.py``; `chunks` and `run_all` by ``tests/test_explain.py`` too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import trio
from psycopg import sql

import trioq

__all__ = ["Sizes", "Step", "chunks", "fill", "run_all"]


@attrs.frozen(kw_only=True)
class Sizes:
    available: int = 600_000
    finished: int = 300_000  # done and cancelled (1 in 4), in the jobs table
    scheduled: int = 10_000
    running: int = 1_000
    dead: int = 300_000
    queues: int = 20
    workers: int = 8  # lease owners of the running jobs (half of them expired)
    history_pairs: int = 10  # (queue, task) pairs with a week of per-minute history
    history_days: int = 7
    parts: int = 2  # connections per big insert (the machine has 2 cores)

    @property
    def jobs(self) -> int:
        return self.available + self.finished + self.scheduled + self.running


_SECONDARY_INDEXES = """
SELECT c.relname, pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'trioq' AND NOT i.indisunique ORDER BY 1
"""

_AVAILABLE = """
INSERT INTO trioq.jobs (id, queue, task, args, state, priority, run_at, attempt, max_attempts,
                        enqueued_at)
SELECT g, 'queue_' || (g %% %(queues)s), 'task_' || (g %% 13),
       jsonb_build_object('user_id', g, 'email', 'user' || g || '@example.com'),
       'available', (g %% 3) - 1, now() - interval '2 hours' + (g %% 7200) * interval '1 s',
       0, 25, now() - interval '3 hours'
  FROM generate_series(%(lo)s::int8, %(hi)s::int8) AS g
"""

_FINISHED = """
INSERT INTO trioq.jobs (id, queue, task, args, state, run_at, attempt, max_attempts, result,
                        enqueued_at, finished_at)
SELECT g, 'queue_' || (g %% %(queues)s), 'task_' || (g %% 13), jsonb_build_object('user_id', g),
       CASE WHEN g %% 4 = 0 THEN 'cancelled' ELSE 'done' END,
       now() - interval '1 day' + (g %% 86400) * interval '1 s', 1, 25,
       CASE WHEN g %% 4 <> 0 THEN '{"ok": true}'::jsonb END,
       now() - interval '2 days', now() - (g %% 86400) * interval '1 s'
  FROM generate_series(%(lo)s::int8, %(hi)s::int8) AS g
"""

_SCHEDULED = """
INSERT INTO trioq.jobs (id, queue, task, state, run_at, max_attempts, enqueued_at)
SELECT g, 'queue_' || (g %% %(queues)s), 'task_' || (g %% 13), 'scheduled',
       now() + (g %% 86400) * interval '1 s', 25, now()
  FROM generate_series(%(lo)s::int8, %(hi)s::int8) AS g
"""

_RUNNING = """
INSERT INTO trioq.jobs (id, queue, task, state, run_at, attempt, max_attempts, lease_owner,
                        lease_expires_at, enqueued_at)
SELECT g, 'queue_' || (g %% %(queues)s), 'task_' || (g %% 13), 'running', now(), 1, 25,
       'host-' || (g %% %(workers)s) || ':' || (1000 + g %% %(workers)s) || ':a1b2c3d4',
       now() + CASE WHEN g %% %(workers)s %% 2 = 0 THEN interval '-1 minute'
                    ELSE interval '1 minute' END, now()
  FROM generate_series(%(lo)s::int8, %(hi)s::int8) AS g
"""

_DEAD = """
INSERT INTO trioq.dead_jobs (id, queue, task, args, priority, attempt, max_attempts, reason,
                             last_error, traceback, enqueued_at, died_at)
SELECT g, 'queue_' || (g %% %(queues)s), 'task_' || (g %% 13), jsonb_build_object('user_id', g),
       0, 25, 25, 'attempts exhausted', 'RuntimeError: boom ' || g,
       'Traceback (most recent call last):\n  File "app.py", line 1, in run\nRuntimeError: boom',
       now() - interval '30 days', now() - (g %% 2592000) * interval '1 s'
  FROM generate_series(%(lo)s::int8, %(hi)s::int8) AS g
"""

# A week of minutes for each pair: counts that vary, histograms with a few buckets filled.
_HISTORY = """
INSERT INTO trioq.job_history (minute, queue, task, completed, retried, dead, cancelled, runs,
                               exec_us_sum, exec_us_max, exec_hist, wait_us_sum, wait_us_max,
                               wait_hist)
SELECT date_trunc('minute', now()) - m * interval '1 minute', 'queue_' || p, 'task_' || p,
       100 + (m + p) %% 50, (m * 7 + p) %% 5, (m + p) %% 97 / 96, (m + p) %% 31 / 30,
       100 + (m + p) %% 50, 2500000, 90000,
       array_fill(0::int8, ARRAY[4]) || ARRAY[10, 60, 25, 5]::int8[]
           || array_fill(0::int8, ARRAY[16]),
       800000, 40000,
       array_fill(0::int8, ARRAY[2]) || ARRAY[30, 50, 15, 5]::int8[]
           || array_fill(0::int8, ARRAY[18])
  FROM generate_series(0, %(minutes)s - 1) AS m, generate_series(0, %(pairs)s - 1) AS p
"""

_TICKS = """
INSERT INTO trioq.cron_ticks (name, tick, job_id, fired_at)
SELECT 'entry_' || e, date_trunc('minute', now()) - m * interval '1 minute', 1 + e * 1440 + m,
       now() - m * interval '1 minute'
  FROM generate_series(0, 9) AS e, generate_series(0, 1439) AS m
"""


def chunks(lo: int, n: int, parts: int) -> Iterator[tuple[int, int]]:
    """``[lo, lo + n)`` in ``parts`` inclusive ranges, for parallel inserts."""
    step = max(1, -(-n // parts))
    for start in range(lo, lo + n, step):
        yield start, min(start + step - 1, lo + n - 1)


Step = tuple[str, Any, Mapping[str, Any] | None]


async def run_all(dsn: str, steps: list[Step]) -> dict[str, float]:
    """Run every ``(label, statement, params)`` on a connection of its own, all at once."""
    took: dict[str, float] = {}

    async def run(label: str, statement: Any, params: Mapping[str, Any] | None) -> None:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            await conn.execute("SET maintenance_work_mem = '256MB'")
            t0 = time.perf_counter()
            await conn.execute(statement, params)
            took[label] = max(took.get(label, 0.0), time.perf_counter() - t0)

    async with trio.open_nursery() as nursery:
        for label, statement, params in steps:
            nursery.start_soon(run, label, statement, params)
    return took


async def fill(dsn: str, sizes: Sizes = Sizes()) -> dict[str, float]:
    """Fill a freshly migrated database (schema ``trioq``); the seconds each step took."""
    timings: dict[str, float] = {}
    t_all = time.perf_counter()
    async with await trioq.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(_SECONDARY_INDEXES)
        indexes = dict(await cur.fetchall())
        for name in indexes:
            await conn.execute(sql.SQL("DROP INDEX trioq.{}").format(sql.Identifier(name)))
    common = {"queues": sizes.queues, "workers": sizes.workers}
    steps: list[Step] = []
    lo = 1
    for label, statement, n in (
        ("available", _AVAILABLE, sizes.available),
        ("finished", _FINISHED, sizes.finished),
        ("scheduled", _SCHEDULED, sizes.scheduled),
        ("running", _RUNNING, sizes.running),
    ):
        for a, b in chunks(lo, n, sizes.parts):
            steps.append((f"insert {label}", statement, {**common, "lo": a, "hi": b}))
        lo += n
    for a, b in chunks(lo, sizes.dead, sizes.parts):  # ids after the jobs', as in real life
        steps.append(("insert dead", _DEAD, {**common, "lo": a, "hi": b}))
    minutes = sizes.history_days * 1440
    steps.append(("insert history", _HISTORY, {"minutes": minutes, "pairs": sizes.history_pairs}))
    steps.append(("insert cron ticks", _TICKS, None))
    t0 = time.perf_counter()
    timings.update(await run_all(dsn, steps))
    timings["inserts (parallel, wall)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    timings.update(await run_all(dsn, [(f"index {n}", d, None) for n, d in indexes.items()]))
    timings["index rebuilds (parallel, wall)"] = time.perf_counter() - t0
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "SELECT setval(pg_get_serial_sequence('trioq.jobs', 'id'), %s)", (lo + sizes.dead,)
        )
        t0 = time.perf_counter()
        await conn.execute("ANALYZE trioq.jobs, trioq.dead_jobs, trioq.job_history, "
                           "trioq.cron_ticks")  # fmt: skip
        timings["analyze"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_all
    return timings
