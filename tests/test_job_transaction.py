"""``job.transaction()``: the round trips it costs, what the deferred BEGIN must still cover,
and shared transactions (``shared=True``): each job's block under a savepoint, all committed
with their completions. Real Postgres; round trips are counted from libpq's own trace of
the protocol (a ``Sync`` or a simple ``Query`` is one wait for the server)."""

from __future__ import annotations

import contextlib
import datetime as dt
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from committing import Commits
from helpers import Counter, rows, scalar, serving, traced, wait_until
from psycopg import pq

import trioq
from trioq import Lease, Queue
from trioq._db.statements import rendered
from trioq._job_transaction import SharedTransactions

LEASE = dt.timedelta(seconds=30)
Q = Queue()


def round_trips(sent: list[str]) -> int:
    return sum(message in ("Sync", "Query") for message in sent)


@asynccontextmanager
async def claimed_jobs(dsn: str, n: int = 1) -> AsyncIterator[tuple[Any, list[trioq.Job]]]:
    """A migrated database with a ledger table and ``n`` jobs claimed by worker ``w``."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        await conn.execute("CREATE TABLE ledger (job_id bigint PRIMARY KEY, note text)")
        await trioq.enqueue_many(conn, [trioq.JobSpec(task="t") for _ in range(n)])
        jobs = await Q.claim(conn, "default", owner="w", limit=n, lease=LEASE)
        yield conn, jobs


@asynccontextmanager
async def contexts(
    dsn: str, jobs: list[trioq.Job], *, shared: SharedTransactions | None = None,
    pool_size: int = 1, patience: float = math.inf,
) -> AsyncIterator[tuple[list[trioq.JobContext], trioq.pg.Pool, list[Lease]]]:  # fmt: skip
    """Contexts of ``jobs``; with ``shared``, one lane, where a job waits ``patience`` s
    behind a block before it runs alone (by default for ever: these tests hold blocks)."""
    forgotten = Commits()
    async with trioq.pg.Pool(dsn, max_size=pool_size, connect_kwargs={"autocommit": True}) as pool:
        if shared is None:
            lanes = None
        else:
            lanes = SharedTransactions(pool, Q, "w", lanes=1, max_jobs=shared.max_jobs)
            lanes.patience = patience
        services = trioq.JobServices(app_pool=pool, queue=Q, owner="w",
                                     committing=forgotten, shared=lanes)  # fmt: skip
        yield [trioq.JobContext(job, services) for job in jobs], pool, forgotten


async def warm(pool: trioq.pg.Pool) -> Any:
    """The pool's one connection, opened, so that the test can trace it."""
    async with pool.connection() as conn:
        return conn


# -- own transaction -------------------------------------------------------------------------------


async def test_one_insert_costs_two_round_trips_and_commits_with_the_completion(dsn: str) -> None:
    async with claimed_jobs(dsn) as (conn, (job,)), contexts(dsn, [job]) as ((ctx,), pool, gone):
        traced_conn = await warm(pool)
        with traced(traced_conn) as sent:
            async with ctx.transaction() as tx:
                assert tx is traced_conn
                await tx.execute("INSERT INTO ledger VALUES (%s, %s)", (job.id, "x"))
        assert round_trips(sent) == 2, sent  # BEGIN+INSERT, completion+COMMIT
        assert await rows(conn, "SELECT job_id FROM ledger") == [(job.id,)]
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0
        assert ctx.completed_in_transaction and gone == [Lease(job.id, job.attempt)]


async def test_a_block_that_runs_no_statement_completes_the_job_in_one_round_trip(
    dsn: str,
) -> None:
    async with claimed_jobs(dsn) as (conn, (job,)), contexts(dsn, [job]) as ((ctx,), pool, _):
        with traced(await warm(pool)) as sent:
            async with ctx.transaction():
                pass
        assert round_trips(sent) == 1
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0


