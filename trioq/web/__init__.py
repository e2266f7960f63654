"""trioq.web: a live dashboard for operators (``pip install 'trioq[web]'``).

``trioq web`` serves it (docs/web.md); `app` returns it as an ASGI app to mount in a
service of your own, served by a trio ASGI server (Hypercorn's trio worker)::

    import trioq.web
    from starlette.applications import Starlette
    from starlette.routing import Mount

    dashboard = trioq.web.app(dsn="postgresql://app@db/app", read_only=True)
    service = Starlette(routes=[Mount("/trioq", app=dashboard)])

Layout: ``_config`` (`DashboardConfig`), ``_app`` (the routes and pages), ``_queries``
(what the pages show, with the library's statements) and ``_limits`` (the caps that keep each
statement's cost bounded),
``_security`` (the token, CSRF, headers), ``_serve`` (Hypercorn on trio, for the CLI),
``templates/`` and ``static/`` (with the vendored htmx and uPlot, see VENDORED.md).
"""

from __future__ import annotations

from collections.abc import Iterable as _Iterable

from .._cron import CronEntry as _CronEntry
from .._metadata import fixup_module_metadata
from .._pg.dsn import configured_dsn as _configured_dsn
from ._app import Dashboard as Dashboard
from ._config import DashboardConfig as DashboardConfig

__all__ = ["Dashboard", "DashboardConfig", "app"]


def _hosts(hosts: _Iterable[str]) -> object:
    """A string stays one, for the config's TypeError (not a host per character)."""
    return hosts if isinstance(hosts, str) else tuple(hosts)


def app(
    dsn: str | None = None,
    *,
    schema: str = "trioq",
    read_only: bool = False,
    token: str | None = None,
    cron: _Iterable[_CronEntry] = (),
    pool_size: int = 4,
    secret: bytes | None = None,
    allowed_hosts: _Iterable[str] = ("localhost",),
) -> Dashboard:
    """The dashboard for the trioq tables in ``schema`` of ``dsn`` (default: ``$TRIOQ_DSN``,
    then ``$DATABASE_URL``), as an ASGI app.

    ``read_only`` hides and refuses every action; ``token`` is then required on every
    request; ``cron`` (your `trioq.Config`'s entries) adds schedules and next ticks to the
    cron page; ``allowed_hosts`` are the names it is served as (beside IP addresses:
    `DashboardConfig.allowed_hosts`). Nothing connects until the first request.
    """
    chosen = _configured_dsn(dsn)
    if chosen is None:
        raise ValueError("trioq.web.app needs a DSN: pass dsn=, or set TRIOQ_DSN or DATABASE_URL")
    config = DashboardConfig(
        dsn=chosen, schema=schema, read_only=read_only, token=token, cron=tuple(cron),
        pool_size=pool_size, secret=secret, allowed_hosts=_hosts(allowed_hosts),
    )  # fmt: skip
    return Dashboard(config)


fixup_module_metadata(__name__, globals())
del fixup_module_metadata
