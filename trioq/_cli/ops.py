"""Operator commands: ``trioq enqueue``, ``status``, ``cancel``, ``dead list|retry|purge``.

Each runs one short trio program against the configured database (the
embedded one when no DSN is set) and prints text, or JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import pathlib
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from .._db.migrate import check_current
from .._db.statements import statements
from .._dead import DeadFilter
from .._job import check_cost
from .._pg.connection import connect
from .._pg.dsn import database
from .._pg.times import TOLERANT
from .._queue import STATUS_STATES, Queue, QueueStatus
from .._unique import Debounce, Unique
from .options import (
    Commands,
    age,
    bounded,
    command,
    duration,
    group,
    job_id,
    queue_name,
    task_name,
    time_or_duration,
)

__all__ = ["add_ops_parsers"]

EXIT_OK, EXIT_ERROR, EXIT_NOT_FOUND = 0, 1, 4

#: (exit code, JSON payload, text); text None: the action printed its output itself.
Action = Callable[[Any, Queue, argparse.Namespace], Awaitable[tuple[int, Any, Any]]]


def add_ops_parsers(commands: Commands, common: argparse.ArgumentParser) -> None:
    _enqueue_parser(commands, common)
    status = _command(
        commands, common, "status", _status,
        help="show queues, their depths and live leases (--watch: live, with recent rates)",
        example="trioq status\n  trioq status --json\n  trioq status --watch --interval 5",
    )  # fmt: skip
    status.add_argument(
        "--watch", action="store_true",
        help="redraw every --interval seconds until Ctrl-C, with each queue's completions and "
        "failures per minute (the last 5 minutes of the job history); with --json, one object "
        "per line",
    )  # fmt: skip
    status.add_argument(
        "--exact", action="store_true",
        help=f"count every job (reads the whole jobs table); by default each count per queue "
        f"and state is exact up to {STATUS_CAP:,} and shown as {STATUS_CAP}+ above, at a cost "
        "that does not grow with the backlog",
    )  # fmt: skip
    status.add_argument("--interval", type=_interval, default=2.0, help="seconds (default 2)")
    status.add_argument("--count", type=_frames, default=0, help=argparse.SUPPRESS)  # tests
    cancel = _command(
        commands, common, "cancel", _cancel,
        help="cancel a job by id",
        example="trioq cancel 42   # exit code 4 if no such live job",
    )  # fmt: skip
    cancel.add_argument("job_id", type=job_id)
    _dead_parser(commands, common)


def _command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
    name: str,
    action: Action,
    *,
    help: str,
    example: str,
    extra: argparse.ArgumentParser | None = None,
) -> argparse.ArgumentParser:
    sub = command(commands, name, parents=[common] if extra is None else [common, extra],
                  help=help, epilog=f"example:\n  {example}")  # fmt: skip
    sub.set_defaults(handler=lambda args: _run(action, args))
    return sub


def _run(action: Action, args: argparse.Namespace) -> int:
    """Run ``action`` and print what it says: with ``--json`` one object on stdout, whatever
    the exit code (a script reads stdout); as text, on stdout when it succeeded and on
    stderr when it did not (``trioq jobs wait 99``: no such job)."""
    with database(args.dsn) as dsn:
        code, payload, text = trio.run(_with_conn, dsn, action, args)
    if text is not None:  # None: the action printed its output itself (status --watch)
        if args.json:
            print(to_json(payload))
        else:
            print(text, file=sys.stdout if code == EXIT_OK else sys.stderr)
    return code


def to_json(payload: Any) -> str:
    """``payload`` as JSON; a value stored by another producer that json cannot encode
    (nested too deep, say) is shown as its text instead of failing the command."""
    try:
        return json.dumps(payload, default=str)
    except (ValueError, RecursionError):
        if isinstance(payload, list):
            return "[" + ", ".join(to_json(item) for item in payload) + "]"
        if isinstance(payload, dict):
            return json.dumps({k: _shown(v) for k, v in payload.items()}, default=str)
        return json.dumps(str(payload)[:1000])


def _shown(value: Any) -> Any:
    try:
        json.dumps(value, default=str)
    except (ValueError, RecursionError):
        return f"<not shown: {type(value).__name__} that JSON cannot encode>"
    return value


async def _with_conn(dsn: str, action: Action, args: argparse.Namespace) -> tuple[int, Any, str]:
    queue = Queue(schema=args.schema)
    # Times Python cannot hold (a row written by hand) read as the ends of its range.
    async with await connect(dsn, autocommit=True, context=TOLERANT) as conn:
        # Never migrated, migrated by a newer trioq, or missing tables: say so (and what to
        # run) before touching anything, as `serve` does.
        await check_current(conn, queue.schema, writable=False)
        return await action(conn, queue, args)


# -- enqueue ------------------------------------------------------------------------------------


def _enqueue_parser(commands: Commands, common: argparse.ArgumentParser) -> None:
    sub = _command(
        commands, common, "enqueue", _enqueue,
        help="enqueue one job",
        example="trioq enqueue greet --args '{\"name\": \"ada\"}' --queue default --delay 10\n"
        "  trioq enqueue import_rows --args @rows.json\n"
        "  jq -c . payload.json | trioq enqueue import_rows --args -",
    )  # fmt: skip
    sub.add_argument("task")
    sub.add_argument(
        "--args", default="{}",
        help="JSON args (default {}); @FILE reads them from FILE, - from stdin (for payloads "
        "beyond the command line's 128 KiB per argument)",
    )  # fmt: skip
    sub.add_argument("--queue", default="default")
    sub.add_argument("--priority", type=int, default=0, help="-100..100, lower runs first")
    sub.add_argument("--delay", type=float, help="seconds from now")
    sub.add_argument(
        "--start-by", metavar="WHEN",
        help="a deadline to start: a time with its zone (2030-01-01T09:00+00:00) or a "
        "duration from now (90s, 30m); not started by then, the job is dead-lettered",
    )  # fmt: skip
    sub.add_argument("--max-attempts", type=int,
                     help="default: the task's, as the worker that runs the job declares it")
    sub.add_argument("--dedup-key", help="skip if a live job of this task has this key")
    sub.add_argument(
        "--global-key",
        action="store_true",
        help="--dedup-key is not scoped by task (any task with this key)",
    )
    sub.add_argument(
        "--unique-period",
        metavar="DURATION",
        type=age,
        help="with --dedup-key: one job per key per window (e.g. 1h), done included",
    )
    sub.add_argument("--concurrency-key", help="the job's key for the queue's per-key limits")
    sub.add_argument(
        "--cost", metavar="SLOTS",
        help="slots the job occupies while it runs, 1-1000 (default: the task's, as the "
        "worker that runs it declares it)",
    )  # fmt: skip
    sub.add_argument(
        "--debounce", metavar="DURATION",
        help="with --dedup-key: a burst of enqueues of the key makes one job, run this long "
        "after the last one, with the last args (e.g. 5s)",
    )  # fmt: skip
    sub.add_argument(
        "--debounce-max-wait", metavar="DURATION",
        help="with --debounce: run at the latest this long after the burst's first enqueue",
    )  # fmt: skip


def read_args(value: str) -> tuple[str, str]:
    """(the JSON text, where it came from) of ``--args``: the value itself, ``@FILE`` (the
    file's contents) or ``-`` (stdin). Read as UTF-8; a file that cannot be read or is not
    UTF-8 is a ValueError naming it."""
    if value == "-":
        source, read = "--args - (stdin)", sys.stdin.buffer.read
    elif value.startswith("@"):
        path = value[1:]
        if not path:
            raise ValueError("--args @: name a file after the @ (e.g. --args @job.json)")
        source, read = f"--args @{path}", lambda: pathlib.Path(path).read_bytes()
    else:
        return value, "--args"
    try:
        data = read()
    except OSError as ex:
        raise ValueError(f"{source}: cannot read it: {ex.strerror or ex}") from None
    try:
        return data.decode("utf-8"), source
    except UnicodeDecodeError as ex:
        raise ValueError(f"{source}: not UTF-8 (byte {ex.start})") from None


async def _enqueue(conn: Any, queue: Queue, args: argparse.Namespace) -> tuple[int, Any, str]:
    text, source = read_args(args.args)
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as ex:
        raise ValueError(f"{source} is not JSON: {ex}") from None
    except RecursionError:
        raise ValueError(f"{source} is not JSON trioq can read: nested too deeply") from None
    unique: bool | Unique = False
    dedup_key = args.dedup_key
    if args.global_key or args.unique_period:
        if dedup_key is None:
            raise ValueError("--global-key and --unique-period need a --dedup-key")
        unique = Unique(key=dedup_key, by_task=not args.global_key, period=args.unique_period)
        dedup_key = None
    start_by = None if args.start_by is None else time_or_duration(args.start_by, "--start-by")
    debounce = _debounce(args)
    result = await queue.enqueue(
        conn, args.task, payload, queue=args.queue, priority=args.priority, delay=args.delay,
        start_by=start_by, max_attempts=args.max_attempts, dedup_key=dedup_key, unique=unique,
        concurrency_key=args.concurrency_key, debounce=debounce, cost=_cost(args.cost),
    )  # fmt: skip
    text = (
        f"debounced into job {result.job_id} (it had not started)"
        if result.duplicate and debounce is not None
        else f"duplicate of job {result.job_id} (it holds the key)" if result.duplicate
        else f"enqueued job {result.job_id}"
    )  # fmt: skip
    return EXIT_OK, attrs.asdict(result), text


def _cost(text: str | None) -> int | None:
    """``--cost`` as an int, refused in the words of every other path (``cost must be an
    int (slots), got '4.5'``, ``cost must be between 1 and 1000 (slots), got 0``)."""
    if text is None:
        return None
    value: object = text
    if text.strip().lstrip("+-").isdigit():
        # digits Python does not read as an int ('²') stay text, refused as such
        with contextlib.suppress(ValueError):
            value = int(text)
    try:
        return check_cost(value)
    except TypeError as ex:  # a flag's text is a bad value, not a bad type: the same words
        raise ValueError(str(ex)) from None


def _debounce(args: argparse.Namespace) -> Debounce | None:
    """``--debounce`` (and ``--debounce-max-wait``) as a `Debounce`, or None."""
    if args.debounce is None:
        if args.debounce_max_wait is not None:
            raise ValueError("--debounce-max-wait needs a --debounce")
        return None
    period = duration(args.debounce, "--debounce")
    wait = args.debounce_max_wait
    max_wait = None if wait is None else duration(wait, "--debounce-max-wait")
    return Debounce(period, max_wait=max_wait)


# -- status and cancel --------------------------------------------------------------------------


_interval = bounded(float, 0.1, 3600)  # seconds
_frames = bounded(int, 0, 1_000_000)  # status --watch --count: frames, then stop (0: never)
_dead_limit = bounded(int, 1, 10_000)


async def _status(conn: Any, queue: Queue, args: argparse.Namespace) -> tuple[int, Any, Any]:
    if args.watch:
        await _watch(conn, queue, args)
        return EXIT_OK, None, None
    payload, text = await _status_once(conn, queue, rates=None, exact=args.exact)
    return EXIT_OK, payload, text


async def _watch(conn: Any, queue: Queue, args: argparse.Namespace) -> None:
    """Redraw the status every ``args.interval`` s (a terminal is cleared first), until
    Ctrl-C or ``args.count`` frames."""
    redraw = sys.stdout.isatty() and not args.json
    st = statements(queue.schema)
    frame = 0
    while True:
        cur = await conn.execute(st.recent_rates, {"minutes": RATE_MINUTES})
        rates = {q: (done, retried, dead) for q, done, retried, dead in await cur.fetchall()}
        payload, text = await _status_once(conn, queue, rates=rates, exact=args.exact)
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        if args.json:
            print(to_json({"time": now.isoformat(), **payload}), flush=True)
        else:
            header = (f"trioq status, every {args.interval:g} s, {now:%Y-%m-%d %H:%M:%S} UTC "
                      f"(per minute: the last {RATE_MINUTES} minutes; Ctrl-C stops)")  # fmt: skip
            print(("\x1b[H\x1b[2J" if redraw else "") + header + "\n" + text + "\n", flush=True)
        frame += 1
        if args.count and frame >= args.count:
            return
        await trio.sleep(args.interval)


#: `status --watch` shows rates over this many minutes of the job history.
RATE_MINUTES = 5
#: `trioq status` counts up to this per queue and state, unless --exact.
STATUS_CAP = 10_000


async def _status_once(
    conn: Any, queue: Queue, *, rates: dict[str, tuple[int, int, int]] | None, exact: bool
) -> tuple[dict[str, Any], str]:
    """The status as JSON and text; with ``rates`` ((completed, retried, dead) per queue in
    the last `RATE_MINUTES`), each queue's completions and failures per minute too, and the
    queues that drained but were busy a moment ago. Counts stop at `STATUS_CAP` unless
    ``exact`` (the JSON's ``at_cap`` names them; the text shows them as ``10000+``)."""
    queues, leases = await queue.status(conn, cap=None if exact else STATUS_CAP)
    stored = [s for s in await queue.queue_settings(conn) if s.paused]
    paused = sorted(s.name for s in stored)
    paused_until = {s.name: s.paused_until.isoformat() for s in stored if s.paused_until}
    rows = [{**attrs.asdict(q), "paused": q.queue in paused} for q in queues]
    head = f"{'queue':<20} {'available':>9} {'scheduled':>9} {'running':>7} {'dead':>6}  oldest"
    if rates is not None:
        head += f"  {'done/min':>9} {'failed/min':>10}"
        seen = {row["queue"] for row in rows}
        rows += [{**attrs.asdict(QueueStatus(queue=name, available=0, scheduled=0, running=0,
                                             dead=0, oldest_wait_seconds=None)),
                  "paused": name in paused}
                 for name in sorted(set(rates) - seen)]  # fmt: skip
        for row in rows:
            done, retried, dead = rates.get(row["queue"], (0, 0, 0))
            row["completed_per_minute"] = round(done / RATE_MINUTES, 1)
            row["failed_per_minute"] = round((retried + dead) / RATE_MINUTES, 1)
    payload: dict[str, Any] = {
        "queues": rows,
        "workers": [attrs.asdict(w) for w in leases],
        "paused": paused,
        "paused_until": paused_until,  # the timed pauses among them: name -> ISO 8601 (UTC)
    }
    lines = [head]
    for row in rows:
        wait = row["oldest_wait_seconds"]
        oldest = "-" if wait is None else f"{wait:.1f}s"
        n = _counts(row)
        line = (f"{row['queue']:<20} {n['available']:>9} {n['scheduled']:>9} "
                f"{n['running']:>7} {n['dead']:>6}  {oldest}")  # fmt: skip
        if rates is not None:
            line = (f"{line:<63}  {row['completed_per_minute']:>9} "
                    f"{row['failed_per_minute']:>10}")  # fmt: skip
        lines.append(line)
    if not rows:
        lines.append("(no jobs)")
    if paused:
        shown_paused = [f"{name} (until {paused_until[name]})" if name in paused_until
                        else name for name in paused]  # fmt: skip
        lines.append(f"paused (trioq queue resume NAME): {', '.join(shown_paused)}")
    if waiting := [f"{_counts(row)['waiting']} in {row['queue']}" for row in rows
                   if row["waiting"]]:  # fmt: skip
        lines.append(f"waiting for their dependencies: {', '.join(waiting)}")
    lines.append("")
    lines.append(f"{'worker':<40} {'running':>7}  next lease expiry")
    for w in leases:
        expiry = f"in {w.next_expiry_seconds:.1f}s" if w.next_expiry_seconds >= 0 else "EXPIRED"
        lines.append(f"{w.worker:<40} {w.running:>7}  {expiry}")
    if not leases:
        lines.append("(no live leases)")
    return payload, "\n".join(lines)


def _counts(row: dict[str, Any]) -> dict[str, str]:
    """A status row's counts as text: ``10000+`` for one that stopped at the cap."""
    capped = set(row.get("at_cap", ()))
    return {s: f"{row[s]}+" if s in capped else str(row[s]) for s in STATUS_STATES}


async def _cancel(conn: Any, queue: Queue, args: argparse.Namespace) -> tuple[int, Any, str]:
    outcome = await queue.cancel(conn, args.job_id)
    text = {
        "cancelled": f"job {args.job_id} cancelled",
        "requested": f"job {args.job_id} is running: its worker will stop it",
        "not_found": f"job {args.job_id}: no such scheduled, available or running job",
    }[outcome.status]
    code = EXIT_NOT_FOUND if outcome.status == "not_found" else EXIT_OK
    return code, {"job_id": args.job_id, "status": outcome.status}, text


# -- dead letters -------------------------------------------------------------------------------


def _dead_parser(commands: Commands, common: argparse.ArgumentParser) -> None:
    subs, common = group(
        commands, common, "dead",
        help="list, retry or purge dead jobs",
        description="List, retry or purge dead jobs (filters combine with AND).",
        epilog="examples:\n  trioq dead list --queue email\n  trioq dead retry --id 42 --id 43\n"
        "  trioq dead purge --task send_welcome --older-than 7d",
    )  # fmt: skip
    filters = argparse.ArgumentParser(add_help=False)
    filters.add_argument("--id", type=job_id, action="append", dest="ids", metavar="ID",
                         help="repeatable")  # fmt: skip
    filters.add_argument("--queue", type=queue_name)
    filters.add_argument("--task", type=task_name)
    for name, action, help, example in (
        ("list", _dead_list, "list dead jobs", "trioq dead list --queue email --limit 20"),
        ("retry", _dead_retry, "move dead jobs back to available with fresh attempts",
         "trioq dead retry --task send_welcome\n  trioq dead retry --all --dry-run"),
        ("purge", _dead_purge, "delete dead jobs",
         "trioq dead purge --older-than 30d\n  trioq dead purge --all --dry-run"),
    ):  # fmt: skip
        sub = _command(subs, common, name, action, help=help, example=example, extra=filters)
        if name != "list":
            _writes_dead(sub, name, action)
    subs.choices["list"].add_argument("--limit", type=_dead_limit, default=100,
                                      help="1..10000 (default 100)")  # fmt: skip
    subs.choices["purge"].add_argument(
        "--older-than", type=age, metavar="AGE",
        help="only jobs that died longer ago than AGE: 1s to 100 years, e.g. 90s, 30m, 12h, 7d",
    )  # fmt: skip


def _writes_dead(sub: argparse.ArgumentParser, verb: str, action: Action) -> None:
    """``retry`` and ``purge``: with no filter they need ``--all`` (a bare ``trioq dead
    purge`` deleted every dead job), and ``--dry-run`` says what they would touch."""
    sub.add_argument(
        "--all", action="store_true", dest="every",
        help=f"{verb} every dead job: needed when no filter is given, refused with one",
    )  # fmt: skip
    sub.add_argument(
        "--dry-run", action="store_true",
        help=f"print the dead jobs it would {verb} now, and change nothing",
    )  # fmt: skip

    def handler(args: argparse.Namespace) -> int:
        filters = "--id, --queue, --task" + (" or --older-than" if verb == "purge" else "")
        if not args.every and not _filtered(args):
            sub.error(f"give a filter ({filters}) or --all to {verb} every dead job (with "
                      "--dry-run to see them first)")  # fmt: skip
        if args.every and _filtered(args):
            sub.error(f"--all is every dead job: give it without a filter ({filters})")
        return _run(action, args)

    sub.set_defaults(handler=handler)


def _filtered(args: argparse.Namespace) -> bool:
    given = (args.ids, args.queue, args.task, getattr(args, "older_than", None))
    return any(value is not None for value in given)


def _filter(args: argparse.Namespace) -> DeadFilter:
    return DeadFilter(ids=args.ids, queue=args.queue, task=args.task)


async def _dead_list(conn: Any, queue: Queue, args: argparse.Namespace) -> tuple[int, Any, str]:
    dead = await queue.dead_list(conn, _filter(args), limit=args.limit)
    lines = [
        f"{d.id:>8}  {d.queue:<12} {d.task:<24} attempts {d.attempt}/{d.max_attempts}  "
        f"{d.reason}: {(d.last_error or '').splitlines()[0] if d.last_error else ''}"
        for d in dead
    ] or ["(no dead jobs)"]
    return EXIT_OK, [attrs.asdict(d) for d in dead], "\n".join(lines)


async def _dead_retry(conn: Any, queue: Queue, args: argparse.Namespace) -> tuple[int, Any, str]:
    ids = await queue.dead_retry(conn, _filter(args), dry_run=args.dry_run)
    return _changed(args, ids, "retried", "retry")


async def _dead_purge(conn: Any, queue: Queue, args: argparse.Namespace) -> tuple[int, Any, str]:
    ids = await queue.dead_purge(conn, _filter(args), older_than=args.older_than,
                                 dry_run=args.dry_run)  # fmt: skip
    return _changed(args, ids, "purged", "purge")


def _changed(
    args: argparse.Namespace, ids: list[int], done: str, verb: str
) -> tuple[int, Any, str]:
    if args.dry_run:
        text = f"would {verb} {len(ids)} dead jobs{_ids(ids)} (dry run: nothing changed)"
        return EXIT_OK, {"dry_run": True, done: ids}, text
    return EXIT_OK, {done: ids}, f"{done} {len(ids)} dead jobs" + _ids(ids)


def _ids(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:20]))
    return f": {shown}{', ...' if len(ids) > 20 else ''}" if ids else ""
