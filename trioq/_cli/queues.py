"""``trioq queue list|pause|resume|set``: a queue's flow control (``docs/flow-control.md``).

Settings are stored in the database and every worker hears of a change by notification;
each command prints the queue's settings afterwards (JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

import attrs

from .._db.sql.status import DEPTH_CAP
from .._db.statements import statements
from .._flow import QueueSettings, RateLimit, check_limit, to_aging
from .._job import check_aware
from .._obs.depth import read_depths
from .._queue import Queue
from .ops import EXIT_OK, _run
from .options import Commands, command, group, queue_name, seconds, shown

__all__ = ["add_queue_parser"]

_NONE = "none"


def add_queue_parser(commands: Commands, common: argparse.ArgumentParser) -> None:
    subs, common = group(
        commands, common, "queue",
        help="pause, resume and limit queues (across every worker)",
        description="Pause, resume and limit queues. Settings live in the database and hold "
        "across every worker process; workers hear of a change within milliseconds.",
        epilog="examples:\n  trioq queue list\n  trioq queue pause email\n"
        "  trioq queue pause email --until 2026-12-03T06:00Z\n  trioq queue pause email --for 2h\n"
        "  trioq queue set email --global-concurrency 5 --rate 100/1m\n"
        "  trioq queue set sync --key-concurrency 1\n"
        "  trioq queue set email --rate none   # remove the rate limit\n"
        "  trioq queue set reports --aging 5m  # a waiting job climbs a priority level per 5 min\n"
        "  trioq queue set tenants --fair      # round-robin across the jobs' keys",
    )  # fmt: skip
    _sub(subs, common, "list", _list, "show every queue's settings and depth")
    pause = _sub(subs, common, "pause", _pause, "stop every worker from claiming from a queue",
                 named=True)  # fmt: skip
    until = pause.add_mutually_exclusive_group()
    until.add_argument(
        "--until", type=_until, metavar="TIME",
        help="resume by itself at TIME, on the database's clock: ISO 8601 with a timezone, "
        "e.g. 2026-12-03T06:00Z or 2026-12-03T07:00+01:00 (without it or --for: until "
        "trioq queue resume)",
    )  # fmt: skip
    until.add_argument(
        "--for", dest="pause_for", type=_for, metavar="DURATION",
        help="resume by itself after DURATION from the database's clock now, e.g. 90s, 30m, "
        "2h, 7d",
    )  # fmt: skip
    _sub(subs, common, "resume", _resume, "let workers claim from a paused queue again", named=True)
    limits = _sub(
        subs, common, "set", _set, "change a queue's limits (none removes one)", named=True
    )
    for flag, kind, metavar, text in (
        ("--global-concurrency", _count, "N|none",
         "at most N jobs of the queue running at once, in all workers"),
        ("--rate", _rate, "N/PERIOD|none",
         "at most N starts in any PERIOD, e.g. 100/1m, 5/s, 10/500ms"),
        ("--key-concurrency", _count, "K|none", "at most K running jobs per concurrency key"),
        ("--key-rate", _rate, "N/PERIOD|none",
         "at most N starts per concurrency key in any PERIOD"),
        ("--aging", _aging, "DURATION|none",
         "a waiting job climbs one priority level per DURATION of waiting, never past the "
         "best priority waiting (anti-starvation; 1s to 366d, default 1m); none turns it off"),
    ):  # fmt: skip
        # SUPPRESS: a flag not given is absent from the namespace ("none" removes a limit).
        limits.add_argument(flag, type=kind, metavar=metavar, help=text,
                            default=argparse.SUPPRESS)  # fmt: skip
    limits.add_argument(
        "--fair", action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
        help="claim round-robin across the jobs' concurrency keys, so one key's backlog "
        "does not delay another's (--no-fair: in priority order, as by default)",
    )  # fmt: skip


def _sub(
    subs: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
    name: str,
    action: Any,
    help: str,
    *,
    named: bool = False,
) -> argparse.ArgumentParser:
    sub = command(subs, name, parents=[common], help=help)
    if named:
        sub.add_argument("name", type=queue_name, help="the queue")
        sub.add_argument(
            "--create", action="store_true",
            help=f"{name} NAME even if nothing knows it yet (no settings, job, dead job, "
            "worker or recent run), e.g. to pause a queue before its first job; without it "
            "such a name is refused (a typo would make a queue no job uses)",
        )  # fmt: skip
    sub.set_defaults(handler=lambda args: _run(action, args) if _checked(args) else 1)
    return sub


def _checked(args: argparse.Namespace) -> bool:
    """Usage problems argparse cannot see are reported before the database is touched."""
    if args.queue_command == "set":
        _changes(args)
    return True


# -- argument types (argparse reports their ValueError as a usage error) -------------------------


def _count(text: str) -> int | None:
    if text.strip().lower() == _NONE:
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (or none)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1 (pause the queue instead)")
    return value


def _until(text: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{shown(text)} is not an ISO 8601 time: use e.g. 2026-12-03T06:00Z or "
            "2026-12-03T07:00+01:00"
        ) from None
    try:
        check_aware(value, "until")  # the words of Queue.pause
    except ValueError as ex:
        raise argparse.ArgumentTypeError(str(ex)) from None
    return value


def _for(text: str) -> dt.timedelta:
    try:
        return dt.timedelta(seconds=seconds(text, ""))
    except ValueError as ex:  # argparse names the option: "argument --for: '7x': ..."
        raise argparse.ArgumentTypeError(str(ex).lstrip()) from None


def _rate(text: str) -> RateLimit | None:
    if text.strip().lower() == _NONE:
        return None
    try:
        return RateLimit.parse(text)
    except ValueError as ex:
        raise argparse.ArgumentTypeError(str(ex)) from None


def _aging(text: str) -> dt.timedelta | None:
    if text.strip().lower() == _NONE:
        return None
    try:
        return to_aging(seconds(text, "aging"), "aging")
    except ValueError as ex:
        raise argparse.ArgumentTypeError(str(ex)) from None


# -- the commands ---------------------------------------------------------------------------------


async def _list(conn: Any, queue: Queue, args: argparse.Namespace) -> tuple[int, Any, str]:
    settings = {s.name: s for s in await queue.queue_settings(conn)}
    depth = {q.queue: q for q in (await queue.status(conn))[0]}
    names = sorted(set(settings) | set(depth))
    rows = []
    for name in names:
        row = _settings_dict(settings.get(name, QueueSettings(name=name)))
        status = depth.get(name)
        row["available"] = status.available if status else 0
        row["running"] = status.running if status else 0
        rows.append(row)
    shown_paused = [_paused_cell(r) for r in rows]
    width = max([6, *map(len, shown_paused)])
    head = (f"{'queue':<20} {'paused':<{width}} {'global':>6} {'rate':>10} {'per key':>7} "
            f"{'key rate':>10} {'aging':>6} {'fair':>4} {'available':>9} "
            f"{'running':>7}")  # fmt: skip
    lines = [head] + [
        f"{r['name']:<20} {cell:<{width}} {_dash(r['global_concurrency']):>6} "
        f"{_dash(r['rate_limit']):>10} {_dash(r['key_concurrency']):>7} "
        f"{_dash(r['key_rate_limit']):>10} {_aging_cell(r['aging']):>6} "
        f"{'yes' if r['fair'] else 'no':>4} {r['available']:>9} {r['running']:>7}"
        for r, cell in zip(rows, shown_paused, strict=True)
    ]
    if not rows:
        lines.append("(no queues)")
    return EXIT_OK, rows, "\n".join(lines)


async def _known(conn: Any, queue: Queue, args: argparse.Namespace) -> None:
    """Refuse a queue nothing knows (`QUEUE_KNOWN`), unless ``--create``: the message
    lists the queues that are known (at most `SHOWN`), and says how to go ahead."""
    if args.create:
        return
    st = statements(queue.schema)
    cur = await conn.execute(st.queue_known, {"name": args.name})
    row = await cur.fetchone()
    if row is not None and row[0]:
        return
    cur = await conn.execute(st.queue_names)
    names = {name for (name,) in await cur.fetchall()}
    names.update(q for q, _ in (await read_depths(conn, st, DEPTH_CAP)).counts)
    shown = ", ".join(sorted(names)[:SHOWN]) or "none"
    more = f" and {len(names) - SHOWN} more (trioq queue list)" if len(names) > SHOWN else ""
    raise ValueError(
        f"unknown queue {args.name!r}: no settings, job, dead job, live worker or run in the "
        f"last day has it (known: {shown}{more}). Check the name, or give --create to "
        f"{args.queue_command} it ahead of its first job"
    )


#: The known queues an unknown one's message lists at most.
SHOWN = 20


async def _pause(conn: Any, queue: Queue, args: argparse.Namespace) -> tuple[int, Any, str]:
    await _known(conn, queue, args)
    settings = await queue.pause(conn, args.name, until=args.until or args.pause_for)
    return EXIT_OK, _settings_dict(settings), f"queue {args.name!r} paused: {_describe(settings)}"


async def _resume(conn: Any, queue: Queue, args: argparse.Namespace) -> tuple[int, Any, str]:
    await _known(conn, queue, args)
    settings = await queue.resume(conn, args.name)
    return EXIT_OK, _settings_dict(settings), f"queue {args.name!r} resumed: {_describe(settings)}"


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    """The limits ``trioq queue set`` was given (checked before connecting)."""
    flags = {"global_concurrency": "global_concurrency", "rate_limit": "rate",
             "key_concurrency": "key_concurrency", "key_rate_limit": "key_rate",
             "aging": "aging", "fair": "fair"}  # fmt: skip
    changes = {k: getattr(args, dest) for k, dest in flags.items() if hasattr(args, dest)}
    if not changes:
        raise ValueError(
            "queue set: give at least one of --global-concurrency, --rate, --key-concurrency, "
            "--key-rate, --aging, --fair/--no-fair"
        )
    for field in ("global_concurrency", "key_concurrency"):
        check_limit(changes.get(field), field)  # the bound the database holds
    return changes


async def _set(conn: Any, queue: Queue, args: argparse.Namespace) -> tuple[int, Any, str]:
    await _known(conn, queue, args)
    settings = await queue.set_limits(conn, args.name, **_changes(args))
    return EXIT_OK, _settings_dict(settings), f"queue {args.name!r}: {_describe(settings)}"


def _settings_dict(settings: QueueSettings) -> dict[str, Any]:
    row = attrs.asdict(settings, recurse=False)
    for key in ("rate_limit", "key_rate_limit"):
        row[key] = None if row[key] is None else str(row[key])
    until = settings.paused_until
    row["paused_until"] = None if until is None else until.isoformat()
    row["aging"] = None if settings.aging is None else settings.aging.total_seconds()
    return row


def paused_text(s: QueueSettings) -> str:
    """``paused until 2026-12-03T06:00:00+00:00`` (UTC), ``paused`` or ``not paused``."""
    if s.paused_until is not None:
        return f"paused until {s.paused_until.isoformat()}"
    return "paused" if s.paused else "not paused"


def _describe(s: QueueSettings) -> str:
    parts = [paused_text(s)]
    if s.global_concurrency is not None:
        parts.append(f"global concurrency {s.global_concurrency}")
    if s.rate_limit is not None:
        parts.append(f"rate {s.rate_limit}")
    if s.key_concurrency is not None:
        parts.append(f"per-key concurrency {s.key_concurrency}")
    if s.key_rate_limit is not None:
        parts.append(f"per-key rate {s.key_rate_limit}")
    if len(parts) == 1:
        parts.append("no limits")
    parts.append("aging off" if s.aging is None else f"aging {_span(s.aging)}")
    if s.fair:
        parts.append("fair share")
    return ", ".join(parts)


def _paused_cell(row: dict[str, Any]) -> str:
    if row["paused_until"] is not None:
        return f"until {row['paused_until']}"
    return "yes" if row["paused"] else "no"


def _span(value: dt.timedelta) -> str:
    """A duration as the command line writes it: 90s, 5m, 2h, 1d."""
    total = value.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if total >= size and total % size == 0:
            return f"{int(total // size)}{unit}"
    return f"{total:g}s"


def _aging_cell(value: float | None) -> str:
    return "off" if value is None else _span(dt.timedelta(seconds=value))


def _dash(value: object) -> str:
    return "-" if value is None else str(value)
