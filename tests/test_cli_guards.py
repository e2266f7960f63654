"""The command line against careless hands ("safe by default"): a retry or purge of every
dead job needs ``--all`` and can be tried with ``--dry-run``, a cut-off that rounds to
nothing is refused, a typo'd queue is not paused, ids out of range are usage errors,
output into a closed pipe ends quietly, and errors go to stderr.

Real Postgres. The commands run in this process (`main`), except where the pipe is the
point. Each refusal is checked for its exit code, its message on stderr, and a database
that nothing changed (every row of the tables compared before and after).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from clitool import TESTS, cli_env

from trioq._cli.main import main

SEED = """
INSERT INTO trioq.dead_jobs (id, queue, task, args, priority, attempt, max_attempts, reason,
                             last_error, enqueued_at, died_at, dedup_key) VALUES
 (101, 'email', 'send', '{}', 0, 3, 3, 'attempts exhausted', 'boom', now(), now(), NULL),
 (102, 'sms', 'send', '{}', 0, 1, 1, 'fatal error', 'bad', now(), now() - interval '2 d',
  NULL),
 (103, 'sms', 'text', '{}', 0, 1, 1, 'fatal error', 'bad', now(), now() - interval '3 d',
  'held');
INSERT INTO trioq.jobs (id, queue, task, args, state, run_at, dedup_key) VALUES
 (1, 'default', 'send', '{}', 'available', now(), 'held');
"""

#: The tables a refusal must leave as they were.
TABLES = ("jobs", "dead_jobs", "queues")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``trioq ARGV`` in this process: its exit code (argparse's too), stdout, stderr."""
    try:
        code = main(list(argv))
    except SystemExit as ex:
        code = ex.code if isinstance(ex.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def seeded(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "migrate", "--dsn", dsn)[0] == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SEED)


