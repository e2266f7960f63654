"""``job.complete_with(query, params)``: one statement and the job's completion in one
transaction and one round trip; ``shared=True``: many jobs' statements and completions in
one transaction and one round trip, and each job still gets only its own error. Real
Postgres; round trips are counted from libpq's trace (see test_job_transaction)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from committing import Commits
from helpers import Counter, rows, serving, traced, wait_until
from psycopg import pq
from test_job_transaction import claimed_jobs, ledger_jobs_served, round_trips, warm

import trioq
import trioq._complete_with
from trioq import Lease, Queue
from trioq._complete_with import SharedCompletions
from trioq._pg.pipeline import execute_pipelined

Q = Queue()
INSERT = "INSERT INTO ledger VALUES (%s, %s) RETURNING job_id, note"


@asynccontextmanager
async def contexts(
    dsn: str, jobs: list[trioq.Job], *, lanes: int = 1, max_jobs: int = 32, pool_size: int = 1
) -> AsyncIterator[tuple[list[trioq.JobContext], trioq.pg.Pool, list[Lease], SharedCompletions]]:
    forgotten = Commits()
    async with trioq.pg.Pool(dsn, max_size=pool_size, connect_kwargs={"autocommit": True}) as pool:
        shared = SharedCompletions(pool, Q, "w", lanes=lanes, max_jobs=max_jobs)
        services = trioq.JobServices(app_pool=pool, queue=Q, owner="w",
                                     committing=forgotten, completions=shared)  # fmt: skip
        yield [trioq.JobContext(job, services) for job in jobs], pool, forgotten, shared


async def all_at_once(
    ctxs: list[trioq.JobContext], params: Any = None
) -> tuple[dict[int, Any], dict[int, BaseException]]:
    """Every job's ``complete_with(INSERT, shared=True)`` at once: rows and errors by job."""
    got: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}

    async def one(ctx: trioq.JobContext) -> None:
        values = (ctx.id, "x") if params is None else params(ctx)
        try:
            cur = await ctx.complete_with(INSERT, values, shared=True)
        except Exception as ex:
            errors[ctx.id] = ex
        else:
            got[ctx.id] = await cur.fetchall()

    async with trio.open_nursery() as nursery:
        for ctx in ctxs:
            nursery.start_soon(one, ctx)
    return got, errors


async def ledger(conn: Any) -> list[int]:
    return sorted(r[0] for r in await rows(conn, "SELECT job_id FROM ledger"))


async def jobs_left(conn: Any) -> list[int]:
    return sorted(r[0] for r in await rows(conn, "SELECT id FROM trioq.jobs"))


async def clean(pool: trioq.pg.Pool) -> None:
    async with pool.connection() as again:
        assert again.pgconn.transaction_status == pq.TransactionStatus.IDLE
        assert again.deferred == ()


# -- own transaction -------------------------------------------------------------------------------


async def test_the_statement_and_the_completion_commit_in_one_round_trip(dsn: str) -> None:
    async with claimed_jobs(dsn) as (conn, (job,)), contexts(dsn, [job]) as ((ctx,), pool, gone, _):
        with traced(await warm(pool)) as sent:
            cur = await ctx.complete_with(INSERT, (job.id, "x"))
        assert round_trips(sent) == 1, sent  # BEGIN, INSERT, completion, COMMIT
        assert await cur.fetchall() == [(job.id, "x")] and cur.rowcount == 1
        assert await ledger(conn) == [job.id]
        assert await jobs_left(conn) == []
        assert ctx.completed_in_transaction and gone == [Lease(job.id, job.attempt)]
        await clean(pool)


