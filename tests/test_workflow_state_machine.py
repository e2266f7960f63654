"""Proof of the dependency resolution: a Hypothesis state machine against real Postgres.

The sibling of ``test_queue_state_machine.py`` for workflows (``docs/workflows.md``). Jobs
are enqueued alone, with ``after=`` (a few existing jobs, which may be running, done and
kept, done and gone, dead or cancelled), or as a diamond-shaped `trioq.Workflow` (maybe
also after an existing job), each dependant with the ``cancel`` or ``run`` policy. Two
workers claim, complete (keeping the result or not), fail (retried, or fatal), release and
crash (forget their leases); time passes (``trioq.now``), the sweeper returns, kills or
cancels the jobs whose leases expired, and any job is cancelled (a waiting one too). The
model resolves every ending as the issue says, and after every step the invariants
compare the database with it:

- every job is where the model says (``waiting`` included), with its attempt and owner, and
  a claim takes exactly the model's runnable jobs in claim order: so a dependant is never
  claimable, nor claimed, before every dependency has ended, and one whose policy is
  ``cancel`` only after every one completed;
- each dependant is freed exactly once: the model counts the times it goes from waiting
  to runnable (at most one), its ``dependencies_left`` is the number of its dependencies
  that have not ended (0 once freed, never negative), and each edge records the outcome of
  its dependency once, the right one (a retry, a release or a returned lease is not an
  ending);
- an ``after=`` naming a job whose row is gone (completed without a kept result) is an
  `UnknownDependencyError`, and nothing of that enqueue (a whole workflow) is inserted.

Examples per CI run: 200 machines of up to 50 steps (about 20 s here);
``TRIOQ_HYPOTHESIS=long`` runs 2,000 of up to 80. Mutations that made it fail when this was
written: freeing a dependant one dependency early (``> 0`` to ``> 1`` in ``jobs_ended``),
not cascading a cancellation to the next round (``WHERE false`` for its dependants), and a
cancel that does not take ``waiting`` jobs. Not seen here: the ``outcome IS NULL`` re-check
of an edge under its lock, which only matters between concurrent transactions (each step
here is one statement after another); ``test_workflows.py`` ends the last two dependencies
at once in two connections for that.
"""

from __future__ import annotations

import collections
import datetime as dt
from typing import Any, TypeVar

import attrs
import pytest
import trio
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    invariant,
    precondition,
    rule,
)
from machines import LeaseMachine, run_machine

import trioq
from trioq import Failure, Lease, Queue

T = TypeVar("T")
LEASE = dt.timedelta(seconds=30)
T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
WORKERS = ("w0", "w1")
POLICIES = st.sampled_from(["cancel", "run"])
MAX_JOBS = 50
Q = Queue()
ENDED = ("done", "gone", "dead", "cancelled")  # gone: done, its row deleted (no kept result)
RUNNABLE = ("available", "running")
#: How often each path was taken in this process (the test checks the main ones were).
SEEN: collections.Counter[str] = collections.Counter()


def _seen(what: str) -> None:
    SEEN[what] += 1
    event(what)


@attrs.define
class ModelJob:
    id: int
    run_at: dt.datetime
    max_attempts: int
    deps: tuple[int, ...] = ()
    policy: str = "cancel"
    state: str = "available"  # waiting, available, running, done, gone, dead, cancelled
    attempt: int = 0
    owner: str | None = None
    lease_until: dt.datetime | None = None
    cancel_requested: bool = False
    edges: dict[int, str | None] = attrs.Factory(dict)  # dependency -> its outcome
    freed: int = 0  # times it went from waiting to runnable

    @property
    def has_row(self) -> bool:
        return self.state not in ("gone", "dead")

    @property
    def left(self) -> int:
        return sum(1 for outcome in self.edges.values() if outcome is None)


def _outcome(state: str) -> str:
    return "done" if state == "gone" else state


