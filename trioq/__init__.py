"""trioq: a Postgres-backed job queue and worker runtime for trio.

General layout (``docs/architecture.md`` draws the module map and the nursery tree; a
test checks that every module is named here and there):

- The faces: this module re-exports every public name (each shows up as ``trioq.X`` in
  reprs and tracebacks: ``_metadata``), and ``pg``, ``retry`` (and ``producer``, ``web``,
  ``testing``) are the public submodules; ``_exceptions`` defines every exception. The
  names that need trio come from ``_trio_api`` on first use, so ``import trioq.producer``
  imports no trio.
- ``trioq/`` (the API users touch, one concept a module): ``_job``, ``_rules``,
  ``_unique``, ``_retry``, ``_outcome``, ``_sanitize``, ``_registry``, ``_hooks``,
  ``_config``, ``_cron``, ``_cron_store``, ``_queue``, ``_enqueue``, ``_workflow``, ``_batch``,
  ``_result``, ``_dead``, ``_flow``, ``_dependencies``, ``_durable``, ``_producer``,
  ``_group_producer``, ``_context``, ``_job_transaction``, ``_complete_with``, ``_lanes``,
  ``_progress``.
- ``_pg/`` (psycopg 3 on trio): ``conn``, ``connection``, ``wait``, ``pipeline``, ``lean``,
  ``pool``, ``errors``, ``dsn``, ``embedded``, ``times``.
- ``_db/`` (trioq's tables): ``adapters``, ``statements``, ``insert``, ``driver``, ``params``,
  ``version``, ``migrate``.
- ``_db/sql/`` (the text of every statement, by domain): ``common``, ``enqueue``,
  ``leases``, ``maintenance``, ``workers``, ``jobs``, ``status``, ``lists``, ``dead``, ``durable``,
  ``queues``, ``cron``, ``history``, ``schema``, ``workflows``.
- ``_worker/`` (the runtime): ``serve``, ``runtime``, ``wiring``, ``execute``,
  ``completer``, ``leases``, ``task_settings``, ``wakeup``, ``watchdog``, ``banner``,
  ``tracing``, ``pooling``.
- ``_worker/services/`` (one module a maintenance service): ``loop``, ``listener``,
  ``heartbeat``, ``liveness``, ``sweeper``, ``scheduler``, ``governor``, ``aging``,
  ``history_writer``, ``pruner``, ``stranded``, ``vacuumer``, ``lifecycle``, ``progress``.
- ``_obs/`` (seeing what it does): ``metrics``, ``prometheus``, ``history``, ``depth``,
  ``carrier``.
- Tools built on all this, which no library module imports: ``_cli`` (the ``trioq``
  command), ``_stress`` (``trioq stress``), ``web`` (the dashboard), ``testing`` (for
  users' tests) and ``examples``.
"""

import typing as _typing

