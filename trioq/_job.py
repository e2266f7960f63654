"""What a job is: the rules of its fields, the spec a caller enqueues, the row a worker
claims, and the lease it holds while it runs.

The field rules are checked here and only here: `JobSpec`, `trioq.Task`,
`trioq.Config`, `trioq.CronEntry` and the command line all call the `check_*`
functions (attrs classes through `trioq._rules.rule`; the numeric rules of configuration
and policies are `trioq._rules`'). Each rule raises one error type
wherever it is checked: a value of the wrong type is a ``TypeError``, a value of
the right type out of range or form a ``ValueError`` (`PayloadTooLargeError`
for the payload limit), and the message names the field as the caller knows it.
Limits are documented in ``docs/queue.md``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ._exceptions import PayloadTooLargeError
from ._rules import name, rule
from ._sanitize import decode_args
from ._unique import Debounce, Unique, UniqueKey, check_dedup_key, to_debounce, unique_key

__all__ = [
    "CLAIMED_COLUMNS",
    "COST_MAX",
    "DEBOUNCE_NEEDS_KEY",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_PAYLOAD",
    "DEPENDANT_NOT_UNIQUE",
    "DEPENDENCY_POLICIES",
    "ENCODE_CHUNK",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_DEPENDENCIES",
    "MAX_ENQUEUE_DELAY",
    "MAX_RETRY_DELAY",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "QUEUE_NAME_RE",
    "SEQUENTIAL_ALONE",
    "START_BY_BEFORE_RUN_AT",
    "TASK_NAME_RE",
    "EnqueueResult",
    "Failure",
    "Job",
    "JobSpec",
    "Lease",
    "args_or_empty",
    "check_after",
    "check_aware",
    "check_chosen_cost",
    "check_chosen_max_attempts",
    "check_cost",
    "check_dedup_key",
    "check_dependency_policy",
    "check_job_id",
    "check_max_attempts",
    "check_max_payload",
    "check_payload",
    "check_priority",
    "check_queue_name",
    "check_task_name",
    "encode_args",
    "encode_args_runs",
    "to_delay",
    "to_start_by",
]

# Use with fullmatch: "$" alone would also match before a final newline.
QUEUE_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}")
TASK_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,199}")
PRIORITY_MIN, PRIORITY_MAX = -100, 100  # lower runs first
#: The most slots one job may cost (weighted slots, ``docs/flow-control.md``): the schema's
#: check (``jobs_cost_check``, migration 24) says the same.
COST_MAX = 1000
DEFAULT_MAX_ATTEMPTS = 25
MAX_ATTEMPTS_LIMIT = 10_000
DEFAULT_MAX_PAYLOAD = 1024 * 1024  # bytes of JSON args
DEFAULT_MAX_RESULT = 1024 * 1024  # bytes of a kept result's JSON
#: Longest a retry or a snooze may put a job off (Postgres timestamps are finite).
MAX_RETRY_DELAY = dt.timedelta(days=365)
#: Longest an enqueue may put a job off.
MAX_ENQUEUE_DELAY = dt.timedelta(days=365 * 100)

JSONValue = Any


# A JSON escape of NUL (\u0000) not itself preceded by an escaped backslash.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# A lone UTF-16 surrogate: valid in a Python str, not encodable as UTF-8.
_SURROGATE = re.compile("[\ud800-\udfff]")

#: What a job does when one of its dependencies dies or is cancelled (``docs/workflows.md``).
DEPENDENCY_POLICIES = ("cancel", "run")
#: Most dependencies one job may have (``after``).
MAX_DEPENDENCIES = 10_000

#: Why a deadline to start before the job's run_at is refused (every enqueue path, the SQL
#: API's ``enqueue`` and the schema's check ``jobs_start_by_after_run_at`` say it).
START_BY_BEFORE_RUN_AT = "start_by must not be before run_at (the job could never start in time)"

#: Why a debounced enqueue needs a key.
DEBOUNCE_NEEDS_KEY = (
    "debounce needs a dedup_key (or unique= without a period): the key says which enqueues "
    "are one burst"
)

#: Why a job of a sequence cannot have dependencies, be unique or be debounced (yet).
SEQUENTIAL_ALONE = (
    "a job of a sequence (sequence_key) cannot have dependencies (after=), a dedup_key, be "
    "unique or debounced, or be in a workflow or batch: its sequence decides when it runs "
    "(docs/flow-control.md, \"Sequences\")"
)

#: Why a job with dependencies (or in a workflow or batch) cannot be unique.
DEPENDANT_NOT_UNIQUE = (
    "a job with dependencies (after=), or in a workflow or batch, cannot have a dedup_key or "
    "be unique: the graph needs every one of its jobs inserted (docs/workflows.md)"
)

# -- the rules ----------------------------------------------------------------------------------


def _check_unique(value: object, field: str) -> None:
    if not isinstance(value, bool | Unique):
        raise TypeError(f"{field} must be a bool or a trioq.Unique, got {value!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: Names already found valid (a program uses a few): checked again by a set lookup. Bounded:
#: a program that makes up names keeps paying for the pattern past `_KNOWN_NAMES_CAP`.
_KNOWN_TASKS: set[str] = set()
_KNOWN_QUEUES: set[str] = set()
_KNOWN_NAMES_CAP = 4096


def _known(value: str, known: set[str]) -> str:
    if len(known) < _KNOWN_NAMES_CAP:
        known.add(value)
    return value


def check_task_name(value: object, field: str = "task") -> str:
    if type(value) is str and value in _KNOWN_TASKS:
        return value
    if value == "":
        raise ValueError(f"{field} must be a non-empty string, got {value!r}")
    checked = name(value, field, TASK_NAME_RE, "up to 200 letters, digits, '_', '.', ':' or "
                   "'-', starting with a letter or '_'")  # fmt: skip
    return _known(checked, _KNOWN_TASKS) if type(checked) is str else checked


def check_queue_name(value: object, field: str = "queue") -> str:
    if type(value) is str and value in _KNOWN_QUEUES:
        return value
    checked = name(value, field, QUEUE_NAME_RE, "1-64 letters, digits, '_', '.', ':' or '-', "
                   "not starting with a punctuation mark")  # fmt: skip
    return _known(checked, _KNOWN_QUEUES) if type(checked) is str else checked


def check_priority(value: object, field: str = "priority") -> int:
    if not _is_int(value):
        raise TypeError(f"{field} must be an int, got {value!r}")
    assert isinstance(value, int)
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValueError(
            f"{field} must be between {PRIORITY_MIN} and {PRIORITY_MAX} "
            f"(lower runs first), got {value}"
        )
    return value


def check_max_attempts(value: object, field: str = "max_attempts") -> int:
    if not _is_int(value):
        raise TypeError(f"{field} must be an int, got {value!r}")
    assert isinstance(value, int)
    if not 1 <= value <= MAX_ATTEMPTS_LIMIT:
        raise ValueError(f"{field} must be between 1 and {MAX_ATTEMPTS_LIMIT}, got {value}")
    return value


def check_chosen_max_attempts(value: object, field: str = "max_attempts") -> int | None:
    """A job's ``max_attempts``: a number, or None to leave it to the job's task."""
    return None if value is None else check_max_attempts(value, field)


def check_cost(value: object, field: str = "cost") -> int:
    """How many slots a job occupies while it runs: an int from 1 to `COST_MAX`."""
    if not _is_int(value):
        raise TypeError(f"{field} must be an int (slots), got {value!r}")
    assert isinstance(value, int)
    if not 1 <= value <= COST_MAX:
        raise ValueError(f"{field} must be between 1 and {COST_MAX} (slots), got {value}")
    return value


def check_chosen_cost(value: object, field: str = "cost") -> int | None:
    """A job's ``cost``: a number of slots, or None to leave it to the job's task."""
    return None if value is None else check_cost(value, field)


def check_max_payload(value: object, field: str = "max_payload_bytes") -> int:
    """A payload limit: a positive number of bytes."""
    if not _is_int(value):
        raise TypeError(f"{field} must be an int (bytes), got {value!r}")
    assert isinstance(value, int)
    if value < 1:
        raise ValueError(f"{field} must be positive, got {value}")
    return value


def check_aware(value: dt.datetime | None, field: str) -> dt.datetime | None:
    """None, or a datetime with a timezone that is within Python's range in UTC too."""
    if value is None:
        return None
    if not isinstance(value, dt.datetime):
        raise TypeError(f"{field} must be a datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            f"{field} {value.isoformat()} is a naive datetime: give it a timezone "
            "(e.g. datetime.now(timezone.utc))"
        )
    try:
        value.astimezone(dt.UTC)
    except OverflowError:  # 9999-12-31 23:00-05:00 is after the year 9999 in UTC
        raise ValueError(
            f"{field} {value.isoformat()} is outside the years 1 to 9999 in UTC (the times the "
            "schema holds)"
        ) from None
    return value


