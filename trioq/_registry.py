"""Tasks: named handlers with their queue, timeout, attempts and retry policy.

A `Registry` collects tasks with a decorator::

    tasks = trioq.Registry()

    @tasks.task(queue="email", max_attempts=5, timeout=30)
    async def send_welcome(job: trioq.JobContext, user_id: int) -> None: ...

A task may also say how its jobs are deduplicated (``unique=trioq.Unique(...)``) and which
concurrency key they carry (``concurrency_key="customer_id"``: derived from the args);
`Task.enqueue` applies both (``docs/flow-control.md``).

Async handlers run in the trio loop; sync handlers run in a worker thread
(bounded by ``Config.sync_threads``). A handler is called with the job context
and the job's args as keyword arguments (args that are not a JSON object are
passed as one positional argument).
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, overload

import attrs

from ._enqueue import DEFAULT_QUEUE
from ._hooks import EventCallback, Hooks, Middleware, check_kind
from ._job import (
    DEFAULT_MAX_ATTEMPTS,
    SEQUENTIAL_ALONE,
    EnqueueResult,
    JobSpec,
    JSONValue,
    check_cost,
    check_max_attempts,
    check_queue_name,
    check_task_name,
)
from ._pg.conn import Conn
from ._retry import RetryPolicy, Sidekiq
from ._rules import positive_or_none
from ._unique import Debounce, Unique, check_dedup_key

__all__ = ["KeyFrom", "Registry", "Task"]

Handler = Callable[..., Any]
#: How a task derives its jobs' concurrency key from their args: the name of a field, the
#: names of several, or a function of the args returning the key (or None: no key).
KeyFrom = str | Sequence[str] | Callable[[JSONValue], "str | None"]


def _key_from(value: object, what: str = "concurrency_key") -> KeyFrom | None:
    if value is None or callable(value) or isinstance(value, str):
        return value
    if isinstance(value, Sequence) and value and all(isinstance(f, str) and f for f in value):
        return tuple(value)
    raise TypeError(
        f"{what} must be a field name, a sequence of field names or a function of "
        f"the args, got {value!r}"
    )


def _sequential(value: object) -> KeyFrom | bool | None:
    """A task's ``sequential``: True (one sequence for the task), a key derivation like
    ``concurrency_key``'s (a sequence per key), or None / False (none)."""
    if value is None or value is False:
        return None
    if value is True:
        return True
    try:
        return _key_from(value)
    except TypeError:
        raise TypeError(f"sequential must be True, a field name, a sequence of field names or "
                        f"a function of the args, got {value!r}") from None


def derive_key(
    key_from: KeyFrom, args: JSONValue, task: str, what: str = "concurrency_key"
) -> str | None:
    """The concurrency key of a job of ``task`` with ``args``: ``field=value`` for each
    named field (values as JSON), or what the function returns (checked like any key).
    ``what``: the option that derives it, in errors (``sequential`` derives the same way)."""
    if callable(key_from):
        return check_dedup_key(key_from(args), f"task {task!r}: {what}() result")
    fields = (key_from,) if isinstance(key_from, str) else tuple(key_from)
    if not isinstance(args, Mapping):
        raise ValueError(f"task {task!r}: {what} from {list(fields)} needs args that "
                         f"are a JSON object, got {args!r}")  # fmt: skip
    missing = [f for f in fields if f not in args]
    if missing:
        raise ValueError(f"task {task!r}: {what} field(s) {missing} missing from args")
    parts = [f"{f}={json.dumps(args[f], sort_keys=True, ensure_ascii=False)}" for f in fields]
    return check_dedup_key(",".join(parts), f"task {task!r}: {what}")


def _check_unique(value: object) -> None:
    if value is not None and not isinstance(value, Unique):
        raise TypeError(f"unique must be a trioq.Unique or None, got {value!r}")


def _timeout(value: float | dt.timedelta | None) -> float | None:
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return value


def _check_timeout(value: float | None) -> None:
    positive_or_none(value, "timeout")


def _check_parameters(name: str, fn: Handler) -> None:
    """Refuse a handler that cannot take the job context as its first argument (every
    run would fail), and one whose other parameters include an option name of
    `Task.enqueue`, where ``send.enqueue(conn, delay=5)`` would silently mean the option."""
    try:
        every = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read (some builtins): nothing to refuse
        return
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                  inspect.Parameter.VAR_POSITIONAL)  # fmt: skip
    if not every or every[0].kind not in positional:
        raise TypeError(
            f"task {name!r}: the handler must take the job context as its first positional "
            f"parameter, e.g. `async def {name}(job, **args)`; it takes "
            f"({', '.join(str(p) for p in every)})"
        )
    parameters = every[1:]
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    clash = sorted(p.name for p in parameters if p.kind in kinds and p.name in ENQUEUE_OPTIONS)
    if clash:
        raise ValueError(
            f"task {name!r}: handler parameter {clash[0]!r} has the name of an option of "
            f"Task.enqueue ({', '.join(sorted(ENQUEUE_OPTIONS))}), so "
            f"`{name}.enqueue(conn, {clash[0]}=...)` would set the option, not the argument: "
            "rename the parameter"
        )


