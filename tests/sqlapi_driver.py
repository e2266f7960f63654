"""The SQL API (docs/sql-api.md) from a plain driver: sync psycopg, and nothing of trioq.

This is how a service in another language produces jobs: it calls ``trioq.enqueue(...)`` and
``trioq.signal(...)`` with named parameters, values as parameters, and reads refusals from
the error's SQLSTATE, message and COLUMN field. `tests/test_sql_api.py` runs this file as a
script (``python tests/sqlapi_driver.py DSN``), which checks at its end that trioq was never
imported; the parity tests (`tests/test_sql_api_parity.py`) send their values through
`call`.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Mapping
from typing import Any

import attrs
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

#: The parameters of ``trioq.enqueue`` and ``trioq.signal``, in their order.
ENQUEUE_PARAMETERS = ("task", "args", "queue", "priority", "run_at", "delay", "max_attempts",
                      "dedup_key", "concurrency_key", "notify", "start_by", "debounce",
                      "debounce_max_wait", "sequence_key")  # fmt: skip
SIGNAL_PARAMETERS = ("job_id", "name", "payload", "task", "key")
#: The parameters that are JSON (sent as jsonb).
_JSON = frozenset({"args", "payload"})


@attrs.frozen
class Refusal:
    """What a refused call raised: its SQLSTATE, the parameter it names (COLUMN), and its
    message."""

    sqlstate: str | None
    column: str | None
    message: str


def call(
    conn: psycopg.Connection[Any],
    function: str,
    values: Mapping[str, Any],
    literals: Mapping[str, str] | None = None,
    *,
    schema: str = "trioq",
) -> Any:
    """``SELECT <schema>.<function>(name => value, ...)``: each of ``values`` as a parameter
    (JSON ones as jsonb), each of ``literals`` as the SQL text given (for what a driver
    cannot send: a numeric 1.5, JSON built by SQL). Returns the function's result."""
    literals = literals or {}
    order = ENQUEUE_PARAMETERS if function == "enqueue" else SIGNAL_PARAMETERS
    given = [name for name in order if name in values or name in literals]
    arguments = sql.SQL(", ").join(
        sql.SQL("{} => {}").format(
            sql.Identifier(name),
            sql.SQL(literals[name]) if name in literals else sql.Placeholder(name),
        )
        for name in given
    )
    params = {n: Jsonb(v) if n in _JSON else v for n, v in values.items() if n not in literals}
    query = sql.SQL("SELECT {}({})").format(sql.Identifier(schema, function), arguments)
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def refusal(
    conn: psycopg.Connection[Any],
    function: str,
    values: Mapping[str, Any],
    literals: Mapping[str, str] | None = None,
    *,
    schema: str = "trioq",
) -> Refusal | None:
    """`call` in a transaction that is rolled back: what it raised (from the server; a
    driver's own refusal propagates), or None if it was accepted."""
    try:
        with conn.transaction(force_rollback=True):
            call(conn, function, values, literals, schema=schema)
    except psycopg.Error as ex:
        if ex.diag.sqlstate is None:
            raise  # the driver's own refusal (NUL in a text), not the server's
        assert ex.diag.message_primary is not None
        return Refusal(ex.diag.sqlstate, ex.diag.column_name, ex.diag.message_primary)
    return None


def scenario(dsn: str) -> dict[str, Any]:
    """What a producer service does, end to end; what it saw, as JSON."""
    seen: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        seen["api_version"] = conn.execute("SELECT trioq.api_version()").fetchone()
        first = call(conn, "enqueue", {"task": "send_welcome", "args": {"user_id": 42},
                                       "queue": "email", "dedup_key": "welcome-42"})  # fmt: skip
        twin = call(conn, "enqueue", {"task": "send_welcome", "args": {"user_id": 42},
                                      "queue": "email", "dedup_key": "welcome-42"})  # fmt: skip
        later = call(conn, "enqueue", {"task": "remind", "delay": dt.timedelta(hours=1),
                                       "priority": -5, "max_attempts": 3})  # fmt: skip
        seen["ids"] = [first, twin, later]
        rows = conn.execute(
            "SELECT id, queue, task, args, state, priority, max_attempts, max_attempts_unset,"
            " dedup_key FROM trioq.jobs ORDER BY id"
        ).fetchall()
        seen["rows"] = [list(row) for row in rows]
        bad = refusal(conn, "enqueue", {"task": "send welcome"})
        seen["refusal"] = attrs.asdict(bad) if bad else None
        seen["signal"] = [
            call(conn, "signal", {"job_id": first, "name": "approval", "payload": {"ok": True}}),
            call(conn, "signal", {"job_id": None, "name": "approval", "task": "send_welcome",
                                  "key": "welcome-42"}),
        ]
    return seen


if __name__ == "__main__":
    print(json.dumps(scenario(sys.argv[1])))
    assert not [name for name in sys.modules if name.split(".")[0] == "trioq"], "imported trioq"