_NO_DELAY = dt.timedelta(0)


def to_delay(
    value: dt.timedelta | float | None,
    field: str = "delay",
    limit: dt.timedelta = MAX_ENQUEUE_DELAY,
) -> dt.timedelta:
    """A delay given as a timedelta or seconds (None: none), checked: finite, not negative,
    at most ``limit``."""
    if value is None:
        return _NO_DELAY
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif _is_int(value) or isinstance(value, float):
        seconds = float(value)
        if not math.isfinite(seconds):
            raise ValueError(f"{field} must be a finite number of seconds, got {value!r}")
    else:
        raise TypeError(f"{field} must be a timedelta or seconds, got {value!r}")
    if seconds < 0:
        raise ValueError(f"{field} must not be negative, got {seconds:g} s")
    if seconds > limit.total_seconds():
        raise ValueError(f"{field} must be at most {limit.days} days, got {seconds:g} s")
    return value if isinstance(value, dt.timedelta) else dt.timedelta(seconds=seconds)


def to_start_by(
    value: dt.datetime | dt.timedelta | float | None, field: str = "start_by"
) -> dt.datetime | dt.timedelta | None:
    """A deadline to start: None (none), an aware datetime (checked as `check_aware`), or a
    timedelta or seconds from the database's clock at the insert (checked as `to_delay`)."""
    if value is None or isinstance(value, dt.datetime):
        return check_aware(value, field)
    if isinstance(value, dt.timedelta) or _is_int(value) or isinstance(value, float):
        return to_delay(value, field)
    raise TypeError(f"{field} must be a datetime, a timedelta or seconds, got {value!r}")


