"""How ``trioq serve`` (and ``trioq web``) log: text or JSON lines, never a password.

``--log-format text`` (the default) prints ``time logger LEVEL message``;
``--log-format json`` prints one JSON object per line::

    {"time": "2026-12-01T11:20:15.165+00:00", "level": "INFO", "logger": "trioq.runtime",
     "message": "job 5 (send) attempt 1 failed: ... (retrying in 4 s)", "job_id": 5,
     "task": "send", "queue": "email", "attempt": 1, "delay": 4.0}

The structured fields (`FIELDS`) are those trioq's records carry (``extra=``); others are
left out, so a JSON line never holds more than its message says. A traceback is the
``exc`` key. Both formats replace the passwords of every configured DSN with ``***``
(`RedactingFormatter`), in the message, the traceback and each field.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from .._pg.errors import dsn_secrets, redact

__all__ = ["FIELDS", "LOG_FORMAT", "LOG_LEVELS", "JsonFormatter", "RedactingFormatter",
           "setup_logging"]  # fmt: skip

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
LOG_LEVELS = ("debug", "info", "warning", "error")

#: The structured fields a JSON line carries when a record has them.
FIELDS = (
    "job_id", "task", "queue", "attempt", "delay", "reason", "worker_id", "database", "schema",
    "schema_version", "queues", "metrics",
)  # fmt: skip


class RedactingFormatter(logging.Formatter):
    """Formats log lines (tracebacks included) with the DSNs' passwords replaced by ***."""

    def __init__(self, fmt: str | None = LOG_FORMAT) -> None:
        super().__init__(fmt)
        self._secrets: list[str] = []

    def add_dsns(self, dsns: list[str | None]) -> None:
        self._secrets = sorted({*self._secrets, *dsn_secrets(dsns)}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        return redact(text, self._secrets)

    def format(self, record: logging.LogRecord) -> str:
        return self.redact(super().format(record))


class JsonFormatter(RedactingFormatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, the
    structured fields it has (`FIELDS`), and ``exc`` (the traceback) if any."""

    def __init__(self) -> None:
        super().__init__(None)

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": self.redact(record.getMessage()),
        }
        for name in FIELDS:
            if name in record.__dict__:
                line[name] = self._safe(record.__dict__[name])
        if record.exc_info:
            line["exc"] = self.redact(self.formatException(record.exc_info))
        elif record.exc_text:
            line["exc"] = self.redact(record.exc_text)
        if record.stack_info:
            line["stack"] = self.redact(record.stack_info)
        return json.dumps(line, default=str, ensure_ascii=False)

    def _safe(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, bool | int | float) or value is None:
            return value
        return json.loads(self.redact(json.dumps(value, default=str)))


def setup_logging(fmt: str = "text", level: str = "info") -> RedactingFormatter:
    """Log to stderr in ``fmt`` (``text`` or ``json``) from ``level`` up; the formatter,
    for adding the DSNs whose passwords it must hide."""
    formatter = JsonFormatter() if fmt == "json" else RedactingFormatter(LOG_FORMAT)
    handler = logging.StreamHandler()
    handler.setFormatter(formatter)
    logging.basicConfig(level=level.upper(), handlers=[handler])
    return formatter
