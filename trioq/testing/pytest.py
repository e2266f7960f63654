"""pytest fixtures for testing code that uses trioq; enable them in your root conftest.py::

    pytest_plugins = ["trioq.testing.pytest"]

- ``trioq_postgres`` (session): a started `trioq.testing.ThrowawayPostgres`;
- ``trioq_dsn``: the DSN of a fresh database, migrated, for one test (dropped after it);
- ``trioq_setup`` (session): override it to return ``setup(dsn)``, run once on the
  template database after trioq's migration (your app's tables), or None (the default).

The fixtures are plain (not async), so they work with pytest-trio, anyio's plugin or
none. ``TRIOQ_TEST_DSN`` (a superuser DSN) uses that server instead of a throwaway one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from ._postgres import ThrowawayPostgres

__all__ = ["trioq_dsn", "trioq_postgres", "trioq_setup"]


@pytest.fixture(scope="session")
def trioq_setup() -> Callable[[str], object] | None:
    """What to run once on the template database (override it); None: nothing."""
    return None


@pytest.fixture(scope="session")
def trioq_postgres(trioq_setup: Callable[[str], object] | None) -> Iterator[ThrowawayPostgres]:
    """The session's Postgres, with a migrated template database."""
    with ThrowawayPostgres(setup=trioq_setup) as postgres:
        yield postgres


@pytest.fixture
def trioq_dsn(trioq_postgres: ThrowawayPostgres) -> Iterator[str]:
    """A fresh migrated database for one test (a copy of the template)."""
    dsn = trioq_postgres.database()
    yield dsn
    trioq_postgres.drop(dsn)
