"""What the Hypothesis state machines share (`test_queue_state_machine.py`,
`test_flow_state_machine.py`, `test_workflow_state_machine.py`): rules that call trio code,
the model of jobs and of the leases workers believe they hold, the rules and invariants every
machine has, and the run of a machine against a migrated database.

Hypothesis drives a machine from a worker thread; its rules run coroutines on the test's
trio loop (`TrioMachine.call`). CI runs the same machines every time (``derandomize``: a
failure is reproducible, not a flake); ``TRIOQ_HYPOTHESIS=long`` (``just prove``) explores
new ones, more and longer.
"""

from __future__ import annotations

import collections
import datetime as dt
import os
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from typing import Any, Generic, TypeVar

import attrs
import hypothesis.internal.conjecture.engine as hypothesis_engine
import trio
from helpers import rows
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg import sql

import trioq
from trioq import Failure, Lease, Queue
from trioq.testing import set_clock

T = TypeVar("T")
LONG = os.environ.get("TRIOQ_HYPOTHESIS") == "long"
#: Seconds Hypothesis may spend shrinking a failure of a machine (its own bound, 300 s, is a
#: constant of its engine, not a setting). A step is a round trip to Postgres, and shrinking
#: a failure once took 324 s; past this bound the smallest sequence found so far is reported.
SHRINK_SECONDS = 20
LEASE = dt.timedelta(seconds=30)
T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
Q = Queue()


class Paths(collections.Counter[str]):
    """How often each path was taken over a run (also reported with Hypothesis ``event()``:
    run pytest with ``--hypothesis-show-statistics``)."""

    def take(self, path: str) -> None:
        event(path)
        self[path] += 1

    def assert_taken(self, paths: Iterable[str]) -> None:
        """Print what was taken; each of ``paths`` must have been, or the run proved less
        than its docstring says."""
        print("\npaths taken:", ", ".join(f"{path} {n}" for path, n in sorted(self.items())))
        missing = [path for path in paths if not self[path]]
        assert not missing, f"the machines never took: {missing}"


@attrs.define(kw_only=True)
class ModelJob:
    """A job as a model sees it; each machine adds what else it tracks."""

    id: int
    run_at: dt.datetime
    max_attempts: int
    priority: int = 0
    state: str = "available"  # each machine's docstring lists the states it has
    attempt: int = 0
    owner: str | None = None
    lease_until: dt.datetime | None = None
    cancel_requested: bool = False

    def holds(self, worker: str, attempt: int) -> bool:
        return self.state == "running" and self.owner == worker and self.attempt == attempt


J = TypeVar("J", bound=ModelJob)


class TrioMachine(RuleBasedStateMachine):
    """A state machine whose rules call trio code through `call`."""

    token: trio.lowlevel.TrioToken  # the test's loop, bound by `run_machine`

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return trio.from_thread.run(fn, *args, trio_token=self.token)


