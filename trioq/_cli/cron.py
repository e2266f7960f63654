"""``trioq cron add|remove|list``: cron entries of the database, and every entry's ticks.

Entries live in two places: the application's code (``Config.cron``) and the database
(``cron_entries``, which ``add`` and ``remove`` change and every worker runs: ``docs/cron.md``,
"Entries in the database"). The fired ticks are in ``cron_ticks``. ``list`` shows the
database's entries (a row trioq cannot serve as broken), with ``--app MODULE:ATTRIBUTE`` (a
`trioq.Config`) the code's too, each with its source and its last and next tick by the
database's clock; a database entry named like a code entry is shown as not run (the code's
wins), and the names the database has ticks of but no entry (renamed or removed) are listed
too.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any

from .._config import Config
from .._cron import CronEntry
from .._cron_store import MAX_GRACE, StoredCronEntry
from .._db.statements import statements
from .._queue import Queue
from .ops import EXIT_NOT_FOUND, EXIT_OK, _command, _run, read_args
from .options import Commands, bounded, command, group, seconds

__all__ = ["add_cron_parser"]


def add_cron_parser(commands: Commands, common: argparse.ArgumentParser) -> None:
    subs, common = group(
        commands, common, "cron",
        help="add, remove and list cron entries (those of the database run on every worker)",
        epilog="examples:\n  trioq cron add nightly --schedule '0 3 * * *' --task report\n"
        "  trioq cron list --app myapp.jobs:config\n  trioq cron remove nightly\n"
        "  trioq cron list --json",
    )  # fmt: skip
    listing = _command(
        subs, common, "list", _list,
        help="each entry (code and database): source, schedule, task, queue, last tick (and "
        "its job), next tick",
        example="trioq cron list --app myapp.jobs:config\n"
        "  trioq cron list --json | jq '.[].next_tick'",
    )  # fmt: skip
    listing.add_argument(
        "--app", help="MODULE:ATTRIBUTE of a trioq.Config: its entries too, and which "
        "database entries they shadow (default: the database's entries and ticks)",
    )  # fmt: skip
    add = command(
        subs, "add", parents=[common],
        help="store a cron entry that every worker runs (a name stored already is refused "
        "unless --replace)",
        epilog="examples:\n  trioq cron add nightly --schedule '0 3 * * *' --task report "
        "--args '{\"kind\": \"sales\"}'\n  trioq cron add payroll --schedule '0 9 * * mon-fri' "
        "--timezone Europe/Paris --task pay --queue money --replace",
    )  # fmt: skip
    add.add_argument("name", help="the entry's name: up to 200 letters, digits, '_', '.', "
                     "':' or '-', starting with a letter or '_'")  # fmt: skip
    add.add_argument("--schedule", required=True,
                     help="croniter syntax: 5 fields, a 6th for seconds, or @daily ...")
    add.add_argument("--task", required=True, help="the task each tick enqueues")
    add.add_argument("--args", default="{}", help="JSON args (default {}); @FILE reads them "
                     "from FILE, - from stdin")  # fmt: skip
    add.add_argument("--queue", default="default", help="the job's queue (default: default)")
    add.add_argument("--priority", type=_priority, default=0, help="-100..100, lower runs first")
    add.add_argument("--max-attempts", type=_attempts,
                     help="default: the task's, as the worker that runs the job declares it")
    add.add_argument("--timezone", default="UTC",
                     help="the IANA zone the schedule is read in (default UTC)")
    add.add_argument("--misfire", choices=("skip", "run_once"), default="skip",
                     help="after downtime: drop the missed ticks (skip) or run one job (run_once)")
    add.add_argument("--misfire-grace", type=_grace, metavar="DURATION",
                     help="under skip, how late a tick may still fire (default 60s)")
    add.add_argument("--replace", action="store_true", help="replace an entry of that name")
    add.add_argument("--disabled", action="store_true",
                     help="store it without running it (add it again with --replace to run it)")
    add.set_defaults(handler=_add_command)
    remove = _command(
        subs, common, "remove", _remove,
        help="delete a cron entry of the database: no worker fires it again",
        example="trioq cron remove nightly   # exit code 4 if there is no such entry",
    )  # fmt: skip
    remove.add_argument("name", help="the entry's name")


# -- argument types ---------------------------------------------------------------------------

_priority = bounded(int, -100, 100)
_attempts = bounded(int, 1, 10_000)


def _grace(text: str) -> dt.timedelta:
    try:
        value = seconds(text, "--misfire-grace")
    except ValueError as ex:
        raise argparse.ArgumentTypeError(str(ex)) from None
    if value > MAX_GRACE.total_seconds():
        raise argparse.ArgumentTypeError(f"--misfire-grace {text!r}: at most 100 years")
    return dt.timedelta(seconds=value)


def _add_command(args: argparse.Namespace) -> int:
    args.entry = _entry(args)  # refused before the database is touched
    return _run(_add, args)


def _entry(args: argparse.Namespace) -> CronEntry:
    """The entry ``cron add`` was given, built (so validated by `CronEntry`'s rules, the
    words of the Python API) before the database is touched."""
    text, source = read_args(args.args)
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as ex:
        raise ValueError(f"{source} is not JSON: {ex}") from None
    except RecursionError:
        raise ValueError(f"{source} is not JSON trioq can read: nested too deeply") from None
    grace = {} if args.misfire_grace is None else {"misfire_grace": args.misfire_grace}
    return CronEntry(
        name=args.name, schedule=args.schedule, task=args.task, args=payload, queue=args.queue,
        priority=args.priority, max_attempts=args.max_attempts, misfire=args.misfire,
        timezone=args.timezone, **grace,
    )  # fmt: skip


# -- the commands -------------------------------------------------------------------------------


async def _add(conn: Any, queue: Queue, args: argparse.Namespace) -> tuple[int, Any, str]:
    stored = await queue.add_cron(conn, args.entry, replace=args.replace,
                                  enabled=not args.disabled)  # fmt: skip
    now = await queue.clock(conn)
    row = _stored_row(stored, now)
    verb = "replaced" if stored.updated_at != stored.created_at else "added"
    text = (f"cron entry {stored.name!r} {verb}: {row['schedule']!r} ({row['timezone']}) "
            f"enqueues {row['task']} on {row['queue']}; "
            + ("disabled" if args.disabled else f"next tick {_when(row['next_tick'])}"))
    return EXIT_OK, row, text


async def _remove(conn: Any, queue: Queue, args: argparse.Namespace) -> tuple[int, Any, str]:
    if await queue.remove_cron(conn, args.name):
        return EXIT_OK, {"name": args.name, "removed": True}, f"cron entry {args.name!r} removed"
    message = f"no cron entry named {args.name!r} in the database"
    return EXIT_NOT_FOUND, {"name": args.name, "removed": False}, message


def _app_entries(spec: str | None) -> tuple[CronEntry, ...] | None:
    if spec is None:
        return None
    from .serve import AppError, load_app

    sys.path.insert(0, "")  # --app modules from the current directory, like serve
    app = load_app(spec)
    if not isinstance(app, Config):
        raise AppError(f"--app {spec!r} is a Registry: cron entries are in a trioq.Config")
    return app.cron


async def _list(conn: Any, queue: Queue, args: argparse.Namespace) -> tuple[int, Any, str]:
    code = _app_entries(args.app)
    st = statements(queue.schema)
    cur = await conn.execute(st.cron_last)
    last = {name: (tick, job_id, fired) for name, tick, job_id, fired in await cur.fetchall()}
    stored = await queue.cron_entries(conn)
    now = await queue.clock(conn)
    in_code = {entry.name for entry in code or ()}
    rows: list[dict[str, Any]] = []
    for entry in code or ():
        rows.append({**_entry_row(entry, now), "source": "app", "enabled": True, "in_app": True,
                     "status": "ok", "error": None})  # fmt: skip
    for item in stored:
        row = _stored_row(item, now)
        if item.name in in_code:
            row["status"] = "shadowed"  # the code entry of that name runs instead
            row["next_tick"] = None
        rows.append(row)
    known = in_code | {item.name for item in stored}
    for name in sorted(set(last) - known):
        rows.append({
            "name": name, "source": None, "schedule": None, "timezone": None, "task": None,
            "queue": None, "next_tick": None, "enabled": None, "in_app": code is None,
            "status": "ticks only", "error": None,
        })  # fmt: skip
    for row in rows:
        tick, job_id, fired = last.get(row["name"], (None, None, None))
        row.update(last_tick=tick, last_job_id=job_id, last_fired_at=fired)
    rows.sort(key=lambda r: (r["name"], r["source"] != "app"))
    return EXIT_OK, rows, _text(rows, code is not None)


def _entry_row(entry: CronEntry, now: dt.datetime) -> dict[str, Any]:
    return {"name": entry.name, "schedule": entry.schedule, "timezone": entry.timezone,
            "task": entry.task, "queue": entry.queue, "next_tick": entry.next_tick(now)}


def _stored_row(item: StoredCronEntry, now: dt.datetime) -> dict[str, Any]:
    """A database entry as ``list`` and ``add`` show it (a broken one: its name and why)."""
    if item.entry is None:
        row: dict[str, Any] = {"name": item.name, "schedule": None, "timezone": None,
                               "task": None, "queue": None, "next_tick": None}  # fmt: skip
        status = "broken"
    else:
        row = _entry_row(item.entry, now)
        row.update(args=item.entry.args, priority=item.entry.priority,
                   max_attempts=item.entry.max_attempts, misfire=item.entry.misfire,
                   misfire_grace=item.entry.misfire_grace.total_seconds())  # fmt: skip
        status = "ok" if item.enabled else "disabled"
        if not item.enabled:
            row["next_tick"] = None
    return {**row, "source": "database", "enabled": item.enabled, "in_app": False,
            "status": status, "error": item.error, "updated_at": item.updated_at}


def _text(rows: list[dict[str, Any]], with_app: bool) -> str:
    if not rows:
        return "(no cron entries" + ("" if with_app else ": give --app to list the schedules "
                                     "of the code") + ")"  # fmt: skip
    lines = [f"{'name':<24} {'source':<8} {'schedule':<16} {'task':<20} {'queue':<12} "
             f"{'last tick':<30} {'next tick':<20} status"]  # fmt: skip
    for r in rows:
        source = r["source"] or "-"
        schedule = r["schedule"] or ("(not in the app)" if with_app and not r["source"] else "-")
        last = _when(r["last_tick"]) + (f" (job {r['last_job_id']})" if r["last_job_id"] else "")
        status = r["status"]
        if status == "broken":
            status = f"broken: {r['error']}"
        elif status == "shadowed":
            status = "not run: the app's entry of this name wins"
        lines.append(f"{r['name']:<24} {source:<8} {schedule:<16} {r['task'] or '-':<20} "
                     f"{r['queue'] or '-':<12} {last:<30} {_when(r['next_tick']):<20} "
                     f"{status}")  # fmt: skip
    if not with_app:
        lines.append("(the code's entries, schedules and next ticks: give --app MODULE:CONFIG)")
    return "\n".join(lines)


def _when(value: dt.datetime | None) -> str:
    return "-" if value is None else f"{value.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S}Z"