#: Job ids are bigint.
JOB_ID_MIN, JOB_ID_MAX = -(2**63), 2**63 - 1


def check_job_id(value: object, field: str = "job_id") -> int:
    if not _is_int(value):
        raise TypeError(f"{field} must be an int, got {value!r}")
    assert isinstance(value, int)
    if not JOB_ID_MIN <= value <= JOB_ID_MAX:
        raise ValueError(f"{field} must fit in a bigint (job ids are), got {value}")
    return value


def check_after(value: object, field: str = "after") -> tuple[int, ...]:
    """The ids of the jobs a job waits for: a list, tuple or set of distinct job ids (at
    most `MAX_DEPENDENCIES`), as a tuple; None is none."""
    if value is None or (type(value) is tuple and not value):
        return ()
    if isinstance(value, str | bytes | Mapping) or not isinstance(
        value, Sequence | set | frozenset
    ):
        raise TypeError(f"{field} must be a list of job ids, got {value!r}")
    ids: tuple[Any, ...] = tuple(value)
    if len(ids) > MAX_DEPENDENCIES:
        raise ValueError(
            f"{field} lists {len(ids)} jobs: a job may wait for at most {MAX_DEPENDENCIES}"
        )
    seen: set[int] = set()
    for i, job_id in enumerate(ids):
        check_job_id(job_id, f"{field}[{i}]")
        if job_id in seen:
            raise ValueError(f"{field} lists job {job_id} twice")
        seen.add(job_id)
    return ids


def check_dependency_policy(value: object, field: str = "on_dependency_failure") -> str:
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a string, got {value!r}")
    if value not in DEPENDENCY_POLICIES:
        raise ValueError(
            f"{field} must be 'cancel' (the job is cancelled when a dependency dies or is "
            f"cancelled) or 'run' (it runs anyway), got {value!r}"
        )
    return value


