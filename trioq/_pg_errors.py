"""Errors of the Postgres layer, and describing a connection target safely."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict

__all__ = ["ConnectError", "describe_target", "redact_dsn"]


class ConnectError(psycopg.OperationalError):
    """No connection could be made; the message names the target, never the password."""


def describe_target(params: Mapping[str, Any]) -> str:
    """The target as a URL without password or other secrets.

    ``postgresql://user@host:port/dbname`` for TCP, and
    ``postgresql://user@/dbname?host=/socket/dir&port=5432`` for a unix socket
    (the form psql accepts).
    """
    user = str(params.get("user") or "")
    host = str(params.get("host") or params.get("hostaddr") or "")
    port = str(params.get("port") or "5432")
    dbname = str(params.get("dbname") or user)
    who = f"{quote(user, safe='')}@" if user else ""
    if not host or host.startswith("/"):
        socket = f"host={quote(host, safe='/')}&" if host else ""
        return f"postgresql://{who}/{quote(dbname, safe='')}?{socket}port={port}"
    return f"postgresql://{who}{host}:{port}/{quote(dbname, safe='')}"


def redact_dsn(dsn: str) -> str:
    """A DSN safe to print: the target as `describe_target` gives it."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable DSN>"
    return describe_target(params)
