"""OpenTelemetry traces (issue #11): the span that enqueued a job is the parent of the span of
every execution of it. The SDK's in-memory exporter, real workers, real Postgres."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import Counter, rows, scalar, serving, wait_until
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import trioq
from trioq._obs.carrier import carrier
from trioq.retry import Constant

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider (set once: OpenTelemetry refuses a second) exporting
    into memory, emptied for each test."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


tracer = trace.get_tracer("tests")


def _runs(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("process ")]


async def _wait_for_spans(exporter: InMemorySpanExporter, n: int) -> list[ReadableSpan]:
    async def enough() -> bool:
        return len(_runs(exporter)) >= n

    await wait_until(enough)
    return sorted(_runs(exporter), key=lambda s: s.start_time or 0)


async def test_the_enqueuing_span_is_the_parent_of_the_execution(
    dsn: str, spans: InMemorySpanExporter
) -> None:
    tasks = trioq.Registry()
    inner_parent: list[Any] = []

    @tasks.task
    async def work(job: trioq.JobContext) -> None:
        with tracer.start_as_current_span("inside the handler") as inner:
            inner_parent.append(inner)

    async with serving(dsn, tasks) as (conn, _runtime):
        with tracer.start_as_current_span("web request") as request:
            job = await work.enqueue(conn)
        stored = await scalar(conn, "SELECT trace_context FROM trioq.jobs WHERE id = %s",
                              job.job_id)  # fmt: skip
        (run,) = await _wait_for_spans(spans, 1)
    context = request.get_span_context()
    assert stored["traceparent"].split("-")[1:3] == [f"{context.trace_id:032x}",
                                                     f"{context.span_id:016x}"]  # fmt: skip
    assert run.name == "process work" and run.kind is SpanKind.CONSUMER
    assert run.parent is not None and run.parent.is_remote
    assert (run.parent.trace_id, run.parent.span_id) == (context.trace_id, context.span_id)
    assert run.context is not None and run.context.trace_id == context.trace_id
    assert dict(run.attributes or {}) == {
        "messaging.system": "trioq", "messaging.operation.type": "process",
        "messaging.destination.name": "default", "messaging.message.id": str(job.job_id),
        "trioq.job.id": job.job_id, "trioq.job.task": "work", "trioq.job.queue": "default",
        "trioq.job.attempt": 1, "trioq.job.outcome": "completed",
    }  # fmt: skip
    (inner,) = [s for s in spans.get_finished_spans() if s.name == "inside the handler"]
    assert inner.parent is not None and inner.parent.span_id == run.context.span_id


async def test_every_attempt_is_a_child_of_the_enqueue_and_failures_are_errors(
    dsn: str, spans: InMemorySpanExporter
) -> None:
    tasks = trioq.Registry()

    @tasks.task(max_attempts=2, retry=Constant(seconds=0))
    async def failing(job: trioq.JobContext) -> None:
        raise ValueError(f"attempt {job.attempt}")

    async with serving(dsn, tasks) as (conn, _runtime):
        with tracer.start_as_current_span("enqueue") as parent:
            await failing.enqueue(conn)
        first, second = await _wait_for_spans(spans, 2)
    span_id = parent.get_span_context().span_id
    assert first.parent is not None and second.parent is not None
    assert first.parent.span_id == span_id == second.parent.span_id
    assert [s.attributes["trioq.job.attempt"] for s in (first, second)] == [1, 2]  # type: ignore[index]
    assert [s.attributes["trioq.job.outcome"] for s in (first, second)] == [  # type: ignore[index]
        "retried", "dead"
    ]
    for span, attempt in ((first, 1), (second, 2)):
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == f"ValueError: attempt {attempt}"
        (event,) = span.events
        assert event.name == "exception" and event.attributes is not None
        assert "Traceback" in str(event.attributes["exception.stacktrace"])


async def test_without_a_span_nothing_is_stored_and_the_execution_is_a_root(
    dsn: str, spans: InMemorySpanExporter
) -> None:
    assert carrier() is None  # no span is current here
    tasks = trioq.Registry()

    @tasks.task
    async def work(job: trioq.JobContext) -> None:
        pass

    async with serving(dsn, tasks) as (conn, _runtime):
        job = await work.enqueue(conn)
        # another producer's garbage in the column is no parent either
        await conn.execute("UPDATE trioq.jobs SET trace_context = '[1, 2]' WHERE id = %s",
                           (job.job_id,))  # fmt: skip
        await trioq.enqueue(conn, "work", queue="default")
        runs = await _wait_for_spans(spans, 2)
    assert [r.parent for r in runs] == [None, None]
    assert {r.attributes["trioq.job.outcome"] for r in runs} == {"completed"}  # type: ignore[index]


async def test_every_enqueue_path_stores_the_context(
    dsn: str, spans: InMemorySpanExporter
) -> None:
    """enqueue, enqueue_many (one statement; COPY; unnest with dedup keys), enqueue_bulk,
    after= and a workflow."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        with tracer.start_as_current_span("producer") as producer:
            first = await trioq.enqueue(conn, "a")
            await trioq.enqueue_many(conn, [trioq.JobSpec(task="b", args={"i": i})
                                            for i in range(3)])  # fmt: skip
            await trioq.enqueue_many(conn, [trioq.JobSpec(task="c", priority=i)
                                            for i in range(3)])  # fmt: skip
            await trioq.enqueue_many(conn, [trioq.JobSpec(task="d", dedup_key=f"k{i}")
                                            for i in range(3)])  # fmt: skip
            await trioq.enqueue_bulk(conn, "e", [{"i": i} for i in range(3)])
            await trioq.enqueue(conn, "g", after=[first.job_id])
            workflow = trioq.Workflow()
            workflow.add("h", "h")
            await workflow.enqueue(conn)
        await trioq.enqueue(conn, "f")  # no span: no context
        found = await rows(conn, "SELECT task, trace_context->>'traceparent' FROM trioq.jobs"
                           " ORDER BY id")  # fmt: skip
    context = producer.get_span_context()
    expected = f"00-{context.trace_id:032x}-{context.span_id:016x}-"
    assert [task for task, _ in found] == ["a", *"bbb", *"ccc", *"ddd", *"eee", "g", "h", "f"]
    assert all(tp is not None and tp.startswith(expected) for _, tp in found[:-1])
    assert found[-1][1] is None


