"""What one round trip costs a Python client here, driver by driver (not a test): the floor
under every path that awaits a statement's answer.

``job.transaction()`` awaits each statement (its cursor, its errors), so a job in it costs the
worker at least one round trip of its own, whatever is shared (docs/transactions.md, "the
ceiling of this shape"); an enqueue is one round trip. This measures, on one connection with
nothing else running, the client CPU (``time.process_time``), the wall time and (with a local
server) the CPU of the connection's backend (``/proc``) per call of:

* ``libpq exec``: psycopg's ``pgconn.exec_`` (libpq's ``PQexec``, C all the way: the floor of
  any Python client on this machine: the system calls of a round trip);
* ``psycopg sync`` / ``psycopg asyncio``: ``execute("SELECT 1")`` on psycopg's own connections;
* ``trioq execute``: `trioq.pg.TrioConnection.execute` (psycopg driven from trio);
* ``trioq sync``: `TrioConnection.sync`, a round trip that runs nothing (a protocol ``Sync``):
  how an idle worker proves its liveness connection alive;
* ``trioq pipelined``: one INSERT with parameters in pipeline mode (`execute_pipelined`), and
  the same with a deferred statement of three parameters ahead of it (a shared member's
  savepoint and fence: `TrioConnection.defer` and ``defer_statement``);
* and trio's own primitives a member of a shared transaction goes through: a checkpoint, a
  cancel scope with a deadline, an uncontended lock.

    python bench/bench_round_trip.py --dsn DSN [--calls 5000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import trio
from _common import Table, default_dsn, fmt, write_json
from psycopg.types.numeric import Int4, Int8

import trioq
from trioq._pg.pipeline import execute_pipelined

INSERT = "INSERT INTO round_trip (job_id, n) VALUES (%s, %s)"
FENCE = "SELECT %s::int8, %s::int4, %s::text"  # three parameters, as `lock_member`'s
SAVEPOINT = b"SAVEPOINT trioq_job"
RELEASE = b"RELEASE SAVEPOINT trioq_job"


def _per_call(
    started: tuple[float, float, float], calls: int, backend: int = 0
) -> dict[str, float]:
    cpu, wall = time.process_time() - started[0], time.perf_counter() - started[1]
    server = _backend_cpu(backend) - started[2]
    return {"cpu_us": cpu / calls * 1e6, "wall_us": wall / calls * 1e6,
            "server_us": server / calls * 1e6 if backend else float("nan")}  # fmt: skip


def _now(backend: int = 0) -> tuple[float, float, float]:
    return time.process_time(), time.perf_counter(), _backend_cpu(backend)


def _backend_cpu(pid: int) -> float:
    """CPU seconds (user + system) of the local server process ``pid``; 0.0 if unknown."""
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _local(conn: Any) -> int:
    """The pid of ``conn``'s backend if it is a process of this machine, else 0."""
    pid = int(conn.info.backend_pid)
    try:
        with open(f"/proc/{pid}/comm") as f:
            return pid if f.read().strip() == "postgres" else 0
    except OSError:
        return 0


def sync_cells(dsn: str, calls: int) -> dict[str, dict[str, float]]:
    found = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        backend = _local(conn)
        for _ in range(200):
            conn.execute("SELECT 1")
        started = _now(backend)
        for _ in range(calls):
            conn.pgconn.exec_(b"SELECT 1")
        found["libpq exec"] = _per_call(started, calls, backend)
        started = _now(backend)
        for _ in range(calls):
            conn.execute("SELECT 1")
        found["psycopg sync"] = _per_call(started, calls, backend)
    return found


async def _asyncio_cell(dsn: str, calls: int) -> dict[str, float]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        backend = _local(conn)
        for _ in range(200):
            await conn.execute("SELECT 1")
        started = _now(backend)
        for _ in range(calls):
            await conn.execute("SELECT 1")
        return _per_call(started, calls, backend)


async def trio_cells(dsn: str, calls: int) -> dict[str, dict[str, float]]:
    found: dict[str, dict[str, float]] = {}
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE TEMP TABLE round_trip (job_id bigint, n int)")
        backend = _local(conn)

        async def timed(label: str, call: Callable[[int], Awaitable[Any]]) -> None:
            for i in range(200):
                await call(i)
            started = _now(backend)
            for i in range(calls):
                await call(i)
            found[label] = _per_call(started, calls, backend)

        async def member(i: int) -> Any:
            conn.defer(*((RELEASE, SAVEPOINT) if i else (SAVEPOINT,)))
            conn.defer_statement(FENCE, (Int8(i), Int4(1), "owner"))
            return await execute_pipelined(conn, [(INSERT, (i, i))])

        await timed("trioq execute", lambda i: conn.execute("SELECT 1"))
        await timed("trioq sync (runs nothing)", lambda i: conn.sync())
        await timed("trioq pipelined insert", lambda i: execute_pipelined(conn, [(INSERT, (i, i))]))
        await conn.execute("BEGIN")
        await timed("trioq member (savepoint, fence, insert)", member)
        await conn.execute("ROLLBACK")
    lock = trio.Lock()
    primitives: dict[str, Callable[[], Awaitable[None]]] = {
        "trio checkpoint": trio.lowlevel.checkpoint,
        "trio checkpoint in a cancel scope with a deadline": _scope,
        "trio lock, uncontended": lambda: _lock(lock),
    }
    for label, primitive in primitives.items():
        started = _now()
        for _ in range(calls * 10):
            await primitive()
        found[label] = _per_call(started, calls * 10)
    return found


async def _scope() -> None:
    with trio.move_on_at(trio.current_time() + 60):
        await trio.lowlevel.checkpoint()


async def _lock(lock: trio.Lock) -> None:
    await lock.acquire()
    lock.release()


def measure(dsn: str, calls: int) -> dict[str, dict[str, float]]:
    found = sync_cells(dsn, calls)
    found["psycopg asyncio"] = asyncio.run(_asyncio_cell(dsn, calls))
    found.update(trio.run(trio_cells, dsn, calls))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=default_dsn())
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs = [measure(args.dsn, args.calls) for _ in range(args.repeat)]
    table = Table([("call", 50, "<"), ("client CPU us", 13, ">"), ("wall us", 8, ">"),
                   ("server CPU us", 13, ">")], markdown=True)  # fmt: skip
    medians = {
        label: {key: statistics.median(run[label].get(key, float("nan")) for run in runs)
                for key in ("cpu_us", "wall_us", "server_us")}
        for label in runs[0]
    }  # fmt: skip
    print(f"medians of {args.repeat} x {args.calls} calls, one connection:")
    print(table.render([[label, fmt(m["cpu_us"], ".1f"), fmt(m["wall_us"], ".1f"),
                         fmt(None if math.isnan(m["server_us"]) else m["server_us"], ".1f")]
                        for label, m in medians.items()]))  # fmt: skip
    if args.json:
        write_json(args.json, {"calls": args.calls, "runs": runs, "medians": medians})


if __name__ == "__main__":
    main()
