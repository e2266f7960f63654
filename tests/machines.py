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
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

T = TypeVar("T")
LONG = os.environ.get("TRIOQ_HYPOTHESIS") == "long"


class TrioMachine(RuleBasedStateMachine):
    """A state machine whose rules call trio code through `call`."""

    token: trio.lowlevel.TrioToken  # the test's loop, bound by `run_machine`

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return trio.from_thread.run(fn, *args, trio_token=self.token)


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
