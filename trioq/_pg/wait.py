"""Drive psycopg's I/O generators with trio.

psycopg expresses every network operation as a generator that yields what it
is waiting for (``Wait.R``, ``Wait.W`` or ``Wait.RW``) and is sent back what
became ready. The stock async connection feeds those generators from an
asyncio loop; these functions feed them from trio instead, so no asyncio loop
ever runs.
"""

from __future__ import annotations

import select
import time
from typing import TypeVar

import trio
from psycopg.abc import PQGen, PQGenConn
from psycopg.waiting import Ready, Wait

RV = TypeVar("RV")

_READY_R = Ready.R
_READY_W = Ready.W
_WAIT_R = Wait.R
_WAIT_W = Wait.W

# Longest time a stream of never-blocking writes may hold the scheduler.
_MAX_BUSY = 0.05


def _poll_now(fileno: int, wait: int) -> int:
    """What of ``wait`` is ready on ``fileno`` right now, without blocking."""
    poller = select.poll()
    mask = (select.POLLIN if wait & _WAIT_R else 0) | (select.POLLOUT if wait & _WAIT_W else 0)
    poller.register(fileno, mask)
    ready = 0
    for _fd, events in poller.poll(0):
        if events & (select.POLLIN | select.POLLERR | select.POLLHUP):
            ready |= _READY_R
        if events & (select.POLLOUT | select.POLLERR | select.POLLHUP):
            ready |= _READY_W
    return ready


def readable_now(fileno: int) -> bool:
    """True if ``fileno`` has data (or EOF) to read right now."""
    return bool(_poll_now(fileno, _WAIT_R))


async def _wait_both(fileno: int) -> int:
    """Wait until ``fileno`` is readable or writable (libpq flushing while reading)."""
    ready = _poll_now(fileno, Wait.RW)
    if ready:
        await trio.lowlevel.checkpoint()
        return ready
    result = 0

    async def wait_one(waiter: object, flag: int, cancel: trio.CancelScope) -> None:
        nonlocal result
        await waiter(fileno)  # type: ignore[operator]
        result |= flag
        cancel.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_one, trio.lowlevel.wait_readable, _READY_R, nursery.cancel_scope)
        nursery.start_soon(wait_one, trio.lowlevel.wait_writable, _READY_W, nursery.cancel_scope)
    return result


async def wait_fd(fileno: int, wait: int) -> int:
    """Block until ``fileno`` is ready for ``wait``; return a ``Ready`` mask."""
    if wait == _WAIT_R:
        await trio.lowlevel.wait_readable(fileno)
        return _READY_R
    if wait == _WAIT_W:
        await trio.lowlevel.wait_writable(fileno)
        return _READY_W
    return await _wait_both(fileno)


async def wait_gen(gen: PQGen[RV], fileno: int) -> RV:
    """Run a connection-bound generator to completion, waiting on ``fileno``.

    Writes are attempted with a zero-timeout poll first: a socket asked for
    writing is nearly always writable, and pipeline mode and COPY would pay a
    scheduler round trip at every flush otherwise.
    """
    try:
        wait = next(gen)
        busy_since = time.monotonic()
        while True:
            ready = _poll_now(fileno, wait) if wait & _WAIT_W else 0
            if ready and time.monotonic() - busy_since > _MAX_BUSY:
                await trio.lowlevel.checkpoint()
                ready = 0
            if not ready:
                ready = await wait_fd(fileno, wait)
                busy_since = time.monotonic()
            wait = gen.send(ready)
    except StopIteration as ex:
        rv: RV = ex.value
        return rv


async def wait_conn_gen(gen: PQGenConn[RV]) -> RV:
    """Run a generator whose file descriptor may change (connect, cancel)."""
    try:
        fileno, wait = next(gen)
        while True:
            ready = await wait_fd(fileno, wait)
            fileno, wait = gen.send(ready)
    except StopIteration as ex:
        rv: RV = ex.value
        return rv
    finally:
        # An abandoned connect generator owns a half-open PGconn: close the
        # generator now so its socket is released at once, not at GC time.
        gen.close()
