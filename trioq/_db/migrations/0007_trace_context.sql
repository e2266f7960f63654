-- trioq schema: the W3C trace context of the span that enqueued a job (OpenTelemetry).
-- Runs with search_path set to the target schema; names here are unqualified.
-- It adds one nullable column and nothing else: a NULL costs no space in a row, and only
-- an enqueue made while an OpenTelemetry span is current fills it
-- ({"traceparent": "00-<trace id>-<span id>-<flags>", "tracestate": ...}). A worker reads
-- it back with the claim and makes its execution span a child of that span
-- (docs/observability.md#traces).
ALTER TABLE jobs ADD COLUMN trace_context jsonb;
