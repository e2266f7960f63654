"""The worker's own pool plans trioq's statements once per connection (a generic plan) on a
direct connection: Postgres left to itself re-plans the claim at every execution (its LIMIT
defeats the generic plan's estimate), 0.3 ms of a 1 ms round trip. Through a transaction
pooler nothing is set (a session setting would leak to the pooler's other clients):
tests/test_pgbouncer.py checks that side."""

from __future__ import annotations

from typing import Any

import trio
from helpers import rows, serving, wait_until

import trioq

CLAIM_PREFIX = "%WITH proved AS (%), c AS (%"  # the plain claim's text (trioq/_db/sql/leases.py)


async def test_the_claim_is_planned_once_on_the_workers_own_connection(dsn: str) -> None:
    """Thirty jobs one at a time (thirty claims and more on one connection of a one-connection
    pool): the claim statement is prepared, and every execution after psycopg prepared it
    used the generic plan (the server kept no custom plan); the app pool, the handlers' own,
    is left to Postgres's choice."""
    tasks = trioq.Registry()
    done = trio.Semaphore(0)

    @tasks.task
    async def noop(job: trioq.JobContext) -> None:
        done.release()

    async with serving(dsn, tasks, pool_size=1) as (conn, runtime):
        for _ in range(30):
            await noop.enqueue(conn)
            with trio.fail_after(10):
                await done.acquire()
        async with runtime.pool.connection() as own:
            assert await rows(own, "SHOW plan_cache_mode") == [("force_generic_plan",)]
            plans: list[Any] = await rows(
                own, "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                     " WHERE statement LIKE %s", CLAIM_PREFIX)  # fmt: skip
            assert len(plans) == 1 and plans[0][0] >= 10 and plans[0][1] == 0, plans
        async with runtime.app_pool.connection() as app:
            assert await rows(app, "SHOW plan_cache_mode") == [("auto",)]
        await wait_until(lambda: _empty(conn))


async def _empty(conn: Any) -> bool:
    return await rows(conn, "SELECT count(*) FROM trioq.jobs WHERE state <> 'done'") == [(0,)]


async def test_the_workers_own_statements_are_prepared_at_their_first_run(dsn: str) -> None:
    """A chore a process runs every few seconds or minutes, spread over its pool's
    connections, seldom reached psycopg's 5th run on one connection, so Postgres parsed and
    planned it every time (the dead-worker check: 3.4 ms a plan). The worker's own pool and
    its liveness connection prepare trioq's statements at their first run; the app pool,
    whose statements are the handlers', keeps psycopg's threshold."""
    tasks = trioq.Registry()
    async with serving(dsn, tasks, pool_size=2) as (_conn, runtime):
        async with runtime.pool.connection() as own:
            assert own.prepare_threshold == 0
            await runtime.queue.clock(own)  # once: prepared at once, planned once
            found = await rows(own, "SELECT generic_plans, custom_plans FROM "
                                    "pg_prepared_statements WHERE statement = %s",
                               runtime.queue.sql.clock.as_string(own))  # fmt: skip
            assert found == [(1, 0)], found
        async with runtime.app_pool.connection() as app:
            assert app.prepare_threshold == 5
