"""The dashboard's configuration: frozen, validated at construction, errors name the field."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from .._cron import CronEntry
from .._db.statements import validate_schema_name
from .._pg.errors import check_dsn, redact_dsn
from .._rules import boolean, positive_int, rule

__all__ = ["MIN_TOKEN_LENGTH", "DashboardConfig", "check_token"]

MIN_TOKEN_LENGTH = 16
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=")


def check_token(token: str, field: str = "token") -> str:
    """``token`` if it can guard the dashboard: 16+ characters a cookie can carry as is."""
    if not isinstance(token, str):
        raise TypeError(f"{field} must be a string, got {type(token).__name__}")
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(
            f"{field} must be at least {MIN_TOKEN_LENGTH} characters (make one with: python -c "
            "'import secrets; print(secrets.token_urlsafe())')"
        )
    if not set(token) <= _TOKEN_CHARS:
        raise ValueError(f"{field} may contain only letters, digits and - . _ ~ + / =")
    return token


def _dsn(_inst: object, attribute: attrs.Attribute[Any], value: str) -> None:
    check_dsn(value, what=attribute.name)


def _token(_inst: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None:
        check_token(value, attribute.name)


def _cron(value: Iterable[CronEntry] | None) -> tuple[CronEntry, ...]:
    entries = tuple(value or ())
    for entry in entries:
        if not isinstance(entry, CronEntry):
            raise TypeError(f"cron entries must be trioq.CronEntry, got {entry!r}")
    return entries


_pool_size = rule(positive_int)


def _hosts(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        raise TypeError(f"allowed_hosts must be a sequence of host names, got {value!r}")
    hosts = []
    for host in value:
        if not isinstance(host, str):
            raise TypeError(f"allowed_hosts must hold strings, got {type(host).__name__}")
        name = host.strip().lower().rstrip(".")
        if not name or not name.isascii() or not name.isprintable() or any(
            c in name for c in " /?#@[]"
        ):
            raise ValueError(f"allowed_hosts: {host!r} is not a host name (nor '*')")
        hosts.append(name)
    return tuple(hosts)


def _secret(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, bytes):
        raise TypeError(f"{attribute.name} must be bytes or None, got {type(value).__name__}")


@attrs.frozen(kw_only=True)
class DashboardConfig:
    """What `trioq.web.app` serves: which database and schema, and what it allows."""

    dsn: str = attrs.field(validator=_dsn, repr=lambda dsn: repr(redact_dsn(dsn)))
    schema: str = attrs.field(default="trioq", validator=rule(validate_schema_name))
    #: Hide every action and refuse every POST (403).
    read_only: bool = attrs.field(default=False, validator=rule(boolean))
    #: Required on every request when set (see `trioq.web._security.TokenGuard`).
    token: str | None = attrs.field(default=None, validator=_token, repr=False)
    #: The app's cron entries, for their schedules and next ticks on the cron page.
    cron: tuple[CronEntry, ...] = attrs.field(default=(), converter=_cron)
    #: Connections the dashboard's pool opens at most.
    pool_size: int = attrs.field(default=4, validator=_pool_size)
    #: Signs the forms' CSRF tokens; random per process when None (give every process
    #: behind one address the same secret).
    secret: bytes | None = attrs.field(default=None, repr=False, validator=_secret)
    #: The names the dashboard is served as (its ``Host`` header); a request for another
    #: name is refused (421) before any page or action, which stops DNS rebinding. IP
    #: addresses are always accepted (a name can be rebound, an address cannot); ``"*"``
    #: accepts every name (when a proxy in front checks it). docs/security.md.
    allowed_hosts: tuple[str, ...] = attrs.field(default=("localhost",), converter=_hosts)
