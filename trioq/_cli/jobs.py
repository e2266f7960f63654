"""``trioq jobs``: ``list`` (the jobs of one state, filtered), ``show ID`` (one job's status,
every state) and ``wait ID`` (its result, once it has finished).

Exit codes: 0 found (``show``), a result (``wait``), listed (``list``, even if empty); 4 no
such job (or, for ``wait``, one that kept no result); 5 ``wait``: the job is dead or
cancelled; 6 ``wait``: timed out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

import trio

from .._db.sql.lists import WINDOW as LIST_WINDOW
from .._db.statements import statements
from .._durable import StepRecord
from .._exceptions import JobCancelledError, JobDeadError, JobNotFoundError
from .._progress import shown
from .._queue import Queue
from .._result import JobStatus
from .ops import EXIT_NOT_FOUND, EXIT_OK, _command
from .options import Commands, bounded, group, job_id, queue_name, task_name

__all__ = ["add_jobs_parser"]

EXIT_NO_RESULT, EXIT_TIMEOUT = 5, 6


def add_jobs_parser(commands: Commands, common: argparse.ArgumentParser) -> None:
    subs, common = group(commands, common, "jobs", help="look at jobs: list them, show one's "
                         "status, wait for its result", epilog="examples:\n  trioq jobs list "
                         "--state running\n  trioq jobs show 42\n  trioq jobs wait 42 --timeout "
                         "30")  # fmt: skip
    listing = _command(
        subs, common, "list", _list,
        help="list jobs of one state (default: running, then available, then scheduled), "
        "filtered by queue and task",
        example="trioq jobs list\n  trioq jobs list --state dead --queue email --limit 20\n"
        "  trioq jobs list --state running --json | jq '.[].id'",
    )  # fmt: skip
    listing.add_argument("--state", choices=LIST_STATES, help="default: the live states")
    listing.add_argument("--queue", type=queue_name)
    listing.add_argument("--task", type=task_name)
    listing.add_argument("--limit", type=_limit, default=50, help="1..1000 (default 50)")
    for name, action, help, example in (
        ("show", _show, "show a job's state, attempts, lease, result or error (exit code 4 if "
         "unknown)", "trioq jobs show 42\n  trioq jobs show 42 --json | jq .state"),
        ("wait", _wait, "wait until a job has finished and print its kept result as JSON",
         "trioq jobs wait 42 --timeout 30   # exit 5 if it died or was cancelled"),
    ):  # fmt: skip
        by_id = _command(subs, common, name, action, help=help, example=example)
        by_id.add_argument("job_id", type=job_id)  # both take a job's id
        if name == "wait":
            by_id.add_argument("--timeout", type=float,
                               help="give up after this many seconds (exit 6)")  # fmt: skip


#: The states `--state` takes, in the order the help lists them.
LIST_STATES = ("available", "scheduled", "running", "done", "cancelled", "dead")
#: The columns of a list row (``trioq/_db/sql/lists.py``), and those shown.
_ROW = ("id", "queue", "task", "state", "priority", "attempt", "max_attempts", "run_at",
        "enqueued_at", "lease_owner", "lease_expires_at", "finished_at", "last_error",
        "args")  # fmt: skip
_LIST_FIELDS = ("id", "queue", "task", "state", "priority", "attempt", "max_attempts", "run_at",
                "enqueued_at", "lease_owner", "finished_at", "last_error")  # fmt: skip
_LIVE = ("running", "available", "scheduled")


_limit = bounded(int, 1, 1000)


async def _list(conn: Any, queue: Queue, args: argparse.Namespace) -> tuple[int, Any, str]:
    """Each state's jobs through the index that serves it (at most `LIST_WINDOW` rows read
    per state, then filtered): running by lease expiry, available in claim order, scheduled
    by due time, done / cancelled / dead newest first."""
    st = statements(queue.schema)
    jobs: list[dict[str, Any]] = []
    for state in (args.state,) if args.state else _LIVE:
        params = {"queue": args.queue, "task": args.task, "contains": None, "text": None,
                  "window": LIST_WINDOW, "limit": args.limit - len(jobs), "offset": 0}  # fmt: skip
        if params["limit"] <= 0:
            break
        cur = await conn.execute(st.job_lists[state], params)
        for row in await cur.fetchall():
            fields = dict(zip(_ROW, row, strict=True))
            jobs.append({name: fields[name] for name in _LIST_FIELDS})
    return EXIT_OK, jobs, _list_text(jobs, args)


def _list_text(jobs: list[dict[str, Any]], args: argparse.Namespace) -> str:
    if not jobs:
        where = " ".join(f"{k} {v!r}" for k, v in (("state", args.state), ("queue", args.queue),
                                                    ("task", args.task)) if v)  # fmt: skip
        return f"(no jobs{' with ' + where if where else ''})"
    lines = [f"{'id':>10}  {'state':<9} {'queue':<16} {'task':<24} {'attempt':>7}  when / error"]
    for j in jobs:
        when = {"scheduled": j["run_at"], "available": j["run_at"],
                "running": j["lease_owner"]}.get(j["state"], j["finished_at"])  # fmt: skip
        text = f"{when:%Y-%m-%d %H:%M:%S}" if isinstance(when, dt.datetime) else str(when or "")
        if j["last_error"]:
            text += f"  {j['last_error'].splitlines()[0]}"
        lines.append(f"{j['id']:>10}  {j['state']:<9} {j['queue']:<16} {j['task']:<24} "
                     f"{j['attempt']:>3}/{j['max_attempts']:<3}  {text}".rstrip())  # fmt: skip
    if len(jobs) == args.limit:
        lines.append(f"(the first {args.limit}: --limit shows more)")
    return "\n".join(lines)


async def _show(conn: Any, queue: Queue, args: argparse.Namespace) -> tuple[int, Any, str]:
    status = await queue.job_status(conn, args.job_id)
    if status.state == "unknown":
        return EXIT_NOT_FOUND, status.to_json(), describe(status)
    steps = await queue.steps(conn, args.job_id)
    payload = {**status.to_json(), "steps": [step_json(step) for step in steps]}
    return EXIT_OK, payload, describe(status, steps)


def step_json(step: StepRecord) -> dict[str, Any]:
    return {"position": step.position, "name": step.name, "kind": step.kind,
            "result": step.result, "attempt": step.attempt,
            "recorded_at": step.recorded_at.isoformat()}  # fmt: skip


#: Steps `trioq jobs show` prints (the JSON has them all), and the width of a shown result.
SHOWN_STEPS, SHOWN_RESULT = 50, 60
#: Characters of a job's progress ``show`` prints (``--json`` has all of it).
SHOWN_PROGRESS = 500


def _step_line(step: StepRecord) -> str:
    result = step.result
    if step.kind == "wait" and isinstance(result, dict) and "until" in result:
        what = f"waiting, until {result['until']}"
    elif step.kind == "sleep" and isinstance(result, dict):
        what = f"until {result.get('until')}"
    else:
        what = json.dumps(result)
    if len(what) > SHOWN_RESULT:
        what = what[: SHOWN_RESULT - 3] + "..."
    return (f"    {step.position:>4}  {step.kind:<5}  {step.name[:30]:<30}  attempt "
            f"{step.attempt:<3} {what}")  # fmt: skip


async def _wait(conn: Any, queue: Queue, args: argparse.Namespace) -> tuple[int, Any, str]:
    payload: dict[str, Any] = {"job_id": args.job_id}
    try:
        result = await queue.result(conn, args.job_id, timeout=args.timeout)
    except (JobDeadError, JobCancelledError) as ex:
        return EXIT_NO_RESULT, {**payload, "state": ex.status.state, "error": str(ex)}, str(ex)
    except JobNotFoundError as ex:
        return EXIT_NOT_FOUND, {**payload, "state": "unknown", "error": str(ex)}, str(ex)
    except trio.TooSlowError:
        text = f"job {args.job_id} has not finished after {args.timeout:g} s"
        return EXIT_TIMEOUT, {**payload, "state": "pending", "error": text}, text
    return EXIT_OK, {**payload, "state": "done", "result": result}, json.dumps(result)


def _field_lines(s: JobStatus) -> list[str]:
    """The lines of `describe` for the fields that say something about this job."""
    lines = []
    if s.progress is not None or s.progress_at is not None:
        lines.append(f"  progress:  {shown(s.progress, SHOWN_PROGRESS)} (at {s.progress_at})")
    if s.run_at is not None and s.state in ("scheduled", "available"):
        lines.append(f"  run at:    {s.run_at}")
    if s.start_by is not None:
        lines.append(f"  start by:  {s.start_by}")
    if s.lease_owner is not None:
        lines.append(f"  lease:     {s.lease_owner}, expires {s.lease_expires_at}")
    if s.finished_at is not None:
        label = "died:    " if s.state == "dead" else "finished:"
        lines.append(f"  {label}  {s.finished_at}")
    if s.dedup_key is not None:
        lines.append(f"  dedup key: {s.dedup_key}")
    if s.sequence_key is not None:
        lines.append(f"  sequence:  {s.sequence_key}")
    if s.state == "done":
        lines.append(f"  result:    {json.dumps(s.result)}")
    if s.reason is not None:
        lines.append(f"  reason:    {s.reason}")
    if s.last_error is not None:
        lines.append(f"  error:     {s.last_error}")
    return lines


def describe(s: JobStatus, steps: Sequence[StepRecord] = ()) -> str:
    """The status as text: one headline, then one line per field that says something, then
    a durable job's records (`SHOWN_STEPS` at most)."""
    if s.state == "unknown":
        return (
            f"job {s.id}: unknown (no such job: never enqueued, completed without "
            "keep_result, or deleted by retention)"
        )
    lines = [
        f"job {s.id}: {s.state}" + (" (cancel requested)" if s.cancel_requested else ""),
        f"  task:      {s.task} (queue {s.queue}, priority {s.priority})",
        f"  args:      {json.dumps(s.args)}",
        f"  attempt:   {s.attempt} of {s.max_attempts}",
        f"  enqueued:  {s.enqueued_at}",
    ]
    lines.extend(_field_lines(s))
    if s.traceback:
        lines.append("  traceback:")
        lines.extend(f"    {line}" for line in s.traceback.rstrip().splitlines())
    if steps:
        lines.append(f"  steps:     {len(steps)} recorded")
        lines.extend(_step_line(step) for step in steps[:SHOWN_STEPS])
        if len(steps) > SHOWN_STEPS:
            lines.append(f"    (the first {SHOWN_STEPS}: --json has them all)")
    return "\n".join(lines)
