"""`trioq.Workflow`: the graph it enqueues, all or nothing, and the inputs it refuses."""

from __future__ import annotations

from typing import Any

import pytest

import trioq
from trioq import JobSpec, Workflow, WorkflowError


async def _conn(dsn: str) -> Any:
    conn = await trioq.connect(dsn, autocommit=True)
    await trioq.migrate(conn)
    return conn


async def _edges(conn: Any) -> set[tuple[int, int]]:
    cur = await conn.execute("SELECT job_id, depends_on FROM trioq.job_dependencies")
    return {(a, b) for a, b in await cur.fetchall()}


async def _rows(conn: Any) -> dict[int, tuple[str, str, int | None, bool]]:
    cur = await conn.execute(
        "SELECT id, task, state, dependencies_left, has_dependants FROM trioq.jobs"
    )
    return {r[0]: (r[1], r[2], r[3], r[4]) for r in await cur.fetchall()}


async def test_a_diamond_goes_in_as_one_graph(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        outside = (await trioq.enqueue(conn, "outside")).job_id
        wf = Workflow()
        top = wf.add("top", "split", {"n": 3})
        mid = wf.group("mid", [JobSpec(task="work", args={"i": i}) for i in range(3)], after=[top])
        wf.add("bottom", JobSpec(task="join", queue="joins")).after(mid, outside)
        assert len(wf) == 5 and wf.steps() == ["top", "mid", "bottom"]
        jobs = await wf.enqueue(conn)
        t, (m0, m1, m2), b = jobs["top"], jobs.group("mid"), jobs["bottom"]
        assert len(jobs) == 5 and list(jobs) == ["top", "mid", "bottom"]
        assert await _edges(conn) == {(m0, t), (m1, t), (m2, t), (b, m0), (b, m1), (b, m2),
                                      (b, outside)}  # fmt: skip
        rows = await _rows(conn)
        assert rows[t] == ("split", "available", None, True)
        assert rows[m0] == ("work", "waiting", 1, True)
        assert rows[b] == ("join", "waiting", 4, False)
        assert rows[outside] == ("outside", "available", None, True)
        with pytest.raises(KeyError, match=r"is a group of 3 jobs: use \.group"):
            jobs["mid"]
        with pytest.raises(KeyError, match="no step 'nope'"):
            jobs.group("nope")


async def test_all_or_nothing(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        wf = Workflow()
        a = wf.add("a", "t")
        wf.group("b", ["t"] * 50).after(a)
        wf.add("c", "t").after("b", 10**9)  # an existing job that is not there
        with pytest.raises(trioq.UnknownDependencyError, match="after lists job 1000000000"):
            await wf.enqueue(conn)
        assert await _rows(conn) == {}
        with pytest.raises(RuntimeError, match="the app failed"):
            async with conn.transaction():
                await Workflow().add("x", "t").workflow.enqueue(conn)
                raise RuntimeError("the app failed")
        assert await _rows(conn) == {} and await _edges(conn) == set()


async def test_an_empty_workflow_enqueues_nothing(dsn: str) -> None:
    async with await _conn(dsn) as conn:
        assert len(await Workflow().enqueue(conn)) == 0


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (
            lambda w: (
                w.add("a", "t").after("b")
                and w.add("b", "t").after("c")
                and w.add("c", "t").after("a")
            ),
            "cycle: 'a' -> 'b' -> 'c' -> 'a'",
        ),
        (lambda w: w.add("a", "t").after("a"), "step 'a' cannot wait for itself"),
        (lambda w: w.add("a", "t", after=["a"]), "step 'a' cannot wait for itself"),
        (lambda w: w.add("a", "t") and w.add("a", "t"), "step 'a' added twice"),
        (
            lambda w: w.add("a", "t") and w.add("b", "t", after=["a", "a"]),
            "step 'b' waits for 'a' twice",
        ),
        (lambda w: w.add("b", "t", after=[7, 7]), "step 'b' waits for 7 twice"),
        (
            lambda w: w.add("b", "t", after=["ghost"]),
            "step 'b' waits for 'ghost', which is not a step of this workflow",
        ),
        (lambda w: w.add("a\x00b", "t"), "step name 'a\\\\x00b' is invalid"),
        (lambda w: w.add("\ud800", "t"), "is invalid"),
        (lambda w: w.add("", "t"), "step name '' is invalid"),
        (lambda w: w.add("x" * 201, "t"), "is invalid: use 1-200 characters"),
        (lambda w: w.group("g", []), "group 'g' has no jobs"),
        (lambda w: w.add("a", JobSpec(task="t", dedup_key="k")), "step 'a' has a dedup_key"),
        (
            lambda w: w.add("a", "t").after(Workflow().add("b", "t")),
            "waits for step 'b' of another workflow",
        ),
        (
            lambda w: w.add("a", "t", on_dependency_failure="skip"),
            "on_dependency_failure must be 'cancel'",
        ),
    ],
)
async def test_bad_graphs_are_refused_naming_the_problem(dsn: str, build: Any, match: str) -> None:
    async with await _conn(dsn) as conn:
        wf = Workflow()
        with pytest.raises((WorkflowError, ValueError), match=match):
            build(wf)
            await wf.enqueue(conn)
        assert await _rows(conn) == {}


def test_wrong_types_are_type_errors() -> None:
    wf = Workflow()
    with pytest.raises(TypeError, match="step name must be a string"):
        wf.add(5, "t")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a JobSpec, a Task or a task name"):
        wf.add("a", 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="give args in the JobSpec"):
        wf.add("a", JobSpec(task="t"), {"x": 1})
    with pytest.raises(TypeError, match="after must be a list"):
        wf.add("b", "t", after="a")
    with pytest.raises(TypeError, match="after takes step names, steps or job ids"):
        wf.add("c", "t", after=[1.5])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="jobs must be a list of jobs"):
        wf.group("g", "t")
    with pytest.raises(ValueError, match=r"after must fit in a bigint"):
        wf.add("d", "t", after=[2**64])


def test_huge_graphs_are_refused_before_any_sql() -> None:
    wf = Workflow()
    wf.group("a", [JobSpec(task="t")] * 1001)
    wf.group("b", [JobSpec(task="t")] * 1000).after("a")  # 1,001,000 edges
    with pytest.raises(WorkflowError, match="more than 1000000 edges"):
        wf._graph()
    many = Workflow()
    many.group("a", [JobSpec(task="t")] * 100_000)
    with pytest.raises(WorkflowError, match="at most 100000 jobs"):
        many.add("one_more", "t")


async def test_a_cancelled_root_cancels_the_whole_graph_and_run_anyway_steps_run(
    dsn: str,
) -> None:
    async with await _conn(dsn) as conn:
        wf = Workflow()
        root = wf.add("root", "t")
        mid = wf.group("mid", ["t"] * 3).after(root)
        wf.add("cleanup", "t", on_dependency_failure="run").after(mid)
        jobs = await wf.enqueue(conn)
        await trioq.Queue().cancel(conn, jobs["root"])
        rows = await _rows(conn)
        assert {rows[i][1] for i in jobs.group("mid")} == {"cancelled"}
        assert rows[jobs["cleanup"]][1] == "available"
        deps = await trioq.dependencies(conn, jobs["cleanup"])
        assert {d.outcome for d in deps} == {"cancelled"} and len(deps) == 3
