"""Prototypes of changes to trioq's runtime, to measure before anyone edits trioq/.

`apply` monkeypatches `trioq._runtime.Runtime` inside the benchmark worker process only
(``trioq_worker.py drain --prototype NAME[,NAME]``); nothing under trioq/ changes. They are
sketches that keep the drain path's semantics (fenced outcomes, held leases heartbeated,
bounded memory), not finished code: shutdown of prefetched jobs, for one, is left out (a
prefetched job still waiting at shutdown keeps its lease until it expires).

* ``early-slot``: a job's slot is freed when its handler returns, before its outcome is handed
  to the completer. Today the slot stays taken while the job task waits for room in the
  completer's channel (capacity = concurrency), so the next claim cannot start while the
  completer writes: claim and complete alternate. Held leases stay bounded: the fetcher
  claims at most ``2 x concurrency - held``.
* ``pipeline``: a fetcher that keeps one claim ahead (a prefetch buffer of ``concurrency``
  jobs in a memory channel, refilled when half empty) and ``concurrency`` long-lived slot
  tasks that take jobs from it, instead of one new trio task per job started only when a
  slot is free. Claims, handler runs and completes overlap; no task is spawned per job.
  Implies ``early-slot``.
* ``lean``: per-job overhead in ``_execute``/``_call``/``_invoke``: no
  ``trio.move_on_after(math.inf)`` cancel scope when the task has no timeout, and
  ``inspect.iscoroutinefunction`` once per task instead of once per job.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import math
from typing import Any

import trio

from trioq._job import Job, encode_args
from trioq._outcome import Kind, Outcome
from trioq._queue import Lease
from trioq._registry import Task
from trioq._runtime import (
    RECONNECT_MAX,
    RECONNECT_MIN,
    Runtime,
    _failure,
    _outcome_of_error,
    _QueueState,
    _Running,
    logger,
)

NAMES = ("early-slot", "pipeline", "lean")


def apply(names: list[str]) -> None:
    unknown = set(names) - set(NAMES)
    if unknown:
        raise SystemExit(f"unknown prototypes {sorted(unknown)}; known: {NAMES}")
    if "pipeline" in names:
        Runtime._fetch_loop = _pipeline_fetch_loop  # type: ignore[method-assign]
    elif "early-slot" in names:
        Runtime._fetch_loop = _early_fetch_loop  # type: ignore[method-assign]
        Runtime._run_job = _early_run_job  # type: ignore[method-assign]
        Runtime._written = _early_written  # type: ignore[method-assign]
    if "lean" in names:
        Runtime._call = _lean_call  # type: ignore[method-assign]
        Runtime._invoke = _lean_invoke  # type: ignore[method-assign]


# -- early-slot ---------------------------------------------------------------------------------


async def _early_fetch_loop(self: Runtime, state: _QueueState, jobs: trio.Nursery) -> None:
    backoff = RECONNECT_MIN
    limit = 2 * state.config.concurrency  # running + waiting for the completer
    while True:
        wanted = min(state.free, limit - len(self._held))
        if wanted <= 0:
            await state.slot_freed.wait()
            continue
        try:
            claimed = await self._claim(state, wanted)
        except Exception as ex:
            logger.warning("claiming from queue %r failed: %s", state.name, ex)
            await trio.sleep(backoff)
            backoff = min(backoff * 2, RECONNECT_MAX)
            continue
        backoff = RECONNECT_MIN
        for job in claimed:
            state.active += 1
            running = _Running(job)
            self._held[Lease(job.id, job.attempt)] = running
            jobs.start_soon(self._run_job, state, running)
        if len(claimed) < wanted:
            with trio.move_on_after(self.config.poll_interval):
                await state.wakeup.wait()


_original_written = Runtime._written


def _early_written(self: Runtime, batch: Any) -> None:
    """Written outcomes release held leases: a fetcher waiting for that may claim again."""
    _original_written(self, batch)
    for state in self._queues.values():
        state.slot_freed.set()


async def _early_run_job(self: Runtime, state: _QueueState, running: _Running) -> None:
    try:
        outcome = await self._execute(running)
    finally:
        state.active -= 1
        state.slot_freed.set()
        self._job_finished.set()
    await self._completer.submit(outcome)


# -- pipeline -----------------------------------------------------------------------------------


async def _pipeline_fetch_loop(self: Runtime, state: _QueueState, jobs: trio.Nursery) -> None:
    concurrency = state.config.concurrency
    prefetch = concurrency
    send, receive = trio.open_memory_channel[_Running](prefetch)
    taken = trio.Event()
    taken_box = [taken]

    async def slot() -> None:
        async for running in receive:
            taken_box[0].set()
            state.active += 1
            try:
                outcome = await self._execute(running)
            finally:
                state.active -= 1
                self._job_finished.set()
            await self._completer.submit(outcome)

    for _ in range(concurrency):
        jobs.start_soon(slot)
    backoff = RECONNECT_MIN
    lease = dt.timedelta(seconds=self.config.lease)
    async with send:
        while True:
            room = prefetch - send.statistics().current_buffer_used
            if room < max(1, prefetch // 2):
                taken_box[0] = trio.Event()
                await taken_box[0].wait()
                continue
            try:
                async with self.pool.connection() as conn:
                    claimed: list[Job] = await self.queue.claim(
                        conn, state.name, owner=self.config.worker_id, limit=room, lease=lease
                    )
            except Exception as ex:
                logger.warning("claiming from queue %r failed: %s", state.name, ex)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX)
                continue
            backoff = RECONNECT_MIN
            self._claimed += len(claimed)
            for job in claimed:
                running = _Running(job)
                self._held[Lease(job.id, job.attempt)] = running
                send.send_nowait(running)
            if len(claimed) < room:
                with trio.move_on_after(self.config.poll_interval):
                    await state.wakeup.wait()


# -- lean ---------------------------------------------------------------------------------------


async def _lean_call(self: Runtime, task: Task, ctx: Any, lease: Lease) -> Outcome:
    try:
        if task.timeout is None:
            result = await self._invoke(task, ctx)
            timed_out = False
        else:
            with trio.move_on_after(task.timeout or math.inf) as deadline:
                result = await self._invoke(task, ctx)
            timed_out = deadline.cancelled_caught
    except Exception as ex:
        return _outcome_of_error(task, ctx.job, lease, ex)
    if timed_out:
        return _failure(task, lease, f"timeout: handler ran over {task.timeout} s", None)
    if task.keep_result:
        try:
            encode_args(result)
        except ValueError as ex:
            error = f"result of task {task.name!r} is not JSON: {ex}"
            return _failure(task, lease, error, None, fatal=True)
        return Outcome(kind=Kind.KEEP, lease=lease, result=result)
    return Outcome(kind=Kind.COMPLETE, lease=lease)


@functools.cache
def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn)


async def _lean_invoke(self: Runtime, task: Task, ctx: Any) -> Any:
    args = ctx.job.args
    if _is_async(task.fn):
        if isinstance(args, dict):
            return await task.fn(ctx, **args)
        return await task.fn(ctx, args)
    call = (
        functools.partial(task.fn, ctx, **args)
        if isinstance(args, dict)
        else functools.partial(task.fn, ctx, args)
    )
    return await trio.to_thread.run_sync(call, limiter=self._sync_limiter, abandon_on_cancel=True)
