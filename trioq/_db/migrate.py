"""Versioned schema migrations shipped in ``trioq/_db/migrations``.

Each migration is ``NNNN_name.sql`` with unqualified names; it runs with
``search_path`` set to the target schema (default ``trioq``). `migrate` applies
every pending migration in one transaction under an advisory lock, so two
concurrent runs are safe (the second finds nothing to do) and a failure leaves
nothing half-created. A database migrated by a newer trioq is refused.
"""

from __future__ import annotations

import functools
import importlib.resources
import logging
import re
from collections.abc import Callable

import attrs
import psycopg

from .._exceptions import MigrationError
from .._pg.conn import Conn
from .adapters import tuple_rows
from .statements import statements, validate_schema_name
from .version import check_schema, missing_tables, schema_version

logger = logging.getLogger("trioq.migrate")

__all__ = [
    "Migration",
    "MigrationResult",
    "check_current",
    "expected_tables",
    "latest_version",
    "migrate",
    "migrations",
]

_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_CREATE_TABLE = re.compile(r"^\s*CREATE TABLE (?:IF NOT EXISTS )?(\w+)", re.MULTILINE | re.I)
_DROP_TABLE = re.compile(r"^\s*DROP TABLE (?:IF EXISTS )?(\w+)", re.MULTILINE | re.I)


@attrs.frozen
class Migration:
    version: int
    name: str
    sql: str


@attrs.frozen(kw_only=True)
class MigrationResult:
    schema: str
    previous_version: int
    version: int
    applied: tuple[int, ...]


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """Every migration shipped with this trioq, in version order."""
    found: list[Migration] = []
    for entry in (importlib.resources.files("trioq._db") / "migrations").iterdir():
        match = _FILE_RE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise MigrationError(f"migration files are not numbered 1..n: {versions}")
    return tuple(found)


def latest_version() -> int:
    return len(migrations())


def expected_tables(version: int | None = None) -> tuple[str, ...]:
    """The tables a schema at ``version`` (default: the latest) has: those the migrations
    up to it create and do not drop, and the bookkeeping table."""
    goal = latest_version() if version is None else version
    tables = {"migrations"}
    for migration in migrations()[:goal]:
        tables |= set(_CREATE_TABLE.findall(migration.sql))
        tables -= set(_DROP_TABLE.findall(migration.sql))
    return tuple(sorted(tables))


async def check_current(
    conn: Conn, schema: str, *, writable: bool = True
) -> int:
    """`check_schema` for this trioq: the latest version, and every table of it."""
    return await check_schema(
        conn, schema, latest_version(), writable=writable, tables=expected_tables()
    )


async def migrate(
    conn: Conn, schema: str = "trioq", *, target: int | None = None,
    on_wait: Callable[[str], None] | None = None,
) -> MigrationResult:  # fmt: skip
    """Bring ``schema`` up to ``target`` (default: the latest) in one transaction.

    ``conn`` must not be inside a transaction. Raises `MigrationError` naming
    the problem (no permission to create the schema, a newer schema, a failing
    statement); the transaction is rolled back, so nothing is half-created. If another
    session is migrating the same schema, ``on_wait`` is called with a message that says
    whom it waits for (default: a warning on ``trioq.migrate``), then it waits.
    """
    validate_schema_name(schema)
    conn = tuple_rows(conn)  # its rows are read by position
    goal = latest_version() if target is None else target
    if not 0 <= goal <= latest_version():
        raise ValueError(f"target must be between 0 and {latest_version()}, got {target}")
    try:
        async with conn.transaction():
            current, pending = await _migrate_locked(conn, schema, goal, on_wait)
    except psycopg.errors.InsufficientPrivilege as ex:
        raise MigrationError(
            f"the role {conn.info.user!r} may not create or change schema {schema!r} in database "
            f"{conn.info.dbname!r}: {_first_line(ex)}; nothing was changed"
        ) from None
    except psycopg.errors.ReadOnlySqlTransaction as ex:
        raise MigrationError(
            f"database {conn.info.dbname!r} is read-only (a hot standby, or "
            f"default_transaction_read_only is on): {_first_line(ex)}; nothing was changed"
        ) from None
    return MigrationResult(
        schema=schema,
        previous_version=current,
        version=max(current, goal),
        applied=tuple(m.version for m in pending),
    )