# One encoder for every call: json.dumps with keyword arguments builds a new one each time.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_NOT_JSON = "must be JSON (dicts, lists, str, int, float, bool, None)"
_HAS_NUL = "must not contain NUL characters (Postgres jsonb cannot store them)"
_HAS_SURROGATE = "must not contain lone surrogates (U+D800 to U+DFFF are not valid UTF-8)"

#: Jobs whose args `encode_args_runs` encodes with one json call (the unit of its checks).
ENCODE_CHUNK = 1000


def encode_args(args: JSONValue, *, field: str = "args") -> str:
    """``args`` as compact JSON text, or a ValueError naming ``field`` and what is not JSON."""
    try:
        text = _ENCODER.encode(args)
    except (TypeError, ValueError) as ex:
        raise ValueError(f"{field} {_NOT_JSON}: {ex}") from None
    except RecursionError:
        raise ValueError(f"{field} {_NOT_JSON}: nested too deep to encode") from None
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise ValueError(f"{field} {_HAS_NUL}")
    if _SURROGATE.search(text):
        raise ValueError(f"{field} {_HAS_SURROGATE}")
    return text


def encode_args_runs(
    values: Sequence[JSONValue], *, task: str, max_bytes: int
) -> list[tuple[int, str]]:
    """The args of many jobs (None meaning ``{}``), validated like `encode_args`.

    Returns runs ``(jobs, text)`` in input order, ``text`` being those jobs' JSON values
    separated by commas. `ENCODE_CHUNK` jobs are encoded by one json call and checked as a
    whole (no NUL escape; at most ``max_bytes`` of UTF-8 in all, so each job is too); only a
    chunk that fails a check is encoded job by job, to name the first bad ``args[i]``.
    """
    runs: list[tuple[int, str]] = []
    for start in range(0, len(values), ENCODE_CHUNK):
        chunk = [{} if v is None else v for v in values[start : start + ENCODE_CHUNK]]
        try:
            text = _ENCODER.encode(chunk)
        except (TypeError, ValueError, RecursionError):
            text = ""
        suspect = (
            not text
            or ("\\u0000" in text and _JSON_NUL.search(text) is not None)
            or _SURROGATE.search(text) is not None
            or (len(text) * 4 > max_bytes and len(text.encode()) > max_bytes)
        )
        if not suspect:
            runs.append((len(chunk), text[1:-1]))
            continue
        for i, value in enumerate(chunk, start):
            one = encode_args(value, field=f"args[{i}]")
            check_payload(one, task=task, max_bytes=max_bytes, where=f"args[{i}]")
            runs.append((1, one))
    return runs


def check_payload(text: str, *, task: str | None, max_bytes: int, where: str = "args") -> None:
    """`PayloadTooLargeError` (naming ``where``, and ``task`` if given) if ``text`` is over
    ``max_bytes`` of UTF-8."""
    if len(text) * 4 <= max_bytes:  # a character is at most 4 bytes of UTF-8
        return
    size = len(text.encode())
    if size > max_bytes:
        of_task = "" if task is None else f" of task {task!r}"
        raise PayloadTooLargeError(
            f"{where}{of_task} are {size} bytes of JSON, over the limit of "
            f"{max_bytes} (max_payload_bytes)"
        )


def args_or_empty(value: JSONValue) -> JSONValue:
    """A job's args as stored: None means ``{}``."""
    return {} if value is None else value