class WorkflowMachine(LeaseMachine):
    workers = WORKERS

    conn: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.jobs: dict[int, ModelJob] = {}
        self.clock = T0
        self.beliefs: dict[str, set[Lease]] = {w: set() for w in WORKERS}
        self.call(self._reset)

    async def _reset(self) -> None:
        await self.conn.execute(
            "TRUNCATE trioq.jobs, trioq.dead_jobs, trioq.job_dependencies, trioq.batches"
        )
        await self._set_clock()

    async def _set_clock(self) -> None:
        await self.conn.execute(
            "SELECT set_config('trioq.now', %s, false)", (self.clock.isoformat(),)
        )

    # -- the model of the resolution -----------------------------------------------------------

    def end(self, job_id: int, state: str) -> None:
        """``job_id`` ended as ``state``: resolve its dependants, a cancellation cascading."""
        model = self.jobs[job_id]
        model.state, model.owner, model.lease_until = state, None, None
        self._cascade([job_id])

    def _cascade(self, todo: list[int]) -> None:
        """Resolve the dependants of the jobs in ``todo``, and of those it cancels."""
        while todo:
            dep = todo.pop()
            outcome = _outcome(self.jobs[dep].state)
            for other in self.jobs.values():
                pending = dep in other.edges and other.has_row and other.edges[dep] is None
                if pending and self._resolve(other, dep, outcome):
                    todo.append(other.id)

    def _resolve(self, model: ModelJob, dep: int, outcome: str) -> bool:
        """One edge of ``model`` resolved; True if that cancels it."""
        model.edges[dep] = outcome
        if model.state != "waiting":
            return False
        if outcome != "done" and model.policy == "cancel":
            _seen(f"a dependency {outcome}: dependant cancelled")
            model.state = "cancelled"
            return True
        if model.left == 0:
            _seen("dependant freed" + ("" if outcome == "done" else f" (run after {outcome})"))
            model.state = "available"
            model.freed += 1
        return False

    def _existing(self, data: st.DataObject, k: int) -> list[int]:
        """Up to ``k`` distinct jobs of the model (rows gone included: those are errors)."""
        if not self.jobs:
            return []
        picks = st.lists(st.sampled_from(sorted(self.jobs)), unique=True, max_size=k)
        return list(data.draw(picks))

    def _add(self, job_id: int, deps: list[int], policy: str, attempts: int) -> None:
        model = ModelJob(id=job_id, run_at=self.clock, max_attempts=attempts,
                         deps=tuple(deps), policy=policy)  # fmt: skip
        model.edges = dict.fromkeys(deps)
        model.state = "waiting" if deps else "available"
        self.jobs[job_id] = model

    def _resolve_at_enqueue(self, job_id: int) -> None:
        model = self.jobs[job_id]
        for dep in model.deps:
            ended = self.jobs[dep].state in ENDED and model.edges[dep] is None
            if ended and self._resolve(model, dep, _outcome(self.jobs[dep].state)):
                self._cascade([job_id])  # a diamond's root: its own dependants follow

    # -- rules: enqueue ------------------------------------------------------------------------

    @precondition(lambda self: len(self.jobs) < MAX_JOBS)
    @rule(attempts=st.integers(1, 3))
    def enqueue(self, attempts: int) -> None:
        result = self.call(lambda: trioq.enqueue(self.conn, "t", max_attempts=attempts))
        self._add(result.job_id, [], "cancel", attempts)

    @precondition(lambda self: bool(self.jobs) and len(self.jobs) < MAX_JOBS)
    @rule(data=st.data(), policy=POLICIES, attempts=st.integers(1, 3))
    def enqueue_after(self, data: st.DataObject, policy: str, attempts: int) -> None:
        deps = self._existing(data, 3) or [min(self.jobs)]
        gone = sorted(d for d in deps if self.jobs[d].state in ("gone",))

        async def go() -> trioq.EnqueueResult:
            return await trioq.enqueue(self.conn, "t", after=deps, max_attempts=attempts,
                                       on_dependency_failure=policy)  # fmt: skip

        if gone:
            with pytest.raises(trioq.UnknownDependencyError) as info:
                self.call(go)
            assert info.value.job_ids == tuple(gone)
            _seen("after= a job whose row is gone: refused")
            return
        result = self.call(go)
        self._add(result.job_id, deps, policy, attempts)
        self._resolve_at_enqueue(result.job_id)

    @precondition(lambda self: len(self.jobs) < MAX_JOBS)
    @rule(data=st.data(), policy=POLICIES, external=st.booleans())
    def enqueue_diamond(self, data: st.DataObject, policy: str, external: bool) -> None:
        """root -> (left, right) -> tail; the root maybe after an existing job."""
        outside = self._existing(data, 1) if external else []
        wf = trioq.Workflow()
        root = wf.add("root", "t", after=outside, on_dependency_failure=policy)
        middle = wf.group("middle", ["t", "t"], on_dependency_failure=policy).after(root)
        wf.add("tail", "t", on_dependency_failure=policy).after(middle)
        gone = [d for d in outside if self.jobs[d].state == "gone"]
        if gone:
            with pytest.raises(trioq.UnknownDependencyError):
                self.call(wf.enqueue, self.conn)
            return  # the invariant checks that none of it was inserted
        ids = self.call(wf.enqueue, self.conn)
        r, (a, b), t = ids["root"], ids.group("middle"), ids["tail"]
        for job_id, deps in ((r, outside), (a, [r]), (b, [r]), (t, [a, b])):
            self._add(job_id, deps, policy, 25)
        self._resolve_at_enqueue(r)

    # -- rules: workers ------------------------------------------------------------------------

    def _runnable(self) -> list[ModelJob]:
        due = [j for j in self.jobs.values() if j.state == "available" and j.run_at <= self.clock]
        return sorted(due, key=lambda j: (j.run_at, j.id))

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 4))
    def claim_again(self, worker: str, limit: int) -> None:
        """(Claims and completions move graphs on: twice the weight of other rules.)"""
        self.claim(worker, limit)

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 4))
    def claim(self, worker: str, limit: int) -> None:
        got = self.call(lambda: Q.claim(self.conn, "default", owner=worker, limit=limit,
                                        lease=LEASE))  # fmt: skip
        expected = self._runnable()[:limit]
        assert [j.id for j in got] == [m.id for m in expected]
        for job, model in zip(got, expected, strict=True):
            if model.deps:
                _seen("a freed dependant claimed")
            model.state, model.owner = "running", worker
            model.attempt += 1
            model.lease_until = self.clock + LEASE
            assert job.attempt == model.attempt
            self.beliefs[worker].add(Lease(job.id, job.attempt))

    def _back(self, job_id: int) -> None:
        """Not an ending: back to available (a retry, a release, a returned lease)."""
        model = self.jobs[job_id]
        model.state, model.owner, model.lease_until, model.run_at = (
            "available", None, None, self.clock
        )  # fmt: skip

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data(), keep=st.booleans())
    def complete_again(self, data: st.DataObject, keep: bool) -> None:
        self.complete(data, keep)

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data(), keep=st.booleans())
    def complete(self, data: st.DataObject, keep: bool) -> None:
        worker, leases = self._pick(data)
        valid = self._valid(worker, leases)
        results = [{"n": le.job_id} for le in leases] if keep else None
        done = self.call(lambda: Q.complete_many(self.conn, owner=worker, leases=leases,
                                                 results=results))  # fmt: skip
        assert done == valid
        for job_id in sorted(valid):
            self.end(job_id, "done" if keep else "gone")

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data(), fatal=st.booleans())
    def fail(self, data: st.DataObject, fatal: bool) -> None:
        worker, leases = self._pick(data)
        valid = self._valid(worker, leases)
        failures = [Failure(lease=le, error="boom", fatal=fatal) for le in leases]
        result = self.call(lambda: Q.fail_many(self.conn, owner=worker, failures=failures))
        for job_id in sorted(valid):
            model = self.jobs[job_id]
            if fatal or model.attempt >= model.max_attempts:
                assert job_id in result.dead
                self.end(job_id, "dead")
            elif model.cancel_requested:
                assert job_id in result.cancelled
                self.end(job_id, "cancelled")
            else:
                assert job_id in result.retried
                self._back(job_id)

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        worker, leases = self._pick(data)
        valid = self._valid(worker, leases)
        released = self.call(lambda: Q.release_many(self.conn, owner=worker, leases=leases))
        assert released == valid
        for job_id in sorted(valid):
            model = self.jobs[job_id]
            model.attempt -= 1
            if model.cancel_requested:
                self.end(job_id, "cancelled")
            else:
                self._back(job_id)

    @precondition(lambda self: bool(self._holders()))
    @rule(worker=st.sampled_from(WORKERS))
    def crash(self, worker: str) -> None:
        """The worker dies: its jobs stay running until their leases expire."""
        self.beliefs[worker].clear()

    @rule(seconds=st.sampled_from([4, 31]))
    def time_passes(self, seconds: int) -> None:
        self.clock += dt.timedelta(seconds=seconds)
        self.call(self._set_clock)

    @rule()
    def sweep(self) -> None:
        result = self.call(lambda: Q.sweep(self.conn))
        for model in sorted(self.jobs.values(), key=lambda m: m.id):
            if model.state != "running" or model.lease_until is None:
                continue
            if model.lease_until >= self.clock:
                continue
            _seen("a lease swept")
            if model.cancel_requested:
                assert model.id in result.cancelled
                self.end(model.id, "cancelled")
            elif model.attempt >= model.max_attempts:
                assert model.id in result.dead
                self.end(model.id, "dead")
            else:
                assert model.id in result.returned
                self._back(model.id)

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        model = self.jobs[data.draw(st.sampled_from(sorted(self.jobs)))]
        outcome = self.call(Q.cancel, self.conn, model.id)
        if model.state in ("waiting", "available"):
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
        live, dead, edges = self.call(self._fetch)
        for job_id, model in self.jobs.items():
            if model.state == "gone":
                assert job_id not in live and job_id not in dead, job_id
            elif model.state == "dead":
                assert job_id not in live and dead.get(job_id) == model.attempt, job_id
            else:
                state, attempt, owner, left = live[job_id]
                assert (state, attempt, owner) == (model.state, model.attempt, model.owner), (
                    job_id, live[job_id], model,
                )  # fmt: skip
                if model.deps and model.state != "cancelled":
                    assert left == model.left, (job_id, left, model)
        assert set(live) | set(dead) <= set(self.jobs), "rows the model never enqueued"
        expected = {
            (model.id, dep): outcome
            for model in self.jobs.values() if model.has_row
            for dep, outcome in model.edges.items()
        }  # fmt: skip
        assert edges == expected

    @invariant()
    def dependants_run_only_after_their_dependencies(self) -> None:
        """The model's own rule, checked on its history: freed at most once, and only when
        every dependency had ended (completed, unless the policy is ``run``)."""
        for model in self.jobs.values():
            assert model.freed <= 1, model
            if model.deps and (model.state in RUNNABLE or model.attempt > 0):
                assert model.freed == 1 and model.left == 0, model
                assert all(self.jobs[d].state in ENDED for d in model.deps), model
                if model.policy == "cancel":
                    assert set(model.edges.values()) == {"done"}, model

    async def _fetch(self) -> tuple[dict[int, Any], dict[int, int], dict[tuple[int, int], Any]]:
        cur = await self.conn.execute(
            "SELECT id, state, attempt, lease_owner, dependencies_left FROM trioq.jobs"
        )
        live = {r[0]: tuple(r[1:]) for r in await cur.fetchall()}
        cur = await self.conn.execute("SELECT id, attempt FROM trioq.dead_jobs")
        dead = {r[0]: r[1] for r in await cur.fetchall()}
        cur = await self.conn.execute(
            "SELECT job_id, depends_on, outcome FROM trioq.job_dependencies"
        )
        return live, dead, {(r[0], r[1]): r[2] for r in await cur.fetchall()}


def test_workflow_state_machine(dsn: str) -> None:
    async def main() -> None:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            await trioq.migrate(conn)
            await run_machine(
                WorkflowMachine, {"conn": conn}, examples=(200, 2000), steps=(50, 80)
            )

    SEEN.clear()
    trio.run(main)
    print(dict(SEEN))
    for path in ("dependant freed", "a freed dependant claimed", "a lease swept",
                 "a dependency dead: dependant cancelled",
                 "a dependency cancelled: dependant cancelled"):  # fmt: skip
        assert SEEN[path], f"no example took the path {path!r}: {dict(SEEN)}"