def snapshot(dsn: str) -> dict[str, list[tuple[object, ...]]]:
    """Every row of the tables a command may change, in a stable order."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {
            table: conn.execute(f"SELECT * FROM trioq.{table} ORDER BY 1").fetchall()
            for table in TABLES
        }


def refused(
    capsys: pytest.CaptureFixture[str], dsn: str, argv: list[str], code: int, *says: str
) -> str:
    """``argv`` exits with ``code``, says each of ``says`` on stderr (no traceback, nothing
    on stdout but JSON), and changes no row."""
    before = snapshot(dsn)
    got, out, err = run(capsys, *argv, "--dsn", dsn)
    assert got == code, (argv, out, err)
    for text in says:
        assert text in err, (argv, err)
    assert "Traceback" not in err
    assert snapshot(dsn) == before, argv
    return err


# -- dead retry / purge: --all, --dry-run ---------------------------------------------------------


@pytest.mark.parametrize("verb", ["retry", "purge"])
def test_retry_or_purge_without_a_filter_needs_all(
    dsn: str, capsys: pytest.CaptureFixture[str], verb: str
) -> None:
    seeded(dsn, capsys)
    err = refused(capsys, dsn, ["dead", verb], 2, "--all", "--id", "--queue", "--task")
    assert f"trioq dead {verb}: error:" in err
    refused(capsys, dsn, ["dead", verb, "--json"], 2, "--all")
    refused(capsys, dsn, ["dead", verb, "--all", "--queue", "sms"], 2, "--all", "filter")
    code, out, err = run(capsys, "dead", verb, "--all", "--dsn", dsn, "--json")
    assert code == 0, err
    # 103 stays dead on retry: its dedup key is held by live job 1.
    assert json.loads(out) == ({"retried": [101, 102]} if verb == "retry"
                               else {"purged": [101, 102, 103]})  # fmt: skip


def test_dry_run_says_what_it_would_touch_and_changes_nothing(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seeded(dsn, capsys)
    before = snapshot(dsn)
    cases = [
        (["dead", "retry", "--all", "--dry-run"], "would retry 2 dead jobs: 101, 102"),
        (["dead", "retry", "--queue", "sms", "--dry-run"], "would retry 1 dead jobs: 102"),
        (["dead", "purge", "--all", "--dry-run"], "would purge 3 dead jobs: 101, 102, 103"),
        (["dead", "purge", "--older-than", "60h", "--dry-run"],
         "would purge 1 dead jobs: 103"),
        (["dead", "purge", "--task", "nothing", "--dry-run"], "would purge 0 dead jobs"),
    ]  # fmt: skip
    for argv, says in cases:
        code, out, err = run(capsys, *argv, "--dsn", dsn)
        assert (code, err) == (0, ""), argv
        assert out.strip() == f"{says} (dry run: nothing changed)", argv
    code, out, _ = run(capsys, "dead", "purge", "--queue", "sms", "--dry-run", "--dsn", dsn,
                       "--json")  # fmt: skip
    assert (code, json.loads(out)) == (0, {"dry_run": True, "purged": [102, 103]})
    assert snapshot(dsn) == before
    # What the dry run said is what the real run does.
    code, out, _ = run(capsys, "dead", "retry", "--all", "--dsn", dsn, "--json")
    assert (code, json.loads(out)) == (0, {"retried": [101, 102]})


# -- --older-than: a cut-off that rounds to nothing -----------------------------------------------


@pytest.mark.parametrize("cutoff", ["0.0001s", "0.5", "0.999s", "0.01m"])
def test_a_cutoff_below_one_second_is_refused(
    dsn: str, capsys: pytest.CaptureFixture[str], cutoff: str
) -> None:
    seeded(dsn, capsys)
    refused(capsys, dsn, ["dead", "purge", f"--older-than={cutoff}"], 2,
            f"--older-than: {cutoff!r} is less than 1 second")  # fmt: skip


def test_a_cutoff_of_one_second_or_more_is_taken(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seeded(dsn, capsys)
    code, out, err = run(capsys, "dead", "purge", "--older-than", "1s", "--dsn", dsn)
    assert (code, out.strip()) == (0, "purged 2 dead jobs: 102, 103"), err  # 101 died now


# -- queue pause / resume / set: a name nothing uses --------------------------------------------


@pytest.mark.parametrize("verb", [["pause"], ["resume"], ["set", "--global-concurrency", "2"]])
def test_a_queue_nothing_knows_is_refused_unless_created_on_purpose(
    dsn: str, capsys: pytest.CaptureFixture[str], verb: list[str]
) -> None:
    seeded(dsn, capsys)
    name, *rest = verb
    err = refused(capsys, dsn, ["queue", name, "emial", *rest], 1, "unknown queue 'emial'",
                  "default, email, sms", "--create")  # fmt: skip
    assert err.startswith("trioq: error: ")
    code, _, err = run(capsys, "queue", name, "emial", *rest, "--create", "--dsn", dsn)
    assert code == 0, err
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT name FROM trioq.queues").fetchall() == [("emial",)]
    # Now it has a row: known, no --create needed.
    assert run(capsys, "queue", name, "emial", *rest, "--dsn", dsn)[0] == 0


def test_every_place_a_queue_is_known_from(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A queue is known when it has a row of settings, live jobs (any live state), dead
    jobs, a live worker that serves it, or recent runs in the job history."""
    seeded(dsn, capsys)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO trioq.queues (name, paused) VALUES ('configured', false);"
            "INSERT INTO trioq.jobs (id, queue, task, args, state, run_at) VALUES"
            " (2, 'later', 't', '{}', 'scheduled', now() + interval '1 d');"
            "INSERT INTO trioq.jobs (id, queue, task, args, state, run_at, attempt,"
            " lease_owner, lease_expires_at) VALUES"
            " (3, 'busy', 't', '{}', 'running', now(), 1, 'w1', now() + interval '1 h');"
            "INSERT INTO trioq.workers (name, host, pid, queues)"
            " VALUES ('w1', 'h', 1, '{\"served\": 5}');"
            "INSERT INTO trioq.job_history (minute, queue, task, completed, exec_hist,"
            " wait_hist) VALUES (date_trunc('minute', now()), 'ran', 't', 1,"
            " array_fill(0::int8, ARRAY[24]), array_fill(0::int8, ARRAY[24]))"
        )
    for queue in ("configured", "later", "busy", "served", "ran", "sms", "default"):
        code, out, err = run(capsys, "queue", "pause", queue, "--dsn", dsn)
        described = f"queue {queue!r} paused: paused, no limits, aging 1m"
        assert (code, out.strip()) == (0, described), err
    err = refused(capsys, dsn, ["queue", "pause", "nobody"], 1, "unknown queue 'nobody'")
    assert "busy, configured, default, email, later, ran, served, sms" in err


# -- ids out of range: usage errors at parse time -------------------------------------------------