@attrs.frozen(kw_only=True)
class JobSpec:
    """A job to enqueue, validated at construction."""

    task: str = attrs.field(validator=rule(check_task_name))
    args: JSONValue = attrs.field(default=None, converter=args_or_empty)
    queue: str = attrs.field(default="default", validator=rule(check_queue_name, default="default"))
    priority: int = attrs.field(default=0, validator=rule(check_priority, default=0))
    run_at: dt.datetime | None = attrs.field(
        default=None, validator=rule(check_aware, default=None)
    )
    delay: dt.timedelta = attrs.field(default=None, converter=to_delay)
    #: The deadline to start (``docs/flow-control.md``, "Deadlines to start"): a job not
    #: started by then is dead-lettered, never run late. A datetime, or a timedelta from the
    #: database's clock at the insert (as ``delay``); None: none.
    start_by: dt.datetime | dt.timedelta | None = attrs.field(
        default=None, converter=to_start_by
    )
    #: None (the default): the task's, resolved by the worker that claims the job (its
    #: `trioq.Task`'s ``max_attempts``, or `DEFAULT_MAX_ATTEMPTS` for a task it does not know).
    max_attempts: int | None = attrs.field(
        default=None, validator=rule(check_chosen_max_attempts, default=None)
    )
    #: An explicit deduplication key, scoped by task; with ``unique=True`` and no key, the
    #: fingerprint of task, queue and canonical args is used; ``unique=trioq.Unique(...)``
    #: chooses what counts (see `trioq.Unique`).
    dedup_key: str | None = attrs.field(
        default=None, validator=rule(check_dedup_key, default=None)
    )
    unique: bool | Unique = attrs.field(
        default=False, validator=rule(_check_unique, default=False)
    )
    #: The job's key for the per-key limits of its queue (``docs/flow-control.md``).
    concurrency_key: str | None = attrs.field(
        default=None, validator=rule(check_dedup_key, default=None)
    )
    #: Ids of jobs it waits for (``docs/workflows.md``): it is ``waiting`` until they end.
    after: tuple[int, ...] = attrs.field(default=(), converter=check_after)
    #: What a dependency that dies or is cancelled does to it: ``cancel`` or ``run``.
    on_dependency_failure: str = attrs.field(
        default="cancel", validator=rule(check_dependency_policy, default="cancel")
    )
    #: One job per burst of enqueues with this job's key, run after the burst with the last
    #: args (``docs/flow-control.md``, "Debounce"): a `trioq.Debounce`, or its period.
    debounce: Debounce | None = attrs.field(default=None, converter=to_debounce)
    #: How many of its worker's slots (and of its queue's global limit) the job occupies
    #: while it runs (``docs/flow-control.md``, "Weighted slots"). None (the default): its
    #: task's, resolved by the worker that claims it (1 until then, and for a task the
    #: worker does not know).
    cost: int | None = attrs.field(
        default=None, validator=rule(check_chosen_cost, default=None)
    )
    #: The job's sequence (``docs/flow-control.md``, "Sequences"): it runs only once every
    #: earlier job of this key has finished, in enqueue order. None: none.
    sequence_key: str | None = attrs.field(
        default=None, validator=rule(check_dedup_key, default=None)
    )
    #: The args as JSON text; computed at construction so bad args fail here.
    args_json: str = attrs.field(init=False)

    #: What the enqueue compares (`uniqueness`), computed at construction so bad options
    #: fail here.
    _uniqueness: UniqueKey | None = attrs.field(init=False, repr=False, eq=False)

    @args_json.default
    def _encode(self) -> str:
        return encode_args(self.args)

    @_uniqueness.default
    def _unique_key(self) -> UniqueKey | None:
        return unique_key(
            task=self.task, queue=self.queue, args=self.args, dedup_key=self.dedup_key,
            unique=self.unique,
        )  # fmt: skip

    def __attrs_post_init__(self) -> None:
        if self.run_at is not None and self.delay:
            raise ValueError("give run_at or delay, not both")
        if self._start_by_too_early():
            raise ValueError(START_BY_BEFORE_RUN_AT)
        if self.after and self._uniqueness is not None:
            raise ValueError(DEPENDANT_NOT_UNIQUE)
        if self.debounce is not None:
            self._check_debounce()
        if self.sequence_key is not None and (self.after or self._uniqueness is not None):
            raise ValueError(SEQUENTIAL_ALONE)

    def _check_debounce(self) -> None:
        found = self._uniqueness
        if found is None or found.windowed:
            raise ValueError(DEBOUNCE_NEEDS_KEY)
        if self.run_at is not None or self.delay:
            raise ValueError("debounce sets the run time (the period after the last enqueue): "
                             "give no run_at or delay")  # fmt: skip
        if self.start_by is not None:
            raise ValueError("give start_by or debounce, not both (debounce moves the run time)")

    def _start_by_too_early(self) -> bool:
        """Whether ``start_by`` is before the run time, where that needs no clock (both
        times, or both offsets from now); else the database compares them at the insert."""
        start_by = self.start_by
        if isinstance(start_by, dt.datetime) and self.run_at is not None:
            return start_by < self.run_at
        if isinstance(start_by, dt.timedelta) and self.run_at is None:
            return start_by < self.delay
        return False

    @property
    def start_by_at(self) -> dt.datetime | None:
        """``start_by`` when it is a time (the insert's ``%(start_by_at)s``)."""
        return self.start_by if isinstance(self.start_by, dt.datetime) else None

    @property
    def start_by_in(self) -> dt.timedelta | None:
        """``start_by`` when it is an offset from now (the insert's ``%(start_by_in)s``)."""
        return self.start_by if isinstance(self.start_by, dt.timedelta) else None

    def start_by_from(self, now: dt.datetime, run_at: dt.datetime) -> dt.datetime | None:
        """The deadline as a time, ``now`` being the database's clock at the insert and
        ``run_at`` the job's; ValueError when it is before ``run_at``."""
        if self.start_by is None:
            return None
        start_by = self.start_by if isinstance(self.start_by, dt.datetime) else now + self.start_by
        if start_by < run_at:
            raise ValueError(START_BY_BEFORE_RUN_AT)
        return start_by

    @property
    def stored_max_attempts(self) -> int:
        """What the row's ``max_attempts`` holds until a worker claims the job: the chosen
        number, or `DEFAULT_MAX_ATTEMPTS` when the task's is left to the worker."""
        return DEFAULT_MAX_ATTEMPTS if self.max_attempts is None else self.max_attempts

    @property
    def max_attempts_unset(self) -> bool:
        """The row's ``max_attempts_unset``: the worker that claims it applies its task's."""
        return self.max_attempts is None

    def uniqueness(self) -> UniqueKey | None:
        """The key (and window) the enqueue compares, or None (see `trioq._unique`)."""
        return self._uniqueness

    def effective_dedup_key(self) -> str | None:
        """What the unique index sees without a window: the task-scoped explicit key, the
        fingerprint, a `Unique`'s key, or None."""
        found = self.uniqueness()
        return None if found is None else found.key


