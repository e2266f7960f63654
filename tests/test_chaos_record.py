"""`trioq stress`'s chaos bookkeeping: a kill that happened is counted even when the run
ends (the chaos task is cancelled) while it reads what the victim held. Before, the cancel
landed in that read: the replacement had started but the kill was not counted, so the
report said one more worker started than kills explain (a CI failure of
`test_faults.py::test_sigkill_every_few_seconds_for_a_minute`)."""

from __future__ import annotations

from typing import Any

import attrs
import trio

from trioq._stress.chaos import ChaosLog, kill_one


@attrs.define
class _Worker:
    pid: int
    slot: int = 0


@attrs.define
class _Group:
    """A worker group whose kill ends the run at once (cancels the chaos task's scope)."""

    scope: trio.CancelScope
    workers: list[_Worker] = attrs.field(factory=lambda: [_Worker(101), _Worker(102)])
    killed: list[int] = attrs.field(factory=list)

    def live(self) -> list[_Worker]:
        return list(self.workers)

    def kill(self, victim: _Worker) -> _Worker:
        self.killed.append(victim.pid)
        self.scope.cancel()
        return victim


class _Held:
    async def by_pid(self) -> dict[int, list[int]]:
        return {101: [1, 2, 3]}

    async def read(self) -> dict[int, list[int]]:
        await trio.sleep(0.05)  # a round trip to the database
        return {101: [1, 2, 3, 4]}


async def test_a_kill_is_recorded_even_when_the_run_ends_during_its_read() -> None:
    log = ChaosLog()
    with trio.CancelScope() as scope:
        group: Any = _Group(scope)
        held: Any = _Held()
        await kill_one(group, held, log, wait=0.0)
    assert group.killed == [101]
    assert log.kills == 1
    [fault] = log.faults
    assert fault.kind == "kill" and list(fault.held) == [1, 2, 3, 4]
