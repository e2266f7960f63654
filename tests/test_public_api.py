"""The public surface is what was meant: names re-exported, implementation private."""

from __future__ import annotations

import inspect

import psycopg

import trioq
import trioq.pg
import trioq.testing

TOP_LEVEL = {
    "CallNext",
    "JobEvent",
    "ListenError",
    "CancelOutcome",
    "Config",
    "CronEntry",
    "StoredCronEntry",
    "FatalError",
    "JobContext",
    "JobServices",
    "LeaseLostError",
    "SharedTransactionError",
    "QueueConfig",
    "Registry",
    "Runtime",
    "RuntimeStatistics",
    "Snooze",
    "Sleep",
    "DurableError",
    "StepRecord",
    "Waiting",
    "WaitTimeout",
    "signal",
    "Task",
    "ConnectError",
    "DatabaseReadOnlyError",
    "EmbeddedPostgresError",
    "InvalidDSNError",
    "JobCancelledError",
    "JobDeadError",
    "JobNotFoundError",
    "JobResultError",
    "JobStatus",
    "job_status",
    "result",
    "DeadFilter",
    "DeadJob",
    "EnqueueResult",
    "FailResult",
    "Failure",
    "HeartbeatResult",
    "Job",
    "JobSpec",
    "Lease",
    "LimitedClaim",
    "DEFAULT_AGING",
    "QueueSettings",
    "RateLimit",
    "Unique",
    "Debounce",
    "PayloadTooLargeError",
    "Queue",
    "SweepResult",
    "MigrationError",
    "MigrationResult",
    "SchemaError",
    "SchemaMissingError",
    "SchemaOutdatedError",
    "SchemaTooNewError",
    "TrioConnection",
    "check_schema",
    "connect",
    "enqueue",
    "enqueue_bulk",
    "enqueue_many",
    # group-commit enqueue (docs/producers.md)
    "CommitUnknownError",
    "GroupProducer",
    "GroupProducerStatistics",
    "open_group_producer",
    "migrate",
    "pg",
    "retry",
    "serve",
    "testing",
    # workflows (docs/workflows.md)
    "Batch",
    "BatchStatus",
    "Dependency",
    "EnqueuedBatch",
    "Step",
    "UnknownDependencyError",
    "Workflow",
    "WorkflowError",
    "WorkflowJobs",
    "batch_status",
    "dependencies",
}

PG = {
    "CANCEL_DRAIN_TIMEOUT",
    "ConnectError",
    "ConnectionLock",
    "Notifications",
    "Pool",
    "PoolClosedError",
    "PoolStatistics",
    "TrioConnection",
    "connect",
    "redact_dsn",
}


WEB = {"Dashboard", "DashboardConfig", "app"}
TESTING = {
    "DrainLimitError",
    "DrainResult",
    "Run",
    "ThrowawayPostgres",
    "advance_clock",
    "assert_enqueued",
    "call",
    "drain",
    "enqueued_jobs",
    "job_context",
    "refute_enqueued",
    "reset_clock",
    "set_clock",
}


def _public(module: object) -> set[str]:
    return {
        name
        for name in vars(module)
        if not name.startswith("_") and getattr(vars(module)[name], "__module__", "") != "typing"
    }


def test_top_level_surface() -> None:
    # trioq.web (the web extra) and trioq.producer (for code that is not trio) are not
    # imported by trioq: attributes once something has. dir() lists the names that need
    # trio before their first use (trioq.__getattr__); each is an attribute after it.
    assert {name for name in dir(trioq) if not name.startswith("_")} - {
        "annotations", "web", "producer"
    } == TOP_LEVEL
    for name in TOP_LEVEL:
        getattr(trioq, name)
    assert _public(trioq) - {"annotations", "web", "producer"} == TOP_LEVEL
    for name in TOP_LEVEL:
        obj = getattr(trioq, name)
        if isinstance(obj, type) or inspect.isfunction(obj):
            assert obj.__module__ in ("trioq", "trioq.pg"), name  # never trioq._x


def test_an_unknown_name_is_an_attribute_error() -> None:
    assert not hasattr(trioq, "no_such_name")
    assert not hasattr(trioq, "_no_such_name")


def test_the_names_imported_on_first_use_are_the_ones_listed() -> None:
    import trioq._trio_api

    defined = {name for name in vars(trioq._trio_api) if not name.startswith("_")}
    assert defined == trioq._TRIO_NAMES


def test_pg_surface() -> None:
    assert _public(trioq.pg) - {"annotations"} == PG


def test_web_surface() -> None:
    import trioq.web

    assert _public(trioq.web) - {"annotations"} == WEB
    assert trioq.web.Dashboard.__module__ == "trioq.web"


PRODUCER = {
    "Producer",
    *(f"{a}{name}" for a in ("", "a") for name in (
        "enqueue", "enqueue_many", "enqueue_bulk", "enqueue_workflow", "enqueue_batch", "signal",
    )),
}  # fmt: skip


def test_producer_surface() -> None:
    import trioq.producer

    assert _public(trioq.producer) - {"annotations"} == PRODUCER
    assert set(trioq.producer.__all__) == PRODUCER


def test_testing_surface_names_its_module_and_needs_no_pytest() -> None:
    assert _public(trioq.testing) == TESTING
    for name in TESTING:
        assert getattr(trioq.testing, name).__module__ == "trioq.testing", name
    # Importable without pytest: only the plugin module imports it.
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['pytest'] = None; import trioq.testing; "
        "assert 'trioq.testing.pytest' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_errors_subclass_the_closest_base() -> None:
    assert issubclass(trioq.SchemaError, RuntimeError)
    assert issubclass(trioq.MigrationError, trioq.SchemaError)
    assert issubclass(trioq.ConnectError, psycopg.OperationalError)
    assert issubclass(trioq.DatabaseReadOnlyError, trioq.SchemaError)
    assert issubclass(trioq.InvalidDSNError, ValueError)
    assert issubclass(trioq.InvalidDSNError, psycopg.ProgrammingError)
    assert issubclass(trioq.JobResultError, RuntimeError)
    assert issubclass(trioq.JobNotFoundError, LookupError)
