"""`trioq.Workflow`: a graph of jobs (fan-out, fan-in, chains), enqueued in one transaction.

A workflow is built step by step, then enqueued whole. A step is one job (`Workflow.add`)
or a group of jobs that run side by side (`Workflow.group`); a step waits for other steps
(every job of a waited-for group), and may wait for existing jobs too (their ids)::

    wf = trioq.Workflow()
    fetch = wf.add("fetch", fetch_page.spec(url=url))
    thumbs = wf.group("thumbs", [thumbnail.spec(size=s) for s in (64, 128, 256)]).after(fetch)
    wf.add("collage", make_collage.spec()).after(thumbs)
    jobs = await wf.enqueue(conn)           # one transaction: all of it or none of it
    jobs["collage"], jobs.group("thumbs")   # the job ids

Everything is checked at `Workflow.enqueue` before any SQL: names, references, cycles
(refused with the cycle named), sizes; errors are `trioq.WorkflowError`. The steps
themselves (`Step`) are frozen; the builder is not, so adding a step costs O(1) however
large the graph (a frozen builder would copy it on every `add`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ._db.insert import GraphJob
from ._enqueue import DEFAULT_QUEUE
from ._exceptions import WorkflowError
from ._job import MAX_DEPENDENCIES, JobSpec, JSONValue, check_dependency_policy, check_job_id
from ._pg.conn import Conn
from ._queue import Queue

if TYPE_CHECKING:
    from ._registry import Task

__all__ = ["MAX_WORKFLOW_EDGES", "MAX_WORKFLOW_JOBS", "Step", "Workflow", "WorkflowJobs"]

#: Most jobs one workflow may enqueue (all in one transaction).
MAX_WORKFLOW_JOBS = 100_000
#: Most edges (job waits for job) one workflow may have: a group after a group is one
#: edge per pair of their jobs; put a step between two large groups instead.
MAX_WORKFLOW_EDGES = 1_000_000
_NAME_MAX = 200
_BAD_NAME = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"step name must be a string, got {name!r}")
    if not name or len(name) > _NAME_MAX or _BAD_NAME.search(name):
        raise WorkflowError(
            f"step name {name!r} is invalid: use 1-{_NAME_MAX} characters, no control "
            "characters (NUL included) or lone surrogates"
        )
    return name


def _is_task(job: object) -> bool:
    """Whether ``job`` is a `trioq.Task`. Only once `trioq._registry` is imported can there
    be one; not importing it here keeps trio out of `trioq.producer`'s imports (the
    registry's hooks are trio's)."""
    registry = sys.modules.get("trioq._registry")
    return registry is not None and isinstance(job, registry.Task)


def _as_spec(job: object, args: JSONValue, where: str) -> JobSpec:
    """A step's job: a `JobSpec`, a `Task` (with ``args``), or a task name (with ``args``)."""
    if isinstance(job, JobSpec):
        if args is not None:
            raise TypeError(f"{where}: give args in the JobSpec, not beside it")
        spec = job
    elif _is_task(job):
        spec = job.spec(args)  # type: ignore[attr-defined]
    elif isinstance(job, str):
        spec = JobSpec(task=job, args=args)
    else:
        raise TypeError(f"{where} must be a JobSpec, a Task or a task name, got {job!r}")
    if spec.uniqueness() is not None:
        raise WorkflowError(
            f"{where} has a dedup_key or is unique: jobs of a workflow cannot be (the graph "
            "needs every one of its jobs inserted)"
        )
    return spec


@attrs.frozen(eq=False)
class Step:
    """A step of a `Workflow`: one job, or a group. `after` makes it wait for more."""

    workflow: Workflow = attrs.field(repr=False)
    name: str
    size: int

    def after(self, *deps: str | Step | int) -> Step:
        """Make this step wait for ``deps`` too (steps, their names, or existing job ids);
        returns the step, so calls chain."""
        self.workflow._add_deps(self.name, deps)
        return self


@attrs.frozen
class WorkflowJobs:
    """The ids of an enqueued workflow's jobs, by step: ``jobs["fetch"]`` (a one-job step),
    ``jobs.group("thumbs")`` (any step, in the order its jobs were given)."""

    ids: Mapping[str, tuple[int, ...]]

    def __getitem__(self, name: str) -> int:
        ids = self.group(name)
        if len(ids) != 1:
            raise KeyError(f"step {name!r} is a group of {len(ids)} jobs: use .group({name!r})")
        return ids[0]

    def group(self, name: str) -> tuple[int, ...]:
        try:
            return self.ids[name]
        except KeyError:
            raise KeyError(f"no step {name!r} in this workflow") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids)

    def __len__(self) -> int:
        return sum(len(ids) for ids in self.ids.values())


