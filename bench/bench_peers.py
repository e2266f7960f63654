"""trioq next to pgqueuer and procrastinate on one burn-down, and a raw SQL ceiling (not a test).

The workload is the same for every library: ``--jobs`` (20,000) no-op jobs are prefilled
through the library's own bulk enqueue, then ONE worker process drains them (``--processes
2``: also TWO, each with the cell's settings; the jobs' table is held in EXCLUSIVE mode until
both said READY, so they start claiming together, and each stops once no job is left). Each
library
runs in its own process: trioq under /work/venv's Python (``trio.run(trioq.serve, config)``),
pgqueuer and procrastinate under the Python of throwaway venvs that this script creates in
``--venvs`` (default /tmp/trioq-bench-peers) and fills from PyPI with the versions pinned in
``bench/peers/requirements-*.txt``. Per measurement (a "cell"):

1. wait (up to ``--quiet-wait`` s) until other processes use fewer than ``--quiet-cores``;
2. create a fresh database ``trioq_peers_<library>`` (dropping a leftover one) and install the
   library's schema with its own installer;
3. prefill: ``trioq.enqueue_many`` / pgqueuer ``Queries.enqueue`` with lists /
   procrastinate ``Task.batch_defer_async``, in a separate process, then ``VACUUM ANALYZE``
   and ``CHECKPOINT`` and a check that exactly ``--jobs`` jobs wait;
4. start the worker process. The timed drain starts at its FIRST handler call (the worker
   prints ``time.monotonic()``, which is CLOCK_MONOTONIC, shared by all processes) and ends
   when, after the worker reported that its last handler ran, a separate connection polling
   every millisecond first sees no unfinished job (the last completion is committed). The
   enqueue, the process start-up, the schema checks and the shutdown are not timed;
5. verify: every job's handler ran exactly once, and every job is finished successfully;
6. drop the database.

Settings per library (everything else is the library's default):

* trioq: ``Config(queues={"bench": QueueConfig(concurrency=C)})``; trioq claims up to the
  free slots and its completer batches outcomes (up to 500 per statement): no batch knob.
* pgqueuer: one ``QueueManager`` on one asyncpg connection, ``mode=drain``, ``batch_size=B``,
  ``max_concurrent_tasks=C`` (pgqueuer requires C >= 2 B, so at C=10 the batch is 5) or
  unlimited (pgqueuer's default, and what its own benchmark uses), on uvloop as ``pgq run``
  does (``--pgqueuer-loops`` adds plain asyncio); and, unlimited, ``--pgqueuer-managers M``
  managers in the one process, each on its own connection (its benchmark's way to more
  throughput: 10 managers at batch 100 is its best setting on this machine).
* procrastinate: ``run_worker_async(concurrency=C, wait=False)``, ``PsycopgConnector``
  defaults; it fetches and finishes one job per statement (no batch setting).
* pgbench: trioq's own claim and complete statements, rendered from
  ``trioq._db.statements.statements('trioq')`` with psycopg's ``as_string`` and the
  parameters turned into pgbench variables (``-M prepared`` binds them like psycopg does),
  claim ``limit`` B,
  ``--pgbench-clients`` connections, over the same prefilled jobs (enqueued with
  ``trioq.enqueue_many``). Its jobs/s come from pgbench's own tps (connections excluded).
  The claim is wrapped so ``\\gset`` can carry the leases to the complete: pgbench receives
  two arrays per claim where trioq receives B rows.

Usage::

    python bench/bench_peers.py                           # TRIOQ_DSN or the local test server
    python bench/bench_peers.py --dsn postgresql://postgres@127.0.0.1:55432/postgres \\
        --repeat 2 --json /tmp/peers.json
    python bench/bench_peers.py --libraries trioq --concurrency 100 --py-spy /tmp/prof
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import psycopg
import trio
from _common import (
    Table,
    add_common_options,
    children_cpu,
    create_database,
    drop_bench_db,
    find_pgbench,
    fmt,
    int_list,
    machine_busy,
    medians,
    pgbench_drain_command,
    pgbench_drain_script,
    pgbench_tps,
    pgbench_version,
    process_cpu,
    scalar,
    show_settings,
    wait_quiet,
    write_json,
)
from psycopg.conninfo import conninfo_to_dict

import trioq

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
DB_PREFIX = "trioq_peers_"
#: The variant of trioq cells run with ``--trioq-baseline DIR`` on PYTHONPATH.
BASELINE = "baseline"
#: trioq variant: the same drain with a global concurrency limit set (the limited claim).
GLOBAL = "global-concurrency="
TARGET_RATIO = 2.5  # trioq's best >= 2.5 x pgqueuer's best setting, same run
CEILING_SHARE = 0.6  # trioq's best >= 60 % of the pgbench ceiling (its best cell), same run
PGQUEUER_REFERENCE = {10: 5_600, 100: 12_000}  # jobs/s measured earlier on this kind of box
VENV_PYTHON = sys.executable  # /work/venv/bin/python when run by `just bench-peers`


@dataclass(frozen=True)
class Library:
    name: str
    script: str
    requirements: str | None  # None: runs under this script's own Python (trioq)
    #: how many jobs wait, before the drain
    waiting_sql: str
    #: is any job not finished yet (polled every millisecond at the end of the drain)
    unfinished_sql: str
    #: jobs finished successfully; ``{jobs}`` is the prefilled count
    succeeded_sql: str
    #: the table the jobs wait in: several worker processes start claiming together, once
    #: all are ready (`drain_many` holds it in EXCLUSIVE mode until then)
    table: str = ""


LIBRARIES = {
    "trioq": Library(
        "trioq",
        "trioq_worker.py",
        None,
        "SELECT count(*) FROM trioq.jobs WHERE state = 'available'",
        "SELECT EXISTS (SELECT 1 FROM trioq.jobs WHERE state IN "
        "('available', 'running', 'scheduled'))",
        "SELECT {jobs} - (SELECT count(*) FROM trioq.jobs)"
        " - (SELECT count(*) FROM trioq.dead_jobs)",
        "trioq.jobs",
    ),
    "pgqueuer": Library(
        "pgqueuer",
        "pgqueuer_worker.py",
        "requirements-pgqueuer.txt",
        "SELECT count(*) FROM pgqueuer WHERE status = 'queued'",
        "SELECT EXISTS (SELECT 1 FROM pgqueuer)",
        "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'",
        "pgqueuer",
    ),
    "procrastinate": Library(
        "procrastinate",
        "procrastinate_worker.py",
        "requirements-procrastinate.txt",
        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'",
        "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))",
        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
    ),
}
# pgbench drains trioq's tables: it is prefilled and checked like trioq.
LIBRARIES["pgbench"] = replace(LIBRARIES["trioq"], name="pgbench")


@dataclass(frozen=True)
class Cell:
    library: str
    concurrency: int | None  # None: unlimited (pgqueuer's default); pgbench: clients
    batch: int | None  # None: the library has no batch setting
    variant: str = ""  # pgqueuer: uvloop or asyncio; trioq: prototypes (trioq_prototypes.py)
    managers: int = 1  # pgqueuer: QueueManagers in the process, a connection each
    processes: int = 1  # worker processes, each with these settings (--processes)

    @property
    def label(self) -> str:
        parts = [self.library]
        if self.library == "pgbench":
            parts.append(f"{self.concurrency} client{'s' if self.concurrency != 1 else ''}")
        else:
            parts.append("unlimited" if self.concurrency is None else f"c={self.concurrency}")
        if self.batch is not None:
            parts.append(f"batch {self.batch}")
        if self.managers != 1:
            parts.append(f"{self.managers} managers")
        if self.processes != 1:
            parts.append(f"{self.processes} processes")
        if self.variant:
            if (
                self.library != "trioq"
                or self.variant == BASELINE
                or self.variant.startswith(GLOBAL)
            ):
                parts.append(self.variant)
            else:
                parts.append(f"prototype {self.variant}")
        return ", ".join(parts)


@dataclass
class Options:
    dsn: str
    jobs: int
    concurrency: list[int]
    pgqueuer_batches: list[int]
    pgqueuer_unlimited: bool
    pgqueuer_loops: list[str]
    pgqueuer_managers: list[int]
    pgbench_batches: list[int]
    pgbench_clients: list[int]
    libraries: list[str]
    repeat: int
    venvs: Path
    fresh_venvs: bool
    remove_venvs: bool
    python: str
    quiet_cores: float
    quiet_wait: float
    timeout: float
    py_spy: Path | None
    cprofile: Path | None
    trioq_stats: bool
    trioq_prototypes: list[str]
    json: Path | None
    trioq_baseline: Path | None = None
    trioq_global_concurrency: int | None = None
    #: Worker processes per drain, each with the cell's settings (trioq and pgqueuer).
    processes: list[int] = field(default_factory=lambda: [1])
    pgbench: str | None = None
    pythons: dict[str, str] = field(default_factory=dict)


# -- the machine --------------------------------------------------------------------------------


# -- venvs --------------------------------------------------------------------------------------


def ensure_venv(opts: Options, lib: Library) -> str:
    """The Python of ``lib``'s throwaway venv, created (or re-created) from its pins."""
    assert lib.requirements is not None
    requirements = PEERS / lib.requirements
    pins = requirements.read_text()
    venv = opts.venvs / lib.name
    stamp = venv / "bench-peers-requirements.txt"
    python = venv / "bin" / "python"
    if opts.fresh_venvs or not stamp.is_file() or stamp.read_text() != pins:
        print(f"creating venv {venv} ({lib.requirements}) ...", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([opts.python, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--quiet"]
        done = subprocess.run(
            [*pip, "-r", str(requirements)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"pip install -r {requirements} failed:\n{done.stderr[-3000:]}")
        stamp.write_text(pins)
    return str(python)


def library_versions(python: str, script: str) -> dict[str, Any]:
    out = subprocess.run(
        [python, script, "versions"], cwd=PEERS, capture_output=True, text=True, check=True
    ).stdout
    for line in out.splitlines():
        if line.startswith("VERSIONS "):
            return dict(json.loads(line.removeprefix("VERSIONS ")))
    raise RuntimeError(f"{script} versions printed no VERSIONS line: {out!r}")


# -- databases ----------------------------------------------------------------------------------


def db_uri(admin_dsn: str, dbname: str) -> str:
    """A postgresql:// URI for ``dbname`` on the admin DSN's server (asyncpg wants a URI)."""
    params = conninfo_to_dict(admin_dsn)
    user = urllib.parse.quote(str(params.get("user", "")), safe="")
    password = params.get("password")
    auth = f"{user}:{urllib.parse.quote(str(password), safe='')}@" if password else f"{user}@"
    host = str(params.get("host", ""))
    port = params.get("port")
    query = {}
    if host.startswith("/"):
        query["host"], host = host, ""
    netloc = auth + host + (f":{port}" if port and host else "")
    if port and not host:
        query["port"] = str(port)
    tail = f"?{urllib.parse.urlencode(query)}" if query else ""
    return f"postgresql://{netloc}/{urllib.parse.quote(dbname)}{tail}"


async def create_db(admin_dsn: str, name: str) -> str:
    """An empty database ``name`` (each library installs its own schema); its URI."""
    await create_database(admin_dsn, name)
    return db_uri(admin_dsn, name)


async def server_info(admin_dsn: str) -> dict[str, Any]:
    async with await trioq.connect(admin_dsn, autocommit=True) as conn:
        return await show_settings(
            conn, ("server_version", "server_version_num", "fsync", "synchronous_commit",
                   "full_page_writes", "shared_buffers", "max_connections"),
        )  # fmt: skip


# -- processes ----------------------------------------------------------------------------------


def trioq_path(opts: Options, cell: Cell) -> Path | None:
    """Where a trioq worker imports trioq from: this checkout, or ``--trioq-baseline``.

    Not the installed trioq: a copy of the repository (``cp -a`` or ``git worktree``)
    then measures its own code, even while the working tree is being edited.
    """
    if cell.library not in ("trioq", "pgbench"):
        return None
    return opts.trioq_baseline if cell.variant == BASELINE else HERE.parent


def peer_env(pythonpath: Path | None = None) -> dict[str, str]:
    """The workers' environment; ``pythonpath`` shadows the installed trioq."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONUNBUFFERED"] = "1"
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return env


async def run_checked(cmd: Sequence[str], env: dict[str, str] | None = None) -> str:
    done = await trio.run_process(
        list(cmd), cwd=PEERS, env=env or peer_env(), capture_stdout=True, capture_stderr=True,
        check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd[:3])} ... failed ({done.returncode}):\n"
            f"{done.stdout.decode()[-2000:]}\n{done.stderr.decode()[-4000:]}"
        )
    return done.stdout.decode()


class Lines:
    """Lines of a child's stdout, one at a time."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = b""
        self.seen: list[str] = []

    async def expect(self, prefix: str) -> list[str]:
        """The rest of the next line that starts with ``prefix``."""
        return (await self.expect_any((prefix,)))[1]

    async def expect_any(self, prefixes: Sequence[str]) -> tuple[str, list[str]]:
        """The next line that starts with one of ``prefixes``: that prefix and the rest."""
        while True:
            while b"\n" not in self._buffer:
                chunk = await self._stream.receive_some(65536)
                if not chunk:
                    raise EOFError(f"worker exited before printing {prefixes}: {self.seen}")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\n", 1)
            line = raw.decode().strip()
            self.seen.append(line)
            kind, *rest = line.split() or [""]
            if kind in prefixes:
                return kind, rest

    async def rest(self) -> list[str]:
        """Every line still to come, until the child closes its stdout."""
        while chunk := await self._stream.receive_some(65536):
            self._buffer += chunk
        lines = [x.strip() for x in self._buffer.decode().splitlines() if x.strip()]
        self._buffer = b""
        self.seen += lines
        return lines


@dataclass
class Drain:
    elapsed: float
    worker_cpu: float | None
    machine_cores: float
    calls: int
    distinct: int
    tail: float  # from the last handler call to "no unfinished job"
    stats: dict[str, Any] | None = None  # trioq_worker.py --stats


async def drain(
    cmd: Sequence[str], dsn: str, lib: Library, limit_s: float, env: dict[str, str]
) -> Drain:
    """Run the worker; time its first handler call to the last committed completion."""
    with tempfile.TemporaryFile() as stderr:
        return await _drain(cmd, dsn, lib, limit_s, stderr, env=env)


async def drain_many(
    cmds: Sequence[Sequence[str]], dsn: str, lib: Library, limit_s: float, env: dict[str, str]
) -> Drain:
    """Run several workers (``--share``: each stops once no job is left); time the first
    handler call of any to the last committed completion; their CPU and calls summed.

    The jobs' table is held in EXCLUSIVE mode (plain reads pass, claims wait) until every
    worker said READY, so that they start claiming together: a worker that started first
    would otherwise take the backlog alone."""
    with contextlib.ExitStack() as stack:
        errs = [stack.enter_context(tempfile.TemporaryFile()) for _ in cmds]
        async with await trioq.connect(dsn, autocommit=True) as poll, \
                await trioq.connect(dsn) as gate:  # fmt: skip
            await scalar(poll, lib.unfinished_sql)  # warm, as in _drain
            await gate.execute(f"LOCK TABLE {lib.table} IN EXCLUSIVE MODE")
            procs = [await trio.lowlevel.open_process(list(cmd), cwd=PEERS, env=env,
                                                      stdout=subprocess.PIPE, stderr=err)
                     for cmd, err in zip(cmds, errs, strict=True)]  # fmt: skip
            lines = [Lines(p.stdout) for p in procs if p.stdout is not None]
            try:
                with trio.fail_after(limit_s):
                    for one in lines:
                        await one.expect("READY")
                    cpu0 = [process_cpu(p.pid) for p in procs]
                    await gate.commit()  # the claims go
                    busy0, seen0 = machine_busy(), time.monotonic()
                    firsts, ends = await _firsts_and_ends(lines)
                    while await scalar(poll, lib.unfinished_sql):  # noqa: ASYNC110
                        await trio.sleep(0.001)
                    t_end = time.monotonic()
                    cpu1 = [process_cpu(p.pid) for p in procs]
                    busy1 = machine_busy()
                    dones = [[int(x) for x in await one.expect("DONE")] for one in lines]
                    for one in lines:
                        await one.rest()
                    for p in procs:
                        await p.wait()
            except Exception as ex:
                tails = [_tail(err) for err in errs]
                seen = [one.seen for one in lines]
                raise RuntimeError(f"drain of {len(cmds)} failed: {ex!r}\n{seen}\n{tails}") from ex
            finally:
                for p in procs:
                    if p.returncode is None:
                        p.kill()
                        await p.wait()
    worker_cpu = None
    if None not in cpu0 and None not in cpu1:
        worker_cpu = sum(c for c in cpu1 if c is not None) - sum(c for c in cpu0 if c is not None)
    return Drain(
        elapsed=t_end - min(firsts),
        worker_cpu=worker_cpu,
        machine_cores=(busy1 - busy0) / max(t_end - seen0, 1e-9),
        calls=sum(calls for calls, _ in dones),
        distinct=sum(distinct for _, distinct in dones),
        tail=t_end - max(ends),
    )


async def _firsts_and_ends(lines: Sequence[Lines]) -> tuple[list[float], list[float]]:
    """Each worker's FIRST (if it got a job) and ALL times."""
    firsts: list[float] = []
    ends: list[float] = []
    for one in lines:  # a process that got no job says ALL 0 without FIRST
        kind, args = await one.expect_any(("FIRST", "ALL"))
        if kind == "FIRST":
            firsts.append(float(args[0]))
            args = await one.expect("ALL")
        ends.append(float(args[0]))
    return firsts, ends


def _tail(err: Any) -> str:
    err.seek(0)
    return str(err.read().decode(errors="replace")[-2000:])


async def _drain(
    cmd: Sequence[str], dsn: str, lib: Library, limit_s: float, stderr: Any, *, env: dict[str, str]
) -> Drain:
    async with await trioq.connect(dsn, autocommit=True) as poll:
        await scalar(poll, lib.unfinished_sql)  # warm: parse and plan before the clock runs
        proc = await trio.lowlevel.open_process(
            list(cmd), cwd=PEERS, env=env, stdout=subprocess.PIPE, stderr=stderr
        )
        assert proc.stdout is not None
        lines = Lines(proc.stdout)
        try:
            with trio.fail_after(limit_s):
                t0, cpu0 = (float(x) for x in await lines.expect("FIRST"))
                busy0, seen0 = machine_busy(), time.monotonic()
                (t_all,) = (float(x) for x in await lines.expect("ALL"))
                while await scalar(poll, lib.unfinished_sql):  # noqa: ASYNC110 - only the db knows
                    await trio.sleep(0.001)
                t_end = time.monotonic()
                cpu1 = process_cpu(proc.pid)
                busy1 = machine_busy()
                calls, distinct = (int(x) for x in await lines.expect("DONE"))
                trailing = await lines.rest()
                await proc.wait()
        except BaseException as ex:
            stderr.seek(0)
            err = stderr.read().decode(errors="replace")[-4000:]
            if not isinstance(ex, Exception):
                raise
            raise RuntimeError(f"{cmd[1]} drain failed: {ex!r}\n{lines.seen}\n{err}") from ex
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    return Drain(
        elapsed=t_end - t0,
        worker_cpu=None if cpu1 is None else cpu1 - cpu0,
        machine_cores=(busy1 - busy0) / max(t_end - seen0, 1e-9),
        calls=calls,
        distinct=distinct,
        tail=t_end - t_all,
        stats=next(
            (json.loads(x.removeprefix("STATS ")) for x in trailing if x.startswith("STATS ")),
            None,
        ),
    )


# -- pgbench ------------------------------------------------------------------------------------


async def pgbench_drain(
    pgbench: str, dsn: str, script: Path, *, jobs: int, batch: int, clients: int
) -> tuple[Drain, str]:
    per_client = -(-jobs // (batch * clients))  # the last claims come back short or empty
    cmd = pgbench_drain_command(
        pgbench, script, dsn, clients=clients, transactions=per_client, batch=batch, queue="bench"
    )
    cpu0, busy0, t0 = children_cpu(), machine_busy(), time.monotonic()
    done = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, check=False)
    cpu1, busy1, t1 = children_cpu(), machine_busy(), time.monotonic()
    elapsed = per_client * clients / pgbench_tps(done)
    cpu = cpu1 - cpu0
    return Drain(
        elapsed=elapsed,
        worker_cpu=cpu,
        machine_cores=(busy1 - busy0) / (t1 - t0),
        calls=jobs,
        distinct=jobs,
        tail=0.0,
    ), shlex.join([*cmd[:-1], "<dsn>"])


# -- one measurement ----------------------------------------------------------------------------


def worker_command(opts: Options, cell: Cell, dsn: str, tag: str) -> list[str]:
    lib = LIBRARIES[cell.library]
    python = opts.pythons[cell.library]
    cmd = [python, lib.script, "drain", "--dsn", dsn, "--jobs", str(opts.jobs)]
    if cell.library == "trioq":
        assert cell.concurrency is not None
        cmd += ["--concurrency", str(cell.concurrency)]
        if opts.cprofile:
            cmd += ["--cprofile", str(opts.cprofile / f"{tag}.prof")]
        if opts.trioq_stats:
            cmd += ["--stats"]
        if cell.variant.startswith(GLOBAL):
            cmd += ["--global-concurrency", cell.variant.removeprefix(GLOBAL)]
        elif cell.variant and cell.variant != BASELINE:
            cmd += ["--prototype", cell.variant]
        if opts.py_spy:
            py_spy = shutil.which("py-spy") or str(Path(VENV_PYTHON).parent / "py-spy")
            out = opts.py_spy / f"{tag}.txt"  # collapsed stacks: flamegraph.pl / speedscope
            cmd = [py_spy, "record", "--nonblocking", "--idle", "--rate", "250", "--format",
                   "raw", "-o", str(out), "--", *cmd]  # fmt: skip
    elif cell.library == "pgqueuer":
        assert cell.batch is not None
        cmd += ["--batch", str(cell.batch), "--concurrency", str(cell.concurrency or 0)]
        cmd += ["--loop", cell.variant or "uvloop", "--managers", str(cell.managers)]
    else:
        assert cell.processes == 1
        assert cell.concurrency is not None
        cmd += ["--concurrency", str(cell.concurrency)]
    if cell.processes > 1:
        cmd += ["--share"]
    return cmd


async def measure(opts: Options, cell: Cell, rep: int) -> dict[str, Any]:
    lib = LIBRARIES[cell.library]
    python = opts.pythons[cell.library]
    others = await wait_quiet(opts.quiet_cores, opts.quiet_wait)
    dbname = DB_PREFIX + cell.library
    dsn = await create_db(opts.dsn, dbname)
    env = peer_env(trioq_path(opts, cell))
    try:
        await run_checked([python, lib.script, "install", "--dsn", dsn], env)
        out = await run_checked(
            [python, lib.script, "prefill", "--dsn", dsn, "--jobs", str(opts.jobs)], env
        )
        prefill_s = float(re.findall(r"^PREFILLED ([\d.]+)", out, re.M)[-1])
        async with await trioq.connect(dsn, autocommit=True) as conn:
            await conn.execute("VACUUM ANALYZE")
            await conn.execute("CHECKPOINT")
            waiting = await scalar(conn, lib.waiting_sql)
        if waiting != opts.jobs:
            raise RuntimeError(f"{cell.label}: {waiting} jobs wait after prefill, not {opts.jobs}")
        command = ""
        if cell.library == "pgbench":
            assert opts.pgbench is not None and cell.batch and cell.concurrency
            script = opts.venvs / "pgbench-drain.sql"
            script.write_text(pgbench_drain_script())
            result, command = await pgbench_drain(
                opts.pgbench, dsn, script, jobs=opts.jobs, batch=cell.batch,
                clients=cell.concurrency,
            )  # fmt: skip
        else:
            tag = f"{cell.library}-c{cell.concurrency or 'unl'}-b{cell.batch or 0}-r{rep}"
            if cell.processes == 1:
                cmd = worker_command(opts, cell, dsn, tag)
                result = await drain(cmd, dsn, lib, opts.timeout, env)
            else:
                cmds = [worker_command(opts, cell, dsn, f"{tag}-p{i}")
                        for i in range(cell.processes)]  # fmt: skip
                result = await drain_many(cmds, dsn, lib, opts.timeout, env)
        async with await trioq.connect(dsn, autocommit=True) as conn:
            unfinished = await scalar(conn, lib.unfinished_sql)
            succeeded = await scalar(conn, lib.succeeded_sql.format(jobs=opts.jobs))
    finally:
        await drop_bench_db(opts.dsn, dbname)
    problems = []
    if unfinished:
        problems.append("jobs left unfinished")
    if succeeded != opts.jobs:
        problems.append(f"{succeeded} jobs succeeded, not {opts.jobs}")
    if result.calls != opts.jobs or result.distinct != opts.jobs:
        problems.append(f"{result.calls} handler calls for {result.distinct} distinct jobs")
    row = {
        "cell": asdict(cell),
        "label": cell.label,
        "repetition": rep,
        "jobs": opts.jobs,
        "jobs_s": opts.jobs / result.elapsed,
        "elapsed_s": result.elapsed,
        "tail_ms": result.tail * 1e3,
        "worker_cpu_s": result.worker_cpu,
        "worker_us_job": None if result.worker_cpu is None else result.worker_cpu / opts.jobs * 1e6,
        "worker_cores": None if result.worker_cpu is None else result.worker_cpu / result.elapsed,
        "machine_cores": result.machine_cores,
        "others_before": others,
        "prefill_s": prefill_s,
        "problems": problems,
        "profiled": bool(
            cell.library == "trioq" and (opts.py_spy or opts.cprofile or opts.trioq_stats)
        ),
    }
    if result.stats is not None:
        row["trioq_stats"] = result.stats
    if command:
        row["command"] = command
    return row


def cells(opts: Options) -> list[Cell]:
    out: list[Cell] = []
    for name in opts.libraries:
        if name == "trioq":
            out += [Cell("trioq", c, None) for c in opts.concurrency]
            out += [
                Cell("trioq", c, None, proto)
                for proto in opts.trioq_prototypes
                for c in opts.concurrency
            ]
            if opts.trioq_baseline is not None:
                out += [Cell("trioq", c, None, BASELINE) for c in opts.concurrency]
            if opts.trioq_global_concurrency is not None:
                variant = f"{GLOBAL}{opts.trioq_global_concurrency}"
                out += [Cell("trioq", c, None, variant) for c in opts.concurrency]
        elif name == "pgqueuer":
            for loop in opts.pgqueuer_loops:
                for c in opts.concurrency:
                    # pgqueuer refuses max_concurrent_tasks < 2 x batch_size
                    allowed = {b for b in opts.pgqueuer_batches if 2 * b <= c} | {c // 2}
                    out += [Cell("pgqueuer", c, b, loop) for b in sorted(allowed) if b >= 1]
                if opts.pgqueuer_unlimited:
                    out += [Cell("pgqueuer", None, b, loop) for b in opts.pgqueuer_batches]
                out += [
                    Cell("pgqueuer", None, b, loop, managers=m)
                    for m in opts.pgqueuer_managers
                    if m > 1
                    for b in opts.pgqueuer_batches
                ]
        elif name == "procrastinate":
            out += [Cell("procrastinate", c, None) for c in opts.concurrency]
        elif name == "pgbench":
            out += [
                Cell("pgbench", clients, b)
                for clients in opts.pgbench_clients
                for b in opts.pgbench_batches
            ]
    # trioq and pgqueuer also at --processes: that many worker processes, each as the cell
    single = [c for c in out if c.library in ("trioq", "pgqueuer")]
    return out + [replace(c, processes=n) for n in opts.processes if n > 1 for c in single]


# -- the report ---------------------------------------------------------------------------------


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell: medians over repetitions, with the min-max of jobs/s."""
    by_label: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_label.setdefault(row["label"], []).append(row)
    out = []
    keys = ("elapsed_s", "tail_ms", "worker_us_job", "worker_cores", "machine_cores",
            "others_before", "prefill_s")  # fmt: skip
    for label, runs in by_label.items():
        rates = [r["jobs_s"] for r in runs]
        out.append({
            "label": label, "cell": runs[0]["cell"], "n": len(runs),
            "jobs_s": statistics.median(rates), "min": min(rates), "max": max(rates),
            **medians(runs, keys),
            "problems": sorted({p for r in runs for p in r["problems"]}),
            "profiled": any(r["profiled"] for r in runs),
        })  # fmt: skip
    for row in out:
        row["vs_trioq"] = ratio_to_trioq(row, out)
    return out


def ratio_to_trioq(row: dict[str, Any], rows: list[dict[str, Any]]) -> float | None:
    """jobs/s over trioq's at the same concurrency; rows without one: over trioq's best."""
    trioq_rows = [r for r in rows if r["cell"]["library"] == "trioq" and not r["cell"]["variant"]]
    if not trioq_rows:
        return None
    c, n = row["cell"]["concurrency"], row["cell"].get("processes", 1)
    same = [r for r in trioq_rows if r["cell"]["concurrency"] == c
            and r["cell"].get("processes", 1) == n]  # fmt: skip
    if row["cell"]["library"] in ("trioq", "pgqueuer", "procrastinate") and same:
        return float(row["jobs_s"] / same[0]["jobs_s"])
    return float(row["jobs_s"] / max(r["jobs_s"] for r in trioq_rows))


SUMMARY_TABLE = Table(
    (
        ("library, concurrency, batch", 38, "<"),
        ("jobs/s", 8, ">"),
        ("min-max", 13, ">"),
        ("vs trioq", 8, ">"),
        ("drain s", 7, ">"),
        ("tail ms", 7, ">"),
        ("worker us/job", 13, ">"),
        ("worker cores", 12, ">"),
        ("box cores", 9, ">"),
        ("others", 6, ">"),
    )
)


def summary_cells(row: dict[str, Any]) -> list[str]:
    return [
        row["label"],
        fmt(row["jobs_s"]),
        f"{row['min']:,.0f}-{row['max']:,.0f}",
        fmt(row["vs_trioq"], ".2f"),
        fmt(row["elapsed_s"], ".2f"),
        fmt(row["tail_ms"], ".1f"),
        fmt(row["worker_us_job"], ".0f"),
        fmt(row["worker_cores"], ".2f"),
        fmt(row["machine_cores"], ".2f"),
        fmt(row["others_before"], ".2f"),
    ]


def print_report(report: dict[str, Any]) -> None:
    env = report["environment"]
    server = env["server"]
    print()
    print(f"host: {env['cpus']} CPUs, {env['platform']}; Python {env['python']}")
    print(
        f"PostgreSQL {server['server_version']}: fsync={server['fsync']} "
        f"synchronous_commit={server['synchronous_commit']} "
        f"full_page_writes={server['full_page_writes']} shared_buffers={server['shared_buffers']}"
    )
    if server["fsync"] == "off":
        print("NOTE: fsync=off on this server: commits cost no disk flush.")
    for name, versions in env["versions"].items():
        shown = ", ".join(f"{k} {v}" for k, v in versions.items() if v)
        print(f"{name}: {shown}")
    if env.get("pgbench_version"):
        print(f"pgbench: {env['pgbench']} ({env['pgbench_version']})")
    print(f"{report['options']['jobs']:,} no-op jobs per drain, one worker process per library "
          "(\", N processes\": N)")
    print()
    print("\n".join(SUMMARY_TABLE.heading()))
    for row in report["summary"]:
        flag = " PROFILED" if row["profiled"] else ""
        flag += (" !! " + "; ".join(row["problems"])) if row["problems"] else ""
        print(SUMMARY_TABLE.row(*summary_cells(row)) + flag)
    print()
    print(
        "jobs/s: median over repetitions (min-max). vs trioq: over trioq at the same concurrency\n"
        "(unlimited pgqueuer and pgbench: over trioq's best). drain s: first handler call to the\n"
        "last committed completion; tail ms: last handler call to that commit. worker us/job,\n"
        "worker cores: CPU of the worker process (pgbench: of pgbench) during the drain. box\n"
        "cores: the whole machine during the drain (worker + Postgres + anything else); others:\n"
        "cores used by other processes just before the drain."
    )
    for fail in report.get("failed", []):
        print(f"FAILED: {fail['label']} (repetition {fail['repetition']}): {fail['error'][:300]}")
    verdict = report.get("verdict")
    if verdict:
        print()
        print(verdict)
    for cmd in report.get("pgbench_commands", []):
        print(f"pgbench command: {cmd}")


def print_stats(st: dict[str, Any]) -> None:
    """One trioq worker's statement statistics (``--trioq-stats``)."""
    wall = st["wall_s"] or 1e-9
    for kind in ("claim", "complete", "submit"):
        k = st[kind]
        print(
            f"    {kind:8} {k['calls']:6} calls  {k['rows_per_call']:6.1f} rows/call  "
            f"median {k['median_ms']:6.2f} ms  in flight {k['busy_s'] / wall:6.1%} of the drain"
        )
    print(
        f"    claim or complete in flight {st['claim_or_complete_busy_s'] / wall:.1%}, both at "
        f"once {st['claim_and_complete_overlap_s'] / wall:.1%}; claim sizes p10/p50/p90 "
        f"{st['claim_sizes_pct']}"
    )


def make_verdict(summary: list[dict[str, Any]]) -> str | None:
    trioq_rows = [
        r
        for r in summary
        if r["cell"]["library"] == "trioq" and not r["profiled"] and not r["cell"]["variant"]
    ]
    pgq_rows = [r for r in summary if r["cell"]["library"] == "pgqueuer"]
    if not trioq_rows or not pgq_rows:
        return None
    best_t = max(trioq_rows, key=lambda r: r["jobs_s"])
    best_p = max(pgq_rows, key=lambda r: r["jobs_s"])
    ratio = best_t["jobs_s"] / best_p["jobs_s"]
    state = "MEETS" if ratio >= TARGET_RATIO else "MISSES"
    verdict = (
        f"trioq best {best_t['jobs_s']:,.0f} jobs/s ({best_t['label']}) / pgqueuer best "
        f"{best_p['jobs_s']:,.0f} jobs/s ({best_p['label']}) = {ratio:.2f}: {state} the "
        f"target of {TARGET_RATIO:.1f}x. (Reference pgqueuer numbers on this kind of box: "
        f"{PGQUEUER_REFERENCE[10]:,} jobs/s batch 10, {PGQUEUER_REFERENCE[100]:,} batch 100.)"
    )
    ceiling = [r for r in summary if r["cell"]["library"] == "pgbench"]
    if ceiling:
        best_c = max(ceiling, key=lambda r: r["jobs_s"])
        share = best_t["jobs_s"] / best_c["jobs_s"]
        verdict += (
            f" trioq best / pgbench ceiling {best_c['jobs_s']:,.0f} jobs/s ({best_c['label']})"
            f" = {share:.0%}: {'MEETS' if share >= CEILING_SHARE else 'MISSES'} the target of "
            f"{CEILING_SHARE:.0%}."
        )
    baseline = [r for r in summary if r["cell"]["variant"] == BASELINE and not r["profiled"]]
    if baseline:
        best_b = max(baseline, key=lambda r: r["jobs_s"])
        verdict += (
            f" Baseline best {best_b['jobs_s']:,.0f} jobs/s ({best_b['label']}) / pgqueuer best"
            f" = {best_b['jobs_s'] / best_p['jobs_s']:.2f}; working tree / baseline ="
            f" {best_t['jobs_s'] / best_b['jobs_s']:.2f}."
        )
    return verdict


# -- main ---------------------------------------------------------------------------------------


async def bench(opts: Options, env: dict[str, Any]) -> dict[str, Any]:
    todo = cells(opts)
    rows: list[dict[str, Any]] = []
    pgbench_commands: list[str] = []
    failed: list[dict[str, Any]] = []
    total = len(todo) * opts.repeat
    for rep in range(opts.repeat):
        shift = rep % len(todo)
        order = todo[shift:] + todo[:shift]  # a different library goes first each repetition
        for cell in order:
            try:
                row = await measure(opts, cell, rep)
            except Exception as ex:
                print(f"[{cell.label}] FAILED: {ex}", flush=True)
                failed.append({"label": cell.label, "repetition": rep, "error": str(ex)})
                continue
            rows.append(row)
            if "command" in row and row["command"] not in pgbench_commands:
                pgbench_commands.append(row["command"])
            extra = " !! " + "; ".join(row["problems"]) if row["problems"] else ""
            print(
                f"[{len(rows) + len(failed)}/{total}] {cell.label:38} "
                f"{row['jobs_s']:>9,.0f} jobs/s  "
                f"drain {row['elapsed_s']:.2f} s  others {row['others_before']:.2f}{extra}",
                flush=True,
            )
            if "trioq_stats" in row:
                print_stats(row["trioq_stats"])
    summary = summarize(rows)
    position = {c.label: i for i, c in enumerate(todo)}
    summary.sort(key=lambda r: position[r["label"]])
    return {
        "environment": env,
        "runs": rows,
        "failed": failed,
        "summary": summary,
        "verdict": make_verdict(summary),
        "pgbench_commands": pgbench_commands,
    }


def parse_args(argv: Sequence[str] | None = None) -> Options:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_common_options(
        p, creates=f"databases {DB_PREFIX}<library>", repeat=1, quiet_cores=0.3, quiet_wait=60.0,
        pgbench=True,
    )  # fmt: skip
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--concurrency", type=int_list, default=[10, 100])
    p.add_argument("--pgqueuer-batches", type=int_list, default=[10, 100])
    p.add_argument(
        "--no-pgqueuer-unlimited", action="store_true",
        help="skip pgqueuer without max_concurrent_tasks (its default)",
    )  # fmt: skip
    p.add_argument("--pgqueuer-loops", default="uvloop", help="comma list of: uvloop, asyncio")
    p.add_argument(
        "--pgqueuer-managers", type=int_list, default=[10],
        help="also run pgqueuer unlimited with this many QueueManagers in its process",
    )  # fmt: skip
    p.add_argument("--pgbench-batches", type=int_list, default=[10, 100])
    p.add_argument("--pgbench-clients", type=int_list, default=[1])
    p.add_argument("--processes", type=int_list, default=[1],
                   help="comma list: also run trioq's and pgqueuer's cells with this many worker "
                   "processes, each with the cell's settings (1: one process, as always)")
    p.add_argument("--libraries", default="trioq,pgqueuer,procrastinate,pgbench")
    p.add_argument("--venvs", type=Path, default=Path(tempfile.gettempdir()) / "trioq-bench-peers")
    p.add_argument("--fresh-venvs", action="store_true", help="re-create the venvs")
    p.add_argument("--remove-venvs", action="store_true", help="delete the venvs at the end")
    p.add_argument("--python", default="python3", help="interpreter for `-m venv`")
    p.add_argument("--timeout", type=float, default=300.0, help="per drain, seconds")
    p.add_argument(
        "--py-spy", type=Path, help="py-spy the trioq worker (collapsed stacks) into DIR"
    )
    p.add_argument("--cprofile", type=Path, help="cProfile the trioq worker into DIR")
    p.add_argument(
        "--trioq-prototypes", default="",
        help="also measure trioq with these bench/peers/trioq_prototypes.py changes: comma "
        "list of NAME[+NAME] (all retired: the runtime has them; see --trioq-baseline)",
    )  # fmt: skip
    p.add_argument(
        "--trioq-stats", action="store_true",
        help="instrument the trioq worker's claim/complete statements (see trioq_worker.py)",
    )  # fmt: skip
    p.add_argument(
        "--trioq-baseline", type=Path,
        help="also measure the trioq package in DIR/trioq (PYTHONPATH=DIR), e.g. "
        "`git archive COMMIT trioq | tar -x -C DIR`, interleaved with the working tree",
    )  # fmt: skip
    p.add_argument(
        "--trioq-global-concurrency", type=int, metavar="N",
        help="also measure trioq with a global concurrency limit of N on the queue (the "
        "limited claim; N above --concurrency measures its cost alone)",
    )  # fmt: skip
    a = p.parse_args(argv)
    libraries = [x for x in a.libraries.split(",") if x]
    unknown = set(libraries) - set(LIBRARIES)
    if unknown:
        p.error(f"unknown libraries: {sorted(unknown)}")
    return Options(
        dsn=a.dsn, jobs=a.jobs, concurrency=a.concurrency, pgqueuer_batches=a.pgqueuer_batches,
        pgqueuer_unlimited=not a.no_pgqueuer_unlimited,
        pgqueuer_loops=[x for x in a.pgqueuer_loops.split(",") if x],
        pgqueuer_managers=a.pgqueuer_managers,
        pgbench_batches=a.pgbench_batches, pgbench_clients=a.pgbench_clients,
        libraries=libraries, repeat=a.repeat, venvs=a.venvs, fresh_venvs=a.fresh_venvs,
        remove_venvs=a.remove_venvs, python=a.python, quiet_cores=a.quiet_cores,
        quiet_wait=a.quiet_wait, timeout=a.timeout, py_spy=a.py_spy, cprofile=a.cprofile,
        trioq_stats=a.trioq_stats, processes=a.processes,
        trioq_prototypes=[x for x in a.trioq_prototypes.split(",") if x],
        json=a.json, pgbench=a.pgbench, trioq_baseline=a.trioq_baseline,
        trioq_global_concurrency=a.trioq_global_concurrency,
    )  # fmt: skip


def prepare(opts: Options) -> dict[str, Any]:
    """Venvs, versions and the pgbench binary; returns the environment for the report."""
    server = trio.run(server_info, opts.dsn)
    env: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "server": server,
        "versions": {},
        "venv_python": subprocess.run(
            [opts.python, "--version"], capture_output=True, text=True, check=False
        ).stdout.strip(),
    }
    for name in opts.libraries:
        lib = LIBRARIES[name]
        python = VENV_PYTHON if lib.requirements is None else ensure_venv(opts, lib)
        opts.pythons[name] = python
        if name != "pgbench":
            env["versions"][name] = library_versions(python, lib.script)
    if "pgbench" in opts.libraries:
        major = int(server["server_version_num"]) // 10000
        opts.pgbench = find_pgbench(opts.pgbench, major)
        if opts.pgbench is None:
            print("pgbench not found: skipping the raw SQL ceiling", flush=True)
            opts.libraries.remove("pgbench")
        else:
            env["pgbench"] = opts.pgbench
            env["pgbench_version"] = pgbench_version(opts.pgbench)
            env["pgbench_script"] = pgbench_drain_script()
    for directory in (opts.venvs, opts.py_spy, opts.cprofile):
        if directory:
            directory.mkdir(parents=True, exist_ok=True)
    return env


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    target = conninfo_to_dict(opts.dsn)
    print(
        f"peer comparison against {target.get('host', 'local socket')}:{target.get('port', 5432)}"
        f" (databases {DB_PREFIX}<library>, created and dropped per measurement)",
        flush=True,
    )
    try:
        env = prepare(opts)
        for name, versions in env["versions"].items():
            print(f"  {name}: {versions}", flush=True)
        report = trio.run(bench, opts, env)
    except psycopg.OperationalError as ex:
        print(f"cannot reach Postgres at {opts.dsn}: {ex}", file=sys.stderr)
        return 2
    finally:
        if opts.remove_venvs:
            shutil.rmtree(opts.venvs, ignore_errors=True)
    report["options"] = {
        k: str(v) if isinstance(v, Path) else v
        for k, v in asdict(opts).items()
        if k not in ("dsn", "pythons")
    }
    print_report(report)
    if opts.json:
        write_json(opts.json, report)
        print(f"wrote {opts.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