async def test_the_statements_error_is_raised_where_it_ran(dsn: str) -> None:
    """BEGIN travels with the first statement (pipeline mode), but its error is raised by
    that statement's execute(), not later."""
    async with claimed_jobs(dsn) as (conn, (job,)), contexts(dsn, [job]) as ((ctx,), _, _):
        await conn.execute("INSERT INTO ledger VALUES (0, 'taken')")
        reached = False
        with pytest.raises(psycopg.errors.UniqueViolation):
            async with ctx.transaction() as tx:
                await tx.execute("INSERT INTO ledger VALUES (%s, %s)", (0, "again"))
                reached = True
        assert not reached
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 1  # not completed


@pytest.mark.parametrize(
    "first", ["cursor", "copy", "executemany", "nested", "server_cursor", "no_params"]
)
async def test_every_kind_of_first_operation_runs_inside_the_transaction(
    dsn: str, first: str
) -> None:
    """The deferred BEGIN goes out before any operation, not only execute(): a block that
    fails after its first operation leaves nothing behind, whatever that operation was."""
    async with claimed_jobs(dsn) as (conn, (job,)), contexts(dsn, [job]) as ((ctx,), _, _):
        with pytest.raises(ZeroDivisionError):
            async with ctx.transaction() as tx:
                await first_operation(tx, first, job.id)
                assert tx.pgconn.transaction_status == pq.TransactionStatus.INTRANS
                assert await scalar(conn, "SELECT count(*) FROM ledger") == 0  # not yet
                raise ZeroDivisionError
        assert await scalar(conn, "SELECT count(*) FROM ledger") == 0
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 1


@pytest.mark.parametrize(
    "first",
    ["execute", "cursor", "copy", "executemany", "nested", "server_cursor", "no_params",
     "pipeline"],
)  # fmt: skip
async def test_a_shared_members_fence_goes_before_any_first_operation(
    dsn: str, first: str
) -> None:
    """Whatever a member's first operation, its SAVEPOINT and fence go out before it: a
    member whose lease was lost fails with `LeaseLostError` and leaves nothing; the next
    commits its writes with its completion."""
    async with claimed_jobs(dsn, 2) as (conn, (stolen, kept)), contexts(
        dsn, [stolen, kept], shared=SHARED
    ) as ((lost_ctx, kept_ctx), _, _):
        await conn.execute("UPDATE trioq.jobs SET lease_owner = 'x' WHERE id = %s", (stolen.id,))
        reached = False
        with pytest.raises(trioq.LeaseLostError):
            async with lost_ctx.transaction(shared=True) as tx:
                await first_operation(tx, first, stolen.id * 10)
                reached = True
        assert not reached  # raised by the first operation: its fence went ahead of it
        assert await scalar(conn, "SELECT count(*) FROM ledger") == 0
        async with kept_ctx.transaction(shared=True) as tx:
            await first_operation(tx, first, kept.id * 10)
        assert await scalar(conn, "SELECT count(*) FROM ledger") >= 1
        assert await rows(conn, "SELECT id FROM trioq.jobs") == [(stolen.id,)]


async def first_operation(tx: Any, kind: str, job_id: int) -> None:
    insert = "INSERT INTO ledger VALUES (%s, 'x')"
    if kind == "execute":
        await tx.execute(insert, (job_id,))
    elif kind == "pipeline":
        async with tx.pipeline():
            await tx.execute(insert, (job_id,))
    elif kind == "cursor":
        async with tx.cursor() as cur:
            await cur.execute(insert, (job_id,))
    elif kind == "copy":
        async with tx.cursor() as cur, cur.copy("COPY ledger (job_id) FROM STDIN") as copy:
            await copy.write_row((job_id,))
    elif kind == "executemany":
        async with tx.cursor() as cur:
            await cur.executemany(insert, [(job_id,), (job_id + 1,)])
    elif kind == "nested":
        async with tx.transaction():  # a savepoint, not a transaction of its own
            await tx.execute(insert, (job_id,))
    elif kind == "server_cursor":
        await tx.execute(insert, (job_id,))  # (a server cursor needs a transaction: ours)
        async with tx.cursor(name="c") as cur:
            await cur.execute("SELECT job_id FROM ledger")
            assert [r async for r in cur] == [(job_id,)]
    else:
        await tx.execute(f"INSERT INTO ledger VALUES ({int(job_id)}, 'x'); SELECT 1")


