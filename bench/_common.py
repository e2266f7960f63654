"""What the benchmark scripts share: machine noise, a process's CPU, a scratch database.

The CPU readings are trioq's own (`trioq._stress.cpu`, also behind `trioq stress`), so
every script and the load test count busy time the same way. The scripts run as
``python bench/bench_X.py``, which puts this folder on ``sys.path``.
"""

from __future__ import annotations

import time

import trio
from psycopg import sql
from psycopg.conninfo import make_conninfo

import trioq
from trioq._stress import cpu as _stress_cpu

__all__ = ["create_bench_db", "drop_bench_db", "machine_busy", "process_cpu", "wait_quiet"]


def machine_busy() -> float:
    """CPU seconds the whole machine spent not idle since boot (all cores)."""
    busy = _stress_cpu.machine_busy()
    if busy is None:
        raise RuntimeError("/proc/stat is not readable: the benchmarks measure CPU on Linux")
    return busy


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) of process ``pid``; None once it is gone."""
    sample = _stress_cpu.process_cpu(pid)
    return None if sample is None else sample.own


async def wait_quiet(max_others: float, patience: float) -> float:
    """Wait until the machine (minus this process) is below ``max_others`` busy cores.

    Returns the last sample; gives up after ``patience`` seconds (the noise is then reported).
    """
    deadline = time.monotonic() + patience
    while True:
        m0, c0, t0 = machine_busy(), time.process_time(), time.monotonic()
        await trio.sleep(0.5)
        others = (machine_busy() - m0 - (time.process_time() - c0)) / (time.monotonic() - t0)
        if others <= max_others or time.monotonic() >= deadline:
            return max(0.0, others)


async def create_bench_db(admin_dsn: str, database: str) -> str:
    """A fresh, migrated database ``database`` (dropped first if it exists); its DSN."""
    async with await trioq.connect(admin_dsn, autocommit=True) as admin:
        name = sql.Identifier(database)
        await admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        await admin.execute(sql.SQL("CREATE DATABASE {}").format(name))
    dsn = make_conninfo(admin_dsn, dbname=database)
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
    return dsn


async def drop_bench_db(admin_dsn: str, database: str) -> None:
    async with await trioq.connect(admin_dsn, autocommit=True) as admin:
        await admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
        )
