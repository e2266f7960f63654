"""Schema migrations against a real Postgres."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import trio
from psycopg import sql
from psycopg.conninfo import make_conninfo

import trioq
from trioq import (
    MigrationError,
    SchemaMissingError,
    SchemaOutdatedError,
    SchemaTooNewError,
    check_schema,
    migrate,
)
from trioq._db.migrate import latest_version, migrations
from trioq._db.statements import validate_schema_name

CATALOG_SNAPSHOT = """
SELECT 'column', c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || ' ' || a.attnotnull::text || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
       || ' ' || a.attidentity::text
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE n.nspname = %(s)s AND a.attnum > 0 AND NOT a.attisdropped AND c.relkind = 'r'
UNION ALL
SELECT 'index', replace(pg_get_indexdef(i.indexrelid), %(q)s, 'S.')
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %(s)s
UNION ALL
SELECT 'constraint', c.conname || ' ' || pg_get_constraintdef(c.oid)
  FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = %(s)s
ORDER BY 1, 2
"""


async def _snapshot(conn: Any, schema: str) -> list[tuple[str, str]]:
    cur = await conn.execute(CATALOG_SNAPSHOT, {"s": schema, "q": f"{schema}."})
    return [tuple(r) for r in await cur.fetchall()]


async def test_migrate_fresh_then_idempotent(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        first = await migrate(conn)
        assert first.previous_version == 0
        assert first.applied == tuple(range(1, latest_version() + 1))
        second = await migrate(conn)
        assert second.applied == ()
        assert second.version == latest_version()
        assert await check_schema(conn, "trioq", latest_version()) == latest_version()
        cur = await conn.execute("SELECT to_regclass('trioq.jobs') IS NOT NULL")
        assert await cur.fetchone() == (True,)


async def test_fresh_install_equals_every_upgrade_path(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await migrate(conn, "fresh")
        expected = await _snapshot(conn, "fresh")
        assert expected
        for start in range(latest_version() + 1):
            schema = f"path_{start}"
            await migrate(conn, schema, target=start)
            for step in range(start + 1, latest_version() + 1):
                await migrate(conn, schema, target=step)
            assert await _snapshot(conn, schema) == expected, f"upgrade from {start}"


async def test_concurrent_migrations_are_safe(dsn: str) -> None:
    results = []

    async def run() -> None:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            results.append(await migrate(conn))

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(run)
    applied = sorted(len(r.applied) for r in results)
    assert applied == [0, 0, 0, latest_version()]


async def test_newer_schema_is_refused(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await migrate(conn)
        await conn.execute(
            "INSERT INTO trioq.migrations (version, name) VALUES (%s, 'future')",
            (latest_version() + 1,),
        )
        with pytest.raises(MigrationError, match="newer trioq"):
            await migrate(conn)
        with pytest.raises(SchemaTooNewError, match="upgrade trioq"):
            await check_schema(conn, "trioq", latest_version())


async def test_missing_and_outdated_schema_are_named(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        with pytest.raises(SchemaMissingError, match="trioq migrate"):
            await check_schema(conn, "trioq", latest_version())
        await migrate(conn, target=0)
        with pytest.raises(SchemaMissingError):
            await check_schema(conn, "trioq", latest_version())
        if latest_version() > 1:
            await migrate(conn, target=1)
            with pytest.raises(SchemaOutdatedError, match="trioq migrate"):
                await check_schema(conn, "trioq", latest_version())


async def test_role_without_create_privilege_gets_clear_error(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as admin:
        db = admin.info.dbname
        await admin.execute("DROP ROLE IF EXISTS trioq_limited")
        await admin.execute("CREATE ROLE trioq_limited LOGIN")
        await admin.execute(
            sql.SQL("REVOKE CREATE ON DATABASE {} FROM PUBLIC").format(sql.Identifier(db))
        )
        try:
            limited_dsn = make_conninfo(dsn, user="trioq_limited")
            async with await trioq.connect(limited_dsn, autocommit=True) as conn:
                with pytest.raises(MigrationError, match=r"trioq_limited.*nothing was changed"):
                    await migrate(conn)
            cur = await admin.execute("SELECT to_regnamespace('trioq') IS NULL")
            assert await cur.fetchone() == (True,)
        finally:
            await admin.execute("DROP ROLE trioq_limited")


@pytest.mark.parametrize(
    "name", ["", "Trioq", "1abc", "a-b", 'x"; DROP TABLE jobs; --', "a" * 64, "tri oq"]
)
def test_bad_schema_names_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="schema name"):
        validate_schema_name(name)


def test_shipped_migrations_are_numbered() -> None:
    assert [m.version for m in migrations()] == list(range(1, latest_version() + 1))
    assert all(m.sql.strip() for m in migrations())


def test_psycopg_error_base() -> None:
    assert issubclass(MigrationError, RuntimeError)
    assert not issubclass(MigrationError, psycopg.Error)