class LeaseMachine(TrioMachine, Generic[J]):
    """One queue's jobs on `conn` under the model's clock (``trioq.now``, from `T0`): the
    model jobs (``jobs``) and the leases each of ``workers`` believes it holds on them
    (``beliefs``; stale ones stay until used or reported lost). ``tables`` (of schema
    trioq) are emptied before every example.

    A job ends (`end`: done, dead, cancelled...) or goes back to the queue (`back`: a
    retry, a release, a returned lease); machines whose endings do more override `end`."""

    workers: tuple[str, ...]
    tables: tuple[str, ...]
    #: The state of a job whose row is deleted (completed without a kept result).
    gone = "done"
    #: The columns of ``trioq.jobs`` that `database_matches_model` reads (after the id; the
    #: first three are state, attempt and owner, the rest for `_check_row`).
    columns: tuple[str, ...] = ("state", "attempt", "lease_owner")
    conn: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.jobs: dict[int, J] = {}
        self.clock = T0
        self.beliefs: dict[str, set[Lease]] = {w: set() for w in self.workers}
        self.call(self._reset)

    async def _reset(self) -> None:
        tables = sql.SQL(", ").join(sql.Identifier("trioq", t) for t in self.tables)
        await self.conn.execute(sql.SQL("TRUNCATE {}").format(tables))
        await set_clock(self.conn, self.clock)

    def advance(self, seconds: int) -> None:
        """Time passes, for the model and the database alike."""
        self.clock += dt.timedelta(seconds=seconds)
        self.call(set_clock, self.conn, self.clock)

    # -- the model -----------------------------------------------------------------------------

    def _due(self) -> list[J]:
        """The available jobs that are due, in claim order."""
        due = [j for j in self.jobs.values() if j.state == "available" and j.run_at <= self.clock]
        return sorted(due, key=lambda j: (j.priority, j.run_at, j.id))

    def end(self, job_id: int, state: str) -> None:
        """``job_id`` ended as ``state`` (done, dead, cancelled...)."""
        model = self.jobs[job_id]
        model.state, model.owner, model.lease_until = state, None, None

    def back(self, job_id: int, delay: int = 0) -> None:
        """Not an ending: back in the queue, due in ``delay`` seconds (a retry, a release,
        a returned lease)."""
        model = self.jobs[job_id]
        model.state = "scheduled" if delay else "available"
        model.owner = model.lease_until = None
        model.run_at = self.clock + dt.timedelta(seconds=delay)

    def _took(self, worker: str, jobs: Sequence[trioq.Job], expected: list[J],
              context: object = None) -> None:  # fmt: skip
        """A claim by ``worker`` returned ``jobs``: exactly the model's ``expected``, in
        order, each one's attempt the next, now running under a lease it holds."""
        assert [j.id for j in jobs] == [m.id for m in expected], context
        for job, model in zip(jobs, expected, strict=True):
            model.state, model.owner = "running", worker
            model.attempt += 1
            model.lease_until = self.clock + LEASE
            assert job.attempt == model.attempt
            self.beliefs[worker].add(Lease(job.id, job.attempt))

    # -- leases --------------------------------------------------------------------------------

    def _held(self, worker: str) -> list[Lease]:
        return sorted(self.beliefs[worker], key=lambda le: (le.job_id, le.attempt))

    def _holders(self) -> list[str]:
        return [w for w in self.workers if self.beliefs[w]]

    def _pick(self, data: st.DataObject, path: str) -> tuple[str, list[Lease]]:
        """A worker that believes it holds leases, and some of them (maybe stale), which it
        forgets: the leases it writes the outcome ``path`` for."""
        worker = data.draw(st.sampled_from(self._holders()))
        return worker, self._choose(data, worker, self._held(worker))

    def _choose(self, data: st.DataObject, worker: str, held: list[Lease]) -> list[Lease]:
        """Up to three of ``held``, forgotten by ``worker``."""
        chosen = data.draw(st.lists(st.sampled_from(held), unique=True, min_size=1, max_size=3))
        self.beliefs[worker] -= set(chosen)
        return chosen

    def _valid_leases(self, worker: str, leases: list[Lease]) -> set[Lease]:
        """The ``leases`` the model says ``worker`` still holds."""
        return {le for le in leases if self.jobs[le.job_id].holds(worker, le.attempt)}

    def _valid(self, worker: str, leases: list[Lease]) -> set[int]:
        return {le.job_id for le in self._valid_leases(worker, leases)}

    # -- outcomes: exactly the jobs whose leases are valid change ------------------------------

    def _complete(self, worker: str, leases: list[Lease], *, state: str = "done",
                  results: list[Any] | None = None) -> None:  # fmt: skip
        """``worker`` completes ``leases``: the valid ones end as ``state``."""
        valid = self._valid(worker, leases)
        done = self.call(lambda: Q.complete_many(self.conn, owner=worker, leases=leases,
                                                 results=results))  # fmt: skip
        assert done == valid
        for job_id in sorted(valid):
            self.end(job_id, state)

    def _release(self, worker: str, leases: list[Lease]) -> None:
        """``worker`` gives ``leases`` back: the valid ones get their attempt refunded, and
        are available again (cancelled, if that was asked)."""
        valid = self._valid(worker, leases)
        released = self.call(lambda: Q.release_many(self.conn, owner=worker, leases=leases))
        assert released == valid
        for job_id in sorted(valid):
            model = self.jobs[job_id]
            model.attempt -= 1
            if model.cancel_requested:
                self.end(job_id, "cancelled")
            else:
                self.back(job_id)

    def _fail(self, worker: str, leases: list[Lease], *, fatal: bool, delay: int = 0) -> set[int]:
        """``worker`` fails ``leases``: the valid ones die (fatal, or their attempts spent),
        are cancelled (if asked) or are retried after ``delay`` seconds. The ids that died."""
        valid = self._valid(worker, leases)
        wait = dt.timedelta(seconds=delay)
        failures = [Failure(lease=le, error="boom", delay=wait, fatal=fatal) for le in leases]
        result = self.call(lambda: Q.fail_many(self.conn, owner=worker, failures=failures))
        dead = {j for j in valid if fatal or self.jobs[j].attempt >= self.jobs[j].max_attempts}
        cancelled = {j for j in valid - dead if self.jobs[j].cancel_requested}
        assert result.dead == dead
        assert result.cancelled == cancelled
        assert result.retried == valid - dead - cancelled
        for job_id in sorted(valid):
            if job_id in dead:
                self.end(job_id, "dead")
            elif job_id in cancelled:
                self.end(job_id, "cancelled")
            else:
                self.back(job_id, delay)
        return dead

    def _swept(self, expired: list[J], result: Any) -> None:
        """The sweepers' verdict on ``expired`` (running, and the lease expired or the owner
        dead): cancelled if asked, dead with its attempts spent, else back in the queue."""
        cancelled = {j.id for j in expired if j.cancel_requested}
        dead = {j.id for j in expired if not j.cancel_requested and j.attempt >= j.max_attempts}
        assert result.cancelled == cancelled
        assert result.dead == dead
        assert result.returned == {j.id for j in expired} - cancelled - dead
        for model in expired:
            if model.id in cancelled:
                self.end(model.id, "cancelled")
            elif model.id in dead:
                self.end(model.id, "dead")
            else:
                self.back(model.id)

    # -- rules every machine has ---------------------------------------------------------------

    @rule()
    def sweep(self) -> None:
        expired = [
            j for j in self.jobs.values()
            if j.state == "running" and j.lease_until is not None and j.lease_until < self.clock
        ]  # fmt: skip
        self._swept(sorted(expired, key=lambda j: j.id), self.call(lambda: Q.sweep(self.conn)))

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        """Any job: one not started yet is cancelled at once, a running one is asked to
        stop, an ended one is not found."""
        model = self.jobs[data.draw(st.sampled_from(sorted(self.jobs)))]
        outcome = self.call(Q.cancel, self.conn, model.id)
        if model.state in ("waiting", "scheduled", "available"):
            assert outcome.status == "cancelled"
            self.end(model.id, "cancelled")
        elif model.state == "running":
            assert outcome.status == "requested"
            model.cancel_requested = True
        else:
            assert outcome.status == "not_found"

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def database_matches_model(self) -> None:
        """Every job is in exactly one place, the model's, with its attempt and owner."""
        live, dead = self.call(self._fetch)
        assert not set(live) & set(dead), "a job is in two tables"
        for job_id, model in self.jobs.items():
            if model.state == self.gone:
                assert job_id not in live and job_id not in dead, f"job {job_id} still there"
            elif model.state == "dead":
                assert job_id in dead, f"dead job {job_id} lost"
                assert dead[job_id] == model.attempt
            else:
                assert job_id in live, f"job {job_id} ({model.state}) lost"
                row = live[job_id]
                assert row[:3] == (model.state, model.attempt, model.owner), (job_id, row, model)
                self._check_row(model, row)
        assert set(live) | set(dead) <= set(self.jobs), "a job appeared from nowhere"

    def _check_row(self, model: J, row: tuple[Any, ...]) -> None:
        """What else a machine checks of a job's row (its `columns`)."""

    async def _fetch(self) -> tuple[dict[int, tuple[Any, ...]], dict[int, int]]:
        columns = sql.SQL(", ").join(map(sql.Identifier, self.columns))
        query = sql.SQL("SELECT id, {} FROM trioq.jobs").format(columns)
        live = {r[0]: tuple(r[1:]) for r in await rows(self.conn, query)}
        dead = await rows(self.conn, "SELECT id, attempt FROM trioq.dead_jobs")
        return live, dict(dead)

    @invariant()
    def attempts_are_bounded(self) -> None:
        for model in self.jobs.values():
            assert 0 <= model.attempt <= model.max_attempts

    @invariant()
    def no_two_workers_hold_one_job(self) -> None:
        for job_id, model in self.jobs.items():
            holders = [
                (w, le.attempt)
                for w in self.workers
                for le in self.beliefs[w]
                if le.job_id == job_id and model.holds(w, le.attempt)
            ]
            assert len(holders) <= 1


