"""Working through a transaction-mode pooler (PgBouncer): which connection does what.

In transaction pooling, a client's statements run on whichever server connection is free
when its transaction starts, so nothing may outlive a transaction: LISTEN (notifications
reach a server connection nobody is linked to, and the LISTEN leaks to the next client),
session advisory locks (the liveness lock stays held by a pooled server connection after
the worker dies), and psycopg's named prepared statements (``_pg3_0`` exists on one
server connection only, and two clients' ``_pg3_0`` collide on a shared one). So:

* the pools (claims, outcomes, heartbeats, maintenance, handlers' connections and
  enqueues) use ``Config.dsn``, which may be the pooler;
* the listener, the liveness connection and ``serve --migrate`` use the session DSN
  (`session_dsn`): ``Config.session_dsn``, ``$TRIOQ_SESSION_DSN``, else ``dsn``;
* the pools prepare no statement (`prepare_threshold` None) when told to, or when a
  session DSN other than ``dsn`` says ``dsn`` is a pooler.

See docs/pooling.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .._config import Config
from .._pg.dsn import DSN_ENV_VARS
from .._pg.errors import check_dsn

__all__ = [
    "OWN_PREPARE_THRESHOLD", "PSYCOPG_PREPARE_THRESHOLD", "SESSION_DSN_VAR", "prepare_threshold",
    "session_dsn",
]  # fmt: skip

#: The environment variable of the session DSN (like ``TRIOQ_DSN`` for ``dsn``).
SESSION_DSN_VAR = "TRIOQ_SESSION_DSN"
#: psycopg's default: a statement is prepared on the server at its 5th run.
PSYCOPG_PREPARE_THRESHOLD = 5
#: The worker's own connections (its pool, its liveness connection) run nothing but trioq's
#: statements, each of a fixed text: prepared at their first run, so that with
#: ``plan_cache_mode = force_generic_plan`` each is planned once per connection. At psycopg's
#: default an idle fleet's chores, each run by a process every few seconds or minutes and
#: spread over its pool's connections, rarely reached a 5th run on one connection and were
#: parsed and planned every time: 8.5 % of a core of Postgres for 200 idle workers, the
#: dead-worker check 3.4 ms a plan (docs/benchmarks.md, round 9).
OWN_PREPARE_THRESHOLD = 0


def session_dsn(config: Config, dsn: str, environ: Mapping[str, str] | None = None) -> str:
    """The DSN for session-level work: ``Config.session_dsn``, ``$TRIOQ_SESSION_DSN``, else
    ``dsn`` (the embedded server's, too, when no DSN is configured at all)."""
    if config.session_dsn:
        return config.session_dsn
    env = os.environ if environ is None else environ
    configured = config.dsn is not None or any(env.get(name) for name in DSN_ENV_VARS)
    if configured and env.get(SESSION_DSN_VAR):
        return check_dsn(env[SESSION_DSN_VAR], what=f"${SESSION_DSN_VAR}")
    return dsn


def prepare_threshold(config: Config, dsn: str, session: str) -> int | None:
    """psycopg's ``prepare_threshold`` for the pooled connections: None prepares nothing."""
    prepared = config.prepared_statements
    if prepared is None:
        prepared = session == dsn
    return PSYCOPG_PREPARE_THRESHOLD if prepared else None