async def test_the_statements_error_is_raised_and_nothing_commits(dsn: str) -> None:
    async with claimed_jobs(dsn) as (conn, (job,)), contexts(dsn, [job]) as ((ctx,), pool, _, _):
        await conn.execute("INSERT INTO ledger VALUES (%s, 'taken')", (job.id,))
        with pytest.raises(psycopg.errors.UniqueViolation, match="ledger_pkey"):
            await ctx.complete_with(INSERT, (job.id, "again"))
        assert await jobs_left(conn) == [job.id]  # not completed: the runtime retries it
        assert not ctx.completed_in_transaction
        await clean(pool)
        await conn.execute("DELETE FROM ledger")
        await ctx.complete_with(INSERT, (job.id, "retried"))  # the connection works on
        assert await ledger(conn) == [job.id] and await jobs_left(conn) == []


async def test_a_lost_lease_commits_nothing(dsn: str) -> None:
    async with claimed_jobs(dsn) as (conn, (job,)), contexts(dsn, [job]) as ((ctx,), pool, _, _):
        await conn.execute("UPDATE trioq.jobs SET lease_owner = 'other' WHERE id = %s", (job.id,))
        with pytest.raises(trioq.LeaseLostError, match=f"job {job.id}"):
            await ctx.complete_with(INSERT, (job.id, "x"))
        assert await ledger(conn) == []
        assert await jobs_left(conn) == [job.id]
        await clean(pool)


@pytest.mark.parametrize(
    "bad", ["nul\x00", "surrogate\udc80", object()], ids=["nul", "surrogate", "unknown type"]
)
async def test_a_parameter_that_cannot_be_sent_raises_and_nothing_commits(
    dsn: str, bad: Any
) -> None:
    async with claimed_jobs(dsn) as (conn, (job,)), contexts(dsn, [job]) as ((ctx,), pool, _, _):
        with pytest.raises((psycopg.Error, UnicodeError)):
            await ctx.complete_with(INSERT, (job.id, bad))
        assert await jobs_left(conn) == [job.id] and await ledger(conn) == []
        await clean(pool)


async def test_a_second_completion_of_the_same_job_is_refused(dsn: str) -> None:
    async with claimed_jobs(dsn) as (conn, (job,)), contexts(dsn, [job]) as ((ctx,), _, _, _):
        await ctx.complete_with(INSERT, (job.id, "x"))
        with pytest.raises(RuntimeError, match="already completed in a transaction"):
            await ctx.complete_with(INSERT, (job.id, "y"))
        with pytest.raises(RuntimeError, match="already completed in a transaction"):
            await ctx.complete_with(INSERT, (job.id, "z"), shared=True)
        assert await rows(conn, "SELECT note FROM ledger") == [("x",)]


async def test_inside_job_transaction_it_is_refused(dsn: str) -> None:
    async with claimed_jobs(dsn) as (conn, (job,)), contexts(dsn, [job], pool_size=2) as (
        (ctx,), _, _, _
    ):
        async with ctx.transaction() as tx:
            await tx.execute("INSERT INTO ledger VALUES (%s, 'in the block')", (job.id,))
            with pytest.raises(RuntimeError, match=r"inside job\.transaction"):
                await ctx.complete_with(INSERT, (job.id + 1, "x"))
        assert await rows(conn, "SELECT note FROM ledger") == [("in the block",)]
        assert await jobs_left(conn) == []


# -- shared: group commit --------------------------------------------------------------------------


async def test_jobs_that_call_it_together_commit_in_one_transaction_and_one_round_trip(
    dsn: str,
) -> None:
    async with claimed_jobs(dsn, 20) as (conn, jobs), contexts(dsn, jobs) as (
        ctxs, pool, gone, shared
    ):
        with traced(await warm(pool)) as sent:
            got, errors = await all_at_once(ctxs)
        assert errors == {}
        assert got == {job.id: [(job.id, "x")] for job in jobs}  # each its own RETURNING
        assert round_trips(sent) == 1, sent
        assert shared.statistics() == shared.statistics().__class__(batches=1, jobs=20, split=0)
        assert await ledger(conn) == sorted(job.id for job in jobs)
        assert await jobs_left(conn) == []
        assert sorted(lease.job_id for lease in gone) == sorted(job.id for job in jobs)
        assert all(ctx.completed_in_transaction for ctx in ctxs)
        await clean(pool)


