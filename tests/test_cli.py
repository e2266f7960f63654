"""The real ``trioq`` command line, run as a subprocess against real Postgres."""

from __future__ import annotations

import json

import psycopg
import pytest
import trio
from clitool import trioq_cli as trioq

import trioq as trioq_lib
from trioq._db.migrate import latest_version


def test_help_has_examples() -> None:
    for command in (["--help"], ["migrate", "--help"], ["demo", "--help"], ["db", "--help"]):
        out = trioq(*command)
        assert out.returncode == 0, out.stderr
        assert "example" in out.stdout


def test_migrate_with_dsn_flag_then_json(dsn: str) -> None:
    first = trioq("migrate", "--dsn", dsn)
    assert first.returncode == 0, first.stderr
    assert f"version 0 -> {latest_version()}" in first.stdout
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
    # The worker's start-up warnings (a queue no task uses, tasks whose queue is not
    # served) would be false alarms in the demo: its tasks are on the queue it serves.
    assert "no registered task uses it" not in out.stderr, out.stderr
    assert "which this worker does not serve" not in out.stderr, out.stderr
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
    assert out.returncode == 2  # a usage error: refused before connecting
    assert "argument --schema: schema name 'x; DROP TABLE y' is invalid" in out.stderr


def test_usage_error_exit_code() -> None:
    assert trioq("no-such-command").returncode == 2


def test_enqueue_status_cancel_roundtrip(dsn: str) -> None:
    assert trioq("migrate", "--dsn", dsn).returncode == 0
    first = trioq("enqueue", "greet", "--args", '{"name": "ada"}', "--dsn", dsn, "--json")
    assert first.returncode == 0, first.stderr
    job = json.loads(first.stdout)
    assert job["duplicate"] is False
    keyed = ["enqueue", "greet", "--dedup-key", "k", "--dsn", dsn, "--json"]
    assert json.loads(trioq(*keyed).stdout)["duplicate"] is False
    assert json.loads(trioq(*keyed).stdout)["duplicate"] is True
    later = trioq("enqueue", "greet", "--delay", "600", "--queue", "later", "--dsn", dsn)
    assert later.stdout.startswith("enqueued job")
    status = json.loads(trioq("status", "--dsn", dsn, "--json").stdout)
    depth = {q["queue"]: (q["available"], q["scheduled"]) for q in status["queues"]}
    assert depth == {"default": (2, 0), "later": (0, 1)}
    assert "default" in trioq("status", "--dsn", dsn).stdout
    cancelled = trioq("cancel", str(job["job_id"]), "--dsn", dsn)
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
    gone = trioq("cancel", str(job["job_id"]), "--dsn", dsn)
    assert gone.returncode == 4


def test_status_counts_jobs_waiting_for_their_dependencies(dsn: str) -> None:
    """A job enqueued with after= is neither available nor scheduled: status says so."""
    assert trioq("migrate", "--dsn", dsn).returncode == 0
    first = json.loads(trioq("enqueue", "greet", "--dsn", dsn, "--json").stdout)["job_id"]

    async def then() -> None:
        async with await trioq_lib.connect(dsn, autocommit=True) as conn:
            await trioq_lib.enqueue(conn, "greet", queue="next", after=[first])

    trio.run(then)
    status = json.loads(trioq("status", "--dsn", dsn, "--json").stdout)
    waiting = {q["queue"]: (q["available"], q["waiting"]) for q in status["queues"]}
    assert waiting == {"default": (1, 0), "next": (0, 1)}
    text = trioq("status", "--dsn", dsn).stdout
    assert "waiting for their dependencies: 1 in next" in text, text


def test_status_stops_counting_at_the_cap_unless_exact(dsn: str) -> None:
    """A backlog past the cap: `trioq status` shows it as 10000+ (and the JSON names the
    count in ``at_cap``) at a cost that does not grow with it; --exact counts everything.
    Both agree on every count below the cap."""
    from trioq._cli.ops import STATUS_CAP

    assert trioq("migrate", "--dsn", dsn).returncode == 0

    async def fill() -> None:
        async with await trioq_lib.connect(dsn, autocommit=True) as conn:
            await trioq_lib.enqueue_bulk(conn, "t", [{}] * (STATUS_CAP + 5), queue="big")
            await trioq_lib.enqueue_bulk(conn, "t", [{}] * 3, queue="small", delay=600)
            first = await trioq_lib.enqueue(conn, "t", queue="small")
            await trioq_lib.enqueue(conn, "t", queue="small", after=[first.job_id])

    trio.run(fill)
    capped = json.loads(trioq("status", "--dsn", dsn, "--json").stdout)["queues"]
    exact = json.loads(trioq("status", "--dsn", dsn, "--json", "--exact").stdout)["queues"]
    rows = {q["queue"]: q for q in capped}
    assert rows["big"]["available"] == STATUS_CAP and rows["big"]["at_cap"] == ["available"]
    assert {q["queue"]: q["available"] for q in exact} == {"big": STATUS_CAP + 5, "small": 1}
    assert all(q["at_cap"] == [] for q in exact)
    keys = ("available", "scheduled", "running", "dead", "waiting")
    assert {k: rows["small"][k] for k in keys} == {k: exact[1][k] for k in keys} == {
        "available": 1, "scheduled": 3, "running": 0, "dead": 0, "waiting": 1,
    }  # fmt: skip
    text = trioq("status", "--dsn", dsn).stdout
    assert f"big {STATUS_CAP}+".replace(" ", "") in text.replace(" ", ""), text
    assert f"{STATUS_CAP + 5}" in trioq("status", "--dsn", dsn, "--exact").stdout


