"""The dashboard's guards: the access token, CSRF tokens, and response headers.

- **Token** (`TokenGuard`, only when one is configured): every request must carry it, as
  ``Authorization: Bearer <token>``, or in the ``trioq_token`` cookie, which a visit to
  any page with ``?token=<token>`` sets (HttpOnly, SameSite=Strict) before redirecting to
  the same page without it, so the token does not stay in the address bar or history.
  Anything else gets 401 and a page that says how to get in (without the token).
- **CSRF** (`Csrf`): a random per-browser id in the ``trioq_csrf`` cookie (HttpOnly,
  SameSite=Strict), and in every form an HMAC of it under a per-process secret. A POST
  whose form token does not match, or whose ``Origin`` is another site, gets 403.
- **Host** (`HostGuard`): a request whose ``Host`` is not a name the dashboard is served as
  (`DashboardConfig.allowed_hosts`, or an IP address) gets 421 before anything else: a page
  of another site whose name an attacker rebinds to this machine's address (DNS rebinding)
  can neither read a page nor post a form, whose ``Origin`` check compares with that same
  ``Host``.
- **Headers** (`SecurityHeaders`): a Content-Security-Policy that allows only the
  dashboard's own origin (no inline script, no CDN: everything comes from the package),
  no framing, no referrer to other sites, no MIME sniffing, no caching of pages.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

__all__ = [
    "CSRF_COOKIE",
    "TOKEN_COOKIE",
    "Csrf",
    "HostGuard",
    "SecurityHeaders",
    "TokenGuard",
    "is_loopback",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

TOKEN_COOKIE = "trioq_token"
CSRF_COOKIE = "trioq_csrf"

_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS = [
    (b"content-security-policy", _CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),  # no-referrer would make form POSTs send Origin: null
]


def is_loopback(host: str) -> bool:
    """Whether a bind host is this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str | None:
    """The name of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``), lower case,
    without a trailing dot; None if it is not one."""
    header = header.strip().lower()
    if header.startswith("["):
        name, sep, rest = header[1:].partition("]")
        if not sep or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
    else:
        name, _, port = header.partition(":")
        if port and not port.isdigit():
            return None
    name = name.rstrip(".")
    if not name or not name.isascii() or not name.isprintable() or any(c in name for c in " /?#@"):
        return None
    return name


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _cookies(scope: Scope) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            try:
                jar.load(value.decode("latin-1"))
            except Exception:  # a malformed cookie header: as if there were none
                continue
    return {key: morsel.value for key, morsel in jar.items()}


def _header(scope: Scope, wanted: bytes) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == wanted:
            return str(value.decode("latin-1"))
    return None


def _cookie_path(scope: Scope) -> str:
    return scope.get("root_path") or "/"


async def _respond(
    send: Send, status: int, body: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    data = body.encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"text/html; charset=utf-8"),
            (b"content-length", str(len(data)).encode()),
            *_HEADERS,
            *(headers or []),
        ],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": data})


_REFUSED = """<!doctype html><html><head><meta charset="utf-8"><title>trioq: token required</title>
</head><body><h1>This dashboard needs its access token</h1>
<p>Open this address once with <code>?token=...</code> appended (the token it was started
with: <code>trioq web --token</code> or <code>$TRIOQ_WEB_TOKEN</code>), or send
<code>Authorization: Bearer ...</code>.</p></body></html>"""


class TokenGuard:
    """ASGI middleware: refuse every HTTP request without the access token (401)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        if not token:
            raise ValueError("token must not be empty")
        self.app = app
        self._token = token.encode()

    def _valid(self, candidate: str | None) -> bool:
        if not candidate:
            return False
        return hmac.compare_digest(candidate.encode("utf-8", "replace"), self._token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = [value for key, value in query if key == "token"]
        if given:
            if not self._valid(given[-1]):
                await _respond(send, 401, _REFUSED)
                return
            await self._set_cookie_and_redirect(scope, send, query)
            return
        auth = _header(scope, b"authorization") or ""
        bearer = auth[7:] if auth.lower().startswith("bearer ") else None
        if self._valid(bearer) or self._valid(_cookies(scope).get(TOKEN_COOKIE)):
            await self.app(scope, receive, send)
            return
        await _respond(send, 401, _REFUSED, [(b"www-authenticate", b"Bearer")])

    async def _set_cookie_and_redirect(
        self, scope: Scope, send: Send, query: list[tuple[str, str]]
    ) -> None:
        rest = urlencode([(k, v) for k, v in query if k != "token"])
        # A path of this dashboard, never another site: ``//evil.example/`` (or with
        # backslashes, which browsers read as slashes) would be a scheme-relative address.
        path = "/" + (scope.get("path") or "/").lstrip("/\\")
        location = path + (f"?{rest}" if rest else "")
        cookie = (
            f"{TOKEN_COOKIE}={self._token.decode()}; Path={_cookie_path(scope)}; HttpOnly; "
            "SameSite=Strict"
        )
        await _respond(send, 303, "", [
            (b"location", location.encode("latin-1", "replace")),
            (b"set-cookie", cookie.encode("latin-1", "replace")),
        ])  # fmt: skip


_MISDIRECTED = """<!doctype html><html><head><meta charset="utf-8">
<title>trioq: unknown host</title></head><body><h1>This dashboard is not served under this name</h1>
<p>Open it by a name it was started with, or start it with
<code>trioq web --allowed-host NAME</code> (<code>allowed_hosts=</code> of
<code>trioq.web.app</code>) for the name a proxy serves it as.</p></body></html>"""


class HostGuard:
    """ASGI middleware: refuse (421) a request for a name the dashboard is not served as."""

    def __init__(self, app: ASGIApp, allowed: tuple[str, ...]) -> None:
        self.app = app
        self._any = "*" in allowed
        self._allowed = frozenset(allowed)

    def allows(self, header: str | None) -> bool:
        name = host_name(header) if header is not None else None
        if name is None:
            return False
        return self._any or name in self._allowed or _is_address(name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allows(_header(scope, b"host")):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await _respond(send, 421, _MISDIRECTED)


class Csrf:
    """Per-browser CSRF tokens: an id in a cookie, its HMAC in every form."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    @staticmethod
    def browser_id(cookies: dict[str, str]) -> str | None:
        value = cookies.get(CSRF_COOKIE)
        return value if value and len(value) == 43 and value.isascii() else None

    @staticmethod
    def new_browser_id() -> str:
        return secrets.token_urlsafe(32)  # 43 characters

    def token(self, browser_id: str) -> str:
        return hmac.new(self._secret, browser_id.encode(), hashlib.sha256).hexdigest()

    def valid(self, browser_id: str | None, token: str | None) -> bool:
        if not browser_id or not token:
            return False
        return hmac.compare_digest(self.token(browser_id), token)

    @staticmethod
    def same_origin(scope: Scope) -> bool:
        """False when the browser says the request came from another origin."""
        origin = _header(scope, b"origin")
        if origin is None or origin == "null":
            return origin is None
        host = _header(scope, b"host")
        return host is not None and origin.split("://", 1)[-1] == host


class SecurityHeaders:
    """ASGI middleware: the headers above on every response; pages are not cached."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = "/static/" in scope.get("path", "")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += _HEADERS
                if not static:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
