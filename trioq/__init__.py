"""trioq: a Postgres-backed job queue and worker runtime for trio."""

from . import pg as pg
from ._pg import TrioConnection as TrioConnection
from ._pg import connect as connect
from ._pg_errors import ConnectError as ConnectError

__version__ = "0.1.0"
