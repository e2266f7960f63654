"""trioq.pg: psycopg 3 driven by trio (connections, pool, notifications)."""

from ._exceptions import ConnectError as ConnectError
from ._exceptions import PoolClosedError as PoolClosedError
from ._metadata import fixup_module_metadata
from ._pg.connection import CANCEL_DRAIN_TIMEOUT as CANCEL_DRAIN_TIMEOUT
from ._pg.connection import ConnectionLock as ConnectionLock
from ._pg.connection import Notifications as Notifications
from ._pg.connection import TrioConnection as TrioConnection
from ._pg.connection import connect as connect
from ._pg.errors import redact_dsn as redact_dsn
from ._pg.pool import Pool as Pool
from ._pg.pool import PoolStatistics as PoolStatistics

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
