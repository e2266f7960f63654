"""``trioq jobs show`` and ``trioq jobs wait``, the real command against real Postgres."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psycopg
from clitool import TESTS, cli_env
from clitool import trioq_cli as trioq

SETUP = """
INSERT INTO trioq.jobs (id, queue, task, args, state, run_at, attempt, lease_owner,
                        lease_expires_at, result, finished_at, last_error) VALUES
 (1, 'mail', 'send', '{"to": "ada"}', 'scheduled', '2031-01-01Z', 0, NULL, NULL, NULL, NULL,
  NULL),
 (2, 'mail', 'send', '{}', 'running', now(), 2, 'host:7:abc', '2031-01-01Z', NULL, NULL,
  'ValueError: once'),
 (3, 'math', 'square', '{"n": 7}', 'done', now(), 1, NULL, NULL, '49', now(), NULL),
 (4, 'mail', 'send', '{}', 'available', now(), 0, NULL, NULL, NULL, NULL, NULL);
INSERT INTO trioq.dead_jobs (id, queue, task, args, priority, attempt, max_attempts, reason,
                             last_error, traceback, enqueued_at) VALUES
 (5, 'mail', 'send', '{}', 0, 3, 3, 'attempts exhausted', 'OSError: no route',
  'Traceback (most recent call last):\n  File "x.py", line 1\nOSError: no route', now());
"""


def setup(dsn: str) -> None:
    assert trioq("migrate", "--dsn", dsn).returncode == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SETUP)


def test_show_every_state_as_text_and_json(dsn: str) -> None:
    setup(dsn)
    out = trioq("jobs", "show", "2", "--dsn", dsn)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "job 2: running"
    assert "  task:      send (queue mail, priority 0)" in lines
    assert "  attempt:   2 of 25" in lines
    assert "  lease:     host:7:abc, expires 2031-01-01 00:00:00+00:00" in lines
    assert "  error:     ValueError: once" in lines
    assert "result: 49" in trioq("jobs", "show", "3", "--dsn", dsn).stdout.replace("    ", " ")
    dead = trioq("jobs", "show", "5", "--dsn", dsn).stdout
    assert "job 5: dead" in dead and "  reason:    attempts exhausted" in dead
    assert "    OSError: no route" in dead.splitlines()  # the traceback, indented
    shown = json.loads(trioq("jobs", "show", "1", "--dsn", dsn, "--json").stdout)
    assert (shown["state"], shown["args"], shown["run_at"]) == (
        "scheduled", {"to": "ada"}, "2031-01-01T00:00:00+00:00",
    )  # fmt: skip
    unknown = trioq("jobs", "show", "99", "--dsn", dsn, "--json")
    assert unknown.returncode == 4
    assert json.loads(unknown.stdout)["state"] == "unknown"
    assert trioq("jobs", "show", "99", "--dsn", dsn).stderr.startswith("job 99: unknown")
    bad = trioq("jobs", "show", str(2**64), "--dsn", dsn)
    assert bad.returncode == 2 and "a job id is a whole number from 1 to" in bad.stderr
    assert trioq("jobs", "show", "abc", "--dsn", dsn).returncode == 2
    assert trioq("jobs", "--dsn", dsn).returncode == 2  # a group: a subcommand is required


def test_wait_prints_results_and_says_why_there_is_none(dsn: str) -> None:
    setup(dsn)
    done = trioq("jobs", "wait", "3", "--dsn", dsn)
    assert (done.returncode, done.stdout) == (0, "49\n")
    dead = trioq("jobs", "wait", "5", "--dsn", dsn, "--json")
    assert dead.returncode == 5
    assert "last error: OSError: no route" in json.loads(dead.stdout)["error"]
    assert trioq("jobs", "wait", "99", "--dsn", dsn).returncode == 4
    late = trioq("jobs", "wait", "1", "--timeout", "0.3", "--dsn", dsn)
    assert (late.returncode, late.stderr) == (6, "job 1 has not finished after 0.3 s\n")

    # A job that finishes while the command waits for it.
    waiter = subprocess.Popen(
        [sys.executable, "-m", "trioq._cli", "jobs", "wait", "4", "--timeout", "60",
         "--dsn", dsn],
        stdout=subprocess.PIPE, text=True, env=cli_env(), cwd=TESTS,
    )  # fmt: skip
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.monotonic() + 30
        flagged = "SELECT 1 FROM trioq.jobs WHERE id = 4 AND notify_finished"
        while conn.execute(flagged).fetchone() is None:
            assert time.monotonic() < deadline, "the command never started waiting"
            time.sleep(0.02)
        conn.execute(
            "UPDATE trioq.jobs SET state = 'done', result = '[1, 2]', finished_at = now()"
            " WHERE id = 4"
        )
    out, _ = waiter.communicate(timeout=30)
    assert (waiter.returncode, out) == (0, "[1, 2]\n")
