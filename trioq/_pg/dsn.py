"""Which database to use: ``--dsn``, then ``TRIOQ_DSN``, then ``DATABASE_URL``, else embedded."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from .embedded import EmbeddedPostgres
from .errors import check_dsn

__all__ = ["DSN_ENV_VARS", "configured_dsn", "database"]

DSN_ENV_VARS = ("TRIOQ_DSN", "DATABASE_URL")


def configured_dsn(cli_dsn: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The DSN the user asked for, or None when the embedded default applies.

    A DSN that libpq cannot parse raises `InvalidDSNError` (a ``ValueError``)
    naming where it came from, never quoting it (it may hold a password).
    """
    if cli_dsn:
        return check_dsn(cli_dsn)
    env = os.environ if environ is None else environ
    for name in DSN_ENV_VARS:
        if env.get(name):
            return check_dsn(env[name], what=f"${name}")
    return None


@contextmanager
def database(cli_dsn: str | None) -> Iterator[str]:
    """Yield a DSN; with none configured, run the embedded Postgres for the block.

    A server already running in the embedded data directory (``trioq db start``)
    is reused and left running. Call from the main thread, before ``trio.run``.
    """
    dsn = configured_dsn(cli_dsn)
    if dsn is not None:
        yield dsn
        return
    with EmbeddedPostgres.from_env().running() as status:
        yield status.dsn
