"""``trioq stress``: the real command against the test database, and its verification.

The CLI runs as a subprocess with real worker processes; the verification is also run
directly on a doctored ledger, so a test shows that it fails when a job is lost.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import psycopg
import pytest
from clitool import cli_env, trioq_cli
from psycopg import sql

from trioq._pg.connection import connect
from trioq._stress.faults import Fault, GracefulStop, recovery, recovery_summary
from trioq._stress.ledger import reset, statements
from trioq._stress.load import IdRanges
from trioq._stress.report import EXIT_FAILED, EXIT_OK, EXIT_TIMEOUT, exit_code
from trioq._stress.run import StressOptions
from trioq._stress.verify import verify

SCHEMA = "trioq_stress"


def _stress(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return trioq_cli("stress", *args, timeout=timeout)


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "trioq._cli", "stress", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )


def _report(path: pathlib.Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _verified(
    tmp_path: pathlib.Path, jobs: int, *args: str, env: dict[str, str] | None = None,
    timeout: float = 120,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:  # fmt: skip
    """``trioq stress ARGS --json REPORT``: it exits 0 and its report says all ``jobs`` were
    verified (`_assert_verified`). Its output, and the report."""
    path = tmp_path / "report.json"
    out = trioq_cli("stress", *args, "--json", str(path), env=env, timeout=timeout)
    assert out.returncode == 0, out.stdout + out.stderr
    report = _report(path)
    _assert_verified(report, jobs)
    return out, report


def _assert_verified(report: dict[str, Any], jobs: int) -> None:
    v = report["verification"]
    assert v["passed"] is True, v
    assert (v["enqueued"], v["completed"]) == (jobs, jobs)
    assert (v["lost"], v["duplicate_completions"], v["dead"], v["phantoms"]) == (0, 0, 0, 0)
    assert v["left"] == {}
    assert report["exit_code"] == EXIT_OK


def test_help_has_an_example() -> None:
    out = _stress("--help")
    assert out.returncode == 0, out.stderr
    assert "examples:" in out.stdout and "trioq stress --jobs" in out.stdout
    assert "exit codes" in out.stdout


def test_usage_errors_exit_2() -> None:
    out = _stress("--mode", "steady", "--rate", "10")
    assert out.returncode == 2
    assert "--mode steady needs --rate and --duration" in out.stderr


def test_burn_down_verifies_and_writes_the_json_report(dsn: str, tmp_path: pathlib.Path) -> None:
    out, report = _verified(tmp_path, 2000, "--dsn", dsn, "--jobs", "2000", "--processes", "2")
    assert "verify:    PASSED" in out.stdout
    assert "done 2,000/2,000" in out.stderr  # the progress line
    assert report["enqueue"]["jobs"] == 2000 and report["enqueue"]["rate"] > 0
    assert report["drain"]["jobs"] == 2000 and report["drain"]["rate"] > 0
    latency = report["latency"]
    assert 0 <= latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["max"]
    cpu = report["cpu"]
    assert cpu["workers"] > 0 and cpu["workers_us_per_job"] > 0
    assert cpu["postgres"] is not None and cpu["postgres_source"].startswith("/proc")
    assert report["workers"]["started"] == 2 and report["workers"]["unexpected_exits"] == 0
    # Independently of the report: one ledger row per job, and nothing left in the queue.
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT count(*), count(DISTINCT job_id) FROM trioq_stress.stress_ledger"
        ).fetchone()
        assert rows == (2000, 2000)
        assert conn.execute("SELECT count(*) FROM trioq_stress.jobs").fetchone() == (0,)


def test_killed_workers_lose_nothing(dsn: str, tmp_path: pathlib.Path) -> None:
    _, report = _verified(
        tmp_path, 300, "--dsn", dsn, "--jobs", "300", "--concurrency", "5", "--work-ms", "50",
        "--kill-every", "1", "--quiet",
    )  # fmt: skip
    assert report["chaos"]["kills"] >= 1
    assert report["options"]["lease"] is None  # chaos picked the short lease itself
    reasons = report["verification"]["reexecuted_reasons"]
    # returned by the liveness check (issue #10) or, the fallback, by lease expiry
    assert set(reasons) <= {"worker died (its liveness lock was free)",
                            "lease expired: worker lost"}, reasons  # fmt: skip


def test_terminated_connections_lose_nothing(dsn: str, tmp_path: pathlib.Path) -> None:
    _, report = _verified(
        tmp_path, 300, "--dsn", dsn, "--jobs", "300", "--concurrency", "5", "--work-ms", "20",
        "--terminate-every", "0.5", "--quiet",
    )  # fmt: skip
    assert report["chaos"]["terminated_connections"] >= 1


@pytest.mark.parametrize("mode", ["one", "one-shared"])
def test_complete_with_loses_nothing_under_kills_and_terminated_connections(
    dsn: str, tmp_path: pathlib.Path, mode: str
) -> None:
    """``job.complete_with()`` (the statement, the completion and COMMIT in one round trip;
    ``one-shared``: batches of jobs in one transaction) under SIGKILLs and terminated
    connections: every job's ledger row once."""
    _, report = _verified(
        tmp_path, 800, "--dsn", dsn, "--jobs", "800", "--concurrency", "10", "--work-ms", "50",
        "--transactions", mode, "--kill-every", "1", "--terminate-every", "0.5", "--quiet",
    )  # fmt: skip
    assert report["chaos"]["kills"] >= 1 and report["chaos"]["terminated_connections"] >= 1
    assert report["options"]["transactions"] == mode


