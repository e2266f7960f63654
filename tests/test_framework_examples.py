"""The framework examples (``examples/django_shop``, ``fastapi_shop``, ``quart_trio_shop``)
work as their READMEs say, each against a fresh database: an order posted to the app
commits with the job it enqueued, and a real trio worker runs that job (the job writes its
own id into the order, so the test sees that the very job the request enqueued ran); an
order whose card is declined after the enqueue leaves neither the order nor the job.

Django runs as it is deployed, in processes of its own (``manage.py migrate``, a WSGI
server, ``trioq serve``): Django's settings belong to the process. FastAPI runs on uvicorn
(its asyncio loop in a thread) beside a ``trioq serve`` process; Quart-Trio in its own
test client, in this trio run, with the worker in the app's nursery. A declined order is
posted with no worker claiming (none runs, or its queue is paused), so a job the request
had left behind would still be there to be seen.
"""

from __future__ import annotations

import select
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio
from clitool import ServeProcess, cli_env
from helpers import poll_until, rows, wait_until

import trioq

EXAMPLES = Path(__file__).parent.parent / "examples"
DJANGO = EXAMPLES / "django_shop"
WSGI_SERVER = Path(__file__).parent / "wsgi_server.py"

PLACED = {"total_cents": 1250, "card": "4242"}
DECLINED = {"total_cents": 990, "card": "declined"}


@pytest.fixture(autouse=True)
def examples_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import fastapi_shop``, as ``examples/`` is the directory their READMEs run in."""
    monkeypatch.syspath_prepend(str(EXAMPLES))


def fetch(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


async def migrate(dsn: str, schema: str | None = None) -> None:
    """trioq's tables (``trioq migrate``), and the shop's ``schema``."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        if schema is not None:
            await conn.execute(schema)


def setup(dsn: str, schema: str | None = None) -> None:
    trio.run(migrate, dsn, schema)


def shop_schema(example: str) -> str:
    """The shop's table, as its README creates it (``psql -f schema.sql``)."""
    return (EXAMPLES / example / "schema.sql").read_text()


def wait_for_receipt(dsn: str, order: int, timeout: float = 30) -> int:
    """The id of the job that sent ``order``'s receipt, once one has (bounded)."""

    def receipt() -> int | None:
        found = fetch(dsn, "SELECT receipt_job FROM orders WHERE id = %s", order)
        return found[0][0] if found else None

    poll_until(receipt, timeout=timeout, what=f"the receipt of order {order}")
    job = receipt()
    assert job is not None
    return job


#: The jobs not yet done (a done job's row goes in the transaction that completes it).
JOBS = "SELECT id, task, args FROM trioq.jobs ORDER BY id"


def jobs(dsn: str) -> list[tuple[Any, ...]]:
    return fetch(dsn, JOBS)


def receipt_job(placed: dict[str, int]) -> tuple[Any, ...]:
    """The row of the job a placed order's response names."""
    return (placed["job"], "send_receipt", {"order_id": placed["order"]})


@contextmanager
def worker(dsn: str, app: str, path: Path) -> Iterator[ServeProcess]:
    """``trioq serve --app APP``, importing from ``path`` (started, not waited for: the test
    waits for what its job does); on exit a graceful stop, whose log must hold no error."""
    process = ServeProcess(["--app", app], env=cli_env({"PYTHONPATH": str(path)}, dsn=dsn))
    try:
        yield process
    finally:
        log = process.stop()
    assert "started" in log and " ERROR " not in log and "Traceback" not in log, log


# -- Django -------------------------------------------------------------------------------------