async def test_a_batch_holds_at_most_max_jobs(dsn: str) -> None:
    async with claimed_jobs(dsn, 10) as (conn, jobs), contexts(dsn, jobs, max_jobs=4) as (
        ctxs, _, _, shared
    ):
        got, errors = await all_at_once(ctxs)
        assert errors == {} and len(got) == 10
        assert shared.statistics().batches == 3 and shared.statistics().jobs == 10
        assert await jobs_left(conn) == []


async def test_a_failing_statement_fails_its_job_alone(dsn: str) -> None:
    async with claimed_jobs(dsn, 6) as (conn, jobs), contexts(dsn, jobs) as (
        ctxs, pool, _, shared
    ):
        bad = jobs[2].id
        await conn.execute("INSERT INTO ledger VALUES (%s, 'taken')", (bad,))
        got, errors = await all_at_once(ctxs)
        assert list(errors) == [bad]
        assert isinstance(errors[bad], psycopg.errors.UniqueViolation)
        assert sorted(got) == sorted(job.id for job in jobs if job.id != bad)
        assert shared.statistics().split == 1
        assert await jobs_left(conn) == [bad]  # for its retry
        assert await rows(conn, "SELECT note FROM ledger WHERE job_id = %s", bad) == [("taken",)]
        await clean(pool)


async def test_a_lost_lease_in_a_batch_loses_that_job_alone(dsn: str) -> None:
    async with claimed_jobs(dsn, 4) as (conn, jobs), contexts(dsn, jobs) as (ctxs, _, _, _):
        stolen = jobs[1].id
        await conn.execute("UPDATE trioq.jobs SET lease_owner = 'other' WHERE id = %s", (stolen,))
        _, errors = await all_at_once(ctxs)
        assert list(errors) == [stolen] and isinstance(errors[stolen], trioq.LeaseLostError)
        assert await ledger(conn) == sorted(job.id for job in jobs if job.id != stolen)
        assert await jobs_left(conn) == [stolen]


async def test_a_parameter_that_cannot_be_sent_fails_its_job_alone(dsn: str) -> None:
    async with claimed_jobs(dsn, 4) as (conn, jobs), contexts(dsn, jobs) as (ctxs, pool, _, _):
        bad = jobs[3].id
        _, errors = await all_at_once(
            ctxs, lambda ctx: (ctx.id, "nul\x00" if ctx.id == bad else "x")
        )
        assert list(errors) == [bad] and isinstance(errors[bad], psycopg.DataError)
        assert await ledger(conn) == sorted(job.id for job in jobs if job.id != bad)
        assert await jobs_left(conn) == [bad]
        await clean(pool)


@pytest.mark.parametrize("gone_out", [False, True])
async def test_a_cancelled_job_is_withdrawn_until_its_batch_goes_out(
    dsn: str, gone_out: bool
) -> None:
    """The lane is busy: the first job's INSERT waits for a lock the test holds. The second
    job is cancelled while it waits for the lane (nothing of it runs, the first job still
    commits), or once it went out in the same batch (it can no longer be withdrawn: the
    batch commits it, and the runtime's own record of the cancelled job is fenced)."""
    async with claimed_jobs(dsn, 2) as (conn, (first, second)), contexts(
        dsn, [first, second]
    ) as ((ctx1, ctx2), pool, _, shared):
        async with await trioq.connect(dsn) as blocker:
            await blocker.execute("LOCK TABLE ledger")  # its transaction stays open
            lane = shared._lanes[0]
            scope = trio.CancelScope()

            async def holder() -> None:
                await ctx1.complete_with(INSERT, (first.id, "x"), shared=True)

            async def waiter() -> None:
                with scope:
                    await ctx2.complete_with(INSERT, (second.id, "y"), shared=True)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(holder)
                if not gone_out:
                    await trio.testing.wait_all_tasks_blocked()  # the first one's batch left
                nursery.start_soon(waiter)
                await trio.testing.wait_all_tasks_blocked()
                waiting = [r.lease.job_id for r in lane.pending]
                assert waiting == ([] if gone_out else [second.id]) and lane.lock.locked()
                scope.cancel()
                await trio.testing.wait_all_tasks_blocked()
                assert list(lane.pending) == []
                await blocker.rollback()
        # Gone out: the waiter got Cancelled, or (had it been the one sending the batch,
        # shielded) returned; its job is completed once either way.
        expected = sorted([first.id, second.id]) if gone_out else [first.id]
        assert await ledger(conn) == expected
        assert await jobs_left(conn) == ([] if gone_out else [second.id])
        await clean(pool)