@pytest.mark.parametrize("call", ["commit", "rollback", "set_autocommit"])
async def test_the_handler_cannot_end_the_jobs_transaction_itself(dsn: str, call: str) -> None:
    async with claimed_jobs(dsn) as (conn, (job,)), contexts(dsn, [job]) as ((ctx,), _, _):
        with pytest.raises(psycopg.ProgrammingError, match=rf"{call}\(\) is not allowed inside"):
            async with ctx.transaction() as tx:
                await tx.execute("INSERT INTO ledger VALUES (%s, 'x')", (job.id,))
                method = getattr(tx, call)
                await (method(True) if call == "set_autocommit" else method())
        assert await scalar(conn, "SELECT count(*) FROM ledger") == 0
        # the connection went back to the pool fit for use
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 1


async def test_cancelled_in_the_first_statement_commits_nothing_and_keeps_the_pool(
    dsn: str,
) -> None:
    async with claimed_jobs(dsn, 2) as (conn, (job, job2)), contexts(dsn, [job, job2]) as (
        (ctx, ctx2), pool, _
    ):
        with trio.move_on_after(0.3) as scope:
            async with ctx.transaction() as tx:
                await tx.execute(
                    "INSERT INTO ledger SELECT %s, 'x' FROM pg_sleep(5)", (job.id,)
                )
        assert scope.cancelled_caught
        assert await scalar(conn, "SELECT count(*) FROM ledger") == 0
        async with ctx2.transaction() as tx:  # the same (only) connection, fit for use
            await tx.execute("INSERT INTO ledger VALUES (%s, 'x')", (job2.id,))
        assert await rows(conn, "SELECT job_id FROM ledger") == [(job2.id,)]
        assert pool.statistics().size <= 1


async def assert_clean_and_usable(conn: Any, pool: trioq.pg.Pool, next_ctx: Any) -> None:
    """The pool's connection is idle with nothing deferred, and the next job's
    transaction on it commits its row."""
    async with pool.connection() as again:
        assert again.pgconn.transaction_status == pq.TransactionStatus.IDLE
        assert again.deferred == ()
    async with next_ctx.transaction() as tx:
        await tx.execute("INSERT INTO ledger VALUES (%s, %s)", (next_ctx.id, "y"))
    assert await rows(conn, "SELECT job_id FROM ledger") == [(next_ctx.id,)]


async def test_a_lost_lease_commits_nothing_and_the_connection_comes_back_clean(
    dsn: str,
) -> None:
    async with claimed_jobs(dsn, 2) as (conn, (job, job2)), contexts(dsn, [job, job2]) as (
        (ctx, ctx2), pool, _
    ):
        with pytest.raises(trioq.LeaseLostError, match=f"job {job.id} attempt 1: lease lost"):
            async with ctx.transaction() as tx:
                await tx.execute("INSERT INTO ledger VALUES (%s, %s)", (job.id, "x"))
                await conn.execute(
                    "UPDATE trioq.jobs SET lease_owner = 'other' WHERE id = %s", (job.id,)
                )
        assert not ctx.completed_in_transaction
        assert await scalar(conn, "SELECT count(*) FROM ledger") == 0  # rolled back
        owner = await scalar(conn, "SELECT lease_owner FROM trioq.jobs WHERE id = %s", job.id)
        assert owner == "other"
        await assert_clean_and_usable(conn, pool, ctx2)


@pytest.mark.parametrize("where", ["second_statement", "between_statements", "no_statement"])
async def test_a_timeout_mid_block_rolls_back_and_the_connection_comes_back_clean(
    dsn: str, where: str
) -> None:
    async with claimed_jobs(dsn, 2) as (conn, (job, job2)), contexts(dsn, [job, job2]) as (
        (ctx, ctx2), pool, gone
    ):
        with trio.move_on_after(0.3) as scope:
            async with ctx.transaction() as tx:
                if where != "no_statement":
                    await tx.execute("INSERT INTO ledger VALUES (%s, %s)", (job.id, "x"))
                if where == "second_statement":
                    await tx.execute("SELECT pg_sleep(%s)", (5,))
                await trio.sleep_forever()
        assert scope.cancelled_caught and not ctx.completed_in_transaction and gone == []
        assert await scalar(conn, "SELECT count(*) FROM ledger") == 0
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 2  # not completed
        await assert_clean_and_usable(conn, pool, ctx2)
        assert pool.statistics().size <= 1