@pytest.mark.parametrize(
    ("cap", "error", "says"),
    [(0, ValueError, "between 1 and"), (-1, ValueError, "between 1 and"),
     (10**7, ValueError, "between 1 and"), (True, TypeError, "an int or None"),
     ("10", TypeError, "an int or None"), (1.5, TypeError, "an int or None")],
)  # fmt: skip
def test_a_bad_status_cap_is_refused_before_any_query(cap: object, error: type, says: str) -> None:
    with pytest.raises(error, match=f"cap must be {says}"):
        trio.run(lambda: trioq_lib.Queue().status(None, cap=cap))  # type: ignore[arg-type]


def test_enqueue_bad_input_is_one_line(dsn: str) -> None:
    assert trioq("migrate", "--dsn", dsn).returncode == 0
    for args, message in [
        (["--args", "not json"], "--args is not JSON"),
        (["--priority", "500"], "priority must be between"),
        (["--delay", "-1"], "delay must not be negative"),
        (["--queue", "bad queue"], "queue 'bad queue' is invalid"),
    ]:
        out = trioq("enqueue", "t", *args, "--dsn", dsn)
        assert out.returncode == 1, (args, out.stdout)
        assert message in out.stderr and "Traceback" not in out.stderr


def test_dead_list_retry_purge(dsn: str) -> None:
    assert trioq("migrate", "--dsn", dsn).returncode == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO trioq.dead_jobs (id, queue, task, args, priority, attempt, max_attempts,"
            " reason, last_error, enqueued_at) VALUES"
            " (101, 'email', 'send', '{}', 0, 3, 3, 'attempts exhausted', 'boom', now()),"
            " (102, 'sms', 'send', '{}', 0, 1, 1, 'fatal error', 'bad', now()),"
            " (103, 'sms', 'text', '{}', 0, 1, 1, 'fatal error', 'bad', now() - interval '1 day')"
        )
    listed = json.loads(trioq("dead", "list", "--queue", "sms", "--dsn", dsn, "--json").stdout)
    assert [d["id"] for d in listed] == [102, 103]
    assert "attempts exhausted: boom" in trioq("dead", "list", "--dsn", dsn).stdout
    retried = json.loads(trioq("dead", "retry", "--id", "101", "--dsn", dsn, "--json").stdout)
    assert retried == {"retried": [101]}
    purged = trioq("dead", "purge", "--task", "text", "--dsn", dsn, "--json")
    assert json.loads(purged.stdout) == {"purged": [103]}
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT id, state, attempt FROM trioq.jobs").fetchall() == [
            (101, "available", 0)
        ]
        assert conn.execute("SELECT id FROM trioq.dead_jobs").fetchall() == [(102,)]


@pytest.mark.parametrize("group", [["dead", "list"], ["queue", "list"], ["jobs", "show", "1"]])
def test_options_before_a_subcommand_are_used_and_no_dsn_is_echoed(group: list[str]) -> None:
    """``trioq dead --dsn URL list`` uses URL (argparse would let the subcommand's default
    undo it: then the embedded database would be used, silently), and ``trioq dead --dsn
    URL`` is a usage error that does not print URL."""
    unreachable = "postgresql://bob:hunter2@127.0.0.1:1/app"
    name, *rest = group
    out = trioq(name, "--dsn", unreachable, *rest)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "cannot connect to postgresql://bob@127.0.0.1:1/app" in out.stderr
    bare = trioq(name, "--dsn", unreachable)
    assert bare.returncode == 2
    assert "required: COMMAND" in bare.stderr
    assert "hunter2" not in out.stderr + out.stdout + bare.stderr + bare.stdout
    assert "127.0.0.1" not in bare.stderr
