"""``trioq queue list|pause|resume|set`` and ``trioq status``, run as the real command line
against real Postgres: the text, the JSON, and bad input (usage errors exit 2, refused
values exit 1, each with one line naming the problem)."""

from __future__ import annotations

import json

import attrs
import pytest
from clitool import trioq_cli as trioq

import trioq as trioq_lib


def ok(*args: str) -> str:
    out = trioq(*args)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_set_list_pause_resume_and_status(dsn: str) -> None:
    ok("migrate", "--dsn", dsn)
    ok("enqueue", "t", "--queue", "email", "--dsn", dsn)
    text = ok("queue", "set", "email", "--global-concurrency", "5", "--rate", "100/1m",
              "--key-concurrency", "1", "--dsn", dsn)  # fmt: skip
    assert text.strip() == (
        "queue 'email': not paused, global concurrency 5, rate 100/1m, per-key concurrency 1, "
        "aging 1m"
    )
    changed = json.loads(ok("queue", "set", "email", "--rate", "none", "--key-rate", "2/500ms",
                            "--dsn", dsn, "--json"))  # fmt: skip
    assert changed == {
        "name": "email",
        "paused": False,
        "global_concurrency": 5,
        "rate_limit": None,
        "key_concurrency": 1,
        "key_rate_limit": "2/500ms",
        "paused_until": None,
        "aging": 60.0,
        "fair": False,
    }
    text = ok("queue", "set", "email", "--aging", "5m", "--dsn", dsn)
    assert text.strip().endswith("per-key rate 2/500ms, aging 5m")
    assert json.loads(ok("queue", "set", "email", "--aging", "none", "--dsn", dsn, "--json"))[
        "aging"
    ] is None
    ok("queue", "pause", "sync", "--create", "--dsn", dsn)  # no jobs yet: --create on purpose
    listed = json.loads(ok("queue", "list", "--dsn", dsn, "--json"))
    assert [(q["name"], q["paused"], q["available"]) for q in listed] == [
        ("email", False, 1),
        ("sync", True, 0),
    ]
    lines = ok("queue", "list", "--dsn", dsn).splitlines()
    assert lines[1].split() == ["email", "no", "5", "-", "1", "2/500ms", "off", "no", "1", "0"]
    assert lines[2].split()[:2] == ["sync", "yes"]
    status = json.loads(ok("status", "--dsn", dsn, "--json"))
    assert status["paused"] == ["sync"]
    assert [q["paused"] for q in status["queues"]] == [False]
    assert "paused (trioq queue resume NAME): sync" in ok("status", "--dsn", dsn)
    assert "queue 'sync' resumed" in ok("queue", "resume", "sync", "--dsn", dsn)
    assert json.loads(ok("status", "--dsn", dsn, "--json"))["paused"] == []


