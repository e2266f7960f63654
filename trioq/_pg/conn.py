"""`Conn`, the type every library call takes, in a module that does not import trio (so
that `trioq.producer` can be imported by code that never runs trio)."""

from __future__ import annotations

from typing import Any

import psycopg

__all__ = ["Conn"]

#: Any async psycopg connection: what every call of the library takes. trioq's own
#: (`TrioConnection`) or one the caller made, in autocommit or inside its transaction.
Conn = psycopg.AsyncConnection[Any]
