"""What a job is: the spec a caller enqueues, and the row a worker claims.

`JobSpec` validates everything before any SQL runs, each error naming the
field. Limits are documented in ``docs/queue.md``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "EnqueueResult",
    "Job",
    "JobSpec",
    "encode_args",
]

QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}$")
TASK_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,199}$")
PRIORITY_MIN, PRIORITY_MAX = -100, 100  # lower runs first
DEFAULT_MAX_ATTEMPTS = 25
MAX_ATTEMPTS_LIMIT = 10_000
DEDUP_KEY_MAX = 500

JSONValue = Any

# A JSON escape of NUL (\u0000) not itself preceded by an escaped backslash.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _queue_name(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not QUEUE_NAME_RE.match(value):
        raise ValueError(
            f"{attribute.name} {value!r} is invalid: use 1-64 letters, digits, '_', '.', ':' "
            "or '-', not starting with a punctuation mark"
        )


def _task_name(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{attribute.name} must be a non-empty string, got {value!r}")
    if not TASK_NAME_RE.match(value):
        raise ValueError(
            f"{attribute.name} {value!r} is invalid: use up to 200 letters, digits, '_', '.', "
            "':' or '-', starting with a letter or '_'"
        )


def _priority(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name} must be an int, got {value!r}")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValueError(
            f"{attribute.name} must be between {PRIORITY_MIN} and {PRIORITY_MAX} "
            f"(lower runs first), got {value}"
        )


def _max_attempts(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name} must be an int, got {value!r}")
    if not 1 <= value <= MAX_ATTEMPTS_LIMIT:
        raise ValueError(
            f"{attribute.name} must be between 1 and {MAX_ATTEMPTS_LIMIT}, got {value}"
        )


def _aware(_inst: object, attribute: attrs.Attribute[Any], value: dt.datetime | None) -> None:
    if value is None:
        return
    if not isinstance(value, dt.datetime):
        raise TypeError(f"{attribute.name} must be a datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            f"{attribute.name} {value.isoformat()} is a naive datetime: give it a timezone "
            "(e.g. datetime.now(timezone.utc))"
        )


def _to_delay(value: dt.timedelta | float | None) -> dt.timedelta:
    if value is None:
        return dt.timedelta(0)
    if isinstance(value, dt.timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"delay must be a timedelta or seconds, got {value!r}")
    return dt.timedelta(seconds=value)


def _non_negative(_inst: object, attribute: attrs.Attribute[Any], value: dt.timedelta) -> None:
    if value < dt.timedelta(0):
        raise ValueError(f"{attribute.name} must not be negative, got {value}")


def _dedup_key(_inst: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not value or len(value) > DEDUP_KEY_MAX:
        raise ValueError(
            f"{attribute.name} must be a non-empty string of at most {DEDUP_KEY_MAX} characters"
        )


def encode_args(args: JSONValue) -> str:
    """``args`` as compact JSON text, or a ValueError naming what is not JSON."""
    try:
        text = json.dumps(args, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as ex:
        raise ValueError(
            f"args must be JSON (dicts, lists, str, int, float, bool, None): {ex}"
        ) from None
    if _JSON_NUL.search(text):
        raise ValueError("args must not contain NUL characters (Postgres jsonb cannot store them)")
    return text


def _args(value: JSONValue) -> JSONValue:
    return {} if value is None else value


@attrs.frozen(kw_only=True)
class JobSpec:
    """A job to enqueue, validated at construction."""

    task: str = attrs.field(validator=_task_name)
    args: JSONValue = attrs.field(default=None, converter=_args)
    queue: str = attrs.field(default="default", validator=_queue_name)
    priority: int = attrs.field(default=0, validator=_priority)
    run_at: dt.datetime | None = attrs.field(default=None, validator=_aware)
    delay: dt.timedelta = attrs.field(default=None, converter=_to_delay, validator=_non_negative)
    max_attempts: int = attrs.field(default=DEFAULT_MAX_ATTEMPTS, validator=_max_attempts)
    #: An explicit deduplication key; with ``unique=True`` and no key, the fingerprint of
    #: task, queue and canonical args is used.
    dedup_key: str | None = attrs.field(default=None, validator=_dedup_key)
    unique: bool = False
    #: The args as JSON text; computed at construction so bad args fail here.
    args_json: str = attrs.field(init=False)

    @args_json.default
    def _encode(self) -> str:
        return encode_args(self.args)

    def __attrs_post_init__(self) -> None:
        if self.run_at is not None and self.delay:
            raise ValueError("give run_at or delay, not both")

    def effective_dedup_key(self) -> str | None:
        """What the unique index sees: the explicit key, the fingerprint, or None."""
        if self.dedup_key is not None:
            return f"key:{self.dedup_key}"
        if not self.unique:
            return None
        canonical = json.dumps(self.args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        digest = hashlib.sha256(f"{self.task}\0{self.queue}\0{canonical}".encode()).hexdigest()
        return f"fp:{digest}"


@attrs.frozen
class EnqueueResult:
    """The job's id; when ``duplicate``, the id of the live twin that was kept instead."""

    job_id: int
    duplicate: bool = False


@attrs.frozen(kw_only=True)
class Job:
    """A claimed job, as a worker sees it."""

    id: int
    queue: str
    task: str
    args: JSONValue
    priority: int
    run_at: dt.datetime
    attempt: int
    max_attempts: int
    enqueued_at: dt.datetime
    lease_expires_at: dt.datetime

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Job:
        """From the claim's RETURNING columns, in `trioq._sql` order."""
        (id_, queue, task, args, priority, run_at, attempt, max_attempts, enqueued, lease) = row
        return cls(
            id=id_,
            queue=queue,
            task=task,
            args=args,
            priority=priority,
            run_at=run_at,
            attempt=attempt,
            max_attempts=max_attempts,
            enqueued_at=enqueued,
            lease_expires_at=lease,
        )

    @property
    def kwargs(self) -> Mapping[str, Any]:
        """``args`` when it is an object (handlers take it as keyword arguments)."""
        return self.args if isinstance(self.args, dict) else {}
