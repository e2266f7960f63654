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
    "SchemaError",
    "SchemaMissingError",
    "SchemaOutdatedError",
    "SchemaTooNewError",
    "check_schema",
    "qualified",
    "validate_schema_name",
]

#: Lower-case identifiers only: they need no quoting in psql and cannot smuggle anything.
SCHEMA_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class SchemaError(RuntimeError):
    """The database schema is not what this trioq needs."""


class SchemaMissingError(SchemaError):
    """The schema has not been created: run ``trioq migrate``."""


class SchemaOutdatedError(SchemaError):
    """The schema is older than this trioq: run ``trioq migrate``."""


class SchemaTooNewError(SchemaError):
    """The schema was migrated by a newer trioq: upgrade trioq."""


def validate_schema_name(schema: str) -> str:
    if not isinstance(schema, str) or not SCHEMA_NAME_RE.match(schema):
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


async def check_schema(conn: psycopg.AsyncConnection[Any], schema: str, expected: int) -> int:
    """Raise unless ``schema`` is at version ``expected``; return the version."""
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
    return version