@attrs.frozen
class EnqueueResult:
    """The job's id; when ``duplicate``, the id of the live twin that was kept instead."""

    job_id: int
    duplicate: bool = False


@attrs.frozen
class Lease:
    """A claimed job's fence: its id and the attempt this worker holds."""

    job_id: int
    attempt: int


@attrs.frozen(kw_only=True)
class Failure:
    """A failed attempt: retried after ``delay`` unless fatal or out of attempts."""

    lease: Lease
    error: str
    traceback: str | None = None
    delay: dt.timedelta = dt.timedelta(0)
    fatal: bool = False
    #: Why it goes to dead_jobs when it does (default: "fatal error" or "attempts exhausted").
    reason: str | None = None


def _column(index: int, name: str) -> Any:
    def get(self: Job) -> Any:
        return self._row[index]

    get.__name__ = name
    return property(get)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICROSECOND = dt.timedelta(microseconds=1)


def _time_column(index: int, name: str) -> Any:
    """A timestamp kept as the claim returned it (int8 µs since the epoch) until read."""

    def get(self: Job) -> dt.datetime:
        value = self._row[index]
        if isinstance(value, dt.datetime):
            return value
        return _EPOCH + dt.timedelta(microseconds=value)

    get.__name__ = name
    return property(get)