async def test_pipeline_mode_under_trio(dsn: str) -> None:
    """psycopg's pipeline mode on trioq.pg: many statements, one round trip; an error in
    the middle aborts the rest of the pipeline and is raised once, the connection fit."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        with traced(conn) as sent:
            async with conn.pipeline():
                curs = [await conn.execute("SELECT %s::int", (i,)) for i in range(20)]
        assert round_trips(sent) == 1
        assert [(await c.fetchone()) for c in curs] == [(i,) for i in range(20)]
        with pytest.raises(psycopg.errors.DivisionByZero):
            async with conn.pipeline():
                await conn.execute("SELECT %s::int", (1,))
                await conn.execute("SELECT 1 / %s", (0,))
                await conn.execute("SELECT %s::int", (3,))
        assert await scalar(conn, "SELECT 42") == 42
        with trio.move_on_after(0.2):
            async with conn.pipeline():
                await conn.execute("SELECT pg_sleep(%s)", (5,))
        assert await scalar(conn, "SELECT 43") == 43


# -- shared transactions ---------------------------------------------------------------------------


SHARED = SharedTransactions.__new__(SharedTransactions)
SHARED.max_jobs = 32


async def run_blocks(ctxs: list[trioq.JobContext], body: Any) -> dict[int, BaseException]:
    """Run every job's ``job.transaction(shared=True)`` block at once; their errors."""
    errors: dict[int, BaseException] = {}

    async def one(ctx: trioq.JobContext) -> None:
        try:
            async with ctx.transaction(shared=True) as tx:
                await body(ctx, tx)
        except Exception as ex:
            errors[ctx.id] = ex

    async with trio.open_nursery() as nursery:
        for ctx in ctxs:
            nursery.start_soon(one, ctx)
    return errors


async def insert(ctx: trioq.JobContext, tx: Any) -> None:
    await tx.execute("INSERT INTO ledger VALUES (%s, %s)", (ctx.id, "x"))


async def test_shared_blocks_commit_together_in_one_round_trip_each(dsn: str) -> None:
    async with claimed_jobs(dsn, 10) as (conn, jobs), contexts(dsn, jobs, shared=SHARED) as (
        ctxs, pool, gone
    ):
        lanes = ctxs[0].services.shared
        assert lanes is not None
        with traced(await warm(pool)) as sent:
            assert await run_blocks(ctxs, insert) == {}
        # one round trip per job (SAVEPOINT + INSERT, the RELEASE going with the next job's),
        # and one for all the completions and the COMMIT
        assert round_trips(sent) == 11, sent
        assert lanes.statistics().transactions == 1 and lanes.statistics().jobs == 10
        assert await scalar(conn, "SELECT count(*) FROM ledger") == 10
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0
        assert sorted(lease.job_id for lease in gone) == sorted(job.id for job in jobs)
        assert all(ctx.completed_in_transaction for ctx in ctxs)


async def test_a_failing_block_rolls_back_alone(dsn: str) -> None:
    async with claimed_jobs(dsn, 6) as (conn, jobs), contexts(dsn, jobs, shared=SHARED) as (
        ctxs, _, _
    ):
        bad = jobs[2].id

        async def body(ctx: trioq.JobContext, tx: Any) -> None:
            await insert(ctx, tx)
            if ctx.id == bad:
                await tx.execute("SELECT 1 / %s", (0,))

        errors = await run_blocks(ctxs, body)
        assert list(errors) == [bad] and isinstance(errors[bad], psycopg.errors.DivisionByZero)
        assert sorted(r[0] for r in await rows(conn, "SELECT job_id FROM ledger")) == sorted(
            job.id for job in jobs if job.id != bad
        )
        assert await rows(conn, "SELECT id FROM trioq.jobs") == [(bad,)]  # for its retry


