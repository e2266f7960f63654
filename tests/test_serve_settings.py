"""``trioq serve``'s settings: every deployable `trioq.Config` field is a flag and a
``TRIOQ_*`` variable (trioq/_cli/settings.py), taken in the order flag > variable > the
app's Config > Config's default; bad values are refused naming the flag or the variable,
before anything starts; ``--concurrency 0`` and ``--json`` mean what they say."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
from clitool import TESTS, ServeProcess, cli_env

import trioq
from trioq._cli.main import build_parser
from trioq._cli.serve import _child_argv, log_format
from trioq._cli.settings import EXCLUDED, KINDS, SETTINGS, Setting, given_settings, serve_config

_tasks = trioq.Registry()

#: An app whose Config differs from Config's default in every setting's field, so that
#: "the app's value" is never the default by chance.
APP = trioq.Config(
    registry=_tasks, dsn="postgresql://app@apphost/app", session_dsn="postgresql://app@direct/app",
    prepared_statements=True, schema="appschema",
    queues={"a": trioq.QueueConfig(concurrency=3, global_concurrency=5),
            "b": trioq.QueueConfig(concurrency=4)},
    lease=600, heartbeat_interval=10, poll_interval=3, sweep_interval=6, liveness_interval=0.7,
    liveness_grace=5, shutdown_grace=40, sync_threads=11, pool_size=9, app_pool_size=12,
    max_payload_bytes=2000, max_result_bytes=3000, max_progress_bytes=4000,
    progress_interval=2, shared_transactions=3,
    shared_transaction_jobs=33, unknown_task_timeout=1000, loop_blocked_warning=6,
    history_interval=7, history_retention=dt.timedelta(days=3), retain_done=100,
    retain_cancelled=200, retain_dead=300, prune_interval=70, prune_batch=500,
    stranded_interval=80, vacuum_interval=3, vacuum_threshold=12, hook_timeout=11,
    hook_concurrency=5, hook_buffer=900,
    metrics="127.0.0.1:9200", metrics_depth_interval=8, metrics_depth_cap=5000, tracing=False,
)  # fmt: skip


def _seconds(flag: str, env: str) -> tuple[str, Any, str, Any]:
    return (flag, float(flag.removesuffix("s")), env, float(env.removesuffix("m")) * 60)


#: flag: (flag text, its value, variable text, its value): each differs from APP's value.
SAMPLES: dict[str, tuple[str, Any, str, Any]] = {
    "--dsn": ("postgresql://f@flag/db", "postgresql://f@flag/db",
              "postgresql://e@env/db", "postgresql://e@env/db"),
    "--session-dsn": ("postgresql://f@fdirect/db", "postgresql://f@fdirect/db",
                      "postgresql://e@edirect/db", "postgresql://e@edirect/db"),
    "--prepared-statements": ("off", False, "auto", None),
    "--schema": ("flagschema", "flagschema", "envschema", "envschema"),
    "--queues": ("x,y", ["x", "y"], " z ", ["z"]),
    "--concurrency": ("7", [7], "8", [8]),
    "--lease": _seconds("45s", "2m"),
    "--heartbeat-interval": ("7", 7.0, "0.1m", 6.0),
    "--liveness-interval": ("0.4", 0.4, "0.3s", 0.3),
    "--liveness-grace": ("3", 3.0, "4s", 4.0),
    "--shutdown-grace": ("0", 0.0, "1m", 60.0),
    "--history-retention": ("12h", dt.timedelta(hours=12), "2d", dt.timedelta(days=2)),
    "--retain-done": ("off", None, "2d", 172800.0),
    "--retain-cancelled": ("1h", 3600.0, "OFF", None),
    "--retain-dead": ("30d", 30 * 86400.0, "off", None),
    "--prune-interval": ("off", None, "5m", 300.0),
    "--stranded-interval": ("90s", 90.0, "off", None),
    "--vacuum-interval": ("off", None, "2s", 2.0),
    "--metrics": ("127.0.0.1:9300", "127.0.0.1:9300", "[::1]:9400-9409", "[::1]:9400-9409"),
    "--tracing": ("auto", None, "on", True),
    "--group-commit": ("off", False, "on", True),
    **{flag: _seconds("13s", "2m") for flag in (
        "--poll-interval", "--sweep-interval", "--unknown-task-timeout",
        "--loop-blocked-warning", "--history-interval", "--hook-timeout",
        "--metrics-depth-interval", "--progress-interval")},
    **{flag: ("13", 13, "14", 14) for flag in (
        "--sync-threads", "--pool-size", "--app-pool-size", "--max-payload-bytes",
        "--max-result-bytes", "--max-progress-bytes", "--shared-transactions",
        "--shared-transaction-jobs", "--prune-batch", "--hook-concurrency", "--hook-buffer",
        "--metrics-depth-cap", "--vacuum-threshold")},
}  # fmt: skip

_BAD_NUMBER = ["", "  ", "abc", "-5", "nan", "inf", "NaN", "1e400", "9" * 400, "5\x00", "٣",
               "0x10", "1_0"]  # fmt: skip
#: Values each kind refuses: the wrong type, negative, zero where more is needed, NaN,
#: huge, empty, NUL, other scripts' digits.
BAD: dict[str, list[str]] = {
    "seconds": [*_BAD_NUMBER, "0", "0s", "7w", "1.", "36500d"],
    "seconds_or_zero": [*_BAD_NUMBER, "-0.5", "36500d"],
    "seconds_or_off": [*_BAD_NUMBER, "0", "of", "never", "36500d"],
    "count": [*_BAD_NUMBER, "0", "1.5", "1000001", "9" * 30],
    "bytes": [*_BAD_NUMBER, "0", "1.5", str(2**30 + 1), "1MiB"],
    "switch": ["", "maybe", "2", "-1", "nan", "on\x00"],
    "on_off": ["", "maybe", "auto", "2", "-1", "nan", "on\x00"],
    "dsn": ["", " ", "postgresql://u:pw@[::1/app", "host=x dbname='unterminated", "h\x00x"],
    "schema": ["", "X", "a b", "x\x00", "1abc", "a" * 64, "x; DROP TABLE y"],
    "queues": ["", ",", " , ", "a b", "x\x00", "a" * 65, "ok,x'; DROP TABLE jobs;--"],
    "address": ["", "nonsense", "127.0.0.1:70000", "x\x00:1", "h:9-1", ":9100"],
}


_PARSER = build_parser([])


def _args(*argv: str) -> Any:
    return _PARSER.parse_args(["serve", "--app", "m:a", *argv])


def _read(config: trioq.Config, setting: Setting) -> Any:
    if setting.dest == "queues":
        return sorted(config.queues)
    if setting.dest == "concurrency":
        return sorted({q.concurrency for q in config.queues.values()})
    return getattr(config, setting.field)


def test_every_config_field_is_a_setting_or_excluded_with_a_reason() -> None:
    """A new Config field fails here until it has a flag and a variable, or a reason."""
    fields = {field.name for field in attrs.fields(trioq.Config)}
    covered = {setting.field for setting in SETTINGS}
    assert sorted(fields - covered - EXCLUDED.keys()) == [], "neither a setting nor excluded"
    assert sorted((covered | EXCLUDED.keys()) - fields) == [], "not a Config field"
    assert sorted(covered & EXCLUDED.keys()) == [], "both a setting and excluded"
    assert all(len(reason) > 20 for reason in EXCLUDED.values())
    assert sorted(SAMPLES) == sorted(setting.flag for setting in SETTINGS), "a setting untried"
    assert sorted(BAD) == sorted(KINDS), "a kind without bad values"
    flags = [setting.flag for setting in SETTINGS]
    variables = [name for setting in SETTINGS for name in setting.env]
    assert len(set(flags)) == len(flags) and len(set(variables)) == len(variables)
    assert all(name.startswith("TRIOQ_") or name == "DATABASE_URL" for name in variables)


def test_the_docs_table_lists_every_setting() -> None:
    """docs/cli.md's table of the settings: a row per setting, with its variables."""
    text = (TESTS.parent / "docs" / "cli.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `--")]
    for setting in SETTINGS:
        assert any(row.startswith(f"| `{setting.flag} ")
                   and all(f"| `{name}`" in row or f", `{name}`" in row for name in setting.env)
                   for row in rows), f"{setting.flag} is not in docs/cli.md's table"  # fmt: skip
    for name in EXCLUDED:
        assert f"| `{name}` |" in text, f"the exclusion of {name} is not in docs/cli.md"


