"""Durable jobs: steps a job records, so that a later run of it resumes where it left off
(``docs/durable.md``).

A handler that calls ``await job.step("charge", charge_card, order_id)`` runs
``charge_card`` once: its JSON result is recorded (a row of ``job_steps``, written fenced by
the job's lease), and every later run of the job (a retry after a failure, a wake-up after
``job.sleep``, a run after its worker died) replays the handler from the top with the
recorded steps returning their results without running. So a retry resumes from the step
that failed, and a sleep of days costs one row and no slot: the run ends, the slot and the
lease are freed, and the job is due again when the sleep is over.

What a replay must keep: the same steps, in the same order, under the same names. A run
that calls another step (or a sleep) at a recorded position, or the same name twice, raises
`DurableError`, a `trioq.FatalError`: the job is dead-lettered with a reason naming the
step, never re-run wrong (``job.patched`` is how new code takes another branch).

This module holds one run's view: `DurableRun`, made by `trioq.JobContext` at its first
durable call, which reads the job's records once (one round trip) and then writes one per
new step.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import attrs
import psycopg

from ._db.statements import LEASE_LOST_SQLSTATE, Statements, rendered
from ._exceptions import (
    DurableError,
    JobCancelledError,
    JobDeadError,
    JobNotFoundError,
    LeaseLostError,
    Sleep,
    Waiting,
    WaitTimeout,
)
from ._job import MAX_ENQUEUE_DELAY, JSONValue, Lease, check_aware, encode_args, to_delay
from ._pg.conn import Conn

if TYPE_CHECKING:  # the pool is trio's; importing it here would make trioq.producer import trio
    from ._pg.pool import Pool

__all__ = [
    "MAX_STEPS",
    "MAX_STEP_NAME",
    "SIGNAL_OUTCOMES",
    "DurableRun",
    "RunOf",
    "StepRecord",
    "check_step_name",
    "job_steps",
    "send_signal",
]  # fmt: skip

#: A step's name: what an operator reads in the step log (`trioq jobs show`).
MAX_STEP_NAME = 200
#: Steps a job may record (the schema refuses more: a handler in a loop without end).
MAX_STEPS = 10_000
#: The longest sleep: what `enqueue`'s ``delay`` allows (100 years).
MAX_SLEEP = MAX_ENQUEUE_DELAY


def check_step_name(value: object, field: str = "step name") -> str:
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a string, got {value!r}")
    if not value or len(value) > MAX_STEP_NAME:
        raise ValueError(f"{field} must be 1 to {MAX_STEP_NAME} characters, got {len(value)}")
    if "\x00" in value or not value.isprintable():
        raise ValueError(f"{field} {value!r} must be printable text (no NUL, no control "
                         "characters)")  # fmt: skip
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ValueError(f"{field} {value!r} must not contain lone surrogates") from None
    return value


@attrs.frozen(kw_only=True)
class StepRecord:
    """One record of a durable job: a step's result, or a sleep's wake-up time."""

    position: int  # the order its run called it in, from 0
    name: str
    kind: str  # step, sleep
    result: JSONValue  # a step's JSON result; a sleep's {"until": ISO time}
    attempt: int  # the attempt that recorded it
    recorded_at: dt.datetime

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> StepRecord:
        position, step, kind, result, attempt, recorded_at = row[:6]
        return cls(position=position, name=step, kind=kind,
                   result=None if result is None else json.loads(result), attempt=attempt,
                   recorded_at=recorded_at)  # fmt: skip


def _until(record: StepRecord) -> dt.datetime:
    result = record.result
    if not isinstance(result, dict) or not isinstance(result.get("until"), str):
        raise DurableError(f"sleep {record.name!r} at position {record.position}: its record "
                           f"holds no wake-up time ({result!r})")  # fmt: skip
    return dt.datetime.fromisoformat(result["until"])


@attrs.frozen(kw_only=True)
class RunOf:
    """What a run's records need of its job and its worker (`trioq.JobContext` makes it)."""

    lease: Lease
    pool: Pool  # the app pool: records go on its connections, apart from the worker's
    sql: Statements  # the schema's
    owner: str  # the lease owner, for the fence
    max_result_bytes: int
    #: Notes a connection fault of the job's own connections (`JobContext._noting_faults`).
    noting_faults: Callable[[], AbstractContextManager[None]]
    #: The worker's `Queue.enqueue` (its schema and payload limit), for `spawn`.
    enqueue: Callable[..., Awaitable[Any]]


