"""The operator CLI of issue #11: ``status --watch``, ``jobs list``, ``cron list``, ``check``,
``enqueue --args @FILE / -``, JSON errors, and ``migrate`` saying whom it waits for.
Real Postgres; the commands run in this process (``main``) unless stdin or a second
session is the point, then as real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from clitool import TESTS, cli_env

from trioq._cli.main import main
from trioq._db.migrate import latest_version


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def migrated(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
    assert main(["migrate", "--dsn", dsn]) == 0


# -- enqueue --args @FILE and - -----------------------------------------------------------------


def test_enqueue_args_from_a_file_beyond_the_argv_limit(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    migrated(dsn)
    capsys.readouterr()
    payload = {"rows": ["x" * 100] * 3000}  # ~320 KB: more than one argv string may hold
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(payload))
    code, out, err = run(capsys, "enqueue", "import_rows", "--args", f"@{path}", "--dsn", dsn,
                         "--json")  # fmt: skip
    assert code == 0, err
    job_id = json.loads(out)["job_id"]
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT args FROM trioq.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None and row[0] == payload


def test_enqueue_args_from_stdin(dsn: str) -> None:
    migrated(dsn)
    payload = json.dumps({"text": "é" * 200_000})
    done = subprocess.run(
        [sys.executable, "-m", "trioq._cli", "enqueue", "big", "--args", "-", "--dsn", dsn],
        input=payload.encode(), capture_output=True, env=cli_env(), cwd=TESTS, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT args->>'text' FROM trioq.jobs").fetchone()
    assert row is not None and row[0] == "é" * 200_000


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "--args @{path}: cannot read it: No such file or directory"),
        (b"", "--args @{path} is not JSON: Expecting value"),
        (b"\xff\xfe{}", "--args @{path}: not UTF-8 (byte 0)"),
        (b'{"a": "\\u0000"}', "args must not contain NUL characters"),
        (b"[" * 100_000 + b"]" * 100_000, "--args @{path} is not JSON trioq can read: nested"),
    ],
    ids=["missing", "empty", "not-utf8", "nul", "deep"],
)
def test_enqueue_bad_args_files_are_one_line_and_nothing_is_enqueued(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None,
    expected: str,
) -> None:  # fmt: skip
    migrated(dsn)
    capsys.readouterr()
    path = tmp_path / "args.json"
    if content is not None:
        path.write_bytes(content)
    code, out, err = run(capsys, "enqueue", "t", "--args", f"@{path}", "--dsn", dsn)
    assert code == 1 and out == ""
    (line,) = err.splitlines()
    assert line.startswith("trioq: error: ") and expected.format(path=path) in line, line
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM trioq.jobs").fetchone() == (0,)
    code, _, err = run(capsys, "enqueue", "t", "--args", "@", "--dsn", dsn)
    assert code == 1 and "name a file after the @" in err


# -- JSON errors --------------------------------------------------------------------------------


def test_with_json_errors_are_one_object_on_stdout(
    unused_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = f"postgresql://alice:hunter2secret@127.0.0.1:{unused_port}/app"
    for argv in (["status"], ["jobs", "list"], ["cron", "list"], ["dead", "list"]):
        code, out, err = run(capsys, *argv, "--dsn", dsn, "--json")
        assert code == 1
        error = json.loads(out)
        assert error["error"] == "ConnectError" and "Connection refused" in error["message"]
        assert "hunter2secret" not in out + err
        assert err.startswith("trioq: error: cannot connect")
    with pytest.raises(SystemExit) as usage:
        main(["enqueue", "--json"])  # no task
    assert usage.value.code == 2
    error = json.loads(capsys.readouterr().out)
    assert error == {"error": "usage", "message": "trioq enqueue: the following arguments are "
                     "required: task"}  # fmt: skip


# -- check ----------------------------------------------------------------------------------------


def test_check_exit_codes(dsn: str, unused_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "check", "--dsn", dsn, "--json")
    assert code == 3  # never migrated
    report = json.loads(out)
    assert (report["ok"], report["error"]) == (False, "SchemaMissingError")
    assert "run `trioq migrate`" in report["message"]
    migrated(dsn)
    capsys.readouterr()
    code, out, _ = run(capsys, "check", "--dsn", dsn)
    assert code == 0 and out.startswith("ok: postgresql://")
    assert f"version {latest_version()} (current)" in out
    code, out, _ = run(capsys, "check", "--dsn", dsn, "--json")
    assert code == 0 and json.loads(out)["version"] == latest_version()
    with psycopg.connect(dsn, autocommit=True) as conn:  # as if a newer trioq migrated it
        conn.execute("INSERT INTO trioq.migrations (version, name) VALUES (999, 'future')")
    code, out, _ = run(capsys, "check", "--dsn", dsn, "--json")
    assert code == 3 and json.loads(out)["error"] == "SchemaTooNewError"
    code, out, err = run(capsys, "check", "--dsn", f"postgresql://x@127.0.0.1:{unused_port}/x")
    assert code == 1 and out == "" and "Connection refused" in err
    with pytest.raises(SystemExit) as usage:
        main(["check", "--timeout", "-1"])
    assert usage.value.code == 2


def test_check_an_outdated_schema(dsn: str) -> None:
    assert main(["migrate", "--dsn", dsn]) == 0
    with psycopg.connect(dsn, autocommit=True) as conn:  # one migration short of current
        conn.execute("DELETE FROM trioq.migrations WHERE version = %s", (latest_version(),))
    done = subprocess.run(
        [sys.executable, "-m", "trioq._cli", "check", "--dsn", dsn, "--json"],
        capture_output=True, text=True, env=cli_env(), timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 3
    assert json.loads(done.stdout)["error"] == "SchemaOutdatedError"


# -- jobs list ------------------------------------------------------------------------------------

JOBS = """
INSERT INTO trioq.jobs (id, queue, task, state, run_at, attempt, lease_owner, lease_expires_at,
                        finished_at, last_error) VALUES
 (1, 'mail', 'send', 'available', now() - interval '1 minute', 0, NULL, NULL, NULL, NULL),
 (2, 'mail', 'send', 'running', now(), 1, 'host:1:a', now() + interval '30 s', NULL, NULL),
 (3, 'sms', 'text', 'scheduled', now() + interval '1 hour', 1, NULL, NULL, NULL,
  'OSError: no signal'),
 (4, 'mail', 'digest', 'available', now(), 0, NULL, NULL, NULL, NULL),
 (5, 'mail', 'send', 'done', now(), 1, NULL, NULL, now(), NULL);