async def test_a_lost_lease_fails_only_its_own_job(dsn: str) -> None:
    """Its fence, ahead of its first statement, fails: its savepoint rolls back (its
    statement never ran) and the others commit in the same transaction."""
    async with claimed_jobs(dsn, 4) as (conn, jobs), contexts(dsn, jobs, shared=SHARED) as (
        ctxs, _, _
    ):
        stolen = jobs[1].id
        await conn.execute("UPDATE trioq.jobs SET lease_owner = 'other' WHERE id = %s", (stolen,))
        ran: list[int] = []

        async def body(ctx: trioq.JobContext, tx: Any) -> None:
            await insert(ctx, tx)
            ran.append(ctx.id)

        errors = await run_blocks(ctxs, body)
        assert list(errors) == [stolen] and isinstance(errors[stolen], trioq.LeaseLostError)
        assert sorted(ran) == sorted(job.id for job in jobs if job.id != stolen)
        lanes = ctxs[0].services.shared
        assert lanes is not None and lanes.statistics().transactions == 1
        assert sorted(r[0] for r in await rows(conn, "SELECT job_id FROM ledger")) == sorted(ran)
        assert await rows(conn, "SELECT id FROM trioq.jobs") == [(stolen,)]  # the thief's


async def test_a_lost_lease_of_a_member_without_statements_fails_only_its_job(dsn: str) -> None:
    async with claimed_jobs(dsn, 3) as (conn, jobs), contexts(dsn, jobs, shared=SHARED) as (
        ctxs, _, _
    ):
        quiet = jobs[2].id
        await conn.execute("UPDATE trioq.jobs SET lease_owner = 'other' WHERE id = %s", (quiet,))

        async def body(ctx: trioq.JobContext, tx: Any) -> None:
            if ctx.id != quiet:
                await insert(ctx, tx)

        errors = await run_blocks(ctxs, body)
        assert list(errors) == [quiet] and isinstance(errors[quiet], trioq.LeaseLostError)
        assert await scalar(conn, "SELECT count(*) FROM ledger") == 2
        assert await rows(conn, "SELECT id FROM trioq.jobs") == [(quiet,)]


async def test_a_member_holds_its_row_against_the_sweeper_but_not_the_heartbeat(
    dsn: str,
) -> None:
    """While a member waits for its transaction (another block is running), its lease
    expires: the sweeper must not reclaim it (its writes are about to commit with its
    completion), and a heartbeat of it must not wait for the transaction."""
    async with claimed_jobs(dsn, 2) as (conn, (first, second)), contexts(
        dsn, [first, second], shared=SHARED
    ) as ((ctx1, _), _, _):
        inside, release = trio.Event(), trio.Event()

        async def one(ctx: trioq.JobContext, hold: bool) -> None:
            async with ctx.transaction(shared=True) as tx:
                await insert(ctx, tx)
                if hold:
                    inside.set()
                    await release.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, ctx1, True)
            await inside.wait()
            await conn.execute("UPDATE trioq.jobs SET lease_expires_at = now() - interval '1 s'")
            held = Lease(first.id, first.attempt)
            with trio.fail_after(5):
                beat = await Q.heartbeat(conn, owner="w", leases=[held], lease=LEASE)
            assert beat.extended == {held}
            await conn.execute("UPDATE trioq.jobs SET lease_expires_at = now() - interval '1 s'")
            swept = await Q.sweep(conn)
            assert swept.returned == {second.id}  # its block has not started: not held
            release.set()
        assert await rows(conn, "SELECT job_id FROM ledger") == [(first.id,)]
        assert await rows(conn, "SELECT id, attempt FROM trioq.jobs") == [(second.id, 1)]
        assert ctx1.completed_in_transaction


async def test_set_transaction_in_a_shared_block_says_to_ask_for_its_own(dsn: str) -> None:
    """Postgres refuses ``SET TRANSACTION`` after a transaction's first statement: in a
    shared block the error says what to do, and the block rolls back alone."""
    async with claimed_jobs(dsn, 2) as (conn, (first, second)), contexts(
        dsn, [first, second], shared=SHARED
    ) as ((ctx1, ctx2), _, _):
        async with ctx1.transaction(shared=True) as tx:
            await insert(ctx1, tx)
        with pytest.raises(psycopg.errors.ActiveSqlTransaction, match=r"shared=False\)\)$"):
            async with ctx2.transaction(shared=True) as tx:
                await tx.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        assert await rows(conn, "SELECT job_id FROM ledger") == [(first.id,)]