#: Settings of two values (on|off): the test above cannot pick three different ones.
TWO_VALUED = [setting for setting in SETTINGS if setting.kind.name == "on_off"]


@pytest.mark.parametrize("setting", TWO_VALUED, ids=lambda s: s.flag)
def test_each_on_off_setting_by_flag_beats_variable_beats_the_apps_config(
    setting: Setting,
) -> None:
    """With two values, each order is tried against an app of the other value."""
    for app_value in (False, True):
        changed: dict[str, Any] = {setting.field: app_value}
        app = attrs.evolve(APP, **changed)
        mine, other = ("off", "on") if app_value else ("on", "off")
        assert _read(serve_config(_args(), app, {}), setting) is app_value
        assert _read(serve_config(_args(setting.flag, mine), app, {}), setting) is not app_value
        for name in setting.env:
            environ = {name: mine}
            assert _read(serve_config(_args(), app, environ), setting) is not app_value
            flag_wins = serve_config(_args(setting.flag, other), app, environ)
            assert _read(flag_wins, setting) is app_value  # the flag's (off/on) over the variable's


@pytest.mark.parametrize(
    "setting", [s for s in SETTINGS if s not in TWO_VALUED], ids=lambda s: s.flag
)
def test_each_setting_by_flag_beats_variable_beats_the_apps_config(setting: Setting) -> None:
    flag_text, flag_value, env_text, env_value = SAMPLES[setting.flag]
    app_value = _read(APP, setting)
    assert app_value not in (flag_value, env_value), "the samples must differ from the app"
    assert flag_value != env_value
    default = trioq.Config(registry=_tasks)
    if setting.field != "queues":
        assert app_value != _read(default, setting), "APP must differ from the default"
    flag = (setting.flag, flag_text)
    assert _read(serve_config(_args(), APP, {}), setting) == app_value
    assert _read(serve_config(_args(*flag), APP, {}), setting) == flag_value
    for name in setting.env:  # each variable alone ($TRIOQ_DSN, $DATABASE_URL)
        assert _read(serve_config(_args(), APP, {name: env_text}), setting) == env_value
        assert _read(serve_config(_args(*flag), APP, {name: env_text}), setting) == flag_value
    first, *rest = setting.env
    for other in rest:  # the first variable beats the later ones
        both = {first: env_text, other: flag_text}
        assert _read(serve_config(_args(), APP, both), setting) == env_value
    # A Registry has no Config: the settings apply to Config's defaults.
    assert _read(serve_config(_args(*flag), _tasks, {}), setting) == flag_value


