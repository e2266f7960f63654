"""Every argument of every ``trioq`` subcommand that takes a value, fed what careless hands
(or a script whose variable is unset) give it: empty, negative, huge, NUL, a lone surrogate
(how Python decodes a byte of argv that is not UTF-8), not a number, junk.

The subcommands come from the real parser's tree (`build_parser`), not from a list here,
so a new command or option is walked the day it is added. Each run must end in a clear
error: a non-zero exit code, a message on stderr that names the argument, no traceback,
and not one row changed in ``jobs``, ``dead_jobs``, ``queues`` or ``cron_entries``. The
values an argument rightly takes (a JSON number is a job's args, ``-1`` a priority) are
listed in `TAKEN`, each with its reason, and must succeed.

The commands run in this process (`main`), against real Postgres (about 900 runs in 10 to
15 s). Those that would run for long or start servers (`PARSED_ONLY`: serve, web, demo, db
start and stop) are only parsed: a refusal must still be clear, but a value they take is
not followed further. ``trioq stress`` is parsed and its options validated
(`StressOptions`), as it does before it starts anything, and held to the full rule.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from trioq._cli.main import build_parser, main
from trioq._cli.stress import _options as stress_options

#: What careless hands give, by name.
VALUES = {
    "empty": "",
    "negative": "-1",
    "huge": str(10**30),
    "nul": "a\x00b",
    "surrogate": "a\udc80b",
    "nan": "NaN",  # float() takes it; "nan" would be a valid schema name
    "junk": "x y;'",
}

#: Commands that are parsed, not run: they serve until stopped, or start a server.
PARSED_ONLY = {("serve",), ("web",), ("demo",), ("db", "start"), ("db", "stop")}

#: The commands that filter by queue and task.
FILTERED = [(("dead",), "list"), (("dead",), "retry"), (("dead",), "purge"), (("jobs",), "list")]

#: Values an argument rightly takes: (command, argument) -> (value names, why). Each must
#: succeed (exit code 0; ``db status``: 3, not running) with no traceback.
QUEUE = ({"huge", "nan"}, "a queue name may be digits, or NaN")
TASK = ({"nan"}, "NaN is a task name")
TAKEN: dict[tuple[tuple[str, ...], str], tuple[set[str], str]] = {
    (("enqueue",), "task"): TASK,
    (("enqueue",), "--queue"): QUEUE,
    (("enqueue",), "--args"): ({"negative", "huge"}, "a JSON number is a job's args (the "
                               "handler's one positional argument)"),
    (("enqueue",), "--priority"): ({"negative"}, "-100 to 100, lower runs first"),
    (("enqueue",), "--dedup-key"): ({"negative", "huge", "nan", "junk"}, "any text is a key"),
    (("enqueue",), "--concurrency-key"): ({"negative", "huge", "nan", "junk"},
                                          "any text is a key"),
    **{((*group, verb), "--queue"): QUEUE for group, verb in FILTERED},
    **{((*group, verb), "--task"): TASK for group, verb in FILTERED},
    (("stress",), "--json"): ({"negative", "huge", "surrogate", "nan", "junk"},
                              "a file may have any name but an empty one"),
    (("stress",), "--launcher"): ({"negative", "huge", "nan"},
                                  "a command prefix: only running it tells"),
    (("cron", "add"), "name"): (TASK[0], "NaN is a cron entry name (the walk adds it)"),
    (("cron", "add"), "--task"): TASK,
    (("cron", "add"), "--queue"): QUEUE,
    (("cron", "add"), "--args"): ({"negative", "huge"}, "a JSON number is a job's args"),
    (("cron", "add"), "--priority"): ({"negative"}, "-100 to 100, lower runs first"),
    (("cron", "remove"), "name"): (TASK[0], "NaN is a cron entry name: the one cron add "
                                   "stored earlier in the walk"),
    **{
        (("db", verb), "--data-dir"): ({"negative", "huge", "nan", "junk"},
                                       "a directory may have any name but an empty one")
        for verb in ("status", "url", "start", "stop")
    },
}  # fmt: skip

#: A value each command needs to run, by its argument: the positionals and required
#: options, and the companions some arguments need (``--unique-period`` needs a key).
NEEDS: dict[tuple[str, ...], dict[str, list[str]]] = {
    ("serve",): {"--app": ["--app", "serve_app:config"]},
    ("enqueue",): {"task": ["t"], "--dedup-key": ["--dedup-key=k"]},
    ("cancel",): {"job_id": ["1001"]},
    ("dead", "retry"): {"--id": ["--id=1002"]},
    ("dead", "purge"): {"--id": ["--id=1002"]},
    ("jobs", "show"): {"job_id": ["1001"]},
    ("jobs", "wait"): {"job_id": ["1003"]},  # done: wait returns at once
    # --replace rides with the schedule: each run that succeeds replaces the one before.
    ("cron", "add"): {"name": ["c"], "--schedule": ["--replace", "--schedule=* * * * *"],
                      "--task": ["--task=t"]},
    ("cron", "remove"): {"name": ["c"]},
    ("queue", "pause"): {"name": ["q"]},
    ("queue", "resume"): {"name": ["q"]},
    ("queue", "set"): {"name": ["q"], "--global-concurrency": ["--global-concurrency=2"]},
}

SEED = """
INSERT INTO trioq.jobs (id, queue, task, args, state, run_at, result, finished_at) VALUES
 (1001, 'q', 't', '{}', 'available', now(), NULL, NULL),
 (1003, 'q', 't', '{}', 'done', now(), '7', now());