@pytest.mark.parametrize("patience", [0.2, 0.0])
async def test_a_job_does_not_wait_behind_a_slow_block(dsn: str, patience: float) -> None:
    """A block holds its lane (it waits on something slow): the next job waits at most
    ``patience`` s (0: not at all), then runs and commits in a transaction of its own while
    the slow block still holds the lane; the slow block then commits in its own."""
    async with claimed_jobs(dsn, 2) as (conn, (slow, quick)), contexts(
        dsn, [slow, quick], shared=SHARED, pool_size=2, patience=patience
    ) as ((slow_ctx, quick_ctx), _, gone):
        inside, release = trio.Event(), trio.Event()

        async def hold() -> None:
            async with slow_ctx.transaction(shared=True) as tx:
                await insert(slow_ctx, tx)
                inside.set()
                await release.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold)
            await inside.wait()
            with trio.fail_after(5):  # without the patience: until the slow block ends
                async with quick_ctx.transaction(shared=True) as tx:
                    await insert(quick_ctx, tx)
            assert await rows(conn, "SELECT job_id FROM ledger") == [(quick.id,)]
            assert [lease.job_id for lease in gone] == [quick.id]
            release.set()
        lanes = slow_ctx.services.shared
        assert lanes is not None
        assert (lanes.statistics().alone, lanes.statistics().transactions) == (1, 1)
        assert sorted(r[0] for r in await rows(conn, "SELECT job_id FROM ledger")) == sorted(
            [slow.id, quick.id]
        )
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0


async def test_a_cancelled_waiter_does_not_strand_the_others(dsn: str) -> None:
    """A job waits for the lane while another's block runs, and is cancelled there: the
    running block's job is still committed (it ends with nobody waiting any more)."""
    async with claimed_jobs(dsn, 2) as (conn, (first, second)), contexts(
        dsn, [first, second], shared=SHARED
    ) as ((ctx1, ctx2), _, _):
        inside, release = trio.Event(), trio.Event()
        scopes: list[trio.CancelScope] = []

        async def holder() -> None:
            async with ctx1.transaction(shared=True) as tx:
                await insert(ctx1, tx)
                inside.set()
                await release.wait()

        async def waiter() -> None:
            with trio.CancelScope() as scope:
                scopes.append(scope)
                async with ctx2.transaction(shared=True) as tx:
                    await insert(ctx2, tx)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(holder)
            await inside.wait()
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            lane = ctx1.services.shared._lanes[0]  # type: ignore[union-attr]
            assert lane.waiting() == 1
            scopes[0].cancel()
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        assert await rows(conn, "SELECT job_id FROM ledger") == [(first.id,)]
        assert await rows(conn, "SELECT id FROM trioq.jobs") == [(second.id,)]


async def test_shared_transactions_under_the_runtime_are_exactly_once(dsn: str) -> None:
    tasks = trioq.Registry()
    done = Counter()

    @tasks.task
    async def credit(job: trioq.JobContext, n: int) -> None:
        async with job.transaction(shared=True) as tx:
            await tx.execute("INSERT INTO ledger VALUES (%s, %s)", (job.id, str(n)))
        done.hit()

    async with ledger_jobs_served(dsn, tasks, done) as runtime:
        shared = runtime._services.shared.statistics()
        assert shared.jobs == 300 and shared.transactions < 300


@pytest.mark.parametrize(
    ("group_commit", "shared", "grouped"),
    [(True, None, True), (False, None, False), (True, False, False), (False, True, True)],
)
async def test_job_transaction_uses_group_commit_by_default_under_serve(
    dsn: str, group_commit: bool, shared: bool | None, grouped: bool
) -> None:
    """``job.transaction()`` as the docs write it first joins the worker's shared
    transactions (``Config.group_commit``, default True); ``shared=`` decides for one block."""
    tasks = trioq.Registry()
    done = Counter()

    @tasks.task
    async def credit(job: trioq.JobContext, n: int) -> None:
        block = job.transaction() if shared is None else job.transaction(shared=shared)
        async with block as tx:
            await tx.execute("INSERT INTO ledger VALUES (%s, %s)", (job.id, str(n)))
        done.hit()

    options = {"group_commit": group_commit} if not group_commit else {}
    async with ledger_jobs_served(dsn, tasks, done, n=100, **options) as runtime:
        stats = runtime._services.shared.statistics()
        assert stats.jobs + stats.alone == (100 if grouped else 0)
        if grouped:
            assert stats.transactions < 100
    assert trioq.Config(registry=tasks).group_commit is True


