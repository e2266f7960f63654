"""What the Hypothesis state machines share (`test_queue_state_machine.py`,
`test_flow_state_machine.py`, `test_workflow_state_machine.py`): rules that call trio code,
and the run of a machine bound to the test's connections.

Hypothesis drives a machine from a worker thread; its rules run coroutines on the test's
trio loop (`TrioMachine.call`). CI runs the same machines every time (``derandomize``: a
failure is reproducible, not a flake); ``TRIOQ_HYPOTHESIS=long`` (``just prove``) explores
new ones, more and longer.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from trioq import Lease

T = TypeVar("T")
LONG = os.environ.get("TRIOQ_HYPOTHESIS") == "long"


class TrioMachine(RuleBasedStateMachine):
    """A state machine whose rules call trio code through `call`."""

    token: trio.lowlevel.TrioToken  # the test's loop, bound by `run_machine`

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return trio.from_thread.run(fn, *args, trio_token=self.token)


class LeaseMachine(TrioMachine):
    """A machine whose workers believe they hold leases (``beliefs``) on model jobs
    (``jobs``: each with ``state``, ``owner`` and ``attempt``), some of them stale."""

    workers: tuple[str, ...]
    beliefs: dict[str, set[Lease]]
    jobs: dict[int, Any]

    def _holders(self) -> list[str]:
        return [w for w in self.workers if self.beliefs[w]]

    def _pick(self, data: st.DataObject) -> tuple[str, list[Lease]]:
        """A worker that believes it holds leases, and up to three of them (forgotten)."""
        worker = data.draw(st.sampled_from(self._holders()))
        held = sorted(self.beliefs[worker], key=lambda le: (le.job_id, le.attempt))
        chosen = data.draw(st.lists(st.sampled_from(held), unique=True, min_size=1, max_size=3))
        self.beliefs[worker] -= set(chosen)
        return worker, chosen

    def _valid(self, worker: str, leases: list[Lease]) -> set[int]:
        """The ids of ``leases`` the model says ``worker`` still holds."""
        return {
            le.job_id for le in leases
            if (m := self.jobs[le.job_id]).state == "running" and m.owner == worker
            and m.attempt == le.attempt
        }  # fmt: skip


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
    await trio.to_thread.run_sync(lambda: run_state_machine_as_test(bound_machine, settings=config))
