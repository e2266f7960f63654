"""``trioq jobs``: one job at a time. ``show ID`` (its status, every state) and ``wait ID``
(its result, once it has finished). A group, so more subcommands fit beside them.

Exit codes: 0 found (``show``) or a result (``wait``); 4 no such job (or, for ``wait``,
one that kept no result); 5 ``wait``: the job is dead or cancelled; 6 ``wait``: timed out.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import trio

from .._exceptions import JobCancelledError, JobDeadError, JobNotFoundError
from .._queue import Queue
from .._result import JobStatus
from .ops import EXIT_NOT_FOUND, EXIT_OK, _command
from .options import database_options

__all__ = ["add_jobs_parser"]

EXIT_NO_RESULT, EXIT_TIMEOUT = 5, 6


def add_jobs_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    jobs = commands.add_parser(
        "jobs",
        parents=[common],  # so `trioq jobs --dsn URL` is a usage error that names no DSN
        help="look at one job: show its status, wait for its result",
        description="Look at one job: show its status, wait for its result.",
        epilog="examples:\n  trioq jobs show 42\n  trioq jobs wait 42 --timeout 30",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subs = jobs.add_subparsers(dest="jobs_command", required=True, metavar="COMMAND")
    common = database_options(in_group=True)
    show = _command(
        subs, common, "show", _show,
        help="show a job's state, attempts, lease, result or error (exit code 4 if unknown)",
        example="trioq jobs show 42\n  trioq jobs show 42 --json | jq .state",
    )  # fmt: skip
    show.add_argument("job_id", type=int)
    wait = _command(
        subs, common, "wait", _wait,
        help="wait until a job has finished and print its kept result as JSON",
        example="trioq jobs wait 42 --timeout 30   # exit 5 if it died or was cancelled",
    )  # fmt: skip
    wait.add_argument("job_id", type=int)
    wait.add_argument("--timeout", type=float, help="give up after this many seconds (exit 6)")


async def _show(conn: Any, queue: Queue, args: argparse.Namespace) -> tuple[int, Any, str]:
    status = await queue.job_status(conn, args.job_id)
    code = EXIT_NOT_FOUND if status.state == "unknown" else EXIT_OK
    return code, status.to_json(), describe(status)


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


def describe(s: JobStatus) -> str:
    """The status as text: one headline, then one line per field that says something."""
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
    if s.run_at is not None and s.state in ("scheduled", "available"):
        lines.append(f"  run at:    {s.run_at}")
    if s.lease_owner is not None:
        lines.append(f"  lease:     {s.lease_owner}, expires {s.lease_expires_at}")
    if s.finished_at is not None:
        label = "died:    " if s.state == "dead" else "finished:"
        lines.append(f"  {label}  {s.finished_at}")
    if s.dedup_key is not None:
        lines.append(f"  dedup key: {s.dedup_key}")
    if s.state == "done":
        lines.append(f"  result:    {json.dumps(s.result)}")
    if s.reason is not None:
        lines.append(f"  reason:    {s.reason}")
    if s.last_error is not None:
        lines.append(f"  error:     {s.last_error}")
    if s.traceback:
        lines.append("  traceback:")
        lines.extend(f"    {line}" for line in s.traceback.rstrip().splitlines())
    return "\n".join(lines)
