"""OpenTelemetry traces (``pip install 'trioq[otel]'``): a span per execution, whose parent
is the span that enqueued the job.

- **At enqueue** (`trioq._obs.carrier.carrier`): if the application has imported OpenTelemetry
  and a span is current, its W3C trace context (``traceparent``, ``tracestate``: the global
  propagator's fields) is stored with the job, in ``jobs.trace_context`` (migration 0006).
  Otherwise nothing is done: the test is one dictionary lookup (``sys.modules``), no
  parameter, no column, the same statement as before. trioq never imports OpenTelemetry
  to enqueue.
- **At execution** (`Tracing`): the worker starts a ``CONSUMER`` span named ``process
  <task>`` around the handler (its middleware, its timeout), as a child of the stored
  context (a new trace if there is none). Attributes: ``messaging.system`` (``trioq``),
  ``messaging.operation.type`` (``process``), ``messaging.destination.name`` (the queue),
  ``messaging.message.id``, ``trioq.job.id``, ``trioq.job.task``, ``trioq.job.queue``,
  ``trioq.job.attempt``, and at the end ``trioq.job.outcome`` (`OUTCOMES`). A failed attempt
  sets the span's status to ERROR with the error, and adds an ``exception`` event with the
  traceback. Spans the handler starts are children of it (trio keeps the context per task).

The worker traces when ``Config.tracing`` says so: None (the default) when the application
has set a tracer provider (``trace.set_tracer_provider``, or the SDK's auto-configuration)
before the worker starts, True always (an error at construction without opentelemetry-api),
False never. A recording span costs the worker about 40 us per job (measured with the SDK
and no exporter; `enabled` has the no-op case).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .._context import JobContext
from .._outcome import Kind, Outcome

__all__ = ["OUTCOMES", "Tracing", "enabled", "outcome_name"]

#: What ``trioq.job.outcome`` says about one execution.
OUTCOMES = (
    "completed", "retried", "dead", "snoozed", "lease_lost", "unknown_task", "aborted",
)  # fmt: skip


def outcome_name(outcome: Outcome, max_attempts: int) -> str:
    """`OUTCOMES`: what the handler's ending means for its job."""
    kind = outcome.kind
    if kind is Kind.COMPLETE or kind is Kind.KEEP or outcome.committed:
        return "completed"
    if kind is Kind.FAIL:
        failure = outcome.failure
        last = failure is not None and (failure.fatal or failure.lease.attempt >= max_attempts)
        return "dead" if last else "retried"
    if kind is Kind.RELEASE:
        return "snoozed"
    if kind is Kind.UNKNOWN:
        return "unknown_task"
    return "lease_lost"  # NOTHING (not committed): LeaseLostError


class Tracing:
    """Starts the execution spans (see the module docstring)."""

    def __init__(self) -> None:
        from opentelemetry import propagate, trace

        self._propagate = propagate
        self._trace = trace
        self._tracer = trace.get_tracer("trioq")
        self._kind = trace.SpanKind.CONSUMER
        self._error = trace.StatusCode.ERROR

    async def run(self, ctx: JobContext, call: Callable[[], Awaitable[Outcome]]) -> Outcome:
        """``await call()`` (the handler's execution) inside its span."""
        job = ctx.job
        parent = None
        if (stored := job.trace_context) is not None:
            parent = self._propagate.extract(_fields(stored))
        attributes: dict[str, Any] = {
            "messaging.system": "trioq",
            "messaging.operation.type": "process",
            "messaging.destination.name": job.queue,
            "messaging.message.id": str(job.id),
            "trioq.job.id": job.id,
            "trioq.job.task": job.task,
            "trioq.job.queue": job.queue,
            "trioq.job.attempt": job.attempt,
        }
        with self._tracer.start_as_current_span(
            f"process {job.task}", context=parent, kind=self._kind, attributes=attributes,
            record_exception=False, set_status_on_exception=False,
        ) as span:  # fmt: skip
            try:
                outcome = await call()
            except trio.Cancelled:  # aborted: lost lease, cancel request, shutdown
                span.set_attribute("trioq.job.outcome", "aborted")
                raise
            span.set_attribute("trioq.job.outcome", outcome_name(outcome, job.max_attempts))
            if (failure := outcome.failure) is not None and outcome.kind is Kind.FAIL:
                span.set_status(self._error, failure.error)
                span.add_event("exception", {
                    "exception.message": failure.error,
                    "exception.stacktrace": failure.traceback or "",
                })  # fmt: skip
            return outcome


def _fields(stored: str) -> dict[str, str]:
    """The stored carrier; a malformed one (another producer's) is no parent at all."""
    try:
        fields = json.loads(stored)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than Python decodes
        return {}
    if not isinstance(fields, dict):
        return {}
    return {str(k): str(v) for k, v in fields.items() if isinstance(v, str)}


def enabled(setting: bool | None) -> bool:
    """Whether a worker with ``Config.tracing == setting`` traces. None: when the application
    has set a tracer provider (an SDK's) by the time the worker starts. OpenTelemetry's
    default no-op spans cost about 11 us per job, a third of a no-op job: not worth paying
    for spans nobody records."""
    if setting is not None:
        return setting
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:  # never imported: no provider can have been set
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
