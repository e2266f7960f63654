"""trioq: a Postgres-backed job queue and worker runtime for trio.

General layout (``docs/architecture.md`` draws the module map and the nursery tree; a
test checks that every module is named here and there):

- The faces: this module re-exports every public name (each shows up as ``trioq.X`` in
  reprs and tracebacks: ``_metadata``), and ``pg``, ``retry`` (and ``web``, ``testing``)
  are the public submodules; ``_exceptions`` defines every exception.
- ``trioq/`` (the API users touch, one concept a module): ``_job``, ``_rules``,
  ``_unique``, ``_retry``, ``_outcome``, ``_sanitize``, ``_registry``, ``_hooks``,
  ``_config``, ``_cron``, ``_queue``, ``_enqueue``, ``_workflow``, ``_batch``,
  ``_result``, ``_dead``, ``_flow``, ``_dependencies``, ``_durable``, ``_context``,
  ``_job_transaction``, ``_complete_with``, ``_lanes``.
- ``_pg/`` (psycopg 3 on trio): ``connection``, ``wait``, ``pipeline``, ``pool``,
  ``errors``, ``dsn``, ``embedded``, ``times``.
- ``_db/`` (trioq's tables): ``statements``, ``insert``, ``driver``, ``params``,
  ``version``, ``migrate``.
- ``_db/sql/`` (the text of every statement, by domain): ``common``, ``enqueue``,
  ``leases``, ``maintenance``, ``workers``, ``jobs``, ``status``, ``lists``, ``dead``, ``durable``,
  ``queues``, ``cron``, ``history``, ``schema``, ``workflows``.
- ``_worker/`` (the runtime): ``serve``, ``runtime``, ``wiring``, ``execute``,
  ``completer``, ``leases``, ``task_settings``, ``wakeup``, ``watchdog``, ``banner``,
  ``tracing``, ``pooling``.
- ``_worker/services/`` (one module a maintenance service): ``loop``, ``listener``,
  ``heartbeat``, ``liveness``, ``sweeper``, ``scheduler``, ``governor``,
  ``history_writer``, ``pruner``, ``stranded``, ``lifecycle``.
- ``_obs/`` (seeing what it does): ``metrics``, ``prometheus``, ``history``, ``depth``,
  ``carrier``.
- Tools built on all this, which no library module imports: ``_cli`` (the ``trioq``
  command), ``_stress`` (``trioq stress``), ``web`` (the dashboard), ``testing`` (for
  users' tests) and ``examples``.
"""

from . import pg as pg
from . import retry as retry
from ._batch import Batch as Batch
from ._batch import BatchStatus as BatchStatus
from ._batch import EnqueuedBatch as EnqueuedBatch
from ._batch import batch_status as batch_status
from ._config import Config as Config
from ._config import QueueConfig as QueueConfig
from ._context import JobContext as JobContext
from ._context import JobServices as JobServices
from ._cron import CronEntry as CronEntry
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
from ._flow import LimitedClaim as LimitedClaim
from ._flow import QueueSettings as QueueSettings
from ._flow import RateLimit as RateLimit
from ._hooks import CallNext as CallNext
from ._hooks import JobEvent as JobEvent
from ._job import EnqueueResult as EnqueueResult
from ._job import Failure as Failure
from ._job import Job as Job
from ._job import JobSpec as JobSpec
from ._job import Lease as Lease
from ._metadata import fixup_module_metadata
from ._pg.connection import TrioConnection as TrioConnection
from ._pg.connection import connect as connect
from ._queue import CancelOutcome as CancelOutcome
from ._queue import FailResult as FailResult
from ._queue import HeartbeatResult as HeartbeatResult
from ._queue import Queue as Queue
from ._queue import SweepResult as SweepResult
from ._registry import Registry as Registry
from ._registry import Task as Task
from ._result import JobStatus as JobStatus
from ._unique import Unique as Unique
from ._worker.runtime import Runtime as Runtime
from ._worker.runtime import RuntimeStatistics as RuntimeStatistics
from ._worker.serve import serve as serve
from ._workflow import Step as Step
from ._workflow import Workflow as Workflow
from ._workflow import WorkflowJobs as WorkflowJobs

__version__ = "0.1.0"

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
