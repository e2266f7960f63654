"""``POST /orders {"total_cents": 1250, "card": "..."}``: the order and its receipt job
commit together, or (a declined card) neither does.

Run it with ``DATABASE_URL=... uvicorn --factory fastapi_shop.app:create_app``.
"""

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

from trioq import producer


class OrderIn(BaseModel):
    total_cents: int
    card: str


class OrderOut(BaseModel):
    order: int
    job: int


async def transaction(request: Request) -> AsyncIterator[AsyncConnection[Any]]:
    """The request's transaction: it commits when the endpoint returns, and rolls back
    when the endpoint raises (an `HTTPException` too)."""
    pool: AsyncConnectionPool = request.state.pool
    async with pool.connection() as conn:
        yield conn


# scope="function": commit before the response is sent. By default (scope="request") the
# code after `yield` runs after the response has gone, so a client could be told 201 of
# an order that is not committed yet, or never will be.
Transaction = Annotated[AsyncConnection[Any], Depends(transaction, scope="function")]


def charge(card: str, order_id: int) -> None:
    """The payment provider (a stand-in): it declines the card called "declined"."""
    if card == "declined":
        raise HTTPException(status_code=402, detail=f"order {order_id}: card declined")


def create_app(dsn: str | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        conninfo = dsn or os.environ["DATABASE_URL"]
        async with AsyncConnectionPool(conninfo, min_size=1, max_size=4, open=False) as pool:
            yield {"pool": pool}  # request.state.pool

    app = FastAPI(lifespan=lifespan)

    @app.post("/orders", status_code=201)
    async def create_order(order: OrderIn, conn: Transaction) -> OrderOut:
        cur = await conn.execute(
            "INSERT INTO orders (total_cents) VALUES (%s) RETURNING id", (order.total_cents,)
        )
        row = await cur.fetchone()
        assert row is not None
        order_id: int = row[0]
        job = await producer.aenqueue(conn, "send_receipt", {"order_id": order_id})
        charge(order.card, order_id)  # raises after the enqueue: the job rolls back too
        return OrderOut(order=order_id, job=job.job_id)

    return app
