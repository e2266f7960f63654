"""Errors of the Postgres layer, and describing a connection target safely."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

__all__ = ["ConnectError", "describe_target", "redact_dsn"]


class ConnectError(psycopg.OperationalError):
    """No connection could be made; the message names the target, never the password."""


def describe_target(params: Mapping[str, Any]) -> str:
    """``user@host:port/dbname`` for messages: no password, no other secrets."""
    user = params.get("user") or "<default user>"
    host = params.get("host") or params.get("hostaddr") or "<default socket>"
    port = params.get("port") or "5432"
    dbname = params.get("dbname") or user
    return f"postgresql://{user}@{host}:{port}/{dbname}"


def redact_dsn(dsn: str) -> str:
    """A DSN safe to print: the target as `describe_target` gives it."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable DSN>"
    return describe_target(params)
