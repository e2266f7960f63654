"""What an idle fleet costs the database (not a test).

For each count of ``--counts`` (default 1, 10, 50, 200), that many real ``trioq serve --app
backlog_app:tasks`` processes (one worker each, trioq's defaults, no jobs) run against a fresh
schema; once every one has its ``workers`` row and ``--settle`` seconds passed, the run
measures for ``--seconds``:

- the CPU of the whole Postgres server: the postmaster and every process it started, the
  ones that exited meanwhile included (its children's times); as cores, and per worker;
- the WAL written (``pg_current_wal_lsn``), transactions committed (``pg_stat_database``);
- the ``workers`` table: updates and how many were HOT, dead tuples, size at the end;
- the serve processes' own CPU, and their connections (``pg_stat_activity``).

A local server only (it reads /proc). An idle process holds 6 connections: give the server
room (``max_connections``), e.g. the bench server started with ``-c max_connections=1600``
for 200 processes.

Usage::

    python bench/bench_idle.py --dsn "$(trioq db url)" --counts 1,10 --seconds 30
    python bench/bench_idle.py --counts 1,10,50,200 --seconds 60 --json idle.json
    python bench/bench_idle.py --counts 50 --poll-interval 10   # the polls' share
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio
from _common import (
    Table,
    default_dsn,
    drop_schema,
    fmt,
    fresh_schema,
    int_list,
    process_cpu,
    show_settings,
    wait_workers,
    write_report,
)

import trioq

SCHEMA = "bench_idle"
APP_NAME = "bench_idle_serve"
HERE = Path(__file__).resolve().parent
TRIOQ = (sys.executable, "-m", "trioq._cli")
SERVER_SETTINGS = ("server_version", "fsync", "max_connections", "autovacuum_naptime")
TICKS = os.sysconf("SC_CLK_TCK")

Conn = Any


def server_cpu(postmaster: int) -> float:
    """CPU seconds of the postmaster, its live children, and its children that exited."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry), int(fields[1])
        if pid == postmaster:  # utime stime cutime cstime: fields 11-14 after the name
            total += sum(int(x) for x in fields[11:15]) / TICKS
        elif ppid == postmaster:
            total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


def postmaster_pid(data_dir: str) -> int:
    return int(Path(data_dir, "postmaster.pid").read_text().split()[0])


async def snapshot(conn: Conn) -> dict[str, Any]:
    workers = f"{SCHEMA}.workers"
    cur = await conn.execute(
        "SELECT pg_current_wal_lsn()::text,"
        " (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),"
        " n_tup_upd, n_tup_hot_upd, n_dead_tup, n_live_tup, pg_relation_size(relid),"
        " pg_total_relation_size(relid), autovacuum_count"
        " FROM pg_stat_user_tables WHERE relid = %s::regclass",
        (workers,),
    )
    row = await cur.fetchone()
    assert row is not None
    hi, lo = str(row[0]).split("/")
    keys = ("xacts", "updates", "hot_updates", "dead", "live", "heap", "total", "autovacuums")
    return {"lsn": (int(hi, 16) << 32) + int(lo, 16), **dict(zip(keys, row[1:], strict=True))}


