"""Durable jobs next to DBOS Transact (not a test): steps/s of a 10-step workflow, signal ->
woken handler latency, and what 100,000 sleeping durable jobs cost the claim (issue 24).

Each library runs in a child process of its own on its own fresh database of the ``--dsn``
server: trioq (``peers/trioq_durable.py``, this Python) and DBOS Transact
(``peers/dbos_durable.py``, under ``--dbos-python``: a venv with
``peers/requirements-dbos.txt``; skipped if it does not exist). Repetitions interleave the
cells, in an order that rotates; before each run the script waits for the machine to be
quiet (``--quiet-cores``), and prints how busy the rest of it was.

1. **steps**: ``--workflows`` workflows of 10 trivial steps (each returns ``{"i": i}``), on
   one worker process, ``C`` at a time for each ``--concurrency``: trioq's ``job.step`` and
   ``job.step_transaction`` (jobs enqueued in bulk first, run by ``trioq.serve``), DBOS's
   ``@DBOS.step`` in a ``@DBOS.workflow`` (``--dbos-modes``: ``sync`` threads, ``async``
   tasks, or its ``queue``). Steps/s from the first workflow's start to the last one's end;
   the worker's CPU and the server's (its processes, read from ``/proc``) per step.
2. **signal**: ``--signals`` signals, each to a workflow parked in its wait, ``--gap`` ms
   after it parked: ``trioq.signal`` + ``job.wait_for`` against ``DBOS.send`` +
   ``DBOS.recv``. Latency from just before the send to the line after the wait, in the
   same process: p50 / p90 / p99 / max of each run, medians over the runs; the send's own
   time (its round trip and commit) and, for trioq, the time to the woken run's first line
   (the claim; the rest is the replay: its records read, the wait's transaction).
3. **claim**: a database with ``--sleepers`` durable jobs that recorded two steps and sleep
   for a year (made once by the real path, in the drained queue) against one without:
   a no-op drain of ``--drain-jobs`` jobs at concurrency 100 (jobs/s), and the server time
   and buffers (``EXPLAIN (ANALYZE, BUFFERS)``, rolled back, the table vacuumed after each)
   of the claim at batch 10 and 100 on a backlog of ``--backlog`` available jobs, of the
   scheduler's promotion and of its next-due look-up.

    python bench/bench_durable.py --dsn "$(trioq db url)" --repeat 2 --json durable.json
    python bench/bench_durable.py --only steps --concurrency 1,10,50 --workflows 2000

Databases: ``trioq_durable_<cell>`` per run (dropped after), ``trioq_durable_sleepers``
and ``trioq_durable_empty`` (dropped at the end unless ``--keep-sleepers``, which also
reuses a sleepers database of the right size).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import trio
from _common import (
    Table,
    add_common_options,
    client_versions,
    cpu_model,
    create_bench_db,
    create_database,
    drop_bench_db,
    fmt,
    int_list,
    postmaster_pid,
    scalar,
    show_settings,
    wait_quiet,
    write_json,
)
from bench_backlog import explain_analyze
from psycopg.conninfo import make_conninfo

import trioq

HERE = Path(__file__).parent
ROOT = HERE.parent
STEPS = 10
QUEUE = "bench"  # peers/trioq_durable.py's queue: the sleepers' and the drain's
LEASE = dt.timedelta(seconds=60)
SLEEPERS_DB = "trioq_durable_sleepers"
EMPTY_DB = "trioq_durable_empty"
QUANTILES = ("p50", "p90", "p99", "max")


# -- children ------------------------------------------------------------------------------------


def child(python: str, script: str, *args: str) -> dict[str, Any]:
    """Run ``peers/<script> args`` under ``python``; the JSON of its last line."""
    done = subprocess.run([python, str(HERE / "peers" / script), *args], capture_output=True,
                          text=True, check=False, timeout=3600)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{script} {' '.join(args[:1])} failed:\n{done.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def rotated(labels: Sequence[str], rep: int) -> list[str]:
    k = rep % len(labels)
    return [*labels[k:], *labels[:k]]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


# -- 1. steps ------------------------------------------------------------------------------------


def step_cells(args: argparse.Namespace) -> dict[str, tuple[str, str, list[str]]]:
    """label -> (python, script, its arguments) for every steps cell."""
    cells: dict[str, tuple[str, str, list[str]]] = {}
    for c in args.concurrency:
        common = ["--workflows", str(args.workflows), "--concurrency", str(c)]
        for kind, label in (("step", "job.step"), ("transaction", "job.step_transaction")):
            cells[f"trioq {label}, c={c}"] = (sys.executable, "trioq_durable.py",
                                              ["steps", "--kind", kind, *common])  # fmt: skip
        if args.dbos_python:
            for mode in args.dbos_modes:
                cells[f"dbos {mode}, c={c}"] = (args.dbos_python, "dbos_durable.py",
                                                ["steps", "--mode", mode, *common])  # fmt: skip
    return cells


async def run_cell(args: argparse.Namespace, name: str, cell: tuple[str, str, list[str]],
                   pg_pid: int) -> dict[str, Any]:  # fmt: skip
    python, script, argv = cell
    others = await wait_quiet(args.quiet_cores, args.quiet_wait)
    database = "trioq_durable_" + name.split(maxsplit=1)[0]
    dsn = await create_database(args.dsn, database)
    try:
        found = await trio.to_thread.run_sync(
            child, python, script, argv[0], "--dsn", dsn, "--pg-pid", str(pg_pid), *argv[1:]
        )
    finally:
        await drop_bench_db(args.dsn, database)
    found["others"] = others
    return found


def step_figures(run: dict[str, Any]) -> dict[str, Any]:
    steps = run["jobs"] * STEPS
    server = run.get("server_cpu_s")
    return {"steps_s": steps / run["wall_s"], "client_us": run["client_cpu_s"] / steps * 1e6,
            "server_us": None if server is None else server / steps * 1e6,
            "others": run["others"]}  # fmt: skip


STEPS_TABLE = Table([("cell", 32, "<"), ("steps/s", 8, ">"), ("min-max", 13, ">"),
                     ("wf/s", 6, ">"), ("client us/step", 14, ">"),
                     ("server us/step", 14, ">")])  # fmt: skip


async def bench_steps(args: argparse.Namespace, pg_pid: int) -> dict[str, Any]:
    cells = step_cells(args)
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in cells}
    for rep in range(args.repeat):
        for label in rotated(list(cells), rep):
            run = step_figures(await run_cell(args, label, cells[label], pg_pid))
            runs[label].append(run)
            print(f"  run {rep + 1} {label:<32} {run['steps_s']:8,.0f} steps/s  client "
                  f"{run['client_us']:5.0f} us/step  server {fmt(run['server_us'])} us/step  "
                  f"(others {run['others']:.2f} cores)", flush=True)  # fmt: skip
    rows, summary = [], {}
    for label, found in runs.items():
        rates = [r["steps_s"] for r in found]
        m = {key: median([r[key] for r in found]) for key in ("steps_s", "client_us", "server_us")}
        summary[label] = m
        rows.append((label, fmt(m["steps_s"]), f"{min(rates):,.0f}-{max(rates):,.0f}",
                     fmt((m["steps_s"] or 0) / STEPS), fmt(m["client_us"]),
                     fmt(m["server_us"])))  # fmt: skip
    print(f"\nsteps of a {STEPS}-step workflow, {args.workflows:,} workflows, one worker process;"
          f" medians of {args.repeat} (min-max of steps/s)")  # fmt: skip
    print(STEPS_TABLE.render(rows))
    return {"runs": runs, "medians": summary}


# -- 2. signal -> handler ------------------------------------------------------------------------


async def bench_signal(args: argparse.Namespace) -> dict[str, Any]:
    common = ["--signals", str(args.signals), "--gap", str(args.gap)]
    cells = {"trioq": (sys.executable, "trioq_durable.py", ["signal", *common])}
    if args.dbos_python:
        for mode in ("sync", "async"):
            cells[f"dbos {mode}"] = (args.dbos_python, "dbos_durable.py",
                                     ["signal", "--mode", mode, *common])  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in cells}
    for rep in range(args.repeat):
        for label in rotated(list(cells), rep):
            found = await run_cell(args, label, cells[label], 0)
            lat, call = found["latencies_ms"], found["signal_call_ms"]
            run = {"p50": percentile(lat, 50), "p90": percentile(lat, 90),
                   "p99": percentile(lat, 99), "max": max(lat),
                   "send_p50": percentile(call, 50), "others": found["others"]}  # fmt: skip
            if "pickup_ms" in found:  # trioq: the woken run's start (the rest is its replay)
                run["pickup_p50"] = percentile(found["pickup_ms"], 50)
            runs[label].append(run)
            print(f"  run {rep + 1} {label:<10} p50 {run['p50']:6.2f}  p90 {run['p90']:6.2f}  "
                  f"p99 {run['p99']:6.2f}  max {run['max']:7.2f} ms  (the send alone: p50 "
                  f"{run['send_p50']:.2f} ms; others {run['others']:.2f} cores)",
                  flush=True)  # fmt: skip
    print(f"\nsignal sent -> the woken handler's next line, {args.signals} signals per run, "
          f"{args.gap} ms +-50 % after the wait parked; ms, medians of {args.repeat} runs "
          "(max: the worst run's)")  # fmt: skip
    table = Table([("cell", 10, "<"), *((q, 7, ">") for q in QUANTILES), ("send p50", 8, ">"),
                   ("run start p50", 13, ">")])  # fmt: skip
    rows, summary = [], {}
    for label, done in runs.items():
        m = {q: median([r.get(q) for r in done])
             for q in (*QUANTILES[:-1], "send_p50", "pickup_p50")}  # fmt: skip
        m["max"] = max(r["max"] for r in done)
        summary[label] = m
        rows.append((label, *(fmt(m[q], ".2f") for q in (*QUANTILES, "send_p50", "pickup_p50"))))
    print(table.render(rows))
    return {"runs": runs, "medians": summary}


# -- 3. the claim with sleepers ------------------------------------------------------------------


async def sleepers_db(args: argparse.Namespace) -> str:
    """The DSN of a database holding ``--sleepers`` sleeping durable jobs (made, or reused)."""
    dsn = make_conninfo(args.dsn, dbname=SLEEPERS_DB)
    if args.keep_sleepers:
        try:
            async with await trioq.connect(dsn, autocommit=True) as conn:
                have = await scalar(conn, "SELECT count(*) FROM trioq.jobs WHERE durable AND "
                                          "state = 'scheduled'")  # fmt: skip
            if have == args.sleepers:
                print(f"reusing {SLEEPERS_DB} ({have:,} sleepers)", flush=True)
                return dsn
        except psycopg.Error:
            pass
    dsn = await create_database(args.dsn, SLEEPERS_DB)
    print(f"making {args.sleepers:,} sleepers in {SLEEPERS_DB} ...", flush=True)
    made = await trio.to_thread.run_sync(child, sys.executable, "trioq_durable.py", "sleepers",
                                         "--dsn", dsn, "--count", str(args.sleepers),
                                         "--concurrency", "100")  # fmt: skip
    print(f"  {made['sleepers']:,} sleepers, {made['step_records']:,} step records, in "
          f"{made['took_s']:.0f} s", flush=True)  # fmt: skip
    return dsn


async def table_sizes(dsn: str) -> dict[str, str]:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT c.relname, pg_size_pretty(pg_total_relation_size(c.oid)) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'trioq' "
            "AND c.relname IN ('jobs', 'job_steps', 'jobs_claim_idx', 'jobs_scheduled_idx')"
        )
        return {name: size for name, size in await cur.fetchall()}


async def explained(conn: trioq.TrioConnection, statement: Any, params: dict[str, Any],
                    runs: int) -> tuple[float, float]:  # fmt: skip
    """The median server ms and buffers of ``statement`` (`explain_analyze`, rolled back),
    the table vacuumed after each run: a rolled-back claim leaves its rows' new versions
    dead, which the next run would have to step over."""
    took, buffers = [], []
    for _ in range(runs):
        found = await explain_analyze(conn, statement, params, 1)
        took.append(found["execution_ms"])
        buffers.append(found["buffers"])
        await conn.execute("VACUUM trioq.jobs")
    return statistics.median(took), statistics.median(buffers)


async def statement_ms(dsn: str, args: argparse.Namespace) -> dict[str, float]:
    """Server ms and buffers (`explained`) of the claim at batch 10 and 100 on a backlog of
    ``--backlog`` available jobs, of the promotion, and of the next-due look-up."""
    q = trioq.Queue()
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await conn.execute("DELETE FROM trioq.jobs WHERE state = 'available'")
        await trioq.enqueue_bulk(conn, "noop", [{"n": 0}] * args.backlog, queue=QUEUE)
        await conn.execute("VACUUM ANALYZE trioq.jobs")
        took = {}
        for batch in (10, 100):
            params = {"queue": QUEUE, "owner": "bench", "limit": batch, "lease": LEASE}
            took[f"claim {batch}"], took[f"claim {batch} buffers"] = await explained(
                conn, q.sql.claim, params, args.explain_runs
            )
        promote = {"limit": 1000, "notify": False, "channel": q.sql.channel}
        took["promote"], _ = await explained(conn, q.sql.promote, promote, args.explain_runs)
        took["next due"], _ = await explained(conn, q.sql.next_due, {}, args.explain_runs)
        await conn.execute("DELETE FROM trioq.jobs WHERE state = 'available'")
    return took


STATEMENTS = ("claim 10", "claim 100", "promote", "next due")


async def bench_claim(args: argparse.Namespace, pg_pid: int) -> dict[str, Any]:
    dsns = {f"{args.sleepers:,} sleepers": await sleepers_db(args),
            "no sleepers": await create_bench_db(args.dsn, EMPTY_DB)}  # fmt: skip
    drains: dict[str, list[dict[str, Any]]] = {label: [] for label in dsns}
    took: dict[str, list[dict[str, float]]] = {label: [] for label in dsns}
    for rep in range(args.repeat):
        for label in rotated(list(dsns), rep):
            others = await wait_quiet(args.quiet_cores, args.quiet_wait)
            run = await trio.to_thread.run_sync(
                child, sys.executable, "trioq_durable.py", "drain", "--dsn", dsns[label],
                "--jobs", str(args.drain_jobs), "--concurrency", "100", "--pg-pid", str(pg_pid)
            )
            figures = {"jobs_s": run["jobs"] / run["wall_s"],
                       "client_us": run["client_cpu_s"] / run["jobs"] * 1e6,
                       "server_us": (run["server_cpu_s"] or 0) / run["jobs"] * 1e6,
                       "others": others}  # fmt: skip
            drains[label].append(figures)
            took[label].append(await statement_ms(dsns[label], args))
            print(f"  run {rep + 1} {label:<18} drain {figures['jobs_s']:7,.0f} jobs/s  "
                  + "  ".join(f"{s} {took[label][-1][s]:.3f} ms" for s in STATEMENTS)
                  + f"  (others {others:.2f} cores)", flush=True)  # fmt: skip
    sizes = {label: await table_sizes(dsn) for label, dsn in dsns.items()}
    print(f"\nthe claim with and without sleeping durable jobs: a no-op drain of "
          f"{args.drain_jobs:,} jobs at c=100 (medians of {args.repeat}), server ms of each "
          f"statement (medians of {args.explain_runs} EXPLAIN ANALYZE each run, backlog "
          f"{args.backlog:,})")  # fmt: skip
    table = Table([("database", 18, "<"), ("jobs/s", 7, ">"), ("min-max", 13, ">"),
                   ("us/job", 6, ">"), *((s + " ms", 11, ">") for s in STATEMENTS),
                   ("buffers 10 / 100", 16, ">")])  # fmt: skip
    rows, summary = [], {}
    for label in dsns:
        rates = [d["jobs_s"] for d in drains[label]]
        m = {s: median([t[s] for t in took[label]])
             for s in (*STATEMENTS, "claim 10 buffers", "claim 100 buffers")}  # fmt: skip
        m["jobs_s"] = median(rates)
        m["client_us"] = median([d["client_us"] for d in drains[label]])
        summary[label] = m
        rows.append((label, fmt(m["jobs_s"]), f"{min(rates):,.0f}-{max(rates):,.0f}",
                     fmt(m["client_us"]), *(fmt(m[s], ".3f") for s in STATEMENTS),
                     f"{fmt(m['claim 10 buffers'])} / {fmt(m['claim 100 buffers'])}"))  # fmt: skip
    print(table.render(rows))
    for label, size in sizes.items():
        print(f"  {label}: " + ", ".join(f"{k} {v}" for k, v in sorted(size.items())))
    if not args.keep_sleepers:
        await drop_bench_db(args.dsn, SLEEPERS_DB)
    await drop_bench_db(args.dsn, EMPTY_DB)
    return {"drains": drains, "statements": took, "medians": summary, "sizes": sizes}


# -- main ----------------------------------------------------------------------------------------


async def main(args: argparse.Namespace) -> dict[str, Any]:
    async with await trioq.connect(args.dsn, autocommit=True) as conn:
        settings = await show_settings(conn, ["server_version", "fsync", "synchronous_commit",
                                              "full_page_writes", "shared_buffers"])  # fmt: skip
        pg_pid = await postmaster_pid(conn)
    env: dict[str, Any] = {**client_versions(), "cpu": cpu_model(), "trioq": trioq.__version__}
    if args.dbos_python:
        env["dbos"] = child(args.dbos_python, "dbos_durable.py", "versions")
    print(f"PostgreSQL {settings}; server CPU read from pid {pg_pid or '-'}\nclients {env}",
          flush=True)  # fmt: skip
    report: dict[str, Any] = {"settings": settings, "env": env}
    if "steps" in args.only:
        report["steps"] = await bench_steps(args, pg_pid)
    if "signal" in args.only:
        report["signal"] = await bench_signal(args)
    if "claim" in args.only:
        report["claim"] = await bench_claim(args, pg_pid)
    return report


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_common_options(p, creates="trioq_durable_* databases", repeat=2, quiet_cores=0.3,
                       quiet_wait=60.0, pgbench=False)  # fmt: skip
    p.add_argument("--only", type=lambda s: s.split(","), default=["steps", "signal", "claim"],
                   help="sections, comma-separated: steps,signal,claim (all)")  # fmt: skip
    p.add_argument("--workflows", type=int, default=1000, help="per steps run (%(default)s)")
    p.add_argument("--concurrency", type=int_list, default=[1, 10, 50],
                   help="workflows at a time, comma-separated (%(default)s)")  # fmt: skip
    p.add_argument("--dbos-python", default=str(ROOT / ".venv-dbos" / "bin" / "python"),
                   help="the Python of a venv with peers/requirements-dbos.txt (%(default)s)")
    p.add_argument("--dbos-modes", type=lambda s: s.split(","), default=["sync", "async"],
                   help="DBOS's ways to run workflows: sync,async,queue (%(default)s)")
    p.add_argument("--signals", type=int, default=200, help="per signal run (%(default)s)")
    p.add_argument("--gap", type=float, default=20.0, help="ms after the wait parked")
    p.add_argument("--sleepers", type=int, default=100_000)
    p.add_argument("--keep-sleepers", action="store_true",
                   help="keep (and reuse) the sleepers' database")  # fmt: skip
    p.add_argument("--drain-jobs", type=int, default=20_000)
    p.add_argument("--backlog", type=int, default=10_000, help="available jobs under EXPLAIN")
    p.add_argument("--explain-runs", type=int, default=20)
    args = p.parse_args(argv)
    if args.dbos_python and not Path(args.dbos_python).exists():
        print(f"no DBOS venv at {args.dbos_python}: DBOS's cells are skipped (python3 -m venv "
              ".venv-dbos && .venv-dbos/bin/pip install -r bench/peers/requirements-dbos.txt)")
        args.dbos_python = None
    return args


if __name__ == "__main__":
    options = parse_args()
    found = trio.run(main, options)
    if options.json:
        write_json(options.json, found)
