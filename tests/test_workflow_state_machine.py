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

from typing import Any

import attrs
import pytest
from helpers import rows
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule
from machines import LEASE, LeaseMachine, ModelJob, Paths, Q, prove

import trioq

WORKERS = ("w0", "w1")
POLICIES = st.sampled_from(["cancel", "run"])
MAX_JOBS = 50
ENDED = ("done", "gone", "dead", "cancelled")  # gone: done, its row deleted (no kept result)
RUNNABLE = ("available", "running")
#: How often each path was taken in this process (the test checks the main ones were).
SEEN = Paths()
_seen = SEEN.take


@attrs.define(kw_only=True)
class WorkflowJob(ModelJob):
    """States: waiting, available, running, done, gone, dead, cancelled."""

    deps: tuple[int, ...] = ()
    policy: str = "cancel"
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


class WorkflowMachine(LeaseMachine[WorkflowJob]):
    workers = WORKERS
    tables = ("jobs", "dead_jobs", "job_dependencies", "batches")
    gone = "gone"
    columns = ("state", "attempt", "lease_owner", "dependencies_left")

    # -- the model of the resolution -----------------------------------------------------------

    def end(self, job_id: int, state: str) -> None:
        """``job_id`` ended as ``state``: resolve its dependants, a cancellation cascading."""
        super().end(job_id, state)
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

    def _resolve(self, model: WorkflowJob, dep: int, outcome: str) -> bool:
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
        model = WorkflowJob(id=job_id, run_at=self.clock, max_attempts=attempts,
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

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 4))
    def claim_again(self, worker: str, limit: int) -> None:
        """(Claims and completions move graphs on: twice the weight of other rules.)"""
        self.claim(worker, limit)

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 4))
    def claim(self, worker: str, limit: int) -> None:
        got = self.call(lambda: Q.claim(self.conn, "default", owner=worker, limit=limit,
                                        lease=LEASE))  # fmt: skip
        expected = self._due()[:limit]
        self._took(worker, got, expected)
        for model in expected:
            if model.deps:
                _seen("a freed dependant claimed")

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data(), keep=st.booleans())
    def complete_again(self, data: st.DataObject, keep: bool) -> None:
        self.complete(data, keep)

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data(), keep=st.booleans())
    def complete(self, data: st.DataObject, keep: bool) -> None:
        worker, leases = self._pick(data, "complete")
        results = [{"n": le.job_id} for le in leases] if keep else None
        self._complete(worker, leases, state="done" if keep else "gone", results=results)

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data(), fatal=st.booleans())
    def fail(self, data: st.DataObject, fatal: bool) -> None:
        worker, leases = self._pick(data, "fail")
        self._fail(worker, leases, fatal=fatal)

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self._release(*self._pick(data, "release"))

    @precondition(lambda self: bool(self._holders()))
    @rule(worker=st.sampled_from(WORKERS))
    def crash(self, worker: str) -> None:
        """The worker dies: its jobs stay running until their leases expire."""
        self.beliefs[worker].clear()

    @rule(seconds=st.sampled_from([4, 31]))
    def time_passes(self, seconds: int) -> None:
        self.advance(seconds)

    def _swept(self, expired: list[WorkflowJob], result: Any) -> None:
        for _ in expired:
            _seen("a lease swept")
        super()._swept(expired, result)

    # -- invariants (and those of every machine) -----------------------------------------------

    def _check_row(self, model: WorkflowJob, row: tuple[Any, ...]) -> None:
        if model.deps and model.state != "cancelled":
            assert row[3] == model.left, (model.id, row, model)

    @invariant()
    def edges_match_model(self) -> None:
        """Each edge records the outcome of its dependency once it ended, the right one."""
        query = "SELECT job_id, depends_on, outcome FROM trioq.job_dependencies"
        edges = {(r[0], r[1]): r[2] for r in self.call(rows, self.conn, query)}
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


def test_workflow_state_machine(dsn: str) -> None:
    SEEN.clear()
    prove(WorkflowMachine, dsn, examples=(200, 2000), steps=(50, 80))
    SEEN.assert_taken((
        "dependant freed", "a freed dependant claimed", "a lease swept",
        "a dependency dead: dependant cancelled", "a dependency cancelled: dependant cancelled",
    ))  # fmt: skip
