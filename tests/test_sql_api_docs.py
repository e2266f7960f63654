"""The examples of docs/sql-api.md print what the page says they print.

Each ```sql block followed by a ```console block is run by psql, in page order, on one
fresh migrated database (the examples build on each other: the ids they show are the ones
the earlier ones drew), and psql's output (errors included, in order; without CONTEXT lines,
as the page says) is compared line by line with the page's, trailing spaces aside."""

from __future__ import annotations

import pathlib
import re
import subprocess
from typing import Any

import psycopg
from test_sql_api import migrate, psql_binary

PAGE = pathlib.Path(__file__).parent.parent / "docs" / "sql-api.md"
_EXAMPLE = re.compile(r"```sql\n(.*?)```\n(?:(?!```).)*?```console\n(.*?)```", re.S)
EXAMPLES = _EXAMPLE.findall(PAGE.read_text())
#: The roles the page creates (dropped before and after, as roles outlive a database).
ROLES = ("shop_producer",)


def test_the_page_has_its_examples() -> None:
    assert len(EXAMPLES) == 10  # the 10th: start_by (migration 21)


def _lines(text: str) -> list[str]:
    return [re.sub(r"^psql:[^:]*:\d+: ", "", line).rstrip() for line in text.splitlines()]


def test_the_examples_print_what_the_page_says(dsn: str) -> None:
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        _drop_roles(conn)
        try:
            for script, expected in EXAMPLES:
                out = subprocess.run(
                    [psql_binary(), "-X", "-q", "-v", "SHOW_CONTEXT=never", dsn],
                    input=script, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                    timeout=60, check=False,
                )  # fmt: skip
                assert _lines(out.stdout) == _lines(expected), script
        finally:
            _drop_roles(conn)


def _drop_roles(conn: psycopg.Connection[Any]) -> None:
    for role in ROLES:
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
        if exists:
            conn.execute(psycopg.sql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(
                psycopg.sql.Identifier(role)))  # fmt: skip