async def one_count(
    dsn: str, count: int, opts: argparse.Namespace, postmaster: int
) -> dict[str, Any]:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await fresh_schema(conn, SCHEMA)
        env = {**os.environ, "PGAPPNAME": APP_NAME, "PYTHONPATH": str(HERE)}
        cmd = [*TRIOQ, "serve", "--app", "backlog_app:tasks", "--dsn", dsn, "--schema", SCHEMA]
        if opts.poll_interval is not None:  # trioq's default otherwise
            cmd += ["--poll-interval", str(opts.poll_interval)]
        procs = [await trio.lowlevel.open_process(cmd, env=env, stdout=subprocess.DEVNULL,
                                                  stderr=subprocess.DEVNULL)
                 for _ in range(count)]  # fmt: skip
        try:
            with trio.fail_after(60 + count):
                await wait_workers(conn, SCHEMA, count, procs)
            await trio.sleep(opts.settle)
            cur = await conn.execute("SELECT count(*) FROM pg_stat_activity "
                                     "WHERE application_name = %s", (APP_NAME,))  # fmt: skip
            connections = (await cur.fetchone() or [0])[0]
            before, cpu0 = await snapshot(conn), server_cpu(postmaster)
            own0 = sum(process_cpu(p.pid) or 0.0 for p in procs)
            t0 = time.perf_counter()
            await trio.sleep(opts.seconds)
            after, cpu1 = await snapshot(conn), server_cpu(postmaster)
            own1 = sum(process_cpu(p.pid) or 0.0 for p in procs)
            wall = time.perf_counter() - t0
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            with trio.move_on_after(30, shield=True):
                for p in procs:
                    await p.wait()
            for p in procs:
                if p.returncode is None:
                    p.kill()
    updates = after["updates"] - before["updates"]
    pg_cores = (cpu1 - cpu0) / wall
    return {
        "count": count,
        "seconds": wall,
        "connections": connections,
        "pg_cores": pg_cores,
        "pg_cpu_s_total": cpu1,  # the server's CPU since it started: proves /proc was read
        "pg_core_pct_per_worker": 100 * pg_cores / count,
        "serve_cores": (own1 - own0) / wall,
        "wal_kb_s": (after["lsn"] - before["lsn"]) / 1024 / wall,
        "xacts_s": (after["xacts"] - before["xacts"]) / wall,
        "worker_updates_s": updates / wall,
        "hot_pct": (100 * (after["hot_updates"] - before["hot_updates"]) / updates
                    if updates else None),
        "workers_dead_end": after["dead"],
        "workers_heap_kb_end": after["heap"] / 1024,
        "workers_heap_kb_start": before["heap"] / 1024,
        "workers_autovacuums": after["autovacuums"] - before["autovacuums"],
    }


def report(results: list[dict[str, Any]]) -> None:
    table = Table([("workers", 7, ">"), ("conns", 5, ">"), ("Postgres % core", 15, ">"),
                   ("per worker", 10, ">"), ("serve cores", 11, ">"), ("WAL KB/s", 8, ">"),
                   ("xacts/s", 7, ">"), ("pings/s", 7, ">"), ("HOT %", 5, ">"),
                   ("workers heap KB start/end", 25, ">"), ("dead", 5, ">")],
                  markdown=True)  # fmt: skip
    rows = [[str(r["count"]), str(r["connections"]), fmt(100 * r["pg_cores"], ".1f"),
             fmt(r["pg_core_pct_per_worker"], ".3f"), fmt(r["serve_cores"], ".2f"),
             fmt(r["wal_kb_s"], ".1f"), fmt(r["xacts_s"]), fmt(r["worker_updates_s"]),
             fmt(r["hot_pct"], ".0f"),
             f"{fmt(r['workers_heap_kb_start'])}/{fmt(r['workers_heap_kb_end'])}",
             fmt(r["workers_dead_end"])] for r in results]  # fmt: skip
    print(table.render(rows))


async def main(opts: argparse.Namespace) -> None:
    async with await trioq.connect(opts.dsn, autocommit=True) as conn:
        settings = await show_settings(conn, SERVER_SETTINGS)
        cur = await conn.execute("SHOW data_directory")
        data_dir = str((await cur.fetchone() or [""])[0])
    postmaster = postmaster_pid(data_dir)
    print(f"server: {settings}", flush=True)
    results = []
    for count in opts.counts:
        result = await one_count(opts.dsn, count, opts, postmaster)
        print(result, flush=True)
        results.append(result)
    await drop_schema(opts.dsn, SCHEMA)
    report(results)
    if opts.json:
        write_report(opts.json, opts, results, server=settings)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=default_dsn())
    parser.add_argument("--counts", type=int_list, default=[1, 10, 50, 200])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--poll-interval", type=float, default=None,
                        help="serve's --poll-interval (default: trioq's): an idle worker's "
                        "claims and settings reads, the backstops of lost notifications")
    parser.add_argument("--json", type=Path)
    return parser.parse_args()


if __name__ == "__main__":
    trio.run(main, parse())