async def test_under_the_runtime_every_job_writes_exactly_once(dsn: str) -> None:
    tasks = trioq.Registry()
    done = Counter()

    @tasks.task
    async def credit(job: trioq.JobContext, n: int) -> None:
        await job.complete_with(
            "INSERT INTO ledger VALUES (%s, %s)", (job.id, str(n)), shared=n % 3 != 0
        )
        done.hit()

    async with ledger_jobs_served(dsn, tasks, done) as runtime:
        shared = runtime._services.completions.statistics()
        assert shared.jobs == 200 and shared.batches < 200 and shared.split == 0


# -- what the review found (docs/transactions.md) -------------------------------------------------


@pytest.mark.parametrize(
    "query",
    ["COMMIT", "  rollback", "END", "ABORT", "BEGIN", "START TRANSACTION", "SAVEPOINT s",
     "RELEASE SAVEPOINT s", "PREPARE TRANSACTION 'x'", "COMMIT PREPARED 'x'",
     "SET search_path = public", "RESET ALL", "DISCARD ALL", "DEALLOCATE ALL",
     "LISTEN x", "COPY ledger FROM STDIN", "COPY (SELECT 1) TO STDOUT",
     "-- a comment\n/* another */ Commit", "", "   -- only a comment"],
)  # fmt: skip
@pytest.mark.parametrize("shared", [False, True])
async def test_statements_that_would_end_the_transaction_or_change_the_session_are_refused(
    dsn: str, query: str, shared: bool
) -> None:
    """Refused before anything is sent: a COMMIT in a shared batch would commit the other
    jobs' statements without their completions; SET would change their statements and the
    pooled session; COPY needs a protocol of its own."""
    async with claimed_jobs(dsn, 2) as (conn, jobs), contexts(dsn, jobs) as (
        (bad, good), pool, gone, _
    ):
        with pytest.raises(psycopg.ProgrammingError, match=r"job\.complete_with\(\)"):
            await bad.complete_with(query, shared=shared)
        await good.complete_with(INSERT, (good.id, "x"), shared=shared)
        assert await ledger(conn) == [good.id]
        assert await jobs_left(conn) == [bad.id]
        assert gone == [good.lease]  # the refused job is still heartbeated
        await clean(pool)


def test_a_query_that_is_not_a_statement_is_a_type_error() -> None:
    from trioq._complete_with import check_statement

    with pytest.raises(TypeError, match="takes a statement"):
        check_statement(42)
    check_statement(b"INSERT INTO t VALUES (1)")
    check_statement(psycopg.sql.SQL("UPDATE {} SET x = 1").format(psycopg.sql.Identifier("t")))
    check_statement("(SELECT 1) UNION (SELECT 2)")