#: The flags every command shares (`trioq._cli.options.database_options`), whose values the
#: parser itself checks: a bad one is a usage error (exit 2) before serve reads anything.
PARSED = {"--dsn", "--schema"}


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.flag)
def test_each_setting_refuses_bad_values_naming_the_flag_or_variable(
    setting: Setting, capsys: pytest.CaptureFixture[str]
) -> None:
    for bad in BAD[setting.kind.name]:
        if setting.flag in PARSED:
            with pytest.raises(SystemExit) as exited:
                _args(setting.flag, bad)
            assert exited.value.code == 2
            error = capsys.readouterr().err.splitlines()[-1]
            assert error.startswith(f"trioq serve: error: argument {setting.flag}: "), error
            if setting.kind.name == "dsn" and bad.strip():
                assert bad not in error, "a DSN is never quoted"
        for args, environ, source in (
            *(() if setting.flag in PARSED else ((_args(setting.flag, bad), {}, setting.flag),)),
            *((_args(), {name: bad}, f"${name}") for name in setting.env),
        ):
            with pytest.raises(ValueError) as refused:
                given_settings(args, environ)
            message = str(refused.value)
            assert message.startswith((source + " ", source + ":")), (bad, message)
            assert "\n" not in message and len(message) < 400, message
            if setting.kind.name == "dsn" and bad.strip():
                assert bad not in message, "a DSN is never quoted"