def test_steady_rate_is_kept_and_restart_is_skipped_on_a_dsn(
    dsn: str, tmp_path: pathlib.Path
) -> None:
    out, report = _verified(
        tmp_path, 900, "--dsn", dsn, "--mode", "steady", "--rate", "300", "--duration", "3",
        "--restart-postgres-at", "1",
    )  # fmt: skip
    assert "--restart-postgres-at skipped" in out.stderr
    steady = report["steady"]
    assert steady["produced"] == 900
    assert 270 <= steady["achieved_rate"] <= 330, steady
    assert report["chaos"]["postgres_restarts"] == 0
    assert report["chaos"]["restart_skipped"]


def test_embedded_postgres_restarted_mid_run_loses_nothing(tmp_path: pathlib.Path) -> None:
    root = tempfile.mkdtemp(prefix="trioq-stress-")
    os.chmod(root, 0o711)  # the server may run as another user (root runs it as postgres)
    data_dir = os.path.join(root, "pg")
    env = cli_env({"TRIOQ_EMBEDDED_DIR": data_dir})
    try:
        _, report = _verified(
            tmp_path, 150, "--jobs", "150", "--concurrency", "5", "--work-ms", "20",
            "--restart-postgres-at", "0.3", "--quiet", env={"TRIOQ_EMBEDDED_DIR": data_dir},
            timeout=180,
        )  # fmt: skip
        assert report["database"]["embedded"] is True
        assert report["chaos"]["postgres_restarts"] == 1
        status = subprocess.run(
            [sys.executable, "-m", "trioq._cli", "db", "status", "--json", "--data-dir", data_dir],
            capture_output=True, text=True, env=env, timeout=60, check=False,
        )  # fmt: skip
        assert json.loads(status.stdout)["running"] is False  # the run stopped what it started
    finally:
        subprocess.run(
            [sys.executable, "-m", "trioq._cli", "db", "stop", "--data-dir", data_dir],
            env=env, capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


def test_a_job_deleted_mid_run_fails_the_verification(dsn: str, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "report.json"
    proc = _start(
        "--dsn", dsn, "--jobs", "40", "--processes", "1", "--concurrency", "2",
        "--work-ms", "100", "--quiet", "--json", str(path),
    )  # fmt: skip
    try:
        deleted = _delete_one_waiting_job(dsn)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == EXIT_FAILED, err
    report = _report(path)
    v = report["verification"]
    assert v["passed"] is False
    assert (v["lost"], v["lost_examples"]) == (1, [deleted])
    assert v["completed"] == 39 and v["duplicate_completions"] == 0
    assert report["exit_code"] == EXIT_FAILED


def _delete_one_waiting_job(dsn: str, timeout: float = 60) -> int:
    """Once the backlog is in, delete one job that is still waiting; its id."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            try:
                row = conn.execute(
                    "DELETE FROM trioq_stress.jobs WHERE id = (SELECT max(id) FROM"
                    " trioq_stress.jobs WHERE state = 'available') RETURNING id"
                ).fetchone()
            except psycopg.errors.UndefinedTable:
                row = None
            if row is not None:
                return int(row[0])
            time.sleep(0.02)
    raise AssertionError("the backlog never appeared")


# -- the verification itself, on a doctored ledger ----------------------------------------------

_INSERT = sql.SQL(
    "INSERT INTO {} (job_id, attempt, worker_pid, started_at, finished_at, run_at, enqueued_at,"
    " prior_error) VALUES (%s, %s, 1, now(), now(), now(), now(), %s)"
)


async def _doctored(dsn: str, *, ledger: list[tuple[int, int, str | None]]) -> Any:
    async with await connect(dsn, autocommit=True) as conn:
        await reset(conn, SCHEMA)
        for job_id, attempt, reason in ledger:
            await conn.execute(_INSERT.format(statements(SCHEMA).ledger), (job_id, attempt, reason))
        ids = IdRanges()
        ids.add(range(1, 6))
        return await verify(conn, SCHEMA, ids, chaos=True)


async def test_verification_passes_on_a_clean_ledger(dsn: str) -> None:
    ledger = [(1, 1, None), (2, 2, "lease expired: worker lost"), (3, 1, None), (4, 1, None)]
    ledger.append((5, 1, None))
    v = await _doctored(dsn, ledger=ledger)
    assert v.passed, v.failures
    assert (v.enqueued, v.completed, v.lost, v.reexecuted) == (5, 5, 0, 1)
    assert v.reexecuted_reasons == {"lease expired: worker lost": 1}
    assert exit_code(v, timed_out=False) == EXIT_OK


async def test_verification_fails_on_lost_and_duplicate_jobs(dsn: str) -> None:
    # Job 2 completed twice, job 4 re-ran with no reason, job 5 is gone without a trace.
    ledger = [(1, 1, None), (2, 1, None), (2, 2, "lease expired"), (3, 1, None), (4, 2, None)]
    v = await _doctored(dsn, ledger=ledger)
    assert not v.passed
    assert (v.lost, v.lost_examples) == (1, [5])
    assert v.duplicate_completions == 1 and v.duplicate_examples == ["2 x2 (attempts 1,2)"]
    assert any("no recorded reason" in f for f in v.failures)
    assert exit_code(v, timed_out=False) == EXIT_FAILED


async def test_jobs_left_in_the_queue_are_a_timeout_not_a_loss(dsn: str) -> None:
    async with await connect(dsn, autocommit=True) as conn:
        await reset(conn, SCHEMA)
        await conn.execute(
            "INSERT INTO trioq_stress.jobs (id, queue, task) VALUES (1, 'stress', 't')"
        )
        ids = IdRanges()
        ids.add([1])
        v = await verify(conn, SCHEMA, ids, chaos=False)
    assert (v.lost, v.left, v.left_examples) == (0, {"available": 1}, [1])
    assert exit_code(v, timed_out=True) == EXIT_TIMEOUT


def test_id_ranges_stay_small() -> None:
    ids = IdRanges()
    ids.add(range(1, 10_001))
    ids.add([20_000, 20_001, 5])
    assert (ids.los, ids.his, ids.count) == ([1, 20_000, 5], [10_000, 20_001, 5], 10_003)


def test_options_name_the_flag_and_pick_chaos_timings() -> None:
    with pytest.raises(ValueError, match="--kill-every must be positive"):
        StressOptions(kill_every=0)
    assert StressOptions().timings == (30.0, 5.0, 5.0)
    assert StressOptions(terminate_every=1).timings == (2.0, 0.5, 0.5)
    assert StressOptions(kill_every=1, lease=6).timings == (6.0, 0.5, 0.5)
    with pytest.raises(ValueError, match="a third of --lease"):
        StressOptions(lease=1, heartbeat=1)


def test_fault_options_are_checked_and_switch_to_chaos_timings() -> None:
    with pytest.raises(ValueError, match="--starve-for and --starve-leave need --starve-at"):
        StressOptions(starve_for=5)
    with pytest.raises(ValueError, match="--pin-xmin-for needs --pin-xmin-at"):
        StressOptions(pin_xmin_for=5)
    for grace in (-1, float("nan"), 1e30):  # NaN passed every comparison: it was taken
        with pytest.raises(ValueError, match=r"--grace must be from 0 to 1e\+09, got "):
            StressOptions(grace=grace)
    assert StressOptions(starve_at=1, processes=4).leave == 12  # 3 per worker process
    assert StressOptions(starve_at=1, starve_leave=2).leave == 2
    for fault in ("kill_at", "starve_at", "pin_xmin_at", "sigterm_at"):
        options: dict[str, Any] = {fault: 1.0}
        assert StressOptions(**options).timings == (2.0, 0.5, 0.5), fault
    assert StressOptions(grace=7).worker_env()["TRIOQ_STRESS_GRACE"] == "7"


async def test_recovery_times_come_from_the_ledger(dsn: str) -> None:
    """Completions at known database times; a kill and a window at known wall times."""
    async with await connect(dsn, autocommit=True) as conn:
        await reset(conn, SCHEMA)
        ledger = statements(SCHEMA).ledger
        # job: (enqueued at, finished at), seconds after t0 on the database clock
        jobs = {1: (0, 1), 2: (2, 3), 3: (4, 9), 4: (5, 6), 5: (8, 8.5)}
        cur = await conn.execute("SELECT extract(epoch FROM now())::float8")
        row = await cur.fetchone()
        assert row is not None
        t0 = row[0]
        for job_id, (enq, fin) in jobs.items():
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {} (job_id, attempt, worker_pid, started_at, finished_at,"
                    " run_at, enqueued_at) VALUES (%(id)s, 1, 1, to_timestamp(%(f)s - 0.1),"
                    " to_timestamp(%(f)s), to_timestamp(%(e)s), to_timestamp(%(e)s))"
                ).format(ledger),
                {"id": job_id, "e": t0 + enq, "f": t0 + fin},
            )
        offset = 100.0  # the wall clock runs 100 s behind the database here
        kill = Fault(kind="kill", started=t0 + 4.5 - offset, ended=t0 + 4.5 - offset,
                     detail="", held=[3, 4])  # fmt: skip
        window = Fault(kind="starvation", started=t0 + 2.5 - offset, ended=t0 + 7 - offset,
                       detail="")  # fmt: skip
        faults = await recovery(conn, SCHEMA, [kill, window], offset)
    k, w = faults
    assert k["first_completion_s"] == pytest.approx(1.5, abs=0.01)  # job 4 at 6
    assert k["caught_up_s"] == pytest.approx(4.5, abs=0.01)  # jobs 1-3 done by 9
    assert (k["held"], k["held_completed"]) == (2, 2)
    assert k["held_recovered_s"] == pytest.approx(4.5, abs=0.01)  # job 3 at 9
    assert w["first_completion_s"] == pytest.approx(1.5, abs=0.01)  # job 5 at 8.5
    assert w["caught_up_s"] == pytest.approx(2.0, abs=0.01)  # jobs 1-4 done by 9
    assert (w["completed_during"], w["seconds"]) == (2, pytest.approx(4.5))  # jobs 2 and 4
    summary = recovery_summary(faults)
    assert summary["kill"]["count"] == 1 and summary["kill"]["held"] == [2]
    assert summary["starvation"]["caught_up_s"] == {"median": 2.0, "max": 2.0}


def test_a_graceful_stop_fails_the_run_on_a_bad_exit_or_a_job_left_running() -> None:
    clean = GracefulStop(grace=5, workers=2, exit_seconds=[0.3, 0.4], exit_codes=[0, 0],
                         running_after=0)  # fmt: skip
    assert clean.failures() == []
    bad = GracefulStop(grace=5, workers=2, exit_seconds=[0.3, 15.1], exit_codes=[0, -9],
                       killed=1, running_after=3)  # fmt: skip
    assert bad.failures() == [
        "graceful stop: 1 workers did not exit in time",
        "graceful stop: exit codes [0, -9]",
        "graceful stop: 3 jobs left running",
    ]


def test_refuses_to_empty_a_schema_it_did_not_create(dsn: str) -> None:
    migrated = subprocess.run(
        [sys.executable, "-m", "trioq._cli", "migrate", "--dsn", dsn],
        capture_output=True, text=True, env=cli_env(), timeout=60, check=False,
    )  # fmt: skip
    assert migrated.returncode == 0, migrated.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO trioq.jobs (queue, task) VALUES ('default', 'precious')")
    out = _stress("--dsn", dsn, "--schema", "trioq", "--jobs", "10", "--quiet")
    assert out.returncode == 1
    assert "holds trioq tables that no stress run created" in out.stderr
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT task FROM trioq.jobs").fetchall() == [("precious",)]


def test_a_worker_that_cannot_start_fails_the_run_with_its_output(dsn: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "trioq._cli", "stress", "--dsn", dsn, "--jobs", "10", "--quiet"],
        capture_output=True, text=True, env={**cli_env(), "TRIOQ_STRESS_POLL": "soon"}, timeout=120,
        check=False,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "a worker exited while starting" in out.stderr
    assert "TRIOQ_STRESS_POLL must be a number of seconds, got 'soon'" in out.stderr
    assert "Traceback" not in out.stderr
