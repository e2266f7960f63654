"""trioq: a Postgres-backed job queue and worker runtime for trio."""

from . import pg as pg
from . import retry as retry
from ._config import Config as Config
from ._config import QueueConfig as QueueConfig
from ._context import JobContext as JobContext
from ._cron import CronEntry as CronEntry
from ._dead import DeadFilter as DeadFilter
from ._dead import DeadJob as DeadJob
from ._enqueue import enqueue as enqueue
from ._enqueue import enqueue_bulk as enqueue_bulk
from ._enqueue import enqueue_many as enqueue_many
from ._exceptions import FatalError as FatalError
from ._exceptions import LeaseLostError as LeaseLostError
from ._exceptions import Snooze as Snooze
from ._job import EnqueueResult as EnqueueResult
from ._job import Job as Job
from ._job import JobSpec as JobSpec
from ._migrate import MigrationError as MigrationError
from ._migrate import MigrationResult as MigrationResult
from ._migrate import migrate as migrate
from ._pg import TrioConnection as TrioConnection
from ._pg import connect as connect
from ._pg_errors import ConnectError as ConnectError
from ._pg_errors import InvalidDSNError as InvalidDSNError
from ._queue import CancelOutcome as CancelOutcome
from ._queue import FailResult as FailResult
from ._queue import Failure as Failure
from ._queue import HeartbeatResult as HeartbeatResult
from ._queue import Lease as Lease
from ._queue import PayloadTooLargeError as PayloadTooLargeError
from ._queue import Queue as Queue
from ._queue import SweepResult as SweepResult
from ._registry import Registry as Registry
from ._registry import Task as Task
from ._runtime import Runtime as Runtime
from ._runtime import RuntimeStatistics as RuntimeStatistics
from ._schema import DatabaseReadOnlyError as DatabaseReadOnlyError
from ._schema import SchemaError as SchemaError
from ._schema import SchemaMissingError as SchemaMissingError
from ._schema import SchemaOutdatedError as SchemaOutdatedError
from ._schema import SchemaTooNewError as SchemaTooNewError
from ._schema import check_schema as check_schema
from ._serve import serve as serve

__version__ = "0.1.0"
