"""``POST /orders {"total_cents": 1250, "card": "..."}``: the order and its receipt job
commit together, or (a declined card) neither does. The app is trio all the way: its
requests, trioq's pool, and a worker that runs in the app's own nursery while it serves.

Run it with ``DATABASE_URL=... hypercorn --worker-class trio "quart_trio_shop.app:create_app()"``.
"""

import os
from collections.abc import AsyncGenerator
from typing import Any

from quart import request
from quart_trio import QuartTrio

import trioq
from trioq.pg import Pool

from .tasks import send_receipt, tasks


class PaymentDeclined(Exception):
    pass


def charge(card: str, order_id: int) -> None:
    """The payment provider (a stand-in): it declines the card called "declined"."""
    if card == "declined":
        raise PaymentDeclined(f"order {order_id}: card declined")


def create_app(dsn: str | None = None) -> QuartTrio:
    conninfo = dsn or os.environ["DATABASE_URL"]
    app = QuartTrio(__name__)
    pool = Pool(conninfo, max_size=4)  # opens connections as requests need them

    @app.while_serving
    async def worker() -> AsyncGenerator[None]:
        config = trioq.Config(dsn=conninfo, registry=tasks)
        runtime = await app.nursery.start(trioq.serve, config)  # once it is listening
        yield
        runtime.stop()  # graceful: running jobs finish (Config.shutdown_grace)
        await pool.aclose()

    @app.post("/orders")
    async def create_order() -> tuple[dict[str, Any], int]:
        order = await request.get_json()
        try:
            async with pool.connection() as conn, conn.transaction():
                cur = await conn.execute(
                    "INSERT INTO orders (total_cents) VALUES (%s) RETURNING id",
                    (order["total_cents"],),
                )
                row = await cur.fetchone()
                assert row is not None
                order_id: int = row[0]
                job = await send_receipt.enqueue(conn, order_id=order_id)
                charge(order["card"], order_id)  # raises after the enqueue: the job rolls back too
        except PaymentDeclined:
            return {"error": "card declined"}, 402
        return {"order": order_id, "job": job.job_id}, 201

    return app