@contextmanager
def django_shop(dsn: str) -> Iterator[str]:
    """The Django shop on a real WSGI server, its tables migrated (``manage.py migrate``):
    its URL."""
    env = cli_env({"DATABASE_URL": dsn, "DJANGO_SETTINGS_MODULE": "django_shop.settings",
                   "PYTHONPATH": str(DJANGO)})  # fmt: skip
    subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"],
                   cwd=DJANGO, env=env, check=True, timeout=60)  # fmt: skip
    server = subprocess.Popen([sys.executable, str(WSGI_SERVER), "django_shop.wsgi:application"],
                              cwd=DJANGO, env=env, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert server.stdout is not None
        ready, _, _ = select.select([server.stdout], [], [], 30)
        port = server.stdout.readline() if ready else ""
        assert port.strip().isdigit(), f"the WSGI server printed no port (exit: {server.poll()})"
        yield f"http://127.0.0.1:{int(port)}"
    finally:
        server.terminate()
        server.communicate(timeout=30)


def test_django_view_commits_the_order_with_its_job_and_the_worker_runs_it(dsn: str) -> None:
    setup(dsn)  # trioq's tables (the shop's are Django's: manage.py migrate)
    with worker(dsn, "orders.tasks:tasks", DJANGO), django_shop(dsn) as url:
        response = httpx.post(f"{url}/orders", json=PLACED, timeout=30)
        assert response.status_code == 201, response.text
        placed = response.json()
        assert wait_for_receipt(dsn, placed["order"]) == placed["job"]
        assert jobs(dsn) == []  # done: deleted in the transaction that wrote the receipt


def test_django_view_declined_after_the_enqueue_leaves_no_order_and_no_job(dsn: str) -> None:
    setup(dsn)
    with django_shop(dsn) as url:
        declined = httpx.post(f"{url}/orders", json=DECLINED, timeout=30)
        assert declined.status_code == 402, declined.text
        assert fetch(dsn, "SELECT * FROM orders") == []
        assert jobs(dsn) == []
        # The next request's order and job commit.
        placed = httpx.post(f"{url}/orders", json=PLACED, timeout=30).json()
    assert jobs(dsn) == [receipt_job(placed)]


# -- FastAPI ------------------------------------------------------------------------------------


@contextmanager
def fastapi_shop(dsn: str, seen: list[list[tuple[Any, ...]]]) -> Iterator[str]:
    """The FastAPI shop on uvicorn (its asyncio loop in a thread of this process): its URL.
    ``seen`` gets the counts of orders and jobs committed when each response starts."""
    import uvicorn
    from fastapi_shop.app import create_app
    from starlette.types import Message, Receive, Scope, Send

    app = create_app(dsn)

    async def watched(scope: Scope, receive: Receive, send: Send) -> None:
        async def watching(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen.append(fetch(dsn, "SELECT (SELECT count(*) FROM orders),"
                                       " (SELECT count(*) FROM trioq.jobs)"))  # fmt: skip
            await send(message)

        await app(scope, receive, watching)

    server = uvicorn.Server(uvicorn.Config(watched, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        poll_until(lambda: server.started or not thread.is_alive(), timeout=30, what="uvicorn")
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)


def test_fastapi_endpoint_commits_the_order_with_its_job_and_the_worker_runs_it(
    dsn: str,
) -> None:
    setup(dsn, shop_schema("fastapi_shop"))
    seen: list[list[tuple[Any, ...]]] = []
    with worker(dsn, "fastapi_shop.tasks:tasks", EXAMPLES), fastapi_shop(dsn, seen) as url:
        response = httpx.post(f"{url}/orders", json=PLACED, timeout=30)
        assert response.status_code == 201, response.text
        placed = response.json()
        assert seen == [[(1, 1)]]  # committed before the client was answered
        assert wait_for_receipt(dsn, placed["order"]) == placed["job"]
        assert jobs(dsn) == []  # done: deleted in the transaction that wrote the receipt


def test_fastapi_endpoint_declined_after_the_enqueue_leaves_no_order_and_no_job(
    dsn: str,
) -> None:
    setup(dsn, shop_schema("fastapi_shop"))
    with fastapi_shop(dsn, []) as url:
        declined = httpx.post(f"{url}/orders", json=DECLINED, timeout=30)
        assert declined.status_code == 402, declined.text
        assert fetch(dsn, "SELECT * FROM orders") == []
        assert jobs(dsn) == []
        # The pool's connection is fit for the next request: its order and job commit.
        placed = httpx.post(f"{url}/orders", json=PLACED, timeout=30).json()
    assert jobs(dsn) == [receipt_job(placed)]


# -- Quart-Trio ---------------------------------------------------------------------------------


async def wait_for_receipt_async(conn: Any, order: int) -> int:
    """`wait_for_receipt` in this trio run."""

    async def receipt() -> Any:
        found = await rows(conn, "SELECT receipt_job FROM orders WHERE id = %s", order)
        return found and found[0][0]

    await wait_until(receipt, timeout=30)
    return int(await receipt())


async def test_quart_trio_endpoint_commits_the_order_with_its_job_and_its_worker_runs_it(
    dsn: str,
) -> None:
    from quart_trio_shop.app import create_app

    await migrate(dsn, shop_schema("quart_trio_shop"))
    app = create_app(dsn)
    async with await trioq.connect(dsn, autocommit=True) as conn, app.test_app() as running:
        response = await running.test_client().post("/orders", json=PLACED)
        assert response.status_code == 201, await response.get_data(as_text=True)
        placed = await response.get_json()
        assert await wait_for_receipt_async(conn, placed["order"]) == placed["job"]
        assert await rows(conn, JOBS) == []  # done: deleted with the receipt's commit


async def test_quart_trio_endpoint_declined_after_the_enqueue_leaves_no_order_and_no_job(
    dsn: str,
) -> None:
    from quart_trio_shop.app import create_app

    await migrate(dsn, shop_schema("quart_trio_shop"))
    async with await trioq.connect(dsn, autocommit=True) as conn:
        # Paused, the app's worker claims nothing: a job the request left would stay to be seen.
        await trioq.Queue().pause(conn, "default")
        async with create_app(dsn).test_app() as running:
            client = running.test_client()
            declined = await client.post("/orders", json=DECLINED)
            assert declined.status_code == 402, await declined.get_data(as_text=True)
            assert await rows(conn, "SELECT * FROM orders") == []
            assert await rows(conn, JOBS) == []
            # The pool's connection is fit for the next request: its order and job commit.
            placed = await (await client.post("/orders", json=PLACED)).get_json()
            assert await rows(conn, JOBS) == [receipt_job(placed)]
            await trioq.Queue().resume(conn, "default")
            assert await wait_for_receipt_async(conn, placed["order"]) == placed["job"]
