"""The shop's fixtures: trioq's kit, plus the shop's tables in every test database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest
from shop.schema import SCHEMA
from shop.tasks import Gateway

import trioq

pytest_plugins = ["trioq.testing.pytest"]


@pytest.fixture(scope="session")
def trioq_setup() -> Callable[[str], None]:
    """Runs once, on the template every test's database is copied from."""

    def setup(dsn: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)

    return setup


@pytest.fixture
async def conn(trioq_dsn: str) -> AsyncIterator[trioq.TrioConnection[Any]]:
    async with await trioq.connect(trioq_dsn, autocommit=True) as c:
        await c.execute("INSERT INTO stock VALUES ('mug', 2), ('lamp', 0)")
        yield c


@pytest.fixture(autouse=True)
def gateway_up() -> None:
    Gateway.up = True