async def _migrate_locked(
    conn: Conn, schema: str, goal: int,
    on_wait: Callable[[str], None] | None,
) -> tuple[int, list[Migration]]:  # fmt: skip
    """Inside the migration's transaction: take the lock, then apply what is pending; the
    version found, and what was applied."""
    await _lock(conn, schema, on_wait)
    if await schema_version(conn, schema) is None:  # no DDL when there is nothing to do
        await _create_bookkeeping(conn, schema)
    current = await _current_version(conn, schema)
    pending = [m for m in migrations() if current < m.version <= goal]
    if current and not pending:
        await _check_tables(conn, schema, current)
    for migration in pending:
        await _apply(conn, schema, migration)
    return current, pending


async def _lock(
    conn: Conn, schema: str, on_wait: Callable[[str], None] | None
) -> None:
    """One migrator per schema: take the lock, saying so first if another session holds it
    (``on_wait``, else a log line), then wait for it."""
    st = statements(schema)
    cur = await conn.execute(st.migrate_try_lock, {"schema": schema})
    row = await cur.fetchone()
    if row is not None and row[0]:
        return
    cur = await conn.execute(st.migrate_lock_holder, {"schema": schema})
    holder = await cur.fetchone()
    who = "another session"
    if holder is not None:
        pid, app, addr, seconds = holder
        who = f"session {pid}" + (f" ({app})" if app else "") + (f" from {addr}" if addr else "")
        if seconds is not None:
            who += f", in a transaction for {float(seconds):.0f} s"
    message = (f"schema {schema!r}: waiting for {who} to finish its migration (it holds the "
               "migration lock)")  # fmt: skip
    if on_wait is None:
        logger.warning("%s", message)
    else:
        on_wait(message)
    await conn.execute(st.migrate_lock, {"schema": schema})


async def _create_bookkeeping(conn: Conn, schema: str) -> None:
    st = statements(schema)
    await conn.execute(st.create_schema)
    await conn.execute(st.create_migrations)


async def _check_tables(conn: Conn, schema: str, version: int) -> None:
    missing = await missing_tables(conn, schema, expected_tables(version))
    if missing:
        raise MigrationError(
            f"schema {schema!r} is at version {version} but its tables {', '.join(missing)} "
            "are missing (dropped by hand?); nothing was changed: restore them from a "
            "backup, or drop the schema with CASCADE (which deletes its "
            "jobs) and run `trioq migrate` again"
        )


async def _current_version(conn: Conn, schema: str) -> int:
    cur = await conn.execute(statements(schema).schema_version)
    row = await cur.fetchone()
    current = int(row[0]) if row else 0
    if current > latest_version():
        raise MigrationError(
            f"schema {schema!r} is at version {current}, but this trioq knows only up to "
            f"version {latest_version()}: it was migrated by a newer trioq; upgrade trioq"
        )
    return current


async def _apply(conn: Conn, schema: str, migration: Migration) -> None:
    st = statements(schema)
    await conn.execute(st.migration_search_path)
    try:
        await conn.execute(migration.sql.encode())
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.ReadOnlySqlTransaction):
        raise
    except psycopg.Error as ex:
        raise MigrationError(
            f"migration {migration.version:04d}_{migration.name} failed: {_first_line(ex)}; "
            "nothing was changed"
        ) from None
    await conn.execute(st.record_migration, {"version": migration.version, "name": migration.name})
    await conn.execute(st.reset_search_path)


def _first_line(ex: BaseException) -> str:
    text = str(ex).strip()
    return text.splitlines()[0] if text else type(ex).__name__