@asynccontextmanager
async def ledger_jobs_served(
    dsn: str, tasks: trioq.Registry, done: Counter, n: int = 300, **options: Any
) -> AsyncIterator[trioq.Runtime]:
    """``n`` jobs of the task ``credit`` (which writes the job's ledger row), run by a
    worker of 20 slots (and ``options``); yields its runtime once all ran, each row written
    once, no job left or dead."""
    queues = {"default": trioq.QueueConfig(concurrency=20)}
    async with serving(dsn, tasks, queues=queues, **options) as (conn, runtime):
        await conn.execute("CREATE TABLE ledger (job_id bigint PRIMARY KEY, note text)")
        await trioq.enqueue_bulk(conn, "credit", [{"n": i} for i in range(n)])
        await done.wait_for(n)
        assert await rows(conn, "SELECT count(*), count(DISTINCT job_id) FROM ledger") == [(n, n)]
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0
        assert await scalar(conn, "SELECT count(*) FROM trioq.dead_jobs") == 0
        yield runtime


@pytest.mark.parametrize("where", ["in_a_statement", "between_statements"])
async def test_a_member_cancelled_mid_block_rolls_back_alone(dsn: str, where: str) -> None:
    """A job timed out inside its block (in a statement, or in Python between two): its
    writes roll back to its savepoint, the jobs before and after it still commit."""
    async with claimed_jobs(dsn, 3) as (conn, jobs), contexts(dsn, jobs, shared=SHARED) as (
        ctxs, pool, _
    ):
        victim = jobs[1].id
        cancelled: list[int] = []

        async def body(ctx: trioq.JobContext, tx: Any) -> None:
            await insert(ctx, tx)
            if ctx.id == victim:
                with trio.move_on_after(0.2) as scope:
                    if where == "in_a_statement":
                        await tx.execute("SELECT pg_sleep(%s)", (5,))
                    await trio.sleep_forever()
                if scope.cancelled_caught:
                    cancelled.append(ctx.id)
                    raise TimeoutError("the job's timeout")

        errors = await run_blocks(ctxs, body)
        assert cancelled == [victim] and list(errors) == [victim]
        assert sorted(r[0] for r in await rows(conn, "SELECT job_id FROM ledger")) == sorted(
            job.id for job in jobs if job.id != victim
        )
        assert await rows(conn, "SELECT id FROM trioq.jobs") == [(victim,)]
        async with pool.connection() as again:
            assert again.pgconn.transaction_status == pq.TransactionStatus.IDLE
            assert again.deferred == ()