class Workflow:
    """A graph of jobs to enqueue in one transaction (see the module docs)."""

    def __init__(self) -> None:
        self._specs: dict[str, list[JobSpec]] = {}
        self._deps: dict[str, list[str | int]] = {}
        self._policy: dict[str, str | None] = {}
        self._jobs = 0

    def add(
        self,
        name: str,
        job: JobSpec | Task | str,
        args: JSONValue = None,
        *,
        after: Iterable[str | Step | int] = (),
        on_dependency_failure: str | None = None,
    ) -> Step:
        """A step of one job: a `JobSpec`, a `Task` or a task name (with ``args``).

        ``after``: what it waits for. ``on_dependency_failure`` (``cancel`` or ``run``)
        overrides the spec's: what a dependency that dies or is cancelled does to it.
        """
        spec = _as_spec(job, args, f"step {name!r}")
        return self._step(name, [spec], after, on_dependency_failure)

    def group(
        self,
        name: str,
        jobs: Iterable[JobSpec | Task | str],
        *,
        after: Iterable[str | Step | int] = (),
        on_dependency_failure: str | None = None,
    ) -> Step:
        """A step of many jobs that run side by side (fan-out); a step after it waits for
        all of them (fan-in). An empty group is refused."""
        if isinstance(jobs, str | bytes | JobSpec | Mapping) or _is_task(jobs):
            raise TypeError(f"group {name!r}: jobs must be a list of jobs, got {jobs!r}")
        specs = [_as_spec(job, None, f"group {name!r}: job {i}") for i, job in enumerate(jobs)]
        if not specs:
            raise WorkflowError(f"group {name!r} has no jobs")
        return self._step(name, specs, after, on_dependency_failure)

    def _step(
        self, name: str, specs: list[JobSpec], after: Iterable[str | Step | int],
        policy: str | None,
    ) -> Step:  # fmt: skip
        _check_name(name)
        if name in self._specs:
            raise WorkflowError(f"step {name!r} added twice")
        if policy is not None:
            check_dependency_policy(policy)
        if self._jobs + len(specs) > MAX_WORKFLOW_JOBS:
            raise WorkflowError(f"a workflow may have at most {MAX_WORKFLOW_JOBS} jobs")
        self._specs[name] = specs
        self._deps[name] = []
        self._policy[name] = policy
        self._jobs += len(specs)
        if isinstance(after, str | bytes | Step | int):
            raise TypeError(f"step {name!r}: after must be a list, got {after!r}")
        self._add_deps(name, tuple(after))
        return Step(self, name, len(specs))

    def _add_deps(self, name: str, deps: Sequence[object]) -> None:
        known = self._deps.get(name)
        if known is None:
            raise WorkflowError(f"no step {name!r} in this workflow")
        for dep in deps:
            ref = self._ref(name, dep)
            if ref in known:
                raise WorkflowError(f"step {name!r} waits for {ref!r} twice")
            known.append(ref)

    def _ref(self, name: str, dep: object) -> str | int:
        if isinstance(dep, Step):
            if dep.workflow is not self:
                raise WorkflowError(f"step {name!r} waits for step {dep.name!r} of another "
                                    "workflow")  # fmt: skip
            dep = dep.name
        if isinstance(dep, str):
            if dep == name:
                raise WorkflowError(f"step {name!r} cannot wait for itself")
            return dep
        if isinstance(dep, int) and not isinstance(dep, bool):
            return check_job_id(dep, f"step {name!r}: after")
        raise TypeError(f"step {name!r}: after takes step names, steps or job ids, got {dep!r}")

    def __len__(self) -> int:
        """How many jobs the workflow enqueues."""
        return self._jobs

    def steps(self) -> list[str]:
        """The steps' names, in the order they were added."""
        return list(self._specs)

    # -- enqueue -------------------------------------------------------------------------------

    async def enqueue(
        self, conn: Conn, *, queue: Queue | None = None, notify: bool = True
    ) -> WorkflowJobs:
        """Check the graph, then insert every job and edge on ``conn`` in one transaction
        (the caller's if one is open): all of it or none of it. The first jobs (those that
        wait for nothing) can run once it commits."""
        q = queue if queue is not None else DEFAULT_QUEUE
        self._check_acyclic()
        jobs, spans = self._graph()
        if not jobs:
            return WorkflowJobs({})
        results = await q.enqueue_graph(conn, jobs, notify=notify)
        return WorkflowJobs({name: tuple(results[a:b]) for name, (a, b) in spans.items()})

    def _check_acyclic(self) -> None:
        """A `WorkflowError` naming an unknown step or a cycle (Kahn's algorithm: the steps
        it cannot order are on or after a cycle)."""
        for name, deps in self._deps.items():
            unknown = [d for d in deps if isinstance(d, str) and d not in self._specs]
            if unknown:
                raise WorkflowError(f"step {name!r} waits for {unknown[0]!r}, which is not a "
                                    "step of this workflow")  # fmt: skip
        waits = {name: {d for d in deps if isinstance(d, str)} for name, deps in self._deps.items()}
        left = _unordered(waits)
        if any(left.values()):
            raise WorkflowError(
                f"the workflow has a cycle: {_cycle(waits, left)} (each waits for the next)"
            )

    def _graph(self) -> tuple[list[GraphJob], dict[str, tuple[int, int]]]:
        """The jobs to insert, in the order their steps were added, and each step's span."""
        spans: dict[str, tuple[int, int]] = {}
        n = 0
        for name, specs in self._specs.items():
            spans[name] = (n, n + len(specs))
            n += len(specs)
        jobs: list[GraphJob] = []
        edges = 0
        for name, specs in self._specs.items():
            internal = tuple(p for d in self._deps[name] if isinstance(d, str)
                             for p in range(*spans[d]))  # fmt: skip
            external = tuple(d for d in self._deps[name] if isinstance(d, int))
            for spec in specs:
                job = GraphJob(spec=self._spec_of(name, spec, external), waits_for=internal)
                edges += len(internal) + len(job.spec.after)
                jobs.append(job)
            if edges > MAX_WORKFLOW_EDGES:
                raise WorkflowError(
                    f"the workflow has more than {MAX_WORKFLOW_EDGES} edges (step {name!r} "
                    "adds one per job it waits for, for each of its jobs): put a one-job "
                    "step between large groups"
                )
        return jobs, spans

    def _spec_of(self, name: str, spec: JobSpec, external: tuple[int, ...]) -> JobSpec:
        changes: dict[str, Any] = {}
        if external:
            both = spec.after + tuple(e for e in external if e not in spec.after)
            if len(both) > MAX_DEPENDENCIES:
                raise WorkflowError(f"step {name!r} waits for more than {MAX_DEPENDENCIES} "
                                    "existing jobs")  # fmt: skip
            changes["after"] = both
        if self._policy[name] is not None:
            changes["on_dependency_failure"] = self._policy[name]
        return attrs.evolve(spec, **changes) if changes else spec


def _unordered(waits: dict[str, set[str]]) -> dict[str, int]:
    """Kahn's algorithm over the steps (``waits``: what each waits for): how many of its
    dependencies each step still waits for once every step that can be ordered is (a
    step left with any is on or after a cycle)."""
    dependants: dict[str, list[str]] = {name: [] for name in waits}
    for name, names in waits.items():
        for dep in names:
            dependants[dep].append(name)
    left = {name: len(names) for name, names in waits.items()}
    ready = [name for name in waits if not left[name]]
    while ready:
        for nxt in dependants[ready.pop()]:
            left[nxt] -= 1
            if not left[nxt]:
                ready.append(nxt)
    return left


def _cycle(waits: dict[str, set[str]], left: dict[str, int]) -> str:
    """One cycle among the steps Kahn's algorithm could not order, as 'a -> b -> a'."""
    stuck = {name for name, n in left.items() if n}
    start = min(stuck)
    path = [start]
    seen = {start: 0}
    while True:
        nxt = min(d for d in waits[path[-1]] if d in stuck)
        if nxt in seen:
            cycle = [*path[seen[nxt] :], nxt]
            return " -> ".join(repr(s) for s in cycle)
        seen[nxt] = len(path)
        path.append(nxt)