class DurableRun:
    """One run of a durable job: its records (read at the first durable call) and the
    position of the next call."""

    def __init__(self, of: RunOf) -> None:
        self._of = of
        self._id = of.lease.job_id
        self._records: list[StepRecord] | None = None
        self._now: dt.datetime | None = None  # the database's clock when they were read
        self._position = 0
        self._called: dict[str, int] = {}  # names called in this run, and their positions
        self._sleeps = 0
        self._spawns = 0

    # -- the calls -----------------------------------------------------------------------------

    async def _step_call(
        self, step: str, fn: Callable[..., Any]
    ) -> tuple[int, StepRecord | None]:
        """The position of step ``step``, and its record if a run made it already."""
        check_step_name(step)
        if not callable(fn):
            raise TypeError(f"step {step!r}: fn must be callable, got {fn!r}")
        return await self._next(step, "step")

    async def step(self, step: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        position, record = await self._step_call(step, fn)
        if record is not None:
            return record.result
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        text = self._encode(step, result)
        await self._record(position, step, "step", result=text)
        return json.loads(text)  # what a replay returns: the same JSON value

    async def step_transaction(
        self, step: str, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any
    ) -> Any:
        position, record = await self._step_call(step, fn)
        if record is not None:
            return record.result
        with self._of.noting_faults():
            async with self._of.pool.connection() as conn, conn.transaction():
                result = await fn(conn, *args, **kwargs)
                text = self._encode(step, result)
                await self._record(position, step, "step", result=text, conn=conn)
        return json.loads(text)

    async def spawn(
        self, task: str, args: JSONValue, options: dict[str, Any], step: str | None
    ) -> int:
        self._spawns += 1
        step = f"spawn {self._spawns}" if step is None else check_step_name(step)
        position, record = await self._next(step, "spawn")
        if record is not None:
            return int(record.result)
        of = self._of
        with of.noting_faults():
            async with of.pool.connection() as conn, conn.transaction():
                child = (await of.enqueue(conn, task, args, **options)).job_id
                await conn.execute(of.sql.set_parent, {"parent": self._id, "child": child})
                await self._record(position, step, "spawn", result=str(child), conn=conn)
        return int(child)

    async def wait_for_job(
        self, child: int, timeout: dt.timedelta | float | None  # noqa: ASYNC109 - in the row
    ) -> JSONValue:
        if self._records is None:
            await self._load()
        assert self._records is not None
        spawned = {r.result for r in self._records if r.kind == "spawn"}
        if not isinstance(child, int) or isinstance(child, bool):
            raise TypeError(f"wait_for_job takes a job id from job.spawn, got {child!r}")
        if child not in spawned:
            raise ValueError(f"job {child} was not spawned by job {self._id} (job.spawn): only "
                             "a child tells its parent that it ended")  # fmt: skip
        ended = await self.wait_for(f"job {child}", timeout)
        assert isinstance(ended, dict)
        state = ended.get("state")
        if state == "done":
            return ended.get("result")
        if state == "dead":
            raise JobDeadError(f"child job {child} is dead: {ended.get('reason')}; last error: "
                               f"{ended.get('error')}", job_id=child)  # fmt: skip
        if state == "cancelled":
            raise JobCancelledError(f"child job {child} was cancelled", job_id=child)
        raise JobNotFoundError(f"child job {child} was deleted before it ended", job_id=child)

    async def sleep(self, delay: dt.timedelta | float, step: str | None) -> None:
        if delay is None:
            raise TypeError("sleep delay must be a timedelta or seconds, got None")
        wait = to_delay(delay, "sleep delay", MAX_SLEEP)
        if wait <= dt.timedelta(0):
            raise ValueError("sleep delay must be positive, got 0 s: a durable sleep ends the "
                             "run; to go on at once, do not sleep")  # fmt: skip
        await self._sleep(step, delay=wait, until=None)

    async def sleep_until(self, when: dt.datetime, step: str | None) -> None:
        if not isinstance(when, dt.datetime):
            raise TypeError(f"sleep_until takes an aware datetime, got {when!r}")
        check_aware(when, "sleep_until")
        await self._sleep(step, delay=None, until=when)

    async def wait_for(
        self, name: str, timeout: dt.timedelta | float | None  # noqa: ASYNC109 - kept in the row
    ) -> JSONValue:
        check_step_name(name, "signal name")
        wait = None if timeout is None else to_delay(timeout, "wait timeout", MAX_SLEEP)
        if wait is not None and wait <= dt.timedelta(0):
            raise ValueError("wait timeout must be positive, got 0 s")
        position, record = await self._next(name, "wait")
        until: dt.datetime | None = None
        if record is not None:
            result = record.result
            if isinstance(result, dict) and "payload" in result:
                return result["payload"]
            if isinstance(result, dict) and "timed_out" in result:
                raise self._timed_out(name, result["timed_out"])
            until = _until(record)  # pending: look again, with the timeout it was given
        of = self._of
        params = {"id": self._id, "attempt": of.lease.attempt, "owner": of.owner,
                  "position": position, "name": name, "until": until,
                  "timeout": wait if wait is not None else MAX_SLEEP}  # fmt: skip
        # Two statements in one transaction: the first takes the job's row lock (waiting for
        # a sender that holds it), so the second, with a snapshot taken after, sees every
        # signal committed before the lock was ours. One statement would look with the
        # snapshot it started with, and miss a signal that committed while it waited.
        with of.noting_faults():
            async with of.pool.connection() as conn, conn.transaction():
                try:
                    await conn.execute(of.sql.lock_one, params)
                except psycopg.Error as ex:
                    if ex.sqlstate != LEASE_LOST_SQLSTATE:
                        raise
                    row = None
                else:
                    cur = await conn.execute(of.sql.wait_signal, params)
                    row = await cur.fetchone()
        if row is None:
            raise LeaseLostError(f"job {self._id} attempt {of.lease.attempt}: lease lost before "
                                 f"its wait for {name!r} was recorded")  # fmt: skip
        result = json.loads(row[0])
        if "payload" in result:
            return result["payload"]
        if "timed_out" in result:
            raise self._timed_out(name, result["timed_out"])
        raise Waiting(f"job {self._id} waits for signal {name!r} until {result['until']}")

    def _timed_out(self, name: str, when: str) -> WaitTimeout:
        return WaitTimeout(f"job {self._id}: no signal {name!r} came before {when}", name=name)

    async def patched(self, patch: str) -> bool:
        check_step_name(patch, "patch name")
        patch = f"patch:{patch}"  # its record's name: apart from the steps' (a step may share it)
        if self._records is None:
            await self._load()
        assert self._records is not None
        position = self._position
        if position < len(self._records):
            record = self._records[position]
            if (record.name, record.kind) != (patch, "patch"):
                return False  # a run that went past here without this patch: the old branch
            await self._next(patch, "patch")
            return True
        await self._next(patch, "patch")
        await self._record(position, patch, "patch", result="true")
        return True

    def key(self, step: str) -> str:
        check_step_name(step)
        return f"trioq:{self._of.sql.schema}:{self._id}:{step}"

    # -- records -------------------------------------------------------------------------------

    async def _sleep(
        self, step: str | None, *, delay: dt.timedelta | None, until: dt.datetime | None
    ) -> None:
        self._sleeps += 1
        step = f"sleep {self._sleeps}" if step is None else check_step_name(step)
        position, record = await self._next(step, "sleep")
        if record is None:
            text, now = await self._record(position, step, "sleep", delay=delay, until=until)
            wake = _until(StepRecord(position=position, name=step, kind="sleep",
                                     result=json.loads(text), attempt=0,
                                     recorded_at=now))  # fmt: skip
        else:
            wake = _until(record)
            assert self._now is not None
            now = self._now
        if wake > now:
            raise Sleep(wake, wake - now)

    async def _next(self, step: str, kind: str) -> tuple[int, StepRecord | None]:
        """The position of this call, and its record if an earlier run made it."""
        if self._records is None:
            await self._load()
        assert self._records is not None
        if step in self._called:
            raise DurableError(
                f"job {self._id}: {kind} {step!r} was called twice in one run (at "
                f"positions {self._called[step]} and {self._position}): give each step its "
                "own name (a loop: f\"charge {i}\")"
            )
        position = self._position
        if position >= MAX_STEPS:
            raise DurableError(f"job {self._id}: more than {MAX_STEPS} steps in one job")
        self._called[step] = position
        self._position += 1
        if position < len(self._records):
            record = self._records[position]
            if (record.name, record.kind) != (step, kind):
                raise DurableError(
                    f"job {self._id}: position {position} is {kind} {step!r} in this run, "
                    f"but {record.kind} {record.name!r} in the run that recorded it (attempt "
                    f"{record.attempt}): the handler's steps changed under a job that had run "
                    "them; new code must keep the recorded order (branch with job.patched)"
                )
            return position, record
        return position, None

    async def _load(self) -> None:
        with self._of.noting_faults():
            async with self._of.pool.connection() as conn:
                statement = rendered(self._of.sql.schema, "load_steps")
                cur = await conn.execute(statement, {"id": self._id})
                rows = await cur.fetchall()
        self._now = rows[0][6]
        self._records = [StepRecord.from_row(row) for row in rows if row[0] is not None]

    async def _record(
        self, position: int, step: str, kind: str, *, result: str | None = None,
        delay: dt.timedelta | None = None, until: dt.datetime | None = None,
        conn: Conn | None = None,
    ) -> tuple[str, dt.datetime]:  # fmt: skip
        of = self._of
        params = {"id": self._id, "attempt": of.lease.attempt, "owner": of.owner,
                  "position": position, "name": step, "kind": kind, "result": result,
                  "delay": delay, "until": until}  # fmt: skip
        statement = rendered(of.sql.schema, "record_step")  # once per step: rendered once
        if conn is not None:
            cur = await conn.execute(statement, params)
            row = await cur.fetchone()
        else:
            with of.noting_faults():
                async with of.pool.connection() as own:
                    cur = await own.execute(statement, params)
                    row = await cur.fetchone()
        if row is None:
            raise LeaseLostError(f"job {self._id} attempt {of.lease.attempt}: lease lost before "
                                 f"{kind} {step!r} was recorded")  # fmt: skip
        assert self._records is not None
        text, now = row
        self._records.append(StepRecord(position=position, name=step, kind=kind,
                                        result=json.loads(text) if text else None,
                                        attempt=of.lease.attempt, recorded_at=now))  # fmt: skip
        return text, now

    def _encode(self, step: str, result: Any) -> str:
        try:
            text = encode_args(result, field=f"the result of step {step!r}")
        except ValueError as ex:  # the same every run: retrying would repeat the step's effect
            raise DurableError(str(ex)) from None
        limit = self._of.max_result_bytes
        if len(text) * 4 > limit and (size := len(text.encode())) > limit:
            raise DurableError(
                f"the result of step {step!r} is {size:,} bytes of JSON, over "
                f"max_result_bytes ({limit:,}): record a reference to it (a row, an object's "
                "key), not the value"
            )
        return text


#: What `trioq.signal` did: woke the job that waited for it, stored it for a wait to come,
#: or nothing (a signal of that name had been sent to the job already).
SIGNAL_OUTCOMES = ("woke", "stored", "duplicate")


async def send_signal(
    conn: Conn, sql: Statements, *, job_id: int | None, key: str | None, name: str,
    payload: JSONValue, max_bytes: int, who: str,
) -> str:  # fmt: skip
    """`trioq.signal`: one of `SIGNAL_OUTCOMES`; `JobNotFoundError` for no such live job."""
    check_step_name(name, "signal name")
    text = encode_args(payload, field=f"the payload of signal {name!r}")
    if len(text) * 4 > max_bytes and (size := len(text.encode())) > max_bytes:
        raise ValueError(f"the payload of signal {name!r} is {size:,} bytes of JSON, over the "
                         f"limit of {max_bytes:,} (max_payload_bytes)")  # fmt: skip
    params = {"id": job_id, "key": key, "name": name, "payload": text,
              "channel": sql.channel}  # fmt: skip
    cur = await conn.execute(sql.signal_job, params)
    row = await cur.fetchone()
    assert row is not None
    found, state, stored, woke = row
    if found is None:
        raise JobNotFoundError(f"{who}: no such job to signal (it may have ended and been "
                               "deleted, or died)", job_id=job_id or 0)  # fmt: skip
    if state in ("done", "cancelled"):
        raise JobNotFoundError(f"job {found} has ended ({state}): nothing will read signal "
                               f"{name!r}", job_id=int(found))  # fmt: skip
    if woke:
        return "woke"
    return "stored" if stored else "duplicate"


async def job_steps(conn: Conn, sql: Statements, job_id: int) -> list[StepRecord]:
    """A job's records, in order (`trioq.JobContext.steps`, ``trioq jobs show``)."""
    cur = await conn.execute(sql.job_steps, {"id": job_id})
    return [StepRecord.from_row(row) for row in await cur.fetchall()]

