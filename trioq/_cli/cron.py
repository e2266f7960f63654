"""``trioq cron list``: each cron entry, its schedule, and its last and next tick.

The schedules live in the application (``Config.cron``), the fired ticks in the database
(``cron_ticks``): with ``--app MODULE:ATTRIBUTE`` (a `trioq.Config`) every entry is listed
with its next tick by the database's clock, and the entries the database has ticks of but
the app does not (renamed or removed) are listed too; without it, only what the database
knows (names and last ticks).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from typing import Any

from .._config import Config
from .._cron import CronEntry
from .._db.statements import statements
from .._queue import Queue
from .ops import EXIT_OK, _command
from .options import Commands, group

__all__ = ["add_cron_parser"]


def add_cron_parser(commands: Commands, common: argparse.ArgumentParser) -> None:
    subs, common = group(commands, common, "cron", help="list cron entries with their last and "
                         "next ticks", epilog="examples:\n  trioq cron list --app myapp.jobs:"
                         "config\n  trioq cron list --json")  # fmt: skip
    listing = _command(
        subs, common, "list", _list,
        help="each entry: schedule, task, queue, last tick (and its job), next tick",
        example="trioq cron list --app myapp.jobs:config\n"
        "  trioq cron list --json | jq '.[].next_tick'",
    )  # fmt: skip
    listing.add_argument(
        "--app", help="MODULE:ATTRIBUTE of a trioq.Config: its entries' schedules and next "
        "ticks (default: only the ticks the database has)",
    )  # fmt: skip


def _entries(spec: str | None) -> tuple[CronEntry, ...] | None:
    if spec is None:
        return None
    from .serve import AppError, load_app

    sys.path.insert(0, "")  # --app modules from the current directory, like serve
    app = load_app(spec)
    if not isinstance(app, Config):
        raise AppError(f"--app {spec!r} is a Registry: cron entries are in a trioq.Config")
    return app.cron


async def _list(conn: Any, queue: Queue, args: argparse.Namespace) -> tuple[int, Any, str]:
    entries = _entries(args.app)
    st = statements(queue.schema)
    cur = await conn.execute(st.cron_last)
    last = {name: (tick, job_id, fired) for name, tick, job_id, fired in await cur.fetchall()}
    now = await queue.clock(conn)
    rows: list[dict[str, Any]] = []
    for entry in entries or ():
        tick, job_id, fired = last.get(entry.name, (None, None, None))
        rows.append({
            "name": entry.name, "schedule": entry.schedule, "timezone": entry.timezone,
            "task": entry.task, "queue": entry.queue, "last_tick": tick, "last_job_id": job_id,
            "last_fired_at": fired, "next_tick": entry.next_tick(now), "in_app": True,
        })  # fmt: skip
    known = {entry.name for entry in entries or ()}
    for name in sorted(set(last) - known):
        tick, job_id, fired = last[name]
        rows.append({
            "name": name, "schedule": None, "timezone": None, "task": None, "queue": None,
            "last_tick": tick, "last_job_id": job_id, "last_fired_at": fired, "next_tick": None,
            "in_app": entries is None,
        })  # fmt: skip
    return EXIT_OK, rows, _text(rows, entries is not None)


def _text(rows: list[dict[str, Any]], with_app: bool) -> str:
    if not rows:
        return "(no cron entries" + ("" if with_app else " have fired: give --app to list "
                                     "the schedules") + ")"  # fmt: skip
    lines = [f"{'name':<24} {'schedule':<16} {'task':<20} {'queue':<12} {'last tick':<30} "
             f"next tick"]  # fmt: skip
    for r in rows:
        schedule = r["schedule"] or ("-" if with_app is False else "(not in the app)")
        last = _when(r["last_tick"]) + (f" (job {r['last_job_id']})" if r["last_job_id"] else "")
        lines.append(f"{r['name']:<24} {schedule:<16} {r['task'] or '-':<20} "
                     f"{r['queue'] or '-':<12} {last:<30} {_when(r['next_tick'])}")  # fmt: skip
    if not with_app:
        lines.append("(schedules and next ticks: give --app MODULE:CONFIG)")
    return "\n".join(lines)


def _when(value: dt.datetime | None) -> str:
    return "-" if value is None else f"{value.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S}Z"