class Job:
    """A claimed job, as a worker sees it (immutable).

    Built once per claimed row on the worker's hot path, so it is a thin wrapper
    around the row (one attribute set, ~0.3 µs) rather than an attrs class
    (~3 µs); the attributes are the same and read-only. The times of a claimed
    job are in UTC.
    """

    __slots__ = ("_row",)
    _row: tuple[Any, ...]

    #: The claim's RETURNING columns, in order (`trioq._db.statements`).
    COLUMNS = (
        "id", "queue", "task", "args", "priority", "run_at", "attempt", "max_attempts",
        "enqueued_at", "lease_expires_at",
    )  # fmt: skip

    id: int = _column(0, "id")
    queue: str = _column(1, "queue")
    task: str = _column(2, "task")
    args: JSONValue = _column(3, "args")
    priority: int = _column(4, "priority")
    run_at: dt.datetime = _time_column(5, "run_at")
    attempt: int = _column(6, "attempt")
    max_attempts: int = _column(7, "max_attempts")
    enqueued_at: dt.datetime = _time_column(8, "enqueued_at")
    lease_expires_at: dt.datetime = _time_column(9, "lease_expires_at")

    def __init__(
        self,
        *,
        id: int,
        queue: str,
        task: str,
        args: JSONValue,
        priority: int,
        run_at: dt.datetime,
        attempt: int,
        max_attempts: int,
        enqueued_at: dt.datetime,
        lease_expires_at: dt.datetime,
    ) -> None:
        row = (id, queue, task, args, priority, run_at, attempt, max_attempts, enqueued_at,
               lease_expires_at)  # fmt: skip
        object.__setattr__(self, "_row", row)

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Job:
        """From the claim's RETURNING columns, in `COLUMNS` order (see `trioq._db.statements`).

        ``args`` may be JSON text (the claim returns it so: decoded here; args that
        Python cannot decode become an `UndecodableArgs`, so one bad row never fails
        the claim of the others) and the times int8 microseconds since the Unix
        epoch (converted when read).
        """
        if isinstance(args := row[3], str):
            row = (*row[:3], decode_args(args), *row[4:])
        job = object.__new__(cls)
        object.__setattr__(job, "_row", tuple(row))
        return job

    def with_max_attempts(self, max_attempts: int) -> Job:
        """This job with another ``max_attempts`` (its task's, resolved after the claim)."""
        job = object.__new__(Job)
        object.__setattr__(job, "_row", (*self._row[:7], max_attempts, *self._row[8:]))
        return job

    def with_cost(self, cost: int) -> Job:
        """This job with another ``cost`` (its task's, resolved after the claim)."""
        row = self._row
        job = object.__new__(Job)
        object.__setattr__(job, "_row", (*row[:10], row[10] if len(row) > 10 else None, cost))
        return job

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Job is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Job is immutable: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Job):
            return NotImplemented
        return self._fields() == other._fields()

    def _fields(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.COLUMNS)

    def __hash__(self) -> int:
        return hash((self._row[0], self._row[6]))  # id, attempt: args may be unhashable

    def __repr__(self) -> str:
        pairs = zip(self.COLUMNS, self._fields(), strict=True)
        fields = ", ".join(f"{name}={value!r}" for name, value in pairs)
        return f"Job({fields})"

    @property
    def cost(self) -> int | None:
        """How many of its worker's slots the job occupies (``docs/flow-control.md``,
        "Weighted slots"): its row's cost, or its task's where the enqueue left it to the
        task (resolved by the worker that claimed it); None in a `Job` built by hand. Not
        one of `COLUMNS` (no part of the job's equality)."""
        row = self._row
        return row[11] if len(row) > 11 else None

    @property
    def trace_context(self) -> str | None:
        """The W3C trace context (JSON text) of the span that enqueued the job, if one was
        current (`trioq._worker.tracing`); not one of `COLUMNS` (no part of the job's equality)."""
        row = self._row
        return row[10] if len(row) > 10 else None

    def history_fields(self) -> tuple[str, str, int]:
        """(queue, task, when this attempt was due): ``max(enqueued_at, run_at)`` in µs since
        the epoch. One call, for the job history (`trioq._obs.history`), which reads them once
        per run on the worker's hot path."""
        row = self._row
        run_at, enqueued_at = row[5], row[8]
        if type(run_at) is not int:  # a datetime (a Job built by hand); claims give ints
            run_at = (run_at - _EPOCH) // _MICROSECOND
        if type(enqueued_at) is not int:
            enqueued_at = (enqueued_at - _EPOCH) // _MICROSECOND
        return row[1], row[2], run_at if run_at > enqueued_at else enqueued_at

    @property
    def kwargs(self) -> Mapping[str, Any]:
        """``args`` when it is an object (handlers take it as keyword arguments)."""
        return self.args if isinstance(self.args, dict) else {}


#: The columns of a claimed job's row, by name and in order: `Job.COLUMNS`, then the trace
#: context. The claim returns them by these names (``trioq/_db/sql/common.py``).
CLAIMED_COLUMNS = (*Job.COLUMNS, "trace_context", "cost")
_TRACE_CONTEXT = CLAIMED_COLUMNS.index("trace_context")
