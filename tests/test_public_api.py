"""The public surface is what was meant: names re-exported, implementation private."""

from __future__ import annotations

import psycopg

import trioq
import trioq.pg

TOP_LEVEL = {
    "CancelOutcome",
    "Config",
    "CronEntry",
    "FatalError",
    "JobContext",
    "JobServices",
    "LeaseLostError",
    "QueueConfig",
    "Registry",
    "Runtime",
    "RuntimeStatistics",
    "Snooze",
    "Task",
    "ConnectError",
    "DatabaseReadOnlyError",
    "EmbeddedPostgresError",
    "InvalidDSNError",
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
    "QueueSettings",
    "RateLimit",
    "Unique",
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
    "migrate",
    "pg",
    "retry",
    "serve",
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


def _public(module: object) -> set[str]:
    return {
        name
        for name in vars(module)
        if not name.startswith("_") and getattr(vars(module)[name], "__module__", "") != "typing"
    }


def test_top_level_surface() -> None:
    assert _public(trioq) - {"annotations"} == TOP_LEVEL


def test_pg_surface() -> None:
    assert _public(trioq.pg) - {"annotations"} == PG


def test_errors_subclass_the_closest_base() -> None:
    assert issubclass(trioq.SchemaError, RuntimeError)
    assert issubclass(trioq.MigrationError, trioq.SchemaError)
    assert issubclass(trioq.ConnectError, psycopg.OperationalError)
    assert issubclass(trioq.DatabaseReadOnlyError, trioq.SchemaError)
    assert issubclass(trioq.InvalidDSNError, ValueError)
    assert issubclass(trioq.InvalidDSNError, psycopg.ProgrammingError)
