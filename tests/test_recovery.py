"""Prompt cancels, connection timeouts and a supervisor that gives up (issue #10).

Real workers and real processes against real Postgres (and, for the timeout, a TCP
endpoint that accepts connections and never answers).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from clitool import TESTS, cli_env, trioq_cli
from helpers import Counter, rows, serving, wait_until

import trioq

#: The library's own timings: a cancel that waited for the heartbeat would take up to 5 s.
DEFAULTS: dict[str, Any] = {
    "lease": 30,
    "heartbeat_interval": 5,
    "poll_interval": 2,
    "sweep_interval": 5,
}


async def test_a_running_async_handler_is_cancelled_within_a_fraction_of_a_second(
    dsn: str,
) -> None:
    started = Counter()
    stopped: list[float] = []
    tasks = trioq.Registry()

    @tasks.task
    async def forever(job: trioq.JobContext) -> None:
        started.hit()
        try:
            await trio.sleep_forever()
        finally:
            stopped.append(trio.current_time())

    async with serving(dsn, tasks, **DEFAULTS) as (conn, _runtime):
        job = await trioq.enqueue(conn, "forever")
        await started.wait_for(1)
        asked = trio.current_time()
        assert (await trioq.Queue().cancel(conn, job.job_id)).status == "requested"

        async def cancelled() -> bool:
            state = await rows(conn, "SELECT state FROM trioq.jobs WHERE id = %s", job.job_id)
            return state == [("cancelled",)]

        await wait_until(cancelled, timeout=4)  # less than one heartbeat interval
    took = stopped[0] - asked
    print(f"\nhandler stopped {took * 1000:.1f} ms after the cancel")
    assert took < 1.0


async def test_a_running_sync_handlers_job_is_marked_cancelled_at_once(dsn: str) -> None:
    release = threading.Event()
    started = Counter()
    tasks = trioq.Registry()

    @tasks.task
    def blocking(job: trioq.JobContext) -> None:
        trio.from_thread.run_sync(started.hit)
        release.wait(30)

    try:
        async with serving(dsn, tasks, **DEFAULTS) as (conn, _runtime):
            job = await trioq.enqueue(conn, "blocking")
            await started.wait_for(1)
            asked = trio.current_time()
            await trioq.Queue().cancel(conn, job.job_id)

            async def cancelled() -> bool:
                state = await rows(conn, "SELECT state FROM trioq.jobs WHERE id = %s",
                                   job.job_id)  # fmt: skip
                return state == [("cancelled",)]

            await wait_until(cancelled, timeout=4)
            took = trio.current_time() - asked
            print(f"\nmarked cancelled {took * 1000:.1f} ms after the cancel")
            assert took < 1.0 and not release.is_set()  # its thread still runs
            release.set()
    finally:
        release.set()


@pytest.fixture
def silent_endpoint() -> Iterator[int]:
    """A TCP port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield int(server.getsockname()[1])


def test_a_server_that_never_answers_is_given_up_on_by_default(silent_endpoint: int) -> None:
    """No ``connect_timeout`` in the DSN: trioq's default (10 s) applies, not libpq's
    (which waits for ever) or psycopg's (130 s)."""
    started = time.monotonic()
    out = trioq_cli("status", "--dsn", f"postgresql://app@127.0.0.1:{silent_endpoint}/app",
                    timeout=60)  # fmt: skip
    took = time.monotonic() - started
    assert out.returncode == 1, out.stdout
    assert "connection timeout expired after 10" in out.stderr, out.stderr
    assert 9 < took < 30, took


def test_serve_processes_gives_up_on_a_worker_that_keeps_dying(unused_port: int) -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "trioq._cli", "serve", "--app", "serve_app:config",
         "--processes", "2", "--dsn", f"postgresql://nobody@127.0.0.1:{unused_port}/x"],
        capture_output=True, text=True, env=cli_env(), cwd=TESTS, timeout=120, check=False,
    )  # fmt: skip
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("trioq: error: worker ") and "5 times in a row: giving up" in last
    assert "restarting in 1 s" in proc.stderr and "restarting in 8 s" in proc.stderr
    assert "restarting in 16 s" not in proc.stderr
    assert took < 45, took