async def test_a_job_enqueued_by_a_handler_is_a_child_of_its_execution(
    dsn: str, spans: InMemorySpanExporter
) -> None:
    tasks = trioq.Registry()
    done = Counter()

    @tasks.task
    async def first(job: trioq.JobContext) -> None:
        await job.enqueue("second")

    @tasks.task
    async def second(job: trioq.JobContext) -> None:
        done.hit()

    async with serving(dsn, tasks) as (conn, _runtime):
        with tracer.start_as_current_span("start"):
            await first.enqueue(conn)
        await done.wait_for(1)
        one, two = await _wait_for_spans(spans, 2)
    assert one.name == "process first" and two.name == "process second"
    assert one.context is not None and two.parent is not None
    assert two.parent.span_id == one.context.span_id
    assert two.context is not None and two.context.trace_id == one.context.trace_id


async def test_tracing_off_starts_no_span(dsn: str, spans: InMemorySpanExporter) -> None:
    tasks = trioq.Registry()
    done = Counter()

    @tasks.task
    async def work(job: trioq.JobContext) -> None:
        done.hit()

    async with serving(dsn, tasks, tracing=False) as (conn, _runtime):
        with tracer.start_as_current_span("enqueue"):
            await work.enqueue(conn)
        await done.wait_for(1)
    assert _runs(spans) == []


def test_by_default_a_worker_traces_only_once_a_provider_is_set() -> None:
    """OpenTelemetry's no-op spans cost a third of a no-op job: without a provider, none."""
    script = (
        "from trioq._worker.tracing import enabled\n"
        "assert enabled(None) is False  # opentelemetry never imported\n"
        "from opentelemetry import trace\n"
        "assert enabled(None) is False  # imported, no provider\n"
        "assert enabled(True) is True and enabled(False) is False\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "trace.set_tracer_provider(TracerProvider())\n"
        "assert enabled(None) is True\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert run.stdout.strip() == "ok", run.stderr
