"""Real ``trioq serve`` processes: signals, SIGKILL recovery, the demo on embedded Postgres."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg.sql
import pytest
from clitool import cli_env, read_until

import trioq  # noqa: F401 - the subprocesses import it; fail early here if broken


def _app_env(dsn: str, **app: str) -> dict[str, str]:
    """For ``trioq serve --app serve_app:config`` on ``dsn``: ``app`` are serve_app's
    settings (``grace="0.5"`` is ``APP_GRACE``)."""
    return cli_env({f"APP_{k.upper()}": v for k, v in app.items()}, dsn=dsn, apps=True)


def _start(dsn: str, **app: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "trioq._cli", "serve", "--app", "serve_app:config", "--migrate"],
        env=_app_env(dsn, **app),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=0,
    )


def _setup(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE runs (job_id bigint, attempt int, pid int, at timestamptz DEFAULT now())"
        )
        subprocess.run(
            [sys.executable, "-m", "trioq._cli", "migrate", "--dsn", dsn], check=True, timeout=60
        )


def _enqueue(dsn: str, n: int, first_seconds: float, then_seconds: float = 0) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "INSERT INTO trioq.jobs (task, queue, args)"
            " SELECT 'sleepy', 'default', jsonb_build_object('first_seconds', %s::float,"
            " 'then_seconds', %s::float) FROM generate_series(1, %s) RETURNING id",
            (first_seconds, then_seconds, n),
        ).fetchall()
        conn.execute("SELECT pg_notify('trioq_trioq', 'default')")
    return [r[0] for r in rows]


def _query(dsn: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def _wait_for(dsn: str, sql: str, expected: Any, timeout: float = 30) -> float:
    """Poll the database until ``sql`` returns ``expected``; return the seconds it took."""
    start = time.monotonic()
    while True:
        got = _query(dsn, sql)
        if got == expected:
            return time.monotonic() - start
        assert time.monotonic() - start < timeout, f"{sql!r} gave {got!r}, wanted {expected!r}"
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout: float = 30) -> str:
    if proc.poll() is None:
        proc.send_signal(sig)
    out, _ = proc.communicate(timeout=timeout)
    return out


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def test_schema_on_the_command_line_wins_over_the_apps(
    dsn: str, procs: list[subprocess.Popen[str]]
) -> None:
    """``--app serve_app:config`` is a Config for schema trioq; ``--schema elsewhere`` serves
    elsewhere: the job enqueued there runs, the one in trioq does not (issue 21: the option
    was dropped silently when the app was a Config)."""
    _setup(dsn)  # migrates schema trioq
    proc = subprocess.Popen(
        [sys.executable, "-m", "trioq._cli", "serve", "--app", "serve_app:config",
         "--schema", "elsewhere", "--migrate"],
        env=_app_env(dsn), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=0,
    )  # fmt: skip
    procs.append(proc)
    read_until(proc, "schema elsewhere")  # the banner says which
    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in ("trioq", "elsewhere"):
            conn.execute(
                psycopg.sql.SQL(
                    "INSERT INTO {}.jobs (task, queue, args)"
                    " VALUES ('sleepy', 'default', '{{\"first_seconds\": 0}}')"
                ).format(psycopg.sql.Identifier(schema))
            )
        conn.execute("SELECT pg_notify('trioq_elsewhere', 'default')")
    _wait_for(dsn, "SELECT count(*) FROM elsewhere.jobs", [(0,)])
    assert _query(dsn, "SELECT count(*) FROM runs") == [(1,)]
    assert _query(dsn, "SELECT state FROM trioq.jobs") == [("available",)]
    out = _stop(proc)
    assert proc.returncode == 0, out


def test_sigterm_stops_gracefully_and_releases_unfinished_jobs(
    dsn: str, procs: list[subprocess.Popen[str]]
) -> None:
    _setup(dsn)
    proc = _start(dsn, grace="0.5")
    procs.append(proc)
    _enqueue(dsn, 10, first_seconds=600)
    _wait_for(dsn, "SELECT count(*) FROM runs", [(10,)])
    start = time.monotonic()
    out = _stop(proc)
    assert proc.returncode == 0, out
    assert time.monotonic() - start < 10
    assert _query(dsn, "SELECT state, attempt, count(*) FROM trioq.jobs GROUP BY 1, 2") == [
        ("available", 0, 10)
    ]


def test_second_signal_skips_the_grace(dsn: str, procs: list[subprocess.Popen[str]]) -> None:
    _setup(dsn)
    proc = _start(dsn, grace="600")
    procs.append(proc)
    _enqueue(dsn, 3, first_seconds=600)
    _wait_for(dsn, "SELECT count(*) FROM runs", [(3,)])
    proc.send_signal(signal.SIGINT)  # graceful: would wait up to 600 s for the jobs
    # trio coalesces a signal that arrives again before it is read: wait for the first.
    read_until(proc, "stopping: waiting up to 600")
    start = time.monotonic()
    out = _stop(proc, signal.SIGINT)
    assert proc.returncode == 0, out
    assert time.monotonic() - start < 10
    assert _query(dsn, "SELECT count(*) FROM trioq.jobs WHERE state = 'running'") == [(0,)]


def test_sigkilled_worker_jobs_are_picked_up_by_another(
    dsn: str, procs: list[subprocess.Popen[str]]
) -> None:
    _setup(dsn)
    fast = {"lease": "1.5", "heartbeat": "0.3", "sweep": "0.3"}
    victim = _start(dsn, **fast)
    procs.append(victim)
    ids = _enqueue(dsn, 8, first_seconds=600, then_seconds=0)
    _wait_for(dsn, "SELECT count(*) FROM runs", [(8,)])
    victim.kill()
    victim.communicate(timeout=30)
    rescuer = _start(dsn, **fast)
    procs.append(rescuer)
    recovery = _wait_for(dsn, "SELECT count(*) FROM trioq.jobs", [(0,)], timeout=60)
    print(f"recovered 8 jobs of a SIGKILLed worker in {recovery:.2f} s")
    runs = _query(dsn, "SELECT job_id, attempt, pid FROM runs ORDER BY job_id, attempt")
    assert sorted({r[0] for r in runs}) == sorted(ids)
    for job_id in ids:
        mine = [(a, pid) for j, a, pid in runs if j == job_id]
        assert [a for a, _ in mine] == [1, 2], mine  # the crash spent attempt 1
        assert mine[0][1] == victim.pid and mine[1][1] == rescuer.pid
    assert _query(dsn, "SELECT count(*) FROM trioq.dead_jobs") == [(0,)]
    _stop(rescuer)


def test_demo_runs_on_the_embedded_postgres() -> None:
    root = tempfile.mkdtemp(prefix="trioq-demo-")
    os.chmod(root, 0o711)  # the server may run as another user (root runs it as postgres)
    env = {k: v for k, v in os.environ.items() if k not in ("TRIOQ_DSN", "DATABASE_URL")}
    env["TRIOQ_EMBEDDED_DIR"] = os.path.join(root, "pg")
    try:
        out = subprocess.run(
            [sys.executable, "-m", "trioq._cli", "demo", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["embedded"] is True
        assert report["enqueued"] == report["completed"] + report["dead"] > 0
        assert "hello, ada" in out.stderr
    finally:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "trioq._cli",
                "db",
                "stop",
                "--data-dir",
                env["TRIOQ_EMBEDDED_DIR"],
            ],
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        shutil.rmtree(root, ignore_errors=True)


def test_processes_flag_runs_supervised_workers(dsn: str) -> None:
    _setup(dsn)
    env = _app_env(dsn, grace="0.5")
    parent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trioq._cli",
            "serve",
            "--app",
            "serve_app:config",
            "--processes",
            "2",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _enqueue(dsn, 40, first_seconds=600)
        # Both children take jobs (20 slots each).
        _wait_for(dsn, "SELECT count(DISTINCT pid) FROM runs", [(2,)])
        out = _stop(parent)
        assert parent.returncode == 0, out
        assert _query(dsn, "SELECT count(*) FROM trioq.jobs WHERE state = 'running'") == [(0,)]
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.communicate(timeout=30)


def _gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped yet counts: it runs nothing)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_children_stop_when_the_supervisor_is_sigkilled(dsn: str) -> None:
    """The parent of ``--processes 2`` dies by SIGKILL: its children stop on their own,
    gracefully (their running jobs given back at once, not left to their leases), rather
    than run on as orphans beside the parent a process manager starts next."""
    _setup(dsn)
    parent = subprocess.Popen(
        [sys.executable, "-m", "trioq._cli", "serve", "--app", "serve_app:config",
         "--processes", "2"],
        env=_app_env(dsn, grace="0.5", lease="600"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        _enqueue(dsn, 40, first_seconds=600)  # 20 slots each: both take some
        _wait_for(dsn, "SELECT count(DISTINCT pid) FROM runs", [(2,)])
        children = [pid for (pid,) in _query(dsn, "SELECT DISTINCT pid FROM runs")]
        parent.kill()
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while not all(_gone(pid) for pid in children):
            assert time.monotonic() < deadline, f"orphaned workers still run: {children}"
            time.sleep(0.05)
        out = parent.communicate(timeout=30)[0]  # the children shared its output pipe
        assert out.count("the supervisor (pid") == 2, out
        # Given back by the graceful stop: a 600 s lease would keep them running otherwise.
        assert _query(dsn, "SELECT count(*) FROM trioq.jobs WHERE state = 'running'") == [(0,)]
        assert _query(dsn, "SELECT count(*) FROM trioq.jobs WHERE state = 'available'") == [(40,)]
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.communicate(timeout=30)


def test_sigterm_while_connecting_stops_the_worker_gracefully() -> None:
    """The server accepts the connection and never answers: the worker is stuck in its
    start-up. SIGTERM there stops it (exit 0, "received SIGTERM"), instead of killing it
    with the signal's default action (-15), which a supervisor reported as exit 241."""
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        dsn = f"postgresql://nobody@127.0.0.1:{port}/app?connect_timeout=60"
        proc = subprocess.Popen(  # no --migrate: the runtime's own start-up connects
            [sys.executable, "-m", "trioq._cli", "serve", "--app", "serve_app:config"],
            env=_app_env(dsn), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            with server.accept()[0]:  # the worker is connecting now, and waits for an answer
                proc.send_signal(signal.SIGTERM)
                output, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, output
    assert "received SIGTERM" in output, output
