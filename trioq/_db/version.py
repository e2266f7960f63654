"""The version check: is the schema in this database the one this trioq needs?

The schema name is configuration, never spliced into SQL as text: it is
validated (`trioq._db.statements.validate_schema_name`) and quoted with
``psycopg.sql.Identifier``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator

import psycopg

from .._exceptions import (
    DatabaseReadOnlyError,
    SchemaMissingError,
    SchemaOutdatedError,
    SchemaTooNewError,
)
from .._pg.conn import Conn, first_row
from .adapters import tuple_rows
from .statements import WRITABLE, statements, validate_schema_name

__all__ = ["check_schema", "check_writable", "migrated", "missing_tables", "schema_version"]


@contextlib.contextmanager
def migrated(conn: Conn, schema: str) -> Iterator[None]:
    """Say what to run when trioq's tables are missing, not 'relation does not exist'
    (the same words as `check_schema`)."""
    try:
        yield
    except psycopg.errors.UndefinedTable as ex:
        raise SchemaMissingError(
            f"schema {schema!r} in database {conn.info.dbname!r} has no trioq tables: "
            "run `trioq migrate`"
        ) from ex


async def schema_version(conn: Conn, schema: str) -> int | None:
    """The applied version of ``schema``, or None if trioq was never migrated there."""
    st = statements(schema)
    row = await first_row(conn, st.schema_exists, st.schema_exists_params())
    if not row or not row[0]:
        return None
    row = await first_row(conn, st.schema_version)
    return int(row[0]) if row else 0


async def check_schema(
    conn: Conn,
    schema: str,
    expected: int,
    *,
    writable: bool = True,
    tables: Collection[str] = (),
) -> int:
    """Raise unless ``schema`` is at version ``expected`` and has all of ``tables``;
    return the version.

    With ``writable`` (the default: the worker runtime needs it), also raise
    `DatabaseReadOnlyError` if the database refuses writes, so a worker pointed
    at a standby or a read-only database stops at start-up with a message
    instead of failing every claim.
    """
    validate_schema_name(schema)
    conn = tuple_rows(conn)  # its rows are read by position
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
    if tables and (missing := await missing_tables(conn, schema, tables)):
        raise SchemaMissingError(
            f"{where} is at version {version} but its tables {', '.join(missing)} are missing "
            "(dropped by hand?): restore them from a backup, or drop the schema "
            "with CASCADE (which deletes its jobs) and run `trioq migrate`"
        )
    if writable:
        await check_writable(conn)
    return version


async def missing_tables(
    conn: Conn, schema: str, tables: Collection[str]
) -> list[str]:
    """Those of ``tables`` that ``schema`` does not have, sorted."""
    cur = await conn.execute(
        statements(schema).missing_tables, {"tables": list(tables), "schema": schema}
    )
    return [row[0] for row in await cur.fetchall()]


async def check_writable(conn: Conn) -> None:
    """Raise `DatabaseReadOnlyError` if a new transaction on ``conn`` could not write."""
    cur = await conn.execute(WRITABLE)
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
