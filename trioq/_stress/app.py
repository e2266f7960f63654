"""The stress workload, served by each worker process of `trioq stress`::

    trioq serve --app trioq._stress.app:config

`trioq stress` starts the workers with their settings in ``TRIOQ_STRESS_*`` environment
variables (see `ENV`); run by hand, the defaults below apply. The one task sleeps
``work_ms`` (synthetic work), then writes its ledger row in the job's own transaction
(``job.transaction()``; see ``TRIOQ_STRESS_TRANSACTIONS`` for the other ways),
which also completes the job: exactly-once effects.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

import trio

from .._config import Config, QueueConfig
from .._context import JobContext
from .._registry import Registry
from .._retry import Constant
from .ledger import statements
from .load import MAX_ATTEMPTS, QUEUE, RETRY_DELAY, TASK

__all__ = ["ENV", "config", "tasks"]

#: Environment variable -> default, as `trioq stress` sets them.
ENV = {
    "TRIOQ_STRESS_SCHEMA": "trioq_stress",
    "TRIOQ_STRESS_CONCURRENCY": "50",
    "TRIOQ_STRESS_POOL_SIZE": "8",
    "TRIOQ_STRESS_APP_POOL_SIZE": "10",
    "TRIOQ_STRESS_LEASE": "30",
    "TRIOQ_STRESS_HEARTBEAT": "5",
    "TRIOQ_STRESS_SWEEP": "5",
    "TRIOQ_STRESS_POLL": "0.5",
    "TRIOQ_STRESS_GRACE": "5",
    "TRIOQ_STRESS_TRANSACTIONS": "own",
}


def _setting(name: str) -> str:
    return os.environ.get(name) or ENV[name]


T = TypeVar("T")


def _parsed(name: str, kind: Callable[[str], T], what: str) -> T:
    """The setting ``name`` as ``kind``, or a ValueError saying it must be ``what``."""
    text = _setting(name)
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{name} must be {what}, got {text!r}") from None


def _number(name: str) -> float:
    return _parsed(name, float, "a number of seconds")


def _integer(name: str) -> int:
    return _parsed(name, int, "an integer")


_SCHEMA = _setting("TRIOQ_STRESS_SCHEMA")
#: ``own``: the ledger row in the job's own transaction (``job.transaction()``); ``shared``:
#: in a shared transaction (``job.transaction(shared=True)``); ``one``: the row's statement
#: given to ``job.complete_with()``; ``one-shared``: to ``complete_with(..., shared=True)``.
#: All commit the row with the job's completion.
_MODE = _setting("TRIOQ_STRESS_TRANSACTIONS")
_SHARED = _MODE in ("shared", "one-shared")
_ONE = _MODE.startswith("one")
_LEDGER = statements(_SCHEMA)

tasks = Registry()


@tasks.task(name=TASK, queue=QUEUE, max_attempts=MAX_ATTEMPTS, retry=Constant(seconds=RETRY_DELAY))
async def stress(job: JobContext, work_ms: float = 0, seq: int = 0, pad: str = "") -> None:
    """Synthetic work, then the ledger row and the completion in one transaction."""
    started = time.monotonic()
    if work_ms > 0:
        await trio.sleep(work_ms / 1000)
    record = _LEDGER.record_rerun if job.attempt > 1 else _LEDGER.record
    params = {
        "id": job.id,
        "attempt": job.attempt,
        "pid": os.getpid(),
        "elapsed": time.monotonic() - started,
        "run_at": job.job.run_at,
        "enqueued_at": job.enqueued_at,
    }
    if _ONE:
        await job.complete_with(record, params, shared=_SHARED)
        return
    async with job.transaction(shared=_SHARED) as conn:
        await conn.execute(record, params)


config = Config(
    registry=tasks,
    schema=_SCHEMA,
    queues={QUEUE: QueueConfig(concurrency=_integer("TRIOQ_STRESS_CONCURRENCY"))},
    pool_size=_integer("TRIOQ_STRESS_POOL_SIZE"),
    app_pool_size=_integer("TRIOQ_STRESS_APP_POOL_SIZE"),
    lease=_number("TRIOQ_STRESS_LEASE"),
    heartbeat_interval=_number("TRIOQ_STRESS_HEARTBEAT"),
    sweep_interval=_number("TRIOQ_STRESS_SWEEP"),
    poll_interval=_number("TRIOQ_STRESS_POLL"),
    shutdown_grace=_number("TRIOQ_STRESS_GRACE"),
)
