"""Durable runs (issue 24), checked by a Hypothesis state machine against real Postgres.

The sibling of ``test_queue_state_machine.py`` for durable jobs (``docs/durable.md``). A few
jobs of one task run a fixed script: ``reserve`` (a `step_transaction` that writes a ledger
row), ``charge`` (a plain `step`, whose effect the test counts), ``approval`` (a wait for a
signal, 300 s timeout, timing out to None), ``nap`` (a 60 s sleep) and ``ship`` (a
`step_transaction` again). Deploys change the script under the jobs: version 2 renames
``charge`` without a patch (the replays of jobs past it must be refused), version 3 branches
with ``job.patched``. The model replays the same script (`script`) against its own records.

Attempts run as a worker runs them: claimed with `trioq.Queue.claim`, the handler run by the
runtime's `trioq._worker.execute.Executor` (records on an app pool of their own, at the
model's clock), the outcome written by the completer's statements; an attempt cancelled in
its scope gets the runtime's own outcome for the reason (`aborted`). Faults are injected at
one point of an attempt: the worker crashes (before a step's effect, or after it and before
its record: nothing of the attempt is written, its lease runs out), the handler fails, the
lease is stolen (the row's owner changed under it), a step's transaction fails at its
commit, the job is cancelled (its scope too, as the heartbeat does), the process shuts down,
a signal comes during a step, or is committed by a transaction that holds the job's row
while the wait looks. Between attempts time passes
(``trioq.now``, no sleeping), the sweeper runs, jobs are cancelled, signalled, dead jobs
retried and the handler redeployed. After every step the invariants compare the database
with the model:

- every job is where the model says (state, attempt, owner, run_at of a parked job, its
  ``waiting_for``), its records are the model's (position, name, kind, result, attempt), and
  so are its signals;
- each step's recorded effect happens exactly once: a ledger row per recorded
  ``step_transaction`` and none for one not recorded (a crash, a stolen lease, a cancel or a
  failure in between roll it back), and a plain step's effect as often as the model says (at
  least once; again only after an attempt that died between effect and record);
- no step runs after a later step was recorded: when a step's function starts, the job's
  records end just before its position (checked inside the handler);
- a wait never misses a committed signal: no job is parked waiting for a signal it has;
- a sleeping or waiting job holds no slot: a parked row has no lease and its attempt was
  refunded, and it is ``scheduled`` (its ``waiting_for`` set only while it waits).

Examples per CI run: 200 machines of up to 50 steps (about 35 s here); ``TRIOQ_HYPOTHESIS=
long`` runs 2,000 of up to 80. Shrinking is bounded (`machines.SHRINK_SECONDS`): each planted
bug below was reported within 12-41 s of the start, most as a machine of one to four rules.
Planted when this was written, each made it fail: the wait looking with its statement's
snapshot (no ``lock_one`` first: a signal committed while it waited for the row is missed),
no fence on ``RECORD_STEP`` (a stolen lease still records), no replay-order check in
``_next`` (a renamed step replays another's record), a replay that runs a recorded step
again, a ``step_transaction`` whose record commits apart from its writes (seen when the
transaction fails at its commit), a wait that parks a job asked to cancel instead of
cancelling it, a park that does not refund the attempt, a signal that never wakes, and the
promotion at a wait's timeout keeping ``waiting_for`` (the bug this machine found: the job
then slept or backed off still "waiting", and a late signal woke it early).

Not covered here: two live runs of one job at once (a zombie handler beside the attempt that
took its lease; each attempt here runs to its end before the next rule), the heartbeat
itself (its abort is played by cancelling the attempt's scope), and children (``spawn``,
``wait_for_job``: ``test_durable.py``).
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import json
from collections.abc import AsyncIterator, Generator
from contextlib import AbstractContextManager, AsyncExitStack
from typing import Any

import attrs
import trio
from helpers import rows
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule
from machines import LEASE, T0, LeaseMachine, ModelJob, Paths, Q, run_machine

import trioq
from trioq import DeadFilter, JobContext, Lease
from trioq._context import JobServices
from trioq._worker.completer import write_kind
from trioq._worker.execute import Executor, aborted
from trioq.retry import Constant
from trioq.testing import set_clock

WORKERS = ("w0", "w1")
MAX_LIVE = 3  # jobs not ended at once
MAX_JOBS = 12
MAX_ATTEMPTS = 3
RETRY = dt.timedelta(seconds=10)
NAP = dt.timedelta(seconds=60)
TIMEOUT = dt.timedelta(seconds=300)
TXN_STEPS = ("reserve", "ship")
NO_SIGNAL = "no signal"  # a payload is always a dict
#: The faults of each point of a run where one may be injected: a step's function (plain or
#: in a transaction), before its effect or after it; just before a sleep or a wait is
#: called (each time a run reaches it, replays too).
STEP_FAULTS = ("crash_before", "crash_after", "error_after", "steal_after", "cancel_after",
               "shutdown_after", "signal")  # fmt: skip
POINT_FAULTS = {
    "step": STEP_FAULTS,
    # commit_fails: the step's transaction fails at its commit, after its record was written
    # (a deferred constraint its ledger row breaks)
    "txn": (*STEP_FAULTS, "commit_fails"),
    "sleep": ("crash_before", "cancel_request", "steal"),
    "wait": ("crash_before", "cancel_request", "steal", "racing_signal"),
}
#: A fault: the first point of its kind that the run reaches, and what happens there (the
#: wait's, reached least often, twice); one run in four goes without.
FAULTS = st.sampled_from(
    [None] * 10
    + [(point, fault) for point, faults in POINT_FAULTS.items() for fault in faults]
    + [("wait", fault) for fault in POINT_FAULTS["wait"]])  # fmt: skip
SEEN = Paths()
_seen = SEEN.take


@attrs.frozen
class Op:
    """One call of the script: ``kind`` step, txn (step_transaction), patch, sleep, wait."""

    kind: str
    name: str


def script(version: int) -> Generator[Op, Any, Any]:
    """The handler, as calls: the real handler and the model both drive it."""
    reserved = yield Op("txn", "reserve")
    new = version == 2
    if version == 3:
        new = yield Op("patch", "charge-v2")
    charged = yield Op("step", "charge-v2" if new else "charge")
    approval = yield Op("wait", "approval")
    yield Op("sleep", "nap")
    shipped = yield Op("txn", "ship")
    return {"reserve": reserved, "charge": charged, "approval": approval, "ship": shipped}


class Crash(BaseException):
    """The worker dies here: nothing of the attempt after this point is written."""


@attrs.define
class Rec:
    name: str
    kind: str
    result: Any  # as `_canonical` reads the row's
    attempt: int


def _canonical(text: str | None) -> Any:
    value = None if text is None else json.loads(text)
    if isinstance(value, dict):
        return {k: dt.datetime.fromisoformat(v) if k in ("until", "timed_out") else v
                for k, v in value.items()}  # fmt: skip
    return value


@attrs.define(kw_only=True)
class DurableJob(ModelJob):
    """States: available, scheduled, running, done (kept), dead, cancelled."""

    records: list[Rec] = attrs.Factory(list)
    signal: Any = NO_SIGNAL
    waiting_for: str | None = None
    effects: collections.Counter[str] = attrs.Factory(collections.Counter)  # plain steps
    ledger: collections.Counter[str] = attrs.Factory(collections.Counter)  # txn steps
    result: Any = None


class Ended(Exception):
    """The model's run of an attempt ended (its outcome applied to the model)."""


