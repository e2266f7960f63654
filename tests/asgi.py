"""Calling an ASGI app in-process, as an HTTP server would (no server, no network)."""

from __future__ import annotations

from collections.abc import Mapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urlencode, urlsplit

import attrs
import trio


@attrs.frozen
class Reply:
    status: int
    headers: dict[str, list[str]]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return values[-1] if values else None

    def cookies(self) -> dict[str, str]:
        jar: SimpleCookie = SimpleCookie()
        for value in self.headers.get("set-cookie", []):
            jar.load(value)
        return {key: morsel.value for key, morsel in jar.items()}


async def call(
    app: Any,
    method: str,
    url: str,
    *,
    form: Mapping[str, Any] | list[tuple[str, str]] | None = None,
    headers: Mapping[str, str] | None = None,
    cookies: Mapping[str, str] | None = None,
    root_path: str = "",
) -> Reply:
    """One request; ``form`` is sent urlencoded (lists become repeated fields)."""
    parts = urlsplit(url)
    body = b""
    sent = dict(headers or {})
    sent.setdefault("host", "localhost")
    if form is not None:
        pairs = form if isinstance(form, list) else [
            (k, str(x)) for k, v in form.items() for x in (v if isinstance(v, list) else [v])
        ]  # fmt: skip
        body = urlencode(pairs).encode()
        sent["content-type"] = "application/x-www-form-urlencoded"
        sent["content-length"] = str(len(body))
    if cookies:
        sent["cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1", "method": method, "scheme": "http",
        "path": parts.path, "raw_path": parts.path.encode(), "root_path": root_path,
        "query_string": parts.query.encode(), "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
        "headers": [(k.lower().encode(), v.encode()) for k, v in sent.items()],
    }  # fmt: skip
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    done = trio.Event()
    status = 0
    reply_headers: dict[str, list[str]] = {}
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            for name, value in message.get("headers", []):
                reply_headers.setdefault(name.decode().lower(), []).append(value.decode())
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                done.set()

    await app(scope, receive, send)
    return Reply(status, reply_headers, b"".join(chunks))