async def test_a_member_cancelled_by_its_scope_does_not_strand_the_transaction(dsn: str) -> None:
    """trio.Cancelled itself (not an exception the handler raises) inside a member's block:
    the block rolls back to its savepoint, Cancelled propagates, the others commit."""
    async with claimed_jobs(dsn, 2) as (conn, (first, second)), contexts(
        dsn, [first, second], shared=SHARED
    ) as ((ctx1, ctx2), pool, _):
        with trio.move_on_after(0.2) as scope:
            async with ctx1.transaction(shared=True) as tx:
                await insert(ctx1, tx)
                await tx.execute("SELECT pg_sleep(%s)", (5,))
        assert scope.cancelled_caught and not ctx1.completed_in_transaction
        async with ctx2.transaction(shared=True) as tx:
            await insert(ctx2, tx)
        assert await rows(conn, "SELECT job_id FROM ledger") == [(second.id,)]
        assert await rows(conn, "SELECT id FROM trioq.jobs") == [(first.id,)]
        async with pool.connection() as again:
            assert again.pgconn.transaction_status == pq.TransactionStatus.IDLE


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("shared_transactions", 0, "shared_transactions must be a positive int, got 0"),
        ("shared_transactions", True, "shared_transactions must be a positive int, got True"),
        ("shared_transaction_jobs", 65, "shared_transaction_jobs must be at most 64"),
        ("shared_transaction_jobs", "8", "shared_transaction_jobs must be a positive int"),
    ],
)
def test_shared_transaction_settings_are_checked(field: str, value: Any, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        trioq.Config(dsn="postgresql:///x", registry=trioq.Registry(), **{field: value})


# -- single enqueue --------------------------------------------------------------------------------


async def test_a_single_enqueue_is_one_round_trip_with_its_notification(dsn: str) -> None:
    """``trioq.enqueue`` on an autocommit connection: the insert and its pg_notify are one
    statement, one round trip (after the first call's schema check), and the statement is
    rendered once, not on every call."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        await trioq.enqueue(conn, "warm")
        async with await trioq.connect(dsn, autocommit=True) as listener:
            await listener.execute("LISTEN trioq_trioq")
            with traced(conn) as sent:
                for i in range(3):
                    await trioq.enqueue(conn, "t", {"n": i})
            assert round_trips(sent) == 3, sent
            gen = listener.notifies(timeout=5, stop_after=3)
            assert [n.payload async for n in gen] == ["default"] * 3
    assert rendered("trioq", "insert") is rendered("trioq", "insert")


# -- heartbeats until the outcome is written (issue 22) ---------------------------------------


def failing_commit_registry(runs: list[int], after_commit: trio.Event) -> trioq.Registry:
    """A job whose own transaction fails to commit (a unique violation its handler catches
    inside the block aborts the transaction), and whose handler then works on."""
    tasks = trioq.Registry()

    @tasks.task(name="works_on", max_attempts=3)
    async def works_on(job: trioq.JobContext, seconds: float) -> None:
        runs.append(job.attempt)
        with contextlib.suppress(psycopg.Error):  # the COMMIT fails
            async with job.transaction() as tx:
                with contextlib.suppress(psycopg.errors.UniqueViolation):
                    await tx.execute("INSERT INTO once VALUES (1)")  # aborts the transaction
        after_commit.set()
        await trio.sleep(seconds)

    return tasks


async def test_a_job_whose_transaction_did_not_commit_is_still_heartbeated(dsn: str) -> None:
    """Its handler works on past its lease (1.5 s) after the commit failed. Before, the lease
    was forgotten as the commit went out and never heartbeated again: it expired, and the
    job ran a second time beside the first."""
    runs: list[int] = []
    after_commit = trio.Event()
    async with serving(dsn, failing_commit_registry(runs, after_commit)) as (conn, _):
        await conn.execute("CREATE TABLE once (n int PRIMARY KEY)")
        await conn.execute("INSERT INTO once VALUES (1)")
        await trioq.enqueue(conn, "works_on", {"seconds": 4.5})
        await wait_until(lambda: _no_jobs(conn), timeout=30)
    assert runs == [1], "the job ran again while its first run was still working"


async def _no_jobs(conn: Any) -> bool:
    return bool(await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0)


async def test_a_cancel_reaches_a_job_whose_transaction_did_not_commit(dsn: str) -> None:
    """After the failed commit, a cancel is delivered by its notification (the heartbeat is
    20 s away): before, the lease was forgotten and the cancel ignored."""
    runs: list[int] = []
    after_commit = trio.Event()
    async with serving(dsn, failing_commit_registry(runs, after_commit), lease=60,
                       heartbeat_interval=20) as (conn, _):  # fmt: skip
        await conn.execute("CREATE TABLE once (n int PRIMARY KEY)")
        await conn.execute("INSERT INTO once VALUES (1)")
        job = await trioq.enqueue(conn, "works_on", {"seconds": 600})
        with trio.fail_after(10):
            await after_commit.wait()
        assert (await trioq.Queue().cancel(conn, job.job_id)).status == "requested"
        await wait_until(lambda: _cancelled(conn, job.job_id), timeout=10)


async def _cancelled(conn: Any, job_id: int) -> bool:
    return (await trioq.job_status(conn, job_id)).state == "cancelled"
