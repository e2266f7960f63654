"""The stress ledger: one row per completed execution, written in the job's own transaction.

The stress handler inserts its row with `Statements.record` inside ``job.transaction()``,
so the row and the (fenced) completion commit together: a run whose lease was lost rolls
back its row, and two rows for one job would be two completions. `reset` gives each run
empty tables: the ledger is recreated and trioq's tables in the stress schema truncated.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
from psycopg import sql

from .._db.migrate import migrate
from .._db.statements import qualified

__all__ = ["LEDGER_TABLE", "Statements", "Timings", "reset", "statements", "timings"]

LEDGER_TABLE = "stress_ledger"

_CREATE = """
CREATE TABLE {ledger} (
    job_id      bigint      NOT NULL,
    attempt     integer     NOT NULL,
    worker_pid  integer     NOT NULL,
    started_at  timestamptz NOT NULL,  -- the handler's start, on the database clock
    finished_at timestamptz NOT NULL,  -- when the row was written, just before the commit
    run_at      timestamptz NOT NULL,  -- when the job became due (this attempt's)
    enqueued_at timestamptz NOT NULL,
    prior_error text                   -- the job's last_error on a re-run: why it ran again
)
"""

# started_at: clock_timestamp() less the seconds the handler has run so far (measured by the
# worker with a monotonic clock), so the database clock is the only clock in the ledger.
_RECORD = """
INSERT INTO {ledger} (job_id, attempt, worker_pid, started_at, finished_at, run_at, enqueued_at)
VALUES (%(id)s, %(attempt)s, %(pid)s, clock_timestamp() - make_interval(secs => %(elapsed)s),
        clock_timestamp(), %(run_at)s, %(enqueued_at)s)
"""

# A re-run (attempt > 1) also keeps why the previous attempt did not finish.
_RECORD_RERUN = """
INSERT INTO {ledger} (job_id, attempt, worker_pid, started_at, finished_at, run_at, enqueued_at,
                      prior_error)
SELECT %(id)s, %(attempt)s, %(pid)s, clock_timestamp() - make_interval(secs => %(elapsed)s),
       clock_timestamp(), %(run_at)s, %(enqueued_at)s,
       (SELECT last_error FROM {jobs} WHERE id = %(id)s)
"""

# Pickup latency: from when the job became due (run_at; in a prefilled backlog that is the
# enqueue) to the handler's start. Drain: from the first pickup to the last completion.
_TIMINGS = """
SELECT count(*),
       extract(epoch FROM max(finished_at) - min(started_at))::float8,
       percentile_cont(ARRAY[0.5, 0.95, 0.99])
           WITHIN GROUP (ORDER BY extract(epoch FROM started_at - run_at)),
       extract(epoch FROM max(started_at - run_at))::float8,
       avg(extract(epoch FROM started_at - run_at))::float8
  FROM {ledger}
"""


@attrs.frozen(kw_only=True)
class Timings:
    """Drain and pickup latency, from the ledger (seconds, on the database clock)."""

    completions: int
    drain_seconds: float | None
    latency_p50: float | None
    latency_p95: float | None
    latency_p99: float | None
    latency_max: float | None
    latency_mean: float | None

    def latency(self) -> dict[str, float | None]:
        return {
            "p50": self.latency_p50,
            "p95": self.latency_p95,
            "p99": self.latency_p99,
            "max": self.latency_max,
            "mean": self.latency_mean,
        }


@attrs.frozen
class Statements:
    ledger: sql.Identifier
    jobs: sql.Identifier
    create: sql.Composed
    record: sql.Composed
    record_rerun: sql.Composed
    timings: sql.Composed


@functools.cache
def statements(schema: str) -> Statements:
    """The ledger's statements for ``schema`` (a validated identifier, never text)."""
    names = {"ledger": qualified(schema, LEDGER_TABLE), "jobs": qualified(schema, "jobs")}

    def compose(text: str) -> sql.Composed:
        return sql.SQL(text.strip()).format(**names)

    return Statements(
        ledger=names["ledger"],
        jobs=names["jobs"],
        create=compose(_CREATE),
        record=compose(_RECORD),
        record_rerun=compose(_RECORD_RERUN),
        timings=compose(_TIMINGS),
    )


async def reset(conn: Any, schema: str) -> None:
    """Migrate ``schema``, recreate the ledger, and empty trioq's tables there."""
    await migrate(conn, schema)
    tables = sql.SQL(", ").join(
        qualified(schema, name) for name in ("jobs", "dead_jobs", "cron_ticks")
    )
    async with conn.transaction():
        await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(statements(schema).ledger))
        await conn.execute(statements(schema).create)
        await conn.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY").format(tables))


async def timings(conn: Any, schema: str) -> Timings:
    cur = await conn.execute(statements(schema).timings)
    row = await cur.fetchone()
    assert row is not None
    completions, drain, percentiles, worst, mean = row
    p50, p95, p99 = percentiles or (None, None, None)
    return Timings(
        completions=completions, drain_seconds=drain, latency_p50=p50, latency_p95=p95,
        latency_p99=p99, latency_max=worst, latency_mean=mean,
    )  # fmt: skip
