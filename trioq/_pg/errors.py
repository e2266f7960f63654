"""Errors of the Postgres layer, and describing a connection target safely.

Nothing here ever returns a password: `describe_target` and `redact_dsn` drop it,
`check_dsn` refuses an unparseable DSN without echoing it (libpq's own message
quotes the whole URI, password included), and `redact` scrubs known secrets
from text about to be printed or logged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict

from .._exceptions import InvalidDSNError

__all__ = [
    "check_dsn",
    "connection_fault",
    "describe_target",
    "dsn_secrets",
    "redact",
    "redact_dsn",
]

#: SQLSTATEs that say the server went away or will not serve this session (not the statement):
#: its shutdown (57P01 admin, 57P02 crash), start-up (57P03), its database dropped (57P04), and a
#: read-only server (25006: a standby after a failover, or default_transaction_read_only).
_SERVER_GONE = frozenset({"57P01", "57P02", "57P03", "57P04", "25006"})

#: Connection parameters whose values are secrets (libpq's, and psycopg's ``sslpassword``).
SECRET_PARAMS = ("password", "sslpassword")
REDACTED = "***"

# A double-quoted span in a libpq message: it may quote (part of) the DSN.
_QUOTED = re.compile(r'"([^"]*)"')
_PUNCTUATION = frozenset("=[]:/@?&'")


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
    except (psycopg.ProgrammingError, ValueError):  # ValueError: a lone surrogate
        return "<unparseable DSN>"
    return describe_target(params)


def check_dsn(dsn: str, *, what: str = "DSN") -> str:
    """Return ``dsn`` if libpq can parse it; else raise `InvalidDSNError`.

    The error keeps libpq's reason but hides every quoted piece of the DSN in
    it, so a password in a malformed URI is never echoed.
    """
    if not isinstance(dsn, str):
        raise InvalidDSNError(f"{what} must be a string, got {type(dsn).__name__}")
    if "\x00" in dsn:  # libpq would cut the DSN there, and connect elsewhere than asked
        raise InvalidDSNError(f"{what} is invalid: it holds a NUL character")
    try:
        dsn.encode()
    except UnicodeEncodeError:
        raise InvalidDSNError(f"{what} is invalid: it is not UTF-8 (a lone surrogate)") from None
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as ex:
        reason = _hide_quoted(_first_line(str(ex)), dsn)
        scheme = dsn.partition("://")[0]
        if scheme != dsn and scheme not in ("postgresql", "postgres"):
            reason += f"; a URI must start with postgresql:// or postgres://, not {scheme}://"
        raise InvalidDSNError(
            f"{what} is invalid: {reason} (the DSN is not shown: it may hold a password)"
        ) from None
    return dsn


def dsn_secrets(dsns: Iterable[str | None]) -> list[str]:
    """The passwords (and other secret parameters) in ``dsns``, longest first."""
    found: set[str] = set()
    for dsn in dsns:
        if not dsn:
            continue
        try:
            params = conninfo_to_dict(dsn)
        except (psycopg.ProgrammingError, ValueError):  # ValueError: a lone surrogate
            continue  # never parsed, so never used: and check_dsn's error never quotes it
        found.update(str(params[k]) for k in SECRET_PARAMS if params.get(k))
    return sorted(found, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret (and its URL-quoted form) replaced."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED).replace(quote(secret, safe=""), REDACTED)
    return text


def _hide_quoted(message: str, dsn: str) -> str:
    def hide(match: re.Match[str]) -> str:
        span = match[1]
        if span and set(span) <= _PUNCTUATION:
            return match[0]  # '"="' or '"]"': syntax, not content
        return '"..."' if span and span in dsn else match[0]

    return _QUOTED.sub(hide, message)


def _first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0] if text else "unparseable"


def connection_fault(error: BaseException) -> psycopg.Error | None:
    """The error in ``error``'s chain (itself, its cause, its context) that says the database
    connection failed rather than the statement: a connection exception (SQLSTATE class 08),
    the server shutting down, starting up or read-only (`_SERVER_GONE`), or an
    ``OperationalError`` with no SQLSTATE at all (the connection broke, or none could be
    opened: psycopg's and trioq's `ConnectError`). None: the statement failed (a constraint,
    a timeout, a deadlock), or it is not a database error."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, psycopg.Error):
            state = current.sqlstate
            if state is None and isinstance(current, psycopg.OperationalError):
                return current
            if state is not None and (state.startswith("08") or state in _SERVER_GONE):
                return current
        current = current.__cause__ or current.__context__
    return None
