"""The real ``trioq`` command line, run as a subprocess against real Postgres."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg
import pytest

from trioq._migrate import latest_version


def trioq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k not in ("TRIOQ_DSN", "DATABASE_URL")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "trioq._cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
        check=False,
    )


def test_help_has_examples() -> None:
    for command in (["--help"], ["migrate", "--help"], ["demo", "--help"], ["db", "--help"]):
        out = trioq(*command)
        assert out.returncode == 0, out.stderr
        assert "example" in out.stdout


def test_migrate_with_dsn_flag_then_json(dsn: str) -> None:
    first = trioq("migrate", "--dsn", dsn)
    assert first.returncode == 0, first.stderr
    assert "version 0 -> 1" in first.stdout
    again = trioq("migrate", "--dsn", dsn, "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report == {
        "schema": "trioq",
        "previous_version": latest_version(),
        "version": latest_version(),
        "applied": [],
    }


@pytest.mark.parametrize("var", ["TRIOQ_DSN", "DATABASE_URL"])
def test_dsn_from_environment(dsn: str, var: str) -> None:
    out = trioq("demo", "--json", "--schema", "envschema", env={var: dsn})
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["embedded"] is False
    assert report["schema_version"] == latest_version()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regclass('envschema.jobs') IS NOT NULL").fetchone() == (
            True,
        )


def test_flag_beats_environment(dsn: str) -> None:
    out = trioq("migrate", "--dsn", dsn, env={"TRIOQ_DSN": "host=/nonexistent user=x"})
    assert out.returncode == 0, out.stderr


def test_unreachable_database_is_one_clear_line_without_password() -> None:
    out = trioq("migrate", "--dsn", "postgresql://bob:hunter2@127.0.0.1:1/app")
    assert out.returncode == 1
    assert out.stderr.startswith("trioq: error: cannot connect to postgresql://bob@127.0.0.1:1/app")
    assert "hunter2" not in out.stderr + out.stdout
    assert "Traceback" not in out.stderr


def test_bad_schema_name_is_rejected(dsn: str) -> None:
    out = trioq("migrate", "--dsn", dsn, "--schema", "x; DROP TABLE y")
    assert out.returncode == 1
    assert "schema name" in out.stderr


def test_usage_error_exit_code() -> None:
    assert trioq("no-such-command").returncode == 2
