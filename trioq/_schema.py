"""The trioq schema: its validated name, qualified identifiers, and the version check.

The schema name is configuration, never spliced into SQL as text: it is
validated against `SCHEMA_NAME_RE` and quoted with ``psycopg.sql.Identifier``.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg import sql

__all__ = [
    "SCHEMA_NAME_RE",
    "DatabaseReadOnlyError",
    "SchemaError",
    "SchemaMissingError",
    "SchemaOutdatedError",
    "SchemaTooNewError",
    "check_schema",
    "check_writable",
    "qualified",
    "validate_schema_name",
]

#: Lower-case identifiers only: they need no quoting in psql and cannot smuggle anything.
#: Matched with ``fullmatch``: ``match`` would also accept a trailing newline (``$``).
SCHEMA_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


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


def validate_schema_name(schema: str) -> str:
    if not isinstance(schema, str) or not SCHEMA_NAME_RE.fullmatch(schema):
        raise ValueError(
            f"schema name {schema!r} is invalid: use 1-63 lower-case letters, digits and "
            "underscores, not starting with a digit"
        )
    return schema


def qualified(schema: str, name: str) -> sql.Identifier:
    """``"schema"."name"`` as a composable identifier."""
    return sql.Identifier(validate_schema_name(schema), name)


async def schema_version(conn: psycopg.AsyncConnection[Any], schema: str) -> int | None:
    """The applied version of ``schema``, or None if trioq was never migrated there."""
    cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.migrations",))
    row = await cur.fetchone()
    if not row or not row[0]:
        return None
    cur = await conn.execute(
        sql.SQL("SELECT coalesce(max(version), 0) FROM {}").format(qualified(schema, "migrations"))
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def check_schema(
    conn: psycopg.AsyncConnection[Any], schema: str, expected: int, *, writable: bool = True
) -> int:
    """Raise unless ``schema`` is at version ``expected``; return the version.

    With ``writable`` (the default: the worker runtime needs it), also raise
    `DatabaseReadOnlyError` if the database refuses writes, so a worker pointed
    at a standby or a read-only database stops at start-up with a message
    instead of failing every claim.
    """
    validate_schema_name(schema)
    version = await schema_version(conn, schema)
    where = f"schema {schema!r} in database {conn.info.dbname!r}"
    if version is None or version == 0:
        raise SchemaMissingError(f"{where} has no trioq tables: run `trioq migrate`")
    if version < expected:
        raise SchemaOutdatedError(
            f"{where} is at version {version}, this trioq needs {expected}: run `trioq migrate`"
        )
    if version > expected:
        raise SchemaTooNewError(
            f"{where} is at version {version}, newer than this trioq knows ({expected}): "
            "upgrade trioq"
        )
    if writable:
        await check_writable(conn)
    return version


async def check_writable(conn: psycopg.AsyncConnection[Any]) -> None:
    """Raise `DatabaseReadOnlyError` if a new transaction on ``conn`` could not write."""
    cur = await conn.execute(
        "SELECT pg_is_in_recovery(), current_setting('transaction_read_only')::bool"
    )
    row = await cur.fetchone()
    standby, read_only = (bool(row[0]), bool(row[1])) if row else (False, False)
    if not (standby or read_only):
        return
    why = (
        "it is a hot standby (pg_is_in_recovery() is true): connect to the primary"
        if standby
        else "transaction_read_only is on (default_transaction_read_only is set for this "
        "database, role or session): turn it off"
    )
    raise DatabaseReadOnlyError(
        f"database {conn.info.dbname!r} is read-only, and trioq workers must write "
        f"(claims, leases, outcomes): {why}"
    )