from . import retry as retry
from ._batch import Batch as Batch
from ._batch import BatchStatus as BatchStatus
from ._batch import EnqueuedBatch as EnqueuedBatch
from ._batch import batch_status as batch_status
from ._cron import CronEntry as CronEntry
from ._cron_store import StoredCronEntry as StoredCronEntry
from ._db.migrate import MigrationResult as MigrationResult
from ._db.migrate import migrate as migrate
from ._db.version import check_schema as check_schema
from ._dead import DeadFilter as DeadFilter
from ._dead import DeadJob as DeadJob
from ._dependencies import Dependency as Dependency
from ._durable import StepRecord as StepRecord
from ._enqueue import dependencies as dependencies
from ._enqueue import enqueue as enqueue
from ._enqueue import enqueue_bulk as enqueue_bulk
from ._enqueue import enqueue_many as enqueue_many
from ._enqueue import job_status as job_status
from ._enqueue import result as result
from ._enqueue import signal as signal
from ._exceptions import CommitUnknownError as CommitUnknownError
from ._exceptions import ConnectError as ConnectError
from ._exceptions import DatabaseReadOnlyError as DatabaseReadOnlyError
from ._exceptions import DurableError as DurableError
from ._exceptions import EmbeddedPostgresError as EmbeddedPostgresError
from ._exceptions import FatalError as FatalError
from ._exceptions import InvalidDSNError as InvalidDSNError
from ._exceptions import JobCancelledError as JobCancelledError
from ._exceptions import JobDeadError as JobDeadError
from ._exceptions import JobNotFoundError as JobNotFoundError
from ._exceptions import JobResultError as JobResultError
from ._exceptions import LeaseLostError as LeaseLostError
from ._exceptions import ListenError as ListenError
from ._exceptions import MigrationError as MigrationError
from ._exceptions import PayloadTooLargeError as PayloadTooLargeError
from ._exceptions import SchemaError as SchemaError
from ._exceptions import SchemaMissingError as SchemaMissingError
from ._exceptions import SchemaOutdatedError as SchemaOutdatedError
from ._exceptions import SchemaTooNewError as SchemaTooNewError
from ._exceptions import SharedTransactionError as SharedTransactionError
from ._exceptions import Sleep as Sleep
from ._exceptions import Snooze as Snooze
from ._exceptions import UnknownDependencyError as UnknownDependencyError
from ._exceptions import Waiting as Waiting
from ._exceptions import WaitTimeout as WaitTimeout
from ._exceptions import WorkflowError as WorkflowError
from ._flow import DEFAULT_AGING as DEFAULT_AGING
from ._flow import LimitedClaim as LimitedClaim
from ._flow import QueueSettings as QueueSettings
from ._flow import RateLimit as RateLimit
from ._job import EnqueueResult as EnqueueResult
from ._job import Failure as Failure
from ._job import Job as Job
from ._job import JobSpec as JobSpec
from ._job import Lease as Lease
from ._metadata import fixup_module_metadata as _fixup
from ._queue import CancelOutcome as CancelOutcome
from ._queue import FailResult as FailResult
from ._queue import HeartbeatResult as HeartbeatResult
from ._queue import Queue as Queue
from ._queue import SweepResult as SweepResult
from ._result import JobStatus as JobStatus
from ._unique import Debounce as Debounce
from ._unique import Unique as Unique
from ._workflow import Step as Step
from ._workflow import Workflow as Workflow
from ._workflow import WorkflowJobs as WorkflowJobs

__version__ = "0.1.0"

_fixup(__name__, globals())

if _typing.TYPE_CHECKING:
    # The names that need trio: `_trio_api` imports them, and `__getattr__` on first use.
    from ._trio_api import *  # noqa: F403


# The names `_trio_api` defines (tests/test_public_api.py checks that they are the same), so
# that a name that is not one of them (``from trioq import producer`` asks for
# ``trioq.producer`` before it imports the submodule) imports no trio.
_TRIO_NAMES = frozenset({
    "CallNext",
    "Config",
    "GroupProducer",
    "GroupProducerStatistics",
    "JobContext",
    "JobEvent",
    "JobServices",
    "QueueConfig",
    "Registry",
    "Runtime",
    "RuntimeStatistics",
    "Task",
    "TrioConnection",
    "connect",
    "open_group_producer",
    "pg",
    "serve",
})  # fmt: skip


def __getattr__(name: str) -> _typing.Any:
    """Import the names that need trio (`_trio_api`) on the first access to any of them,
    so ``import trioq.producer`` imports no trio; then they are plain attributes."""
    if name not in _TRIO_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import _trio_api

    names = {key: value for key, value in vars(_trio_api).items() if not key.startswith("_")}
    if name not in names:
        # Asked while `_trio_api` itself imports: its ``from . import pg`` asks for
        # ``trioq.pg`` before it imports the submodule (which then becomes the attribute).
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _fixup(__name__, names)
    globals().update(names)
    return names[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | _TRIO_NAMES)
