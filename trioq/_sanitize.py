"""Making what a job produced safe to store, and reading back what another producer stored.

Whatever a handler raises or returns, and whatever a row holds, the worker must keep
running and the job must end with a recorded reason. Text written to Postgres may not
hold NUL and must be valid UTF-8; timestamps are finite; rows are bounded. And args
written by SQL or another producer may be valid jsonb that Python cannot decode (nested
thousands deep, or a number of thousands of digits).

- `safe_text`: NUL and lone surrogates escaped (``\\x00``, ``\\udcff``), cut at a limit
  with a note saying how much was cut. Error texts and tracebacks go through it.
- `decode_args`: the args' JSON text decoded, or an `UndecodableArgs` that says why not.
"""

from __future__ import annotations

import json
import re

__all__ = [
    "DATA_ERRORS",
    "ERROR_LIMIT",
    "TRACEBACK_LIMIT",
    "UndecodableArgs",
    "decode_args",
    "safe_text",
]

#: Longest stored error message and traceback, in characters (a note says what was cut).
ERROR_LIMIT = 4_000
TRACEBACK_LIMIT = 20_000

# NUL and lone UTF-16 surrogates: valid in a Python str, refused by Postgres text.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
#: How much of undecodable args a message quotes.
_PREVIEW = 80

#: Errors that come from a value, not from the database or the connection: writing it
#: again fails again. ``ValueError`` covers ``UnicodeEncodeError`` (a lone surrogate)
#: and a JSON value that cannot be encoded; ``RecursionError`` a value nested too deep.
DATA_ERRORS: tuple[type[BaseException], ...] = (ValueError, OverflowError, RecursionError)


def _escape(match: re.Match[str]) -> str:
    char = match[0]
    return "\\x00" if char == "\x00" else f"\\u{ord(char):04x}"


def safe_text(text: str, limit: int) -> str:
    """``text`` with NUL and lone surrogates escaped, at most about ``limit`` characters."""
    if _UNSTORABLE.search(text):
        text = _UNSTORABLE.sub(_escape, text)
    if len(text) > limit:
        cut = len(text) - limit
        text = f"{text[:limit]}\n... [{cut} more characters cut by trioq]"
    return text


class UndecodableArgs:
    """A job's args that are valid jsonb but cannot be decoded in Python.

    A claimed job with such args is not run: it goes to dead_jobs with `reason`.
    """

    __slots__ = ("reason", "text")

    def __init__(self, text: str, reason: str) -> None:
        self.text = text
        self.reason = reason

    def __repr__(self) -> str:
        return f"UndecodableArgs({self.reason!r}, {len(self.text)} characters of JSON)"

    def __str__(self) -> str:
        preview = self.text[:_PREVIEW] + ("..." if len(self.text) > _PREVIEW else "")
        return f"<undecodable args ({self.reason}): {preview}>"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, UndecodableArgs):
            return NotImplemented
        return (self.text, self.reason) == (other.text, other.reason)

    def __hash__(self) -> int:
        return hash(self.text)


def decode_args(text: str) -> object:
    """The JSON ``text`` decoded, or `UndecodableArgs` if Python cannot (too deep, a number
    with more digits than ``sys.get_int_max_str_digits()``, out of memory)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError, MemoryError) as ex:
        reason = f"{type(ex).__name__}: {str(ex).splitlines()[0] if str(ex) else ''}".strip(": ")
        return UndecodableArgs(text, safe_text(reason, 300))