def test_a_setting_over_its_fields_own_limit_is_refused_in_the_flags_words() -> None:
    with pytest.raises(ValueError, match=r"^--shared-transaction-jobs '65': "
                       r"shared_transaction_jobs must be at most 64"):  # fmt: skip
        given_settings(_args("--shared-transaction-jobs", "65"), {})


def test_settings_that_do_not_go_together_are_refused_naming_them() -> None:
    """The app's heartbeat (10 s) is over a third of ``--lease 20s``; the app's liveness
    interval (0.7 s) is over half of ``$TRIOQ_LIVENESS_GRACE``."""
    with pytest.raises(ValueError, match=r"a lease survives a missed heartbeat \(given: "
                       r"--lease '20s'\)$"):  # fmt: skip
        serve_config(_args("--lease", "20s"), APP, {})
    with pytest.raises(ValueError, match=r"\(given: \$TRIOQ_LIVENESS_GRACE '1'\)$"):
        serve_config(_args(), APP, {"TRIOQ_LIVENESS_GRACE": "1"})
    both = serve_config(_args("--lease", "20s"), APP, {"TRIOQ_HEARTBEAT_INTERVAL": "5s"})
    assert (both.lease, both.heartbeat_interval) == (20.0, 5.0)


def test_the_concurrency_keeps_the_apps_limits_and_no_prepared_statements_is_off() -> None:
    config = serve_config(_args("--concurrency", "7", "--no-prepared-statements"), APP, {})
    assert config.queues == {"a": trioq.QueueConfig(concurrency=7, global_concurrency=5),
                             "b": trioq.QueueConfig(concurrency=7)}  # fmt: skip
    assert config.prepared_statements is False and config.handle_signals is True


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trioq._cli", "serve", *args], env=cli_env(env), cwd=TESTS,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_serve_concurrency_zero_is_refused_before_it_connects(unused_port: int) -> None:
    """It was falsy, so ``--concurrency 0`` served 10 slots (here it would have tried the
    refused port)."""
    nowhere = f"postgresql://nobody@127.0.0.1:{unused_port}/x"
    for argv, env, source in (
        (["--concurrency", "0"], {}, "--concurrency '0'"),
        (["--concurrency", "-3"], {}, "--concurrency '-3'"),
        ([], {"TRIOQ_CONCURRENCY": "0"}, "$TRIOQ_CONCURRENCY '0'"),
    ):
        done = _serve("--app", "serve_app:config", "--dsn", nowhere, *argv, env=env)
        assert done.returncode == 1, done.stderr
        assert done.stderr.splitlines() == [
            f"trioq: error: {source}: use a whole number from 1 to 1,000,000"]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_bad_value_of_each_kind_exits_1_before_anything_starts(
    kind: str, tmp_path: Path
) -> None:
    """No DSN: the embedded server would be started (its data directory made, or here its
    initdb failing: tmp_path is not the server user's) if the value were read after it,
    and the app (which does not exist) would be imported first."""
    setting = next(s for s in SETTINGS if s.kind.name == kind)
    bad = BAD[kind][2]
    env = {"TRIOQ_EMBEDDED_DIR": str(tmp_path / "embedded")}
    for argv, extra, source in (
        ([setting.flag, bad], {}, setting.flag),
        ([], {setting.env[0]: bad}, f"${setting.env[0]}"),
    ):
        done = _serve("--app", "nosuch_module:app", *argv, env={**env, **extra})
        if argv and setting.flag in PARSED:  # a usage error of the parser, exit 2
            assert done.returncode == 2, done.stderr
            last = done.stderr.splitlines()[-1]
            assert last.startswith(f"trioq serve: error: argument {source}: "), last
        else:
            assert done.returncode == 1, done.stderr
            assert done.stderr.startswith((f"trioq: error: {source} ",
                                           f"trioq: error: {source}:"))  # fmt: skip
            assert len(done.stderr.splitlines()) == 1
        assert "nosuch_module" not in done.stderr
        assert not (tmp_path / "embedded").exists()