async def test_a_slow_statement_delays_its_batch_but_fails_nobody(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One job's INSERT waits on a row lock held by another transaction for longer than
    the batch may take: the batch is given up (its statements cancelled on the server),
    the other jobs commit alone at once, and the slow one commits alone once the lock is
    free."""
    monkeypatch.setattr(trioq._complete_with, "BATCH_TIMEOUT", 0.5)
    async with claimed_jobs(dsn, 4) as (conn, jobs), contexts(dsn, jobs, pool_size=4) as (
        ctxs, pool, _, shared
    ):
        slow = jobs[1].id
        outcome: list[tuple[dict[int, Any], dict[int, BaseException]]] = []
        async with await trioq.connect(dsn) as blocker:  # not autocommit: its insert stays open
            await blocker.execute("INSERT INTO ledger VALUES (%s, 'held')", (slow,))
            async with trio.open_nursery() as nursery:

                async def run() -> None:
                    outcome.append(await all_at_once(ctxs))

                nursery.start_soon(run)

                async def others_done() -> bool:
                    return await jobs_left(conn) == [slow]

                await wait_until(others_done)
                assert shared.statistics().split == 1
                await blocker.rollback()
        [(got, errors)] = outcome
        assert errors == {} and sorted(got) == sorted(job.id for job in jobs)
        assert await ledger(conn) == sorted(job.id for job in jobs)
        assert await jobs_left(conn) == []
        await clean(pool)


@pytest.mark.parametrize("shared", [False, True])
async def test_a_statement_longer_than_the_lease_still_commits(dsn: str, shared: bool) -> None:
    """The completion goes first and locks the job's row, so the sweeper cannot take the
    job back while the statement runs past the lease (the test timings: lease 1.5 s)."""
    tasks = trioq.Registry()
    done, lost = Counter(), Counter()

    @tasks.task(max_attempts=2)
    async def slow(job: trioq.JobContext) -> None:
        try:
            await job.complete_with(
                "INSERT INTO ledger SELECT %s, pg_sleep(2.5)::text", (job.id,), shared=shared
            )
        except trioq.LeaseLostError:
            lost.hit()
            raise
        done.hit()

    async with serving(dsn, tasks) as (conn, _):
        await conn.execute("CREATE TABLE ledger (job_id bigint PRIMARY KEY, note text)")
        await trioq.enqueue(conn, "slow", {})
        await done.wait_for(1)
        assert await ledger(conn) != [] and await jobs_left(conn) == []
        assert lost.calls == []


async def test_a_batch_whose_commit_result_is_lost_tells_its_jobs_the_lease_is_gone(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch commits on the server, then the connection breaks before its result is
    read (simulated). Each job is sent alone; its completion, which goes first, finds the
    job already completed: `LeaseLostError` (the runtime writes nothing), and the
    statement does not run a second time."""
    real = execute_pipelined

    async def commit_then_break(conn: Any, statements: Any, **kw: Any) -> Any:
        cursors = await real(conn, statements, **kw)
        if len(statements) > 2:  # the batch, not a job alone
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return cursors

    monkeypatch.setattr(trioq._complete_with, "execute_pipelined", commit_then_break)
    async with claimed_jobs(dsn, 3) as (conn, jobs), contexts(dsn, jobs) as (ctxs, _, _, _):
        _, errors = await all_at_once(ctxs)
        assert sorted(errors) == sorted(job.id for job in jobs)
        assert all(isinstance(e, trioq.LeaseLostError) for e in errors.values()), errors
        assert await ledger(conn) == sorted(job.id for job in jobs)  # each row once
        assert await jobs_left(conn) == []


@pytest.mark.parametrize("shared", [False, True])
async def test_the_statement_sees_its_jobs_row(dsn: str, shared: bool) -> None:
    """The fence that goes first only locks the job's row; the completion that deletes it
    comes after the statement (`trioq stress` reads the job's last error this way)."""
    async with claimed_jobs(dsn) as (conn, (job,)), contexts(dsn, [job]) as ((ctx,), _, _, _):
        await ctx.complete_with(
            "INSERT INTO ledger SELECT id, task FROM trioq.jobs WHERE id = %s", (job.id,),
            shared=shared,
        )  # fmt: skip
        assert await rows(conn, "SELECT job_id, note FROM ledger") == [(job.id, "t")]
        assert await jobs_left(conn) == []
