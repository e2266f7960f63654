"""The public names that need trio, imported on first use (``trioq.__getattr__``).

`trioq` imports its trio-free names eagerly, so ``import trioq.producer`` (for Django,
Flask, FastAPI, scripts) imports no trio. The first access to any name here imports them
all, as one step, and names them ``trioq.X`` (``_metadata``). Every name of this module
that does not start with ``_`` is public: ``trioq/__init__.py`` star-imports it for the
type checkers and the API reference.
"""

from . import pg as pg
from ._config import Config as Config
from ._config import QueueConfig as QueueConfig
from ._context import JobContext as JobContext
from ._context import JobServices as JobServices
from ._group_producer import GroupProducer as GroupProducer
from ._group_producer import GroupProducerStatistics as GroupProducerStatistics
from ._group_producer import open_group_producer as open_group_producer
from ._hooks import CallNext as CallNext
from ._hooks import JobEvent as JobEvent
from ._pg.connection import TrioConnection as TrioConnection
from ._pg.connection import connect as connect
from ._registry import Registry as Registry
from ._registry import Task as Task
from ._worker.runtime import Runtime as Runtime
from ._worker.runtime import RuntimeStatistics as RuntimeStatistics
from ._worker.serve import serve as serve
