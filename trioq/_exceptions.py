"""Every exception trioq defines, in one place.

Each subclasses the closest builtin (or psycopg's own class, where code already catches
that), so ``except ValueError`` or ``except psycopg.OperationalError`` keeps working::

    Exception
     ├── FatalError                 a handler raises it: no retry, the job goes to dead_jobs
     │    └── DurableError          a durable job's replay does not match its records (or a
     │                              step name twice, a result that cannot be recorded)
     ├── Snooze                     job.snooze(): run again later, the attempt refunded
     │    └── Sleep                 job.sleep(): the run ends, the job is due at its wake-up
     ├── Waiting                    job.wait_for(): the run ends, the job parked for its signal
     ├── TimeoutError
     │    └── WaitTimeout           job.wait_for(): no signal came before the timeout
     ├── ValueError
     │    ├── PayloadTooLargeError  a job's JSON args are over Queue.max_payload_bytes
     │    ├── WorkflowError         a workflow or batch that cannot be enqueued: a cycle, an
     │    │                         unknown step, a duplicate name or edge (nothing enqueued)
     │    └── UnknownDependencyError  after= names a job that does not exist (also a
     │                              LookupError; nothing enqueued)
     ├── OSError
     │    └── ListenError           the metrics server cannot listen on its address
     ├── RuntimeError
     │    ├── LeaseLostError        the job's lease was reclaimed: its outcome is not ours
     │    ├── SharedTransactionError  job.transaction(shared=True): the shared transaction
     │    │                           did not commit (another job's lease was lost, or the
     │    │                           commit failed): this job's writes rolled back, it runs again
     │    ├── PoolClosedError       a connection was asked of a closed pool
     │    ├── EmbeddedPostgresError the embedded server could not be set up, started or stopped
     │    ├── DrainLimitError       trioq.testing.drain ran max_jobs and jobs were still due
     │    ├── JobResultError        trioq.result: the job ended without a result (.status says how)
     │    │    ├── JobDeadError          it died: its reason, last error and traceback
     │    │    ├── JobCancelledError     it was cancelled
     │    │    └── JobNotFoundError      no such job (also a LookupError)
     │    └── SchemaError           the database schema is not what this trioq needs
     │         ├── SchemaMissingError      never migrated: run `trioq migrate`
     │         ├── SchemaOutdatedError     older than this trioq: run `trioq migrate`
     │         ├── SchemaTooNewError       migrated by a newer trioq: upgrade trioq
     │         ├── DatabaseReadOnlyError   a standby, or default_transaction_read_only
     │         └── MigrationError          a migration failed; nothing was changed
     └── psycopg.Error
          ├── psycopg.OperationalError
          │    ├── ConnectError      no connection could be made (the password never shown)
          │    └── CommitUnknownError  a group producer's COMMIT got no answer: the job may
          │                          or may not be enqueued (a dedup key makes a retry safe)
          └── psycopg.ProgrammingError
               └── InvalidDSNError   an unparseable DSN (also a ValueError; never echoed)

Bad arguments raise the builtins themselves, one type per rule wherever the rule is
checked (``trioq._job``): a value of the wrong type is a ``TypeError``, a value of the
right type out of its range or form a ``ValueError``, and the message names the field.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg

__all__ = [
    "CommitUnknownError",
    "ConnectError",
    "DatabaseReadOnlyError",
    "DrainLimitError",
    "DurableError",
    "EmbeddedPostgresError",
    "FatalError",
    "InvalidDSNError",
    "JobCancelledError",
    "JobDeadError",
    "JobNotFoundError",
    "JobResultError",
    "LeaseLostError",
    "ListenError",
    "MigrationError",
    "PayloadTooLargeError",
    "PoolClosedError",
    "SchemaError",
    "SchemaMissingError",
    "SchemaOutdatedError",
    "SchemaTooNewError",
    "SharedTransactionError",
    "Sleep",
    "Snooze",
    "UnknownDependencyError",
    "WaitTimeout",
    "Waiting",
    "WorkflowError",
    "leaves",
]

# -- raised by handlers, to steer their job ------------------------------------------------------


class FatalError(Exception):
    """Raise from a handler to fail the job at once, skipping its remaining attempts."""


class Snooze(Exception):
    """Raised by ``JobContext.snooze``: put the job back for later, refunding the attempt."""

    def __init__(self, delay: dt.timedelta) -> None:
        super().__init__(f"snoozed for {delay}")
        self.delay = delay


class DurableError(FatalError):
    """A durable job cannot go on as its records say (``docs/durable.md``): a replay that
    calls another step at a recorded position, a step name used twice in one run, a step
    result that is not JSON or is too large. Fatal: the job is dead-lettered with this
    reason rather than run wrong."""


class Sleep(Snooze):
    """Raised by ``JobContext.sleep``: this run ends (the slot and the lease freed) and the
    job is due again at ``until``; its recorded steps replay then. Do not catch it."""

    def __init__(self, until: dt.datetime, delay: dt.timedelta) -> None:
        Exception.__init__(self, f"sleeping until {until.isoformat()}")
        self.delay = delay
        self.until = until


class Waiting(Exception):
    """Raised by ``JobContext.wait_for`` when no signal has come: the job was given back
    (its slot and lease freed, the attempt refunded) in the statement that looked, and is
    woken by the signal or its timeout. This run ends; do not catch it."""


class WaitTimeout(TimeoutError):
    """``JobContext.wait_for``: the timeout passed before a signal of that name came."""

    def __init__(self, message: str, *, name: str) -> None:
        super().__init__(message)
        self.name = name


# -- raised by trioq -----------------------------------------------------------------------------


class PayloadTooLargeError(ValueError):
    """A job's JSON args exceed the queue's ``max_payload_bytes``."""


class WorkflowError(ValueError):
    """A workflow or batch that cannot be enqueued (a cycle, a step that does not exist, a
    name or an edge given twice, one too many); the message names it. Nothing is enqueued."""


class UnknownDependencyError(ValueError, LookupError):
    """``after`` names a job that does not exist: never enqueued, completed without
    ``keep_result=True`` (its row is deleted), or pruned. ``job_ids`` lists them. Nothing is
    enqueued."""

    def __init__(self, message: str, *, job_ids: tuple[int, ...]) -> None:
        super().__init__(message)
        self.job_ids = job_ids


class ListenError(OSError):
    """A server of the worker (``Config.metrics``) cannot listen on its address (in use, not
    this machine's, not allowed); ``errno`` is the socket's."""


class LeaseLostError(RuntimeError):
    """The job's lease is no longer ours (expired and reclaimed); nothing was written."""


class SharedTransactionError(RuntimeError):
    """The shared transaction that held this job's writes (``job.transaction(shared=True)``)
    rolled back, through no fault of this job: its writes are gone, and the job is retried."""


class CommitUnknownError(psycopg.OperationalError):
    """The connection broke while `trioq.GroupProducer` committed this job's batch: the
    server may have committed it or not, and nobody can say which. With a ``dedup_key``,
    enqueueing again is safe (a twin that committed is found); without one, it may make a
    second job."""


class PoolClosedError(RuntimeError):
    """The pool was closed."""


class EmbeddedPostgresError(RuntimeError):
    """The embedded Postgres server could not be found, initialized, started or stopped."""


class DrainLimitError(RuntimeError):
    """``trioq.testing.drain`` ran ``max_jobs`` jobs and jobs were still due (a job that
    snoozes or enqueues itself forever, or a bound set too low)."""


class JobResultError(RuntimeError):
    """``trioq.result``: the job ended without a result. ``status`` (a `trioq.JobStatus`, or
    None when there is no such job) says how."""

    def __init__(self, message: str, *, job_id: int, status: Any = None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.status = status


class JobDeadError(JobResultError):
    """The job is dead: ``status.reason``, ``status.last_error`` and ``status.traceback``."""


class JobCancelledError(JobResultError):
    """The job was cancelled (``status.last_error`` holds an earlier attempt's error, if any)."""


class JobNotFoundError(JobResultError, LookupError):
    """No such job: never enqueued, completed without ``keep_result=True`` (its row is
    deleted), or deleted by retention."""


class SchemaError(RuntimeError):
    """The database schema is not what this trioq needs."""


class SchemaMissingError(SchemaError):
    """The schema has not been created: run ``trioq migrate``."""


class SchemaOutdatedError(SchemaError):
    """The schema is older than this trioq: run ``trioq migrate``."""


class SchemaTooNewError(SchemaError):
    """The schema was migrated by a newer trioq: upgrade trioq."""


class DatabaseReadOnlyError(SchemaError):
    """The database refuses writes (a hot standby, or ``default_transaction_read_only``)."""


class MigrationError(SchemaError):
    """A migration could not be applied; nothing was changed."""


class ConnectError(psycopg.OperationalError):
    """No connection could be made; the message names the target, never the password."""


class InvalidDSNError(psycopg.ProgrammingError, ValueError):
    """The DSN cannot be parsed; the message says why without quoting the DSN.

    A ``ValueError`` (a bad argument) and, like psycopg's own parse error, a
    ``psycopg.ProgrammingError``, so code catching either keeps working.
    """


def leaves(ex: BaseException) -> list[BaseException]:
    """``ex`` with every (nested) exception group flattened: its plain exceptions, in order.

    trio's nurseries wrap the errors of their tasks in groups; callers that decide what an
    error means look at these.
    """
    if isinstance(ex, BaseExceptionGroup):
        return [leaf for inner in ex.exceptions for leaf in leaves(inner)]
    return [ex]