def test_a_timed_pause_is_set_shown_and_cleared(dsn: str) -> None:
    ok("migrate", "--dsn", dsn)
    ok("enqueue", "t", "--queue", "email", "--dsn", dsn)
    text = ok("queue", "pause", "email", "--until", "2126-12-03T07:00+01:00", "--dsn", dsn)
    assert text.strip() == (
        "queue 'email' paused: paused until 2126-12-03T06:00:00+00:00, no limits, aging 1m"
    )
    listed = json.loads(ok("queue", "list", "--dsn", dsn, "--json"))
    assert [(q["paused"], q["paused_until"]) for q in listed] == [
        (True, "2126-12-03T06:00:00+00:00")
    ]
    line = ok("queue", "list", "--dsn", dsn).splitlines()[1]
    assert line.split()[:3] == ["email", "until", "2126-12-03T06:00:00+00:00"]
    status = json.loads(ok("status", "--dsn", dsn, "--json"))
    assert status["paused"] == ["email"]
    assert status["paused_until"] == {"email": "2126-12-03T06:00:00+00:00"}
    assert ("paused (trioq queue resume NAME): email (until 2126-12-03T06:00:00+00:00)"
            in ok("status", "--dsn", dsn))  # fmt: skip
    settings = json.loads(ok("queue", "pause", "email", "--for", "2h", "--dsn", dsn, "--json"))
    assert settings["paused"] and settings["paused_until"] is not None
    settings = json.loads(ok("queue", "pause", "email", "--dsn", dsn, "--json"))  # indefinite
    assert (settings["paused"], settings["paused_until"]) == (True, None)
    assert "paused: paused, no limits" in ok("queue", "pause", "email", "--dsn", dsn)
    resumed = json.loads(ok("queue", "resume", "email", "--dsn", dsn, "--json"))
    assert (resumed["paused"], resumed["paused_until"]) == (False, None)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--until", "2126-12-03T06:00"], 2, "is a naive datetime: give it a timezone"),
        (["--until", "tomorrow"], 2, "is not an ISO 8601 time"),
        (["--until", "2126-13-03T06:00Z"], 2, "is not an ISO 8601 time"),
        (["--until", "2126-12-03T06:00Z" * 1000], 2, "is not an ISO 8601 time"),
        (["--until", "a\udc80b"], 2, "is not an ISO 8601 time"),  # argv not UTF-8
        (["--until", "2020-01-01T00:00Z"], 1, "must lie after the database's clock"),
        (["--until", "9999-12-31T00:00Z"], 1, "at most 100 years ahead"),
        (["--until", "9999-12-31T23:00-05:00"], 2, "outside the years 1 to 9999"),
        (["--for", "0"], 2, "more than 0"),
        (["--for", "200y"], 2, "use seconds"),
        (["--for", "36600d"], 2, "less than 100 years"),
        (["--for", "1h", "--until", "2126-12-03T06:00Z"], 2, "not allowed with"),
    ],
)
def test_a_bad_end_of_a_pause_is_refused_and_changes_nothing(
    dsn: str, args: list[str], code: int, message: str
) -> None:
    ok("migrate", "--dsn", dsn)
    ok("queue", "pause", "q", "--create", "--dsn", dsn)
    out = trioq("queue", "pause", "q", *args, "--dsn", dsn)
    assert (out.returncode, "Traceback" in out.stderr) == (code, False), out.stderr
    assert message in out.stderr
    [row] = json.loads(ok("queue", "list", "--dsn", dsn, "--json"))
    assert (row["paused"], row["paused_until"]) == (True, None)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["queue", "set", "q"], 1, "give at least one of --global-concurrency"),
        (["queue", "set", "q", "--global-concurrency", "0"], 2, "at least 1 (pause the queue"),
        (["queue", "set", "q", "--global-concurrency", "x"], 2, "not a whole number"),
        (["queue", "set", "q", "--global-concurrency", "99999999999"], 1, "between 1 and"),
        (["queue", "set", "q", "--rate", "5/x"], 2, "use N/PERIOD"),
        (["queue", "set", "q", "--rate", "0/1s"], 2, "rate limit must be between"),
        (["queue", "set", "q", "--key-rate", "1/999d"], 2, "366 days"),
        (["queue", "set", "q", "--aging", "0"], 2, "aging '0': must be more than 0"),
        (["queue", "set", "q", "--aging", "0.5s"], 2, "aging must be between 1 s and 366 days"),
        (["queue", "set", "q", "--aging", "400d"], 2, "aging must be between 1 s and 366 days"),
        (["queue", "set", "q", "--aging=-1m"], 2, "aging '-1m': use seconds"),
        (["queue", "set", "q", "--aging", "nan"], 2, "aging 'nan': use seconds"),
        (["queue", "set", "q", "--aging", "\udcff"], 2, "aging"),
        (["queue", "pause", "bad name"], 2, "queue 'bad name' is invalid"),
        (["queue", "pause", "a" * 65], 2, "is invalid"),
        (["queue", "pause"], 2, "required: name"),
        (["queue"], 2, "required: COMMAND"),
    ],
)
def test_bad_input_is_one_line_naming_the_problem(
    dsn: str, args: list[str], code: int, message: str
) -> None:
    out = trioq(*args, "--dsn", dsn)
    assert out.returncode == code, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_a_usage_error_never_shows_the_dsn() -> None:
    for args in (["queue"], ["queue", "pause"], ["queue", "set", "q", "--rate", "x"]):
        out = trioq(*args, "--dsn", "postgresql://bob:hunter2@127.0.0.1:1/app")
        assert out.returncode == 2
        assert "hunter2" not in out.stderr + out.stdout


def test_enqueue_with_a_unique_window_a_global_key_and_a_concurrency_key(dsn: str) -> None:
    ok("migrate", "--dsn", dsn)
    window = ["--dedup-key", "daily", "--unique-period", "1d"]
    first = json.loads(ok("enqueue", "report", *window, "--concurrency-key", "c", "--dsn", dsn,
                          "--json"))  # fmt: skip
    again = ok("enqueue", "report", *window, "--dsn", dsn)
    assert again.strip() == f"duplicate of job {first['job_id']} (it holds the key)"
    ok("enqueue", "a", "--dedup-key", "g", "--global-key", "--dsn", dsn)
    assert "duplicate" in ok("enqueue", "b", "--dedup-key", "g", "--global-key", "--dsn", dsn)
    assert "duplicate" not in ok("enqueue", "b", "--dedup-key", "g", "--dsn", dsn)
    out = trioq("enqueue", "x", "--unique-period", "1h", "--dsn", dsn)
    assert out.returncode == 1 and "need a --dedup-key" in out.stderr


def test_serve_concurrency_flag_keeps_the_apps_limits() -> None:
    """``trioq serve --concurrency N`` changes the slots, not the app's QueueConfig limits."""
    import flow_app

    from trioq._cli.main import build_parser
    from trioq._cli.settings import serve_config

    args = build_parser().parse_args(["serve", "--app", "flow_app:config", "--concurrency", "7"])
    app = attrs.evolve(flow_app.config, queues={
        "limited": trioq_lib.QueueConfig(concurrency=2, global_concurrency=3),
        "rated": trioq_lib.QueueConfig(rate_limit="5/s"),
    })  # fmt: skip
    config = serve_config(args, app, {"TRIOQ_DSN": "postgresql://x@localhost/db"})
    assert config.queues == {
        "limited": trioq_lib.QueueConfig(concurrency=7, global_concurrency=3),
        "rated": trioq_lib.QueueConfig(concurrency=7, rate_limit="5/s"),
    }