def test_a_bad_setting_with_a_good_app_starts_no_embedded_server(tmp_path: Path) -> None:
    """The Config is built (its cross-field rules checked) before the embedded server
    starts: before, a bad ``--metrics`` was found only once it ran."""
    env = {"TRIOQ_EMBEDDED_DIR": str(tmp_path / "embedded"), "APP_LEASE": "30"}
    done = _serve("--app", "serve_app:config", "--heartbeat-interval", "11", env=env)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "trioq: error: heartbeat_interval (11.0 s) must be at most a third of the lease "
        "(30.0 s), so a lease survives a missed heartbeat (given: --heartbeat-interval '11')"]
    assert not (tmp_path / "embedded").exists()


def test_json_asks_for_json_log_lines() -> None:
    assert log_format(_args("--json")) == "json"
    assert log_format(_args("--json", "--log-format", "json")) == "json"
    assert log_format(_args()) == "text"
    assert log_format(_args("--log-format", "json")) == "json"
    with pytest.raises(ValueError, match="--json asks for JSON log lines, --log-format text"):
        log_format(_args("--json", "--log-format", "text"))


def test_serve_json_logs_json_lines(dsn: str) -> None:
    """``trioq serve --json`` logged text (the option was the database options' and serve
    ignored it): now every line of its log is a JSON object."""
    subprocess.run([sys.executable, "-m", "trioq._cli", "migrate", "--dsn", dsn], check=True,
                   timeout=60, capture_output=True)  # fmt: skip
    worker = ServeProcess(["--app", "serve_app:config", "--json"], env=cli_env(dsn=dsn))
    try:
        banner = worker.read_until("started")
    finally:
        log = worker.stop()
    assert json.loads(banner)["logger"] == "trioq.runtime"
    assert worker.proc.returncode == 0, log
    lines = log.splitlines()
    assert len(lines) >= 3 and all(json.loads(line)["message"] for line in lines), log


def test_the_workers_of_processes_get_the_flags_and_each_its_metrics_port() -> None:
    args = _args("--lease", "45s", "--schema", "flagschema", "--retain-dead", "off",
                 "--session-dsn", "postgresql://u:pw@direct/db", "--metrics", "127.0.0.1:9300",
                 "--dsn", "postgresql://u:pw@db/db", "--processes", "3")  # fmt: skip
    args.log_format = "json"
    config = serve_config(args, APP, {"TRIOQ_POOL_SIZE": "4"})
    argv = _child_argv(args, config)
    assert argv == ["serve", "--app", "m:a", "--log-format", "json", "--log-level", "info",
                    "--schema", "flagschema", "--lease", "45s", "--retain-dead", "off",
                    "--metrics", "127.0.0.1:9300-9302"]  # fmt: skip
    # No flag: the variable (inherited) or the app's address is spread over the workers too.
    args = _args("--processes", "2")
    args.log_format = "text"
    spread = _child_argv(args, serve_config(args, APP, {"TRIOQ_METRICS": "[::1]:9500"}))
    assert spread[-2:] == ["--metrics", "[::1]:9500-9501"]
    assert _child_argv(args, serve_config(args, APP, {}))[-2:] == ["--metrics",
                                                                  "127.0.0.1:9200-9201"]
