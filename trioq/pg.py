"""trioq.pg: psycopg 3 driven by trio (connections, pool, notifications)."""

from ._exceptions import ConnectError as ConnectError
from ._exceptions import PoolClosedError as PoolClosedError
from ._metadata import fixup_module_metadata
from ._pg import CANCEL_DRAIN_TIMEOUT as CANCEL_DRAIN_TIMEOUT
from ._pg import ConnectionLock as ConnectionLock
from ._pg import Notifications as Notifications
from ._pg import TrioConnection as TrioConnection
from ._pg import connect as connect
from ._pg_errors import redact_dsn as redact_dsn
from ._pool import Pool as Pool
from ._pool import PoolStatistics as PoolStatistics

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