async def run_machine(
    machine: type[TrioMachine], bound: dict[str, Any], *, examples: tuple[int, int],
    steps: tuple[int, int],
) -> None:  # fmt: skip
    """Run ``machine`` with ``bound`` (its connections) as class attributes: ``examples``
    and ``steps`` are (CI, long) pairs."""
    bound_machine = type(
        f"Bound{machine.__name__}",
        (machine,),
        {**bound, "token": trio.lowlevel.current_trio_token()},
    )
    config = settings(
        max_examples=examples[LONG],
        stateful_step_count=steps[LONG],
        deadline=None,
        database=None,
        derandomize=not LONG,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    with shrinking_bounded():
        await trio.to_thread.run_sync(
            lambda: run_state_machine_as_test(bound_machine, settings=config)
        )


@contextmanager
def shrinking_bounded(seconds: float = SHRINK_SECONDS) -> Iterator[None]:
    """Hypothesis gives up shrinking after ``seconds`` (``SHRINK_SECONDS``) in this block."""
    before = hypothesis_engine.MAX_SHRINKING_SECONDS
    hypothesis_engine.MAX_SHRINKING_SECONDS = seconds  # type: ignore[assignment]
    try:
        yield
    finally:
        hypothesis_engine.MAX_SHRINKING_SECONDS = before


def prove(
    machine: type[TrioMachine], dsn: str, *, examples: tuple[int, int], steps: tuple[int, int],
    other: bool = False,
) -> None:  # fmt: skip
    """`run_machine` on the migrated database ``dsn``: its connection (autocommit) bound as
    ``conn``; with ``other``, a second one (in transactions) as ``other``."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            conn = await stack.enter_async_context(await trioq.connect(dsn, autocommit=True))
            await trioq.migrate(conn)
            bound = {"conn": conn}
            if other:
                bound["other"] = await stack.enter_async_context(await trioq.connect(dsn))
            await run_machine(machine, bound, examples=examples, steps=steps)

    trio.run(main)
