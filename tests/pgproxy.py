"""A TCP proxy in front of the test server that loses the answer to a COMMIT.

`CommitCut` listens on 127.0.0.1 and relays each connection to the server's Unix socket,
reading the protocol's messages (clients must not ask for SSL or GSS encryption: the DSN
says ``sslmode=disable gssencmode=disable``, `dsn_through`). With ``after_commit`` the first
COMMIT a client sends goes through, the server commits it, and its answer (CommandComplete
``COMMIT``) is not passed on: the client's connection is closed instead, so the client
cannot know the transaction committed. Without, the COMMIT itself is dropped and the
connection closed (the server rolls back). Only the first COMMIT sent once `armed` is cut;
every other passes.
"""

from __future__ import annotations

import struct
from typing import Any

import attrs
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = ["CommitCut", "dsn_through"]


def dsn_through(dsn: str, port: int) -> str:
    """``dsn``, through a proxy on 127.0.0.1:``port`` (no SSL, no GSS encryption)."""
    params = conninfo_to_dict(dsn)
    params.update(host="127.0.0.1", port=str(port), sslmode="disable", gssencmode="disable")
    params.pop("hostaddr", None)
    return make_conninfo("", **params)


#: What the last command of a pool's prelude says (the app pool's reset, the worker pool's
#: setup): the COMMIT after it is the prelude's.
_PRELUDE_MARKS = (b"RESET_SESSION", b"SET_CONFIG('TRIOQ.NOW', ''")

@attrs.define
class CommitCut:
    socket_path: str
    after_commit: bool = True
    port: int = 0
    #: Whether the next COMMIT is cut (set it once the setup's own COMMITs went through).
    armed: bool = False
    #: Set once a COMMIT was cut.
    cut: trio.Event = attrs.field(factory=trio.Event)

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._relay, listeners)
            task_status.started(self.port)

    async def _relay(self, client: trio.SocketStream) -> None:
        server = await trio.open_unix_socket(self.socket_path)
        # "passed": COMMITs of a pool's prelude (its reset or setup, in BEGIN ... COMMIT:
        # `trioq._pg.connection`) sent and not yet answered: not the job's, so neither cut
        # nor armed by.
        state: dict[str, Any] = {"armed": False, "reset": False, "passed": 0}
        async with client, server, trio.open_nursery() as nursery:

            async def up() -> None:
                await self._pump(client, server, nursery, state, typed=False)

            async def down() -> None:
                await self._pump(server, client, nursery, state, typed=True)

            nursery.start_soon(up)
            nursery.start_soon(down)

    async def _pump(
        self, source: trio.SocketStream, sink: trio.SocketStream, nursery: trio.Nursery,
        state: dict[str, Any], *, typed: bool,
    ) -> None:  # fmt: skip
        """Relay whole messages; the client's first (the startup message) has no type."""
        buffer = b""
        from_client = not typed
        try:
            while True:
                data = await source.receive_some(65536)
                if not data:
                    break
                buffer += data
                out, buffer, typed, cut = self._messages(buffer, typed, from_client, state)
                if out:
                    await sink.send_all(out)
                if cut:
                    self.cut.set()
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        nursery.cancel_scope.cancel()  # either side gone or cut: close both

    def _messages(
        self, buffer: bytes, typed: bool, from_client: bool, state: dict[str, Any]
    ) -> tuple[bytes, bytes, bool, bool]:
        """The complete messages of ``buffer`` to pass on, the rest, whether the next one
        is typed, and whether to cut the connection here."""
        out = b""
        while True:
            head = 5 if typed else 4
            if len(buffer) < head:
                return out, buffer, typed, False
            (length,) = struct.unpack("!i", buffer[head - 4 : head])
            end = head - 4 + length
            if len(buffer) < end:
                return out, buffer, typed, False
            message, buffer = buffer[:end], buffer[end:]
            kind = message[:1] if typed else b""
            typed = True
            if self.cut.is_set() or not self.armed:
                out += message
                continue
            if from_client and kind in (b"Q", b"P") and any(
                mark in message.upper() for mark in _PRELUDE_MARKS
            ):
                state["reset"] = True
            elif from_client and kind in (b"Q", b"P") and b"COMMIT" in message.upper() and (
                state["reset"]
            ):
                state["reset"], state["passed"] = False, state["passed"] + 1
            elif from_client and kind in (b"Q", b"P") and b"COMMIT" in message.upper():
                if not self.after_commit:
                    return out, buffer, typed, True  # the COMMIT never reaches the server
                state["armed"] = True
            if not from_client and kind == b"C" and b"COMMIT" in message and state["passed"]:
                state["passed"] -= 1  # a reset's
            elif not from_client and state["armed"] and kind == b"C" and b"COMMIT" in message:
                return out, buffer, typed, True  # committed; the answer is lost
            out += message
