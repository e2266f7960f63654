"""Test harness: trio test runner, one Postgres cluster per session, a database per test.

Async tests run under ``trio.run`` directly (no plugin), and the runner asserts
that no asyncio event loop is running around or inside them. ``TRIOQ_TEST_DSN``
points the suite at an external server instead of the throwaway cluster.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio
from pgcluster import create_database, drop_database, session_cluster

_db_counter = itertools.count()


def _assert_no_asyncio_loop() -> None:
    assert asyncio._get_running_loop() is None, "an asyncio event loop is running"


async def _run_checked(fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    _assert_no_asyncio_loop()
    await fn(**kwargs)
    _assert_no_asyncio_loop()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests with ``trio.run``."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}
    trio.run(functools.partial(_run_checked, pyfuncitem.obj, kwargs))
    return True


@pytest.fixture(scope="session")
def pg_admin_dsn() -> Iterator[str]:
    """A superuser DSN of the session's cluster (or of ``TRIOQ_TEST_DSN``)."""
    with session_cluster() as dsn:
        yield dsn


@pytest.fixture
def dsn(pg_admin_dsn: str) -> Iterator[str]:
    """A fresh, empty database for one test."""
    name = f"trioq_test_{os.getpid()}_{next(_db_counter)}"
    yield create_database(pg_admin_dsn, name)
    drop_database(pg_admin_dsn, name)


@pytest.fixture
def unused_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