@attrs.define
class Sim:
    """The model's view of one attempt."""

    fault: tuple[str, str] | None
    fired: bool = False
    lost: bool = False  # the lease was stolen: every later fenced write is refused
    position: int = 0

    def fire(self, point: str) -> str | None:
        return _fire(self, point)

    def write(self) -> None:
        """A fenced write (a record, a wait, an outcome): nothing, if the lease was lost."""
        if self.lost:
            _seen("a write refused: the lease was lost")
            raise Ended


def _fire(run: Sim | DurableMachine, point: str) -> str | None:
    """The fault to inject at this point of the run (a step's function, a sleep or a wait
    reached), if any."""
    if run.fault is None or run.fired or run.fault[0] != point:
        return None
    run.fired = True
    return run.fault[1]


class ClockedPool(trioq.pg.Pool):
    """The app pool of the attempts: each connection at the machine's clock (``trioq.now``,
    which the worker's own connection has too), so a sleep's record and its release agree."""

    def __init__(self, inner: trioq.pg.Pool) -> None:
        super().__init__("", max_size=1)
        self.inner = inner
        self.clock = T0  # each machine's

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        async with self.inner.connection() as conn:
            await set_clock(conn, self.clock)
            yield conn


def _no_heartbeat(lease: Lease) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


class DurableMachine(LeaseMachine[DurableJob]):
    workers = WORKERS
    tables = ("jobs", "dead_jobs", "job_steps", "job_signals")
    gone = "gone"  # never: results are kept, rows stay
    columns = ("state", "attempt", "lease_owner", "waiting_for", "run_at", "cancel_requested",
               "lease_expires_at")  # fmt: skip
    other: Any = None  # faults and checks, beside the worker's connection
    sender: Any = None  # a signal's transaction held open while a wait looks
    pool: ClockedPool

    def __init__(self) -> None:
        self.pool.clock = T0
        super().__init__()
        self.version = 1
        self.payloads = 0
        self.effects: collections.Counter[tuple[int, str]] = collections.Counter()
        self.violations: list[str] = []
        tasks = trioq.Registry()
        tasks.task(name="flow", max_attempts=MAX_ATTEMPTS,
                   retry=Constant(seconds=RETRY.total_seconds()),
                   keep_result=True)(self._handler)  # fmt: skip
        self.executors = {
            w: Executor(tasks, JobServices(app_pool=self.pool, queue=Q, owner=w,
                                           committing=_no_heartbeat), sync_threads=1)
            for w in WORKERS
        }  # fmt: skip
        # One attempt's fault and what became of it.
        self.fault: tuple[str, str] | None = None
        self.fired = False
        self.crashed = False
        self.abort: str | None = None
        self.scope = trio.CancelScope()
        self.nursery: trio.Nursery | None = None
        self.wait_done: trio.Event | None = None
        self.payload: Any = None
        self.answers: list[str] = []  # what the attempt's own signals and cancels returned
        self.raced = False  # a wait blocked on the racing sender's lock

    async def _reset(self) -> None:
        await super()._reset()
        await self.conn.execute("TRUNCATE public.ledger")

    def advance(self, seconds: int) -> None:
        super().advance(seconds)
        self.pool.clock = self.clock

    # -- the real handler ----------------------------------------------------------------------

    async def _handler(self, job: JobContext) -> Any:
        calls = script(self.version)
        position = 0  # of the next call that records (a patch not taken records nothing)
        value: Any = None
        while True:
            try:
                op = calls.send(value)
            except StopIteration as stop:
                return stop.value
            value, position = await self._do(job, op, position)

    async def _do(self, job: JobContext, op: Op, position: int) -> tuple[Any, int]:
        if op.kind == "patch":
            taken = await job.patched(op.name)
            return taken, position + taken
        if op.kind == "step":
            return await job.step(op.name, self._plain, job, op.name, position), position + 1
        if op.kind == "txn":
            value = await job.step_transaction(op.name, self._txn, job, op.name, position)
            return value, position + 1
        await self._hook(job, op.kind)
        if op.kind == "sleep":
            await job.sleep(NAP, name=op.name)
            return None, position + 1
        try:
            value = await job.wait_for(op.name, timeout=TIMEOUT)
        except trioq.WaitTimeout:
            value = None
        finally:
            if self.wait_done is not None:
                self.wait_done.set()
        return value, position + 1

    async def _plain(self, job: JobContext, name: str, position: int) -> str:
        fault = await self._starting(job, name, position, "step")
        self.effects[(job.id, name)] += 1
        await self._after_effect(job, fault)
        return f"{name}@{job.attempt}"

    async def _txn(self, conn: Any, job: JobContext, name: str, position: int) -> str:
        fault = await self._starting(job, name, position, "txn")
        doomed = 1 if fault == "commit_fails" else None  # no such row: refused at the commit
        await conn.execute("INSERT INTO public.ledger (job_id, step, attempt, doomed) "
                           "VALUES (%s, %s, %s, %s)", (job.id, name, job.attempt, doomed))
        await self._after_effect(job, fault)
        return f"{name}@{job.attempt}"

    async def _starting(
        self, job: JobContext, name: str, position: int, point: str
    ) -> str | None:
        """A step's function starts: the job's records must end just before its position
        (no step runs after a later one, or itself, was recorded)."""
        found = await rows(self.other, "SELECT count(*), coalesce(max(position), -1) "
                                       "FROM trioq.job_steps WHERE job_id = %s", job.id)
        if found[0] != (position, position - 1):
            self.violations.append(f"job {job.id}: step {name!r} (position {position}) "
                                   f"started with records (count, last) {found[0]}")
        fault = _fire(self, point)
        if fault == "crash_before":
            self.crashed = True
            raise Crash
        return fault

    async def _after_effect(self, job: JobContext, fault: str | None) -> None:
        if fault in ("crash_after", "error_after"):
            self.crashed = fault == "crash_after"
            raise Crash if self.crashed else RuntimeError("injected after the effect")
        if fault == "steal_after":
            await self._steal(job.id)
        elif fault == "signal":
            self.answers.append(await self._signal(self.other, job.id))
        elif fault in ("cancel_after", "shutdown_after"):
            if fault == "cancel_after":
                self.answers.append((await Q.cancel(self.other, job.id)).status)
            self.abort = "cancel" if fault == "cancel_after" else "shutdown"
            self.scope.cancel()
            await trio.lowlevel.checkpoint()  # raises Cancelled, as the heartbeat's abort

    async def _hook(self, job: JobContext, point: str) -> None:
        fault = _fire(self, point)
        if fault == "crash_before":
            self.crashed = True
            raise Crash
        if fault == "cancel_request":
            self.answers.append((await Q.cancel(self.other, job.id)).status)
        elif fault == "steal":
            await self._steal(job.id)
        elif fault == "racing_signal":
            assert self.nursery is not None
            self.wait_done = trio.Event()
            self.answers.append(await self.nursery.start(self._racing, job.id))

    async def _steal(self, job_id: int) -> None:
        await self.other.execute("UPDATE trioq.jobs SET lease_owner = 'thief' WHERE id = %s",
                                 (job_id,))  # fmt: skip

    async def _signal(self, conn: Any, job_id: int) -> str:
        try:
            return await trioq.signal(conn, job_id, "approval", self.payload)
        except trioq.JobNotFoundError:
            return "not found"

    async def _racing(self, job_id: int, task_status: Any) -> None:
        """A sender's transaction: its signal is in, and it holds the job's row until the
        wait blocks on it (or the run went past the wait without looking)."""
        async with self.sender.transaction():
            task_status.started(await self._signal(self.sender, job_id))
            assert self.wait_done is not None
            while not self.wait_done.is_set():
                found = await rows(self.other, "SELECT count(*) FROM pg_stat_activity WHERE "
                                   "datname = current_database() AND wait_event_type = 'Lock'")
                if found[0][0]:
                    self.raced = True
                    break
                await trio.sleep(0.002)

    async def _attempt(self, worker: str, job: trioq.Job) -> None:
        """One attempt as a worker makes it; a crash writes nothing."""
        lease = Lease(job.id, job.attempt)
        outcome = None
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                with trio.CancelScope() as self.scope:
                    outcome = await self.executors[worker].run(job, lease)
        if self.crashed:
            return
        if outcome is None:  # cancelled in its scope: the runtime's outcome for the reason
            outcome = aborted(self.abort, lease)
        await write_kind(self.conn, Q.driver, outcome.kind, [outcome], owner=worker)

    # -- the model of an attempt ---------------------------------------------------------------

    def _simulate(self, model: DurableJob, sim: Sim) -> list[str]:
        """Run the script against the model's records; what its own signals return."""
        said: list[str] = []
        calls = script(self.version)
        value: Any = None
        try:
            while True:
                try:
                    op = calls.send(value)
                except StopIteration as stop:
                    sim.write()  # the kept result, fenced
                    model.result = stop.value
                    self.end(model.id, "done")
                    _seen("completed")
                    return said
                value = self._sim_op(model, sim, op, said)
        except Ended:
            return said

    def _sim_op(self, model: DurableJob, sim: Sim, op: Op, said: list[str]) -> Any:
        records = model.records
        if op.kind == "patch":
            name = f"patch:{op.name}"
            if sim.position < len(records):
                if (records[sim.position].name, records[sim.position].kind) != (name, "patch"):
                    _seen("patch: the old branch")
                    return False
                sim.position += 1
                return True
            sim.write()
            records.append(Rec(name, "patch", True, model.attempt))
            sim.position += 1
            _seen("patch: the new branch")
            return True
        kind = "step" if op.kind == "txn" else op.kind
        if kind in ("sleep", "wait"):  # the handler's hook comes before the call
            self._sim_hook(model, sim, op, said)
        record = None
        if sim.position < len(records):
            record = records[sim.position]
            if (record.name, record.kind) != (op.name, kind):
                _seen("replay does not match: dead")
                self._sim_fail(model, sim, fatal=True)
        sim.position += 1
        if kind == "step":
            return record.result if record is not None else self._sim_step(model, sim, op, said)
        if kind == "sleep":
            return self._sim_sleep(model, sim, record)
        return self._sim_wait(model, sim, record)

    def _sim_step(self, model: DurableJob, sim: Sim, op: Op, said: list[str]) -> Any:
        fault = sim.fire(op.kind)
        if fault is not None:
            _seen(f"fault {fault} at {op.kind} step")
        if fault == "crash_before":
            raise Ended
        if op.kind == "step":
            model.effects[op.name] += 1
            if model.effects[op.name] > 1:
                _seen("a plain step ran again after an attempt lost its record")
        if fault == "crash_after":
            raise Ended
        if fault == "error_after":
            self._sim_fail(model, sim, fatal=False)
        if fault == "steal_after":
            sim.lost, model.owner = True, "thief"
        elif fault == "signal":
            said.append(self._sim_signal(model))
        elif fault == "cancel_after":
            said.append("requested")
            model.cancel_requested = True
            sim.write()
            self.end(model.id, "cancelled")
            _seen(f"cancelled in {op.kind} step")
            raise Ended
        elif fault == "shutdown_after":
            sim.write()
            self._sim_release(model, None)
            _seen(f"shut down in {op.kind} step")
            raise Ended
        sim.write()  # the record (with the ledger row, in a transaction)
        if fault == "commit_fails":
            _seen("a step's transaction failed at its commit")
            self._sim_fail(model, sim, fatal=False)
        result = f"{op.name}@{model.attempt}"
        if op.kind == "txn":
            model.ledger[op.name] += 1
        model.records.append(Rec(op.name, "step", result, model.attempt))
        return result

    def _sim_hook(self, model: DurableJob, sim: Sim, op: Op, said: list[str]) -> None:
        fault = sim.fire(op.kind)
        if fault is not None:
            _seen(f"fault {fault} at {op.kind}")
        if fault == "crash_before":
            raise Ended
        if fault == "cancel_request":
            said.append("requested")
            model.cancel_requested = True
        elif fault == "steal":
            sim.lost, model.owner = True, "thief"
        elif fault == "racing_signal":
            said.append(self._sim_signal(model))

    def _sim_sleep(self, model: DurableJob, sim: Sim, record: Rec | None) -> None:
        if record is None:
            sim.write()
            record = Rec("nap", "sleep", {"until": self.clock + NAP}, model.attempt)
            model.records.append(record)
        until = record.result["until"]
        if until <= self.clock:
            _seen("woke after a sleep")
            return None
        sim.write()  # the release, fenced
        self._sim_release(model, until)
        raise Ended

    def _sim_wait(self, model: DurableJob, sim: Sim, record: Rec | None) -> Any:
        if record is not None and "until" not in record.result:
            return record.result.get("payload")  # resolved: its payload, None (timed out)
        sim.write()  # the wait, under the fence
        until = self.clock + TIMEOUT if record is None else record.result["until"]
        if model.signal != NO_SIGNAL:
            result: dict[str, Any] = {"payload": model.signal}
            _seen("a wait returned its signal")
        elif until <= self.clock:
            result = {"timed_out": until}
            _seen("a wait timed out")
        else:
            result = {"until": until}
        if record is None:
            model.records.append(Rec("approval", "wait", result, model.attempt))
        else:
            record.result = result
        if "until" not in result:
            model.waiting_for = None  # resolved: waits for nothing any more
            return result.get("payload")
        model.attempt -= 1
        if model.cancel_requested:
            self.end(model.id, "cancelled")
            _seen("a wait parked as cancelled")
        else:
            self.back(model.id)
            model.state, model.run_at, model.waiting_for = "scheduled", until, "approval"
            _seen("parked waiting")
        raise Ended

    def _sim_release(self, model: DurableJob, until: dt.datetime | None) -> None:
        """Given back, the attempt refunded: scheduled at ``until`` (a sleep), available
        now; cancelled, if asked."""
        model.attempt -= 1
        if model.cancel_requested:
            self.end(model.id, "cancelled")
            return
        self.back(model.id)
        if until is not None:
            model.state, model.run_at = "scheduled", until
            _seen("sleeping")

    def _sim_fail(self, model: DurableJob, sim: Sim, *, fatal: bool) -> None:
        sim.write()
        if fatal or model.attempt >= model.max_attempts:
            self.end(model.id, "dead")
        elif model.cancel_requested:
            self.end(model.id, "cancelled")
        else:
            self.back(model.id, int(RETRY.total_seconds()))
            _seen("failed: retried later")
        raise Ended

    def _sim_signal(self, model: DurableJob) -> str:
        """`trioq.signal` of the next payload, as the model says it goes."""
        if model.state in ("done", "dead", "cancelled"):
            return "not found"
        if model.signal != NO_SIGNAL:
            return "duplicate"
        model.signal = self.payload
        if model.state == "scheduled" and model.waiting_for == "approval":
            model.state, model.run_at, model.waiting_for = "available", self.clock, None
            _seen("a signal woke a waiting job")
            return "woke"
        _seen(f"a signal stored ({model.state})")
        return "stored"

    def _next_payload(self) -> None:
        self.payloads += 1
        self.payload = {"n": self.payloads}

    # -- rules ---------------------------------------------------------------------------------

    @initialize()
    def first_job(self) -> None:
        self.enqueue()

    def _live(self) -> int:
        return sum(1 for j in self.jobs.values() if j.state not in ("done", "dead", "cancelled"))

    @precondition(lambda self: self._live() < MAX_LIVE and len(self.jobs) < MAX_JOBS)
    @rule()
    def enqueue(self) -> None:
        result = self.call(lambda: trioq.enqueue(self.conn, "flow", {},
                                                 max_attempts=MAX_ATTEMPTS))  # fmt: skip
        self.jobs[result.job_id] = DurableJob(id=result.job_id, run_at=self.clock,
                                              max_attempts=MAX_ATTEMPTS)  # fmt: skip

    def _promoted(self) -> list[DurableJob]:
        return [j for j in self.jobs.values()
                if j.state == "scheduled" and j.run_at <= self.clock]  # fmt: skip

    @precondition(lambda self: bool(self._due() or self._promoted()))
    @rule(worker=st.sampled_from(WORKERS), fault=FAULTS)
    def attempt_again(self, worker: str, fault: tuple[str, str] | None) -> None:
        """(Attempts move the jobs on: three times the weight of other rules.)"""
        self.attempt(worker, fault)

    @precondition(lambda self: bool(self._due() or self._promoted()))
    @rule(worker=st.sampled_from(WORKERS), fault=FAULTS)
    def attempt_once_more(self, worker: str, fault: tuple[str, str] | None) -> None:
        self.attempt(worker, fault)

    @precondition(lambda self: bool(self._due() or self._promoted()))
    @rule(worker=st.sampled_from(WORKERS), fault=FAULTS)
    def attempt(self, worker: str, fault: tuple[str, str] | None) -> None:
        """Promote what is due, claim the first job, and run one attempt of it (with
        ``fault`` injected where the run reaches it)."""
        self.call(lambda: Q.promote_due(self.conn, notify=False))
        for model in self._promoted():
            model.state = "available"
        expected = self._due()[:1]
        got = self.call(lambda: Q.claim(self.conn, "default", owner=worker, limit=1,
                                        lease=LEASE))  # fmt: skip
        self._took(worker, got, expected)
        self.beliefs[worker].clear()  # the attempt runs to its end here
        model = expected[0]
        self._next_payload()
        self.fault, self.fired, self.crashed, self.abort = fault, False, False, None
        self.wait_done, self.answers, self.raced = None, [], False
        self.call(self._attempt, worker, got[0])
        if self.raced:
            _seen("racing signal: the wait blocked on the sender")
        said = self._simulate(model, Sim(fault))
        assert self.answers == said, (self.answers, said)

    @rule(seconds=st.sampled_from([1, 31, 61, 301]))
    def time_passes(self, seconds: int) -> None:
        self.advance(seconds)

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data())
    def signal(self, data: st.DataObject) -> None:
        """A signal from outside, before or after the wait (or to a job that ended)."""
        model = self.jobs[data.draw(st.sampled_from(sorted(self.jobs)))]
        self._next_payload()
        said = self.call(self._signal, self.conn, model.id)
        assert said == self._sim_signal(model), (said, model)

    @precondition(lambda self: any(j.waiting_for and j.state == "scheduled"
                                   for j in self.jobs.values()))  # fmt: skip
    @rule(data=st.data())
    def signal_a_waiting_job(self, data: st.DataObject) -> None:
        """A signal after the wait: the job was parked waiting for it (its timeout may have
        passed, not yet promoted)."""
        waiting = sorted(j.id for j in self.jobs.values()
                         if j.waiting_for and j.state == "scheduled")  # fmt: skip
        model = self.jobs[data.draw(st.sampled_from(waiting))]
        self._next_payload()
        assert self.call(self._signal, self.conn, model.id) == self._sim_signal(model) == "woke"

    @rule(data=st.data(), action=st.sampled_from(["cancel", "deploy"]))
    def operator(self, data: st.DataObject, action: str) -> None:
        """A cancel, or a deploy of another version of the handler (one rule: each ends
        or changes jobs wholesale, and at the weight of a rule each they would leave the
        others little to do)."""
        if action == "cancel":
            self.cancel(data)
        else:
            self.version = data.draw(st.sampled_from([1, 2, 3]))

    def cancel(self, data: st.DataObject) -> None:  # `operator`'s, not a rule of its own
        super().cancel(data)

    @precondition(lambda self: any(j.state == "dead" for j in self.jobs.values()))
    @rule(data=st.data())
    def retry_dead(self, data: st.DataObject) -> None:
        """``trioq dead retry``: back to available with fresh attempts, resuming from its
        records."""
        dead = sorted(j.id for j in self.jobs.values() if j.state == "dead")
        job_id = data.draw(st.sampled_from(dead))
        assert self.call(lambda: Q.dead_retry(self.conn, DeadFilter(ids=[job_id]))) == [job_id]
        model = self.jobs[job_id]
        model.state, model.attempt, model.run_at = "available", 0, self.clock
        model.cancel_requested, model.waiting_for = False, None
        _seen("a dead job retried")

    # -- invariants ----------------------------------------------------------------------------

    def _check_row(self, model: DurableJob, row: tuple[Any, ...]) -> None:
        waiting_for, run_at, cancel_requested, lease_expires_at = row[3:]
        assert cancel_requested == model.cancel_requested, (model, row)
        if model.state == "scheduled":
            assert (waiting_for, run_at) == (model.waiting_for, model.run_at), (model, row)
        if model.state == "running":
            assert lease_expires_at == model.lease_until, (model, row)
        if model.state == "done":
            assert model.result is not None

    @invariant()
    def records_and_effects_match_model(self) -> None:
        steps, ledger, signals, results = self.call(self._records)
        for model in self.jobs.values():
            expected = [(i, r.name, r.kind, r.result, r.attempt)
                        for i, r in enumerate(model.records)]  # fmt: skip
            assert steps.get(model.id, []) == expected, f"job {model.id}: its records"
            # Each recorded step_transaction's effect once; none for one not recorded.
            for name in TXN_STEPS:
                recorded = any(r[1] == name for r in expected)
                assert ledger.get((model.id, name), 0) == int(recorded), (
                    f"job {model.id}: ledger rows of step {name!r}, recorded: {recorded}")
                assert model.ledger[name] == int(recorded), (model.id, name)
            plain = {name: self.effects[(job_id, name)]
                     for job_id, name in self.effects if job_id == model.id}  # fmt: skip
            assert plain == {k: v for k, v in model.effects.items() if v}, (
                f"job {model.id}: runs of its plain steps")
            for r in expected:  # a plain step recorded ran at least once
                assert r[2] != "step" or r[1] in TXN_STEPS or plain.get(r[1], 0) >= 1
            assert signals.get(model.id, NO_SIGNAL) == model.signal, f"job {model.id}: signal"
            if model.state == "done":
                assert results[model.id] == model.result, f"job {model.id}: its result"
        assert set(steps) | set(signals) <= set(self.jobs)
        assert set(ledger) <= {(j, n) for j in self.jobs for n in TXN_STEPS}

    async def _records(self) -> tuple[dict[int, list[Any]], dict[Any, int], dict[int, Any],
                                      dict[int, Any]]:  # fmt: skip
        steps: dict[int, list[Any]] = collections.defaultdict(list)
        for job_id, position, name, kind, result, attempt in await rows(
            self.conn, "SELECT job_id, position, name, kind, result::text, attempt "
                       "FROM trioq.job_steps ORDER BY job_id, position"):  # fmt: skip
            steps[job_id].append((position, name, kind, _canonical(result), attempt))
        ledger = {(r[0], r[1]): r[2] for r in await rows(
            self.conn, "SELECT job_id, step, count(*) FROM public.ledger GROUP BY 1, 2")}
        signals = {r[0]: json.loads(r[1]) for r in await rows(
            self.conn, "SELECT job_id, payload::text FROM trioq.job_signals "
                       "WHERE name = 'approval'")}  # fmt: skip
        results = {r[0]: json.loads(r[1]) for r in await rows(
            self.conn, "SELECT id, result::text FROM trioq.jobs WHERE state = 'done'")}
        return dict(steps), ledger, signals, results

    @invariant()
    def a_parked_job_holds_no_lease_and_misses_no_signal(self) -> None:
        """From the database alone: a sleeping or waiting job has no lease, and no job is
        parked waiting for a signal it has been sent."""
        parked = self.call(rows, self.conn, """
            SELECT j.id, j.lease_owner, j.lease_expires_at, j.waiting_for,
                   EXISTS (SELECT 1 FROM trioq.job_signals s
                            WHERE s.job_id = j.id AND s.name = j.waiting_for)
              FROM trioq.jobs j WHERE j.durable AND j.state = 'scheduled'""")
        for job_id, owner, expires, waiting_for, missed in parked:
            assert (owner, expires) == (None, None), f"parked job {job_id} holds a lease"
            assert not missed, f"job {job_id} waits for {waiting_for!r}, which it was sent"

    @invariant()
    def no_step_ran_out_of_order(self) -> None:
        assert not self.violations, self.violations


