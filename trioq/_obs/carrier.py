"""The W3C trace context an enqueue stores with its job (see `trioq._worker.tracing`).

`carrier` is called by every enqueue, so it is as cheap as it can be when there is nothing
to store: when the application has not imported OpenTelemetry, no span can be current,
and the test is one dictionary lookup (``sys.modules``). trioq never imports
OpenTelemetry here.
"""

from __future__ import annotations

import json
import sys

__all__ = ["carrier"]


def carrier() -> str | None:
    """The current span's W3C trace context as JSON text (``{"traceparent": ...}``); None
    without a valid current span."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    from opentelemetry import propagate

    fields: dict[str, str] = {}
    propagate.inject(fields)
    return json.dumps(fields) if fields else None