def _check_retry(value: object) -> None:
    if not callable(getattr(value, "delay", None)):
        raise TypeError(
            f"retry must be a retry policy (trioq.retry.Sidekiq, Constant, Linear, Exponential "
            f"or any object with delay(attempt) -> timedelta), got {value!r}"
        )


@attrs.frozen(kw_only=True)
class Task:
    """A registered handler. Calling it calls the handler (handy in tests)."""

    name: str
    fn: Handler = attrs.field(repr=False)
    queue: str = "default"
    timeout: float | None = attrs.field(default=None, converter=_timeout)  # seconds; None: none
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry: RetryPolicy = attrs.field(factory=Sidekiq)
    keep_result: bool = False  # keep the row as 'done' with the handler's JSON result
    #: How `enqueue` deduplicates this task's jobs (None: it does not, unless asked).
    unique: Unique | None = None
    #: How `enqueue` derives a job's concurrency key from its args (`KeyFrom`).
    concurrency_key: KeyFrom | None = attrs.field(default=None, converter=_key_from)
    #: How many of its worker's slots (and of its queue's global limit) each of its jobs
    #: occupies while it runs (``docs/flow-control.md``, "Weighted slots"): 1 to 1000.
    cost: int = 1
    #: Strict FIFO (``docs/flow-control.md``, "Sequences"): True runs the task's jobs one at a
    #: time in enqueue order; a field name, names or a function of the args (as
    #: ``concurrency_key``) does so per key. None: no sequence.
    sequential: KeyFrom | bool | None = attrs.field(default=None, converter=_sequential)
    #: Whether the handler is a coroutine function (run in the loop) or sync (in a thread).
    is_async: bool = attrs.field(init=False)
    #: The handler's signature (None: it has none to read, as some builtins).
    _signature: inspect.Signature | None = attrs.field(init=False, repr=False, eq=False)

    @_signature.default
    def _read_signature(self) -> inspect.Signature | None:
        try:
            return inspect.signature(self.fn)
        except (TypeError, ValueError):
            return None

    @is_async.default
    def _is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def misfit(self, args: object) -> str | None:
        """Why the handler cannot be called with ``args`` as its one positional argument
        after the job context (what args that are not a JSON object are passed as); None if
        it can, or if it has no signature to tell."""
        if self._signature is None:
            return None
        try:
            self._signature.bind(None, args)
        except TypeError as ex:
            shown = f"{self.name}{self._signature}"
            return f"cannot be its one positional argument after the job: {shown}: {ex}"
        return None

    def __attrs_post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"task {self.name!r}: handler must be callable, got {self.fn!r}")
        check_task_name(self.name, "task name")
        check_queue_name(self.queue)
        _check_timeout(self.timeout)
        check_max_attempts(self.max_attempts)
        check_cost(self.cost, f"task {self.name!r}: cost")
        if self.sequential is not None and self.unique is not None:
            raise ValueError(f"task {self.name!r}: {SEQUENTIAL_ALONE}")
        _check_retry(self.retry)
        _check_parameters(self.name, self.fn)
        _check_unique(self.unique)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def spec(self, args: JSONValue = None, /, **kwargs: Any) -> JobSpec:
        """A `JobSpec` of this task on its queue, with its ``max_attempts``, cost and derived
        concurrency key, for `trioq.Workflow`, `trioq.Batch` and ``enqueue_many``: args
        positionally or as keywords (``resize.spec(size=64)``). Its ``unique`` is not
        applied (jobs of workflows and batches cannot be unique)."""
        if kwargs and args is not None:
            raise TypeError("give args or keyword arguments, not both")
        payload = kwargs or args
        key = None
        if self.concurrency_key is not None:
            key = derive_key(self.concurrency_key, payload, self.name)
        return JobSpec(task=self.name, args=payload, queue=self.queue,
                       max_attempts=self.max_attempts, concurrency_key=key,
                       cost=self.stored_cost,
                       sequence_key=self.sequence_of(payload))  # fmt: skip

    def sequence_of(self, args: JSONValue) -> str | None:
        """The sequence of this task's job with ``args`` (its ``sequential``): the task's
        name, or ``name|key`` for a key derived from the args; None: none."""
        sequential = self.sequential
        if sequential is None or sequential is False:
            return None
        if sequential is True:
            return self.name
        key = derive_key(sequential, args, self.name, "sequential")
        return check_dedup_key(f"{self.name}|{key}", f"task {self.name!r}: sequential key")

    @property
    def stored_cost(self) -> int | None:
        """The cost its enqueues write: its ``cost``, or None (left to the task, which is 1
        then) for the default, so that jobs of cost-1 tasks are written as before (COPY)."""
        return None if self.cost == 1 else self.cost

    async def enqueue(
        self,
        conn: Conn,
        args: JSONValue = None,
        *,
        priority: int = 0,
        run_at: dt.datetime | None = None,
        delay: dt.timedelta | float | None = None,
        start_by: dt.datetime | dt.timedelta | float | None = None,
        dedup_key: str | None = None,
        unique: bool | Unique | None = None,
        concurrency_key: str | None = None,
        debounce: Debounce | dt.timedelta | float | None = None,
        **kwargs: Any,
    ) -> EnqueueResult:
        """Enqueue this task on its queue: ``await send.enqueue(conn, user_id=1)``.

        The task's ``unique`` applies unless ``unique`` or ``dedup_key`` is given; its
        ``concurrency_key`` derives the key from the args unless one is given; its ``cost``
        is the job's (another cost for one job: ``trioq.enqueue(..., cost=)``; a handler
        parameter may be called ``cost``, so this method takes no such option).
        """
        if kwargs and args is not None:
            raise TypeError("give args or keyword arguments, not both")
        payload = kwargs or args
        if unique is None:
            unique = self.unique if self.unique is not None and dedup_key is None else False
        if concurrency_key is None and self.concurrency_key is not None:
            concurrency_key = derive_key(self.concurrency_key, payload, self.name)
        return await DEFAULT_QUEUE.enqueue(
            conn, self.name, payload, queue=self.queue, priority=priority, run_at=run_at,
            delay=delay, start_by=start_by, max_attempts=self.max_attempts, dedup_key=dedup_key,
            unique=unique, concurrency_key=concurrency_key, debounce=debounce,
            cost=self.stored_cost, sequence_key=self.sequence_of(payload),
        )  # fmt: skip