def test_durable_state_machine(dsn: str) -> None:
    SEEN.clear()

    async def main() -> None:
        async with AsyncExitStack() as stack:
            conns = []
            for _ in range(3):
                conns.append(await stack.enter_async_context(
                    await trioq.connect(dsn, autocommit=True)))  # fmt: skip
            conn, other, sender = conns
            await trioq.migrate(conn)
            await conn.execute("CREATE TABLE public.doom (id int PRIMARY KEY)")  # empty
            await conn.execute("CREATE TABLE public.ledger (id serial PRIMARY KEY, job_id bigint "
                               "NOT NULL, step text NOT NULL, attempt int, doomed int REFERENCES "
                               "public.doom DEFERRABLE INITIALLY DEFERRED)")  # fmt: skip
            inner = await stack.enter_async_context(trioq.pg.Pool(
                dsn, max_size=3, connect_kwargs={"autocommit": True}))  # fmt: skip
            bound = {"conn": conn, "other": other, "sender": sender,
                     "pool": ClockedPool(inner)}  # fmt: skip
            await run_machine(DurableMachine, bound, examples=(200, 2000), steps=(50, 80))

    trio.run(main)
    SEEN.assert_taken((
        "racing signal: the wait blocked on the sender", "a wait returned its signal",
        "a wait timed out", "a signal woke a waiting job", "parked waiting", "sleeping",
        "woke after a sleep", "completed", "a plain step ran again after an attempt lost its "
        "record", "a write refused: the lease was lost", "replay does not match: dead",
        "patch: the old branch", "patch: the new branch", "a dead job retried",
        "cancelled in txn step", "shut down in txn step", "a wait parked as cancelled",
        "a step's transaction failed at its commit", "a wait timed out", "failed: retried later",
    ))  # fmt: skip