INSERT INTO trioq.dead_jobs (id, queue, task, args, priority, attempt, max_attempts, reason,
                             enqueued_at) VALUES
 (1002, 'q', 't', '{}', 0, 1, 1, 'fatal error', now());
"""


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every runnable command of the tree: its words and its parser."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        yield path, parser
    for group in groups:
        for name, sub in group.choices.items():
            yield from commands(sub, (*path, name))


def takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0 and not isinstance(
        action, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction
    )


def key(action: argparse.Action) -> str:
    """How an argument is named: its first option string, or a positional's dest."""
    return action.option_strings[0] if action.option_strings else action.dest


def names(action: argparse.Action) -> list[str]:
    """What a message about ``action`` says: an option string, or its dest as words."""
    dest = action.dest
    return [*action.option_strings, dest, dest.replace("_", "-"), dest.replace("_", " "),
            *([action.metavar] if isinstance(action.metavar, str) else [])]  # fmt: skip


def argv_for(
    path: tuple[str, ...], parser: argparse.ArgumentParser, tested: argparse.Action,
    value: str, dsn: str,
) -> list[str]:  # fmt: skip
    """The command with what it needs, ``tested`` given ``value``, and ``--dsn``."""
    needs = NEEDS.get(path, {})
    words = list(path)
    for action in parser._actions:
        if not takes_value(action):
            continue
        name = key(action)
        if action is tested:
            words += [f"{name}={value}"] if action.option_strings else [value]
        elif name in needs:
            words += needs[name]
        elif name == "--dsn":
            words += [f"--dsn={dsn}"]
    return words


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as ex:
        code = ex.code if isinstance(ex.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def parse(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    """Parse only (and, for stress, validate its options as it does before a run)."""
    try:
        args = build_parser(argv).parse_args(argv)
        if argv[0] == "stress":
            stress_options(args)
        code = 0
    except SystemExit as ex:
        code = ex.code if isinstance(ex.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def verdict(
    path: tuple[str, ...], action: argparse.Action, label: str, result: tuple[int, str, str]
) -> str | None:
    """What is wrong with one run, or None."""
    code, out, err = result
    taken, _why = TAKEN.get((path, key(action)), (set(), ""))
    if "Traceback" in err:
        return f"a traceback: {err.strip()[-300:]}"
    if label in taken:
        ok = (0, 3) if path == ("db", "status") else (0,)
        return None if code in ok else f"exit {code} for a value it takes: {err.strip()}"
    if code == 0:
        # A command that is only parsed may take it: what it then does is not walked here.
        return None if path in PARSED_ONLY else f"taken (exit 0): {out.strip()[:200]}"
    if not err.strip():
        return f"exit {code}, nothing on stderr"
    if not any(name.lower() in err.lower() for name in names(action)):
        return f"the message does not name the argument: {err.strip()[-300:]}"
    return None


def test_every_argument_refuses_what_careless_hands_give(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    # Never another database: an empty or ignored --dsn would fall back to this (refused at
    # once), not to the embedded Postgres. The db commands' data directories go to tmp_path.
    monkeypatch.setenv("TRIOQ_DSN", "postgresql://nobody@127.0.0.1:1/nowhere")
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("TRIOQ_EMBEDDED_DIR", str(tmp_path / "embedded"))
    monkeypatch.chdir(tmp_path)
    assert run(capsys, ["migrate", f"--dsn={dsn}"])[0] == 0
    db = psycopg.connect(dsn, autocommit=True)
    db.execute(SEED)

    def counts() -> tuple[int, ...]:
        row = db.execute("SELECT (SELECT count(*) FROM trioq.jobs), (SELECT count(*) FROM"
                         " trioq.dead_jobs), (SELECT count(*) FROM trioq.queues),"
                         " (SELECT count(*) FROM trioq.cron_entries)").fetchone()
        assert row is not None
        return tuple(row)

    started, seen, failures = time.monotonic(), 0, []
    for path, parser in commands(build_parser([])):
        runner = parse if path in PARSED_ONLY or path == ("stress",) else run
        for action in filter(takes_value, parser._actions):
            taken, _why = TAKEN.get((path, key(action)), (set(), ""))
            for label, value in VALUES.items():
                if action.choices is not None and value in action.choices:
                    continue
                before = counts()
                try:
                    result = runner(capsys, argv_for(path, parser, action, value, dsn))
                except Exception as ex:  # reported with the others, below
                    capsys.readouterr()
                    result = -1, "", f"Traceback: {type(ex).__name__}: {ex}"
                seen += 1
                problem = verdict(path, action, label, result)
                if label not in taken and counts() != before:
                    problem = f"the database changed ({before} -> {counts()})"
                if problem is not None:
                    failures.append(f"trioq {' '.join(path)} {key(action)} {label}: {problem}")
    db.close()
    print(f"walked {seen} runs in {time.monotonic() - started:.1f} s")
    assert not failures, f"{len(failures)} of {seen} runs:\n" + "\n".join(failures)
    assert seen > 500  # the tree was walked, not an empty list