class Registry:
    """A set of tasks by name. Build it at import time; the runtime reads it."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}
        #: Middleware and event callbacks (`trioq._hooks`): `middleware`, `on`.
        self.hooks = Hooks()

    def middleware(self, fn: Middleware) -> Middleware:
        """Register ``async def fn(job, call_next)`` around every execution of this registry's
        tasks (the first registered is the outermost): ``@tasks.middleware``. See
        ``docs/observability.md#middleware`` for what a middleware may do."""
        self.hooks.add_middleware(fn)
        return fn

    def on(self, kind: str) -> Callable[[EventCallback], EventCallback]:
        """Register ``async def fn(event: trioq.JobEvent)`` for one kind of event:
        ``@tasks.on("dead")``. Kinds: retried, dead, cancelled, lease_lost, unknown_task."""
        check_kind(kind)

        def register(fn: EventCallback) -> EventCallback:
            self.hooks.add_callback(kind, fn)
            return fn

        return register

    @overload
    def task(self, fn: Handler, /) -> Task: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        timeout: float | dt.timedelta | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        retry: RetryPolicy | None = None,
        keep_result: bool = False,
        unique: Unique | None = None,
        concurrency_key: KeyFrom | None = None,
        cost: int = 1,
        sequential: KeyFrom | bool | None = None,
    ) -> Callable[[Handler], Task]: ...

    def task(
        self,
        fn: Handler | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        timeout: float | dt.timedelta | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        retry: RetryPolicy | None = None,
        keep_result: bool = False,
        unique: Unique | None = None,
        concurrency_key: KeyFrom | None = None,
        cost: int = 1,
        sequential: KeyFrom | bool | None = None,
    ) -> Task | Callable[[Handler], Task]:
        """Register a handler: ``@tasks.task`` or ``@tasks.task(queue=..., ...)``."""

        if name is not None and not name:
            raise ValueError("task name must not be empty (omit name= to use the function's)")

        def register(handler: Handler) -> Task:
            if not callable(handler):
                raise TypeError(f"@task must decorate a callable, got {handler!r}")
            task = Task(
                name=handler.__name__ if name is None else name,
                fn=handler,
                queue=queue,
                timeout=timeout,
                max_attempts=max_attempts,
                retry=retry or Sidekiq(),
                keep_result=keep_result,
                unique=unique,
                concurrency_key=concurrency_key,
                cost=cost,
                sequential=sequential,
            )
            self.add(task)
            return task

        return register if fn is None else register(fn)

    def add(self, task: Task) -> None:
        if task.name in self._tasks:
            raise ValueError(f"task {task.name!r} is already registered")
        self._tasks[task.name] = task

    def get(self, name: str) -> Task | None:
        return self._tasks.get(name)

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks.values())

    def __len__(self) -> int:
        return len(self._tasks)

    def queues(self) -> Mapping[str, list[str]]:
        """Queue name -> names of the tasks that run there."""
        out: dict[str, list[str]] = {}
        for task in self._tasks.values():
            out.setdefault(task.queue, []).append(task.name)
        return out


#: The names `Task.enqueue` takes for itself (read from its signature, so a new option is
#: covered): a handler parameter of one of these names could never be given as a keyword
#: argument there (it would be taken as the option).
ENQUEUE_OPTIONS = frozenset(inspect.signature(Task.enqueue).parameters) - {"self", "kwargs"}
