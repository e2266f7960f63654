"""The shop's tests: its jobs run inline with trioq.testing.drain, no worker running."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from shop.tasks import Gateway, charge, greeting, place_order, reserve_stock, send_receipt, tasks

import trioq
import trioq.testing as tt

Conn = trioq.TrioConnection[Any]


async def status_of(conn: Conn, order_id: int) -> str:
    cur = await conn.execute("SELECT status FROM orders WHERE id = %s", (order_id,))
    row = await cur.fetchone()
    assert row is not None
    return str(row[0])


async def test_placing_an_order_enqueues_the_stock_reservation(conn: Conn) -> None:
    order = await place_order(conn, "ada@example.com", "mug", 1250)
    await tt.assert_enqueued(conn, reserve_stock, args={"order_id": order}, count=1)
    await tt.refute_enqueued(conn, charge)  # nothing is charged before stock is reserved


async def test_an_order_goes_all_the_way_to_its_receipt(conn: Conn) -> None:
    order = await place_order(conn, "ada@example.com", "mug", 1250)
    result = await tt.drain(conn, tasks)
    assert [(run.task, run.outcome) for run in result.runs] == [
        ("reserve_stock", "completed"),
        ("charge", "completed"),
        ("send_receipt", "completed"),
    ]
    assert not result.failures
    assert await status_of(conn, order) == "paid"
    (receipt_run,) = [run for run in result.runs if run.task == "send_receipt"]
    receipt = await trioq.result(conn, receipt_run.job_id)
    subject = f"Receipt {receipt_run.job_id}: 12.50 EUR"
    assert receipt == {"to": "ada@example.com", "subject": subject}


async def test_an_order_over_the_card_limit_dies_at_once(conn: Conn) -> None:
    order = await place_order(conn, "bob@example.com", "mug", 250_000)
    result = await tt.drain(conn, tasks)
    (failed,) = result.failures
    assert (failed.task, failed.outcome, failed.attempt) == ("charge", "dead", 1)
    with pytest.raises(trioq.JobDeadError, match="over the card limit"):
        await trioq.result(conn, failed.job_id)
    assert await status_of(conn, order) == "reserved"
    await tt.refute_enqueued(conn, send_receipt)


async def test_a_gateway_outage_is_retried_on_the_clock(conn: Conn) -> None:
    await tt.set_clock(conn, dt.datetime(2030, 6, 1, 9, 0, tzinfo=dt.UTC))
    order = await place_order(conn, "cy@example.com", "mug", 990)
    Gateway.up = False
    first = await tt.drain(conn, tasks)
    assert [(r.task, r.outcome) for r in first.runs][-1] == ("charge", "retried")
    assert first.failures[0].error == "ConnectionError: payment gateway unreachable"
    (waiting,) = await tt.enqueued_jobs(conn, charge)
    assert (waiting.state, waiting.attempt) == ("scheduled", 1)
    assert (await tt.drain(conn, tasks)).runs == ()  # not due for 30 s
    Gateway.up = True
    await tt.advance_clock(conn, 30)
    second = await tt.drain(conn, tasks)
    assert [(r.task, r.attempt, r.outcome) for r in second.runs] == [
        ("charge", 2, "completed"),
        ("send_receipt", 1, "completed"),
    ]
    assert await status_of(conn, order) == "paid"


async def test_an_order_out_of_stock_waits_for_a_restock(conn: Conn) -> None:
    order = await place_order(conn, "di@example.com", "lamp", 4900)
    result = await tt.drain(conn, tasks)
    assert [(r.task, r.outcome) for r in result.runs] == [("reserve_stock", "snoozed")]
    await conn.execute("UPDATE stock SET units = 1 WHERE sku = 'lamp'")
    later = await tt.drain(conn, tasks, advance=True)  # the clock jumps to the next look
    assert [(r.task, r.outcome) for r in later.runs] == [
        ("reserve_stock", "completed"),
        ("charge", "completed"),
        ("send_receipt", "completed"),
    ]
    assert (await tt.enqueued_jobs(conn, states=["done"]))[0].task == "send_receipt"
    assert await status_of(conn, order) == "paid"


async def test_a_test_can_roll_everything_back(conn: Conn) -> None:
    async with conn.transaction(force_rollback=True):
        await place_order(conn, "ed@example.com", "mug", 100)
        assert (await tt.drain(conn, tasks)).completed == 3
    cur = await conn.execute("SELECT (SELECT count(*) FROM orders), count(*) FROM trioq.jobs")
    assert await cur.fetchone() == (0, 0)


async def test_the_receipt_handler_called_directly(conn: Conn) -> None:
    order = await place_order(conn, "fay@example.com", "mug", 500)
    receipt = await tt.call(send_receipt, {"order_id": order}, id=77, conn=conn)
    assert receipt == {"to": "fay@example.com", "subject": "Receipt 77: 5.00 EUR"}


async def test_a_handler_that_needs_no_database() -> None:
    text = await tt.call(greeting, {"customer": "Grace"}, id=5, attempt=2)
    assert text == "Welcome, Grace! (job 5, attempt 2)"
    ctx = tt.job_context(greeting, {"customer": "Grace"}, id=5)
    assert greeting(ctx, customer="Grace").startswith("Welcome, Grace! (job 5")
