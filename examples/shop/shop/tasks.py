"""The shop's jobs.

- ``place_order`` (not a job) inserts the order and enqueues ``reserve_stock`` in the
  caller's transaction: both commit, or neither.
- ``reserve_stock`` waits (snoozes) while the item is out of stock, then takes a unit and
  enqueues ``charge``, in one transaction with its own completion (exactly once).
- ``charge`` refuses orders over the card limit for good (``FatalError``), fails
  retryably when the (pretend) gateway is down, and enqueues ``send_receipt``.
- ``send_receipt`` keeps its result (the receipt), which the web layer reads with
  ``trioq.result``.
"""

from __future__ import annotations

from typing import Any

import trioq
from trioq.retry import Constant

tasks = trioq.Registry()

CARD_LIMIT_CENTS = 100_000
RESTOCK_CHECK_SECONDS = 3600


class Gateway:
    """The payment gateway; tests switch it off to see retries."""

    up = True


async def place_order(conn: trioq.TrioConnection[Any], customer: str, sku: str, cents: int) -> int:
    async with conn.transaction():
        cur = await conn.execute(
            "INSERT INTO orders (customer, sku, cents) VALUES (%s, %s, %s) RETURNING id",
            (customer, sku, cents),
        )
        row = await cur.fetchone()
        assert row is not None
        order_id: int = row[0]
        await reserve_stock.enqueue(conn, order_id=order_id)
    return order_id


@tasks.task(queue="orders")
async def reserve_stock(job: trioq.JobContext, order_id: int) -> None:
    async with job.transaction() as tx:
        cur = await tx.execute(
            "UPDATE stock SET units = units - 1 FROM orders"
            " WHERE orders.id = %s AND stock.sku = orders.sku AND units > 0 RETURNING units",
            (order_id,),
        )
        if await cur.fetchone() is None:
            job.snooze(RESTOCK_CHECK_SECONDS)  # rolls the transaction back; look again later
        await tx.execute("UPDATE orders SET status = 'reserved' WHERE id = %s", (order_id,))
        await charge.enqueue(tx, order_id=order_id)


@tasks.task(queue="payments", max_attempts=4, retry=Constant(seconds=30))
async def charge(job: trioq.JobContext, order_id: int) -> None:
    async with job.transaction() as tx:
        cur = await tx.execute("SELECT cents FROM orders WHERE id = %s", (order_id,))
        row = await cur.fetchone()
        if row is None or row[0] > CARD_LIMIT_CENTS:
            raise trioq.FatalError(f"order {order_id}: over the card limit")
        if not Gateway.up:
            raise ConnectionError("payment gateway unreachable")
        await tx.execute("UPDATE orders SET status = 'paid' WHERE id = %s", (order_id,))
        await send_receipt.enqueue(tx, order_id=order_id)


@tasks.task(queue="mail", keep_result=True)
async def send_receipt(job: trioq.JobContext, order_id: int) -> dict[str, Any]:
    async with job.connection() as conn:
        cur = await conn.execute("SELECT customer, cents FROM orders WHERE id = %s", (order_id,))
        row = await cur.fetchone()
        assert row is not None
        await conn.execute(
            "INSERT INTO receipts VALUES (%s, %s) ON CONFLICT DO NOTHING", (order_id, job.id)
        )
    customer, cents = row
    return {"to": customer, "subject": f"Receipt {job.id}: {cents / 100:.2f} EUR"}


@tasks.task(queue="mail")
def greeting(job: trioq.JobContext, customer: str) -> str:
    """A sync job that needs no database (unit-tested with trioq.testing.call)."""
    return f"Welcome, {customer}! (job {job.id}, attempt {job.attempt})"