BAD_IDS = ["99999999999999999999", "9223372036854775808", "0", "-1", "-9223372036854775809"]
BY_ID = [["cancel", "{}"], ["jobs", "show", "{}"], ["jobs", "wait", "{}"],
         ["dead", "list", "--id", "{}"], ["dead", "retry", "--id", "{}"],
         ["dead", "purge", "--id", "{}"]]  # fmt: skip


@pytest.mark.parametrize("argv", BY_ID, ids=lambda argv: " ".join(argv[:2]))
def test_an_id_out_of_range_is_a_usage_error(
    dsn: str, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    seeded(dsn, capsys)
    for bad in BAD_IDS:
        line = [word.format(bad) for word in argv]
        err = refused(capsys, dsn, line, 2, "1 to 9223372036854775807", repr(bad))
        assert "bigint out of range" not in err
    # The largest id is taken (and, being no job's, found nowhere).
    line = [word.format(2**63 - 1) for word in argv]
    code, _, err = run(capsys, *line, "--dsn", dsn)
    assert code in (0, 4), err
    assert "Traceback" not in err


# -- errors go to stderr ------------------------------------------------------------------------


def test_jobs_wait_says_why_on_stderr(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    seeded(dsn, capsys)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO trioq.jobs (id, queue, task, args, state, run_at)"
                     " VALUES (7, 'later', 't', '{}', 'scheduled', now() + interval '1 d')")
    for argv, code, says in [
        (["jobs", "wait", "99"], 4, "job 99"),
        (["jobs", "wait", "7", "--timeout", "0.05"], 6, "job 7 has not finished after 0.05 s"),
        (["jobs", "show", "99"], 4, "job 99: unknown"),
        (["cancel", "99"], 4, "job 99: no such scheduled, available or running job"),
    ]:  # fmt: skip
        got, out, err = run(capsys, *argv, "--dsn", dsn)
        assert (got, out) == (code, ""), argv
        assert says in err, argv
        # With --json the answer is still one object on stdout.
        got, out, err = run(capsys, *argv, "--dsn", dsn, "--json")
        assert got == code and isinstance(json.loads(out), dict), argv


# -- output into a closed pipe ------------------------------------------------------------------


def closed_pipe_run(
    *argv: str, dsn: str, buffered: bool
) -> subprocess.CompletedProcess[str]:
    """``trioq ARGV`` with stdout a pipe whose reading end is closed before it starts (as
    ``trioq ... | head -0`` ends up): every write to stdout fails with EPIPE. ``buffered``:
    stdout keeps what is printed until a flush (else PYTHONUNBUFFERED: each print fails)."""
    env = cli_env(dsn=dsn)
    env.pop("PYTHONUNBUFFERED", None)
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "trioq._cli", *argv], stdout=write, stderr=subprocess.PIPE,
            text=True, env=env, cwd=TESTS, timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.close(write)


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["db", "url"], ["db", "status", "--json"], ["status"],
     ["status", "--watch", "--count", "3", "--interval", "0.1"], ["dead", "list", "--json"]],
    ids=" ".join,
)  # fmt: skip
def test_output_into_a_closed_pipe_ends_quietly(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    seeded(dsn, capsys)
    if argv[0] == "db":
        argv = [*argv, "--data-dir", str(tmp_path / "pg")]
    for buffered in (True, False):
        done = closed_pipe_run(*argv, dsn=dsn, buffered=buffered)
        assert (done.returncode, done.stderr) == (141, ""), buffered


# -- a DSN that is not UTF-8 ----------------------------------------------------------------------


@pytest.mark.parametrize("var", ["TRIOQ_DSN", "DATABASE_URL"])
def test_a_dsn_that_is_not_utf8_in_the_environment_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, var: str
) -> None:
    """A byte that is not UTF-8 in the environment reaches Python as a lone surrogate. The
    DSN is refused, and the error line, which scrubs the configured DSNs' passwords, does
    not fail on it (it raised UnicodeEncodeError from inside the error handler)."""
    monkeypatch.delenv("TRIOQ_DSN", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv(var, "postgresql://app:pw\udcff@127.0.0.1:1/app")
    code, out, err = run(capsys, "status")
    assert (code, out) == (1, "")
    assert err == f"trioq: error: ${var} is invalid: it is not UTF-8 (a lone surrogate)\n"