INSERT INTO trioq.dead_jobs (id, queue, task, args, priority, attempt, max_attempts, reason,
                             last_error, enqueued_at) VALUES
 (6, 'sms', 'text', '{}', 0, 3, 3, 'attempts exhausted', 'OSError: no route', now());
"""


def test_jobs_list_by_state_queue_and_task(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    migrated(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(JOBS)
    capsys.readouterr()

    def ids(*argv: str) -> list[int]:
        code, out, err = run(capsys, "jobs", "list", "--dsn", dsn, "--json", *argv)
        assert code == 0, err
        return [job["id"] for job in json.loads(out)]

    assert ids() == [2, 1, 4, 3]  # running, available (claim order), scheduled
    assert ids("--state", "dead") == [6] and ids("--state", "done") == [5]
    assert ids("--queue", "mail") == [2, 1, 4]
    assert ids("--task", "send") == [2, 1]
    assert ids("--limit", "2") == [2, 1]
    assert ids("--state", "cancelled") == []
    code, out, _ = run(capsys, "jobs", "list", "--dsn", dsn, "--state", "scheduled")
    assert code == 0 and "OSError: no signal" in out and "sms" in out
    code, out, _ = run(capsys, "jobs", "list", "--dsn", dsn, "--queue", "nope")
    assert out.strip() == "(no jobs with queue 'nope')"
    code, out, _ = run(capsys, "jobs", "list", "--dsn", dsn, "--json", "--state", "dead")
    (dead,) = json.loads(out)
    assert (dead["state"], dead["last_error"], dead["attempt"]) == ("dead", "OSError: no route", 3)
    with pytest.raises(SystemExit):
        main(["jobs", "list", "--limit", "0"])
    capsys.readouterr()


# -- cron list ------------------------------------------------------------------------------------


def test_cron_list_with_and_without_the_app(
    dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    migrated(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO trioq.cron_ticks (name, tick, job_id, fired_at) VALUES"
                     " ('nightly', '2026-01-01 03:00Z', 41, now()),"
                     " ('nightly', '2026-01-02 03:00Z', 42, now()),"
                     " ('retired', '2025-06-01 00:00Z', NULL, now())")  # fmt: skip
    capsys.readouterr()
    monkeypatch.syspath_prepend(str(TESTS))
    code, out, err = run(capsys, "cron", "list", "--dsn", dsn, "--json", "--app",
                         "obs_app:with_cron")  # fmt: skip
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(out)}
    assert set(rows) == {"nightly", "hourly", "retired"}
    nightly = rows["nightly"]
    assert (nightly["schedule"], nightly["task"], nightly["last_job_id"]) == ("0 3 * * *", "ok", 42)
    assert nightly["last_tick"].startswith("2026-01-02 03:00:00")
    assert nightly["next_tick"].endswith("03:00:00+00:00")
    assert rows["hourly"]["last_tick"] is None and rows["hourly"]["next_tick"] is not None
    assert rows["retired"]["in_app"] is False
    code, out, _ = run(capsys, "cron", "list", "--dsn", dsn, "--app", "obs_app:with_cron")
    assert "(not in the app)" in out and "2026-01-02 03:00:00Z (job 42)" in out
    code, out, _ = run(capsys, "cron", "list", "--dsn", dsn)
    assert "nightly" in out and "give --app" in out
    code, _, err = run(capsys, "cron", "list", "--dsn", dsn, "--app", "obs_app:tasks")
    assert code == 1 and "is a Registry: cron entries are in a trioq.Config" in err


# -- status --watch -------------------------------------------------------------------------------


def test_status_watch_redraws_with_recent_rates(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    migrated(dsn)
    zeros = "array_fill(0::int8, ARRAY[24])"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(JOBS)
        conn.execute(
            "INSERT INTO trioq.job_history (minute, queue, task, completed, retried, dead,"
            f" exec_hist, wait_hist) VALUES (date_trunc('minute', now()), 'mail', 'send', 50,"
            f" 4, 1, {zeros}, {zeros}), (date_trunc('minute', now()), 'drained', 't', 10, 0, 0,"
            f" {zeros}, {zeros}), (now() - interval '1 hour', 'mail', 'send', 999, 0, 0,"
            f" {zeros}, {zeros})"
        )
    capsys.readouterr()
    started = time.monotonic()
    code, out, _ = run(capsys, "status", "--dsn", dsn, "--watch", "--interval", "0.2",
                       "--count", "3", "--json")  # fmt: skip
    assert code == 0 and time.monotonic() - started >= 0.4  # it waited between frames
    frames = [json.loads(line) for line in out.splitlines()]
    assert len(frames) == 3 and all("time" in f for f in frames)
    queues: dict[str, Any] = {q["queue"]: q for q in frames[-1]["queues"]}
    assert queues["mail"]["completed_per_minute"] == 10.0  # 50 in the last 5 minutes
    assert queues["mail"]["failed_per_minute"] == 1.0
    assert queues["drained"]["available"] == 0 and queues["drained"]["completed_per_minute"] == 2.0
    code, out, _ = run(capsys, "status", "--dsn", dsn, "--watch", "--interval", "0.1",
                       "--count", "2")  # fmt: skip
    headers = [line for line in out.splitlines() if line.startswith("trioq status, every 0.1 s")]
    assert len(headers) == 2 and "done/min" in out
    code, out, _ = run(capsys, "status", "--dsn", dsn)  # without --watch: as before
    assert "done/min" not in out and "mail" in out


# -- migrate waits, and says so -------------------------------------------------------------------


def test_migrate_says_whom_it_waits_for(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as holder:
        pid = holder.info.backend_pid
        holder.execute("BEGIN")
        holder.execute("SELECT pg_advisory_xact_lock(hashtext('trioq.migrate'), hashtext('trioq'))")
        proc = subprocess.Popen(
            [sys.executable, "-m", "trioq._cli", "migrate", "--dsn", dsn, "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
        )  # fmt: skip
        assert proc.stderr is not None
        line = proc.stderr.readline()  # blocks until it says it waits (bounded by the test)
        assert line.startswith(f"trioq migrate: schema 'trioq': waiting for session {pid}")
        assert "to finish its migration (it holds the migration lock)" in line
        assert proc.poll() is None  # still waiting
        holder.execute("COMMIT")
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and json.loads(out)["version"] == latest_version()
