"""`trioq.open_group_producer` (issue 25): concurrent enqueues coalesce into one transaction
per batch, each caller returns only after its own row committed, and a failure is its own
caller's."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from helpers import migrated, scalar

import trioq
from trioq.pg import Pool


async def _count(conn: Any, where: str = "true") -> int:
    return int(await scalar(conn, f"SELECT count(*) FROM trioq.jobs WHERE {where}"))


async def test_a_hundred_concurrent_enqueues_commit_in_few_transactions(dsn: str) -> None:
    async with migrated(dsn) as conn, Pool(dsn, max_size=4) as pool:
        results: dict[int, trioq.EnqueueResult] = {}
        async with trioq.open_group_producer(pool) as producer:

            async def one(i: int) -> None:
                results[i] = await producer.enqueue("t", {"i": i}, queue=f"q{i % 3}")
                # returned: committed, seen by another connection
                assert await _count(conn, f"id = {results[i].job_id}") == 1

            async with trio.open_nursery() as nursery:
                for i in range(100):
                    nursery.start_soon(one, i)
            stats = producer.statistics()
        assert stats.jobs == 100
        assert stats.batches <= 4, stats  # one per flusher at most, not one per job
        assert stats.largest_batch >= 25
        rows = await (await conn.execute("SELECT id, args, queue FROM trioq.jobs")).fetchall()
        by_id = {job_id: (args, queue) for job_id, args, queue in rows}
        assert {i: by_id[r.job_id] for i, r in results.items()} == {
            i: ({"i": i}, f"q{i % 3}") for i in range(100)
        }


async def test_a_job_the_database_refuses_fails_only_its_caller(dsn: str) -> None:
    async with migrated(dsn) as conn, Pool(dsn, max_size=2) as pool:
        await conn.execute("""
            CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.task = 'bad' THEN RAISE EXCEPTION 'no bad jobs'; END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse BEFORE INSERT ON trioq.jobs
            FOR EACH ROW EXECUTE FUNCTION refuse();
        """)
        outcomes: dict[int, object] = {}
        async with trioq.open_group_producer(pool, flushers=1) as producer:

            async def one(i: int) -> None:
                try:
                    outcomes[i] = await producer.enqueue("bad" if i == 7 else "good", i)
                except psycopg.Error as exc:
                    outcomes[i] = exc

            async with trio.open_nursery() as nursery:
                for i in range(20):
                    nursery.start_soon(one, i)
            stats = producer.statistics()
        assert isinstance(outcomes.pop(7), psycopg.errors.RaiseException)
        assert all(isinstance(r, trioq.EnqueueResult) for r in outcomes.values())
        assert await _count(conn) == 19
        assert stats.retried_alone == 20  # the batch that failed went again, job by job


async def test_bad_input_is_the_callers_error_with_the_trio_paths_words(dsn: str) -> None:
    async with migrated(dsn) as conn, Pool(dsn, max_size=1) as pool:
        async with trioq.open_group_producer(pool) as producer:
            bad: list[dict[str, Any]] = [{"task": ""}, {"task": "t", "priority": 2**40},
                                         {"task": "t", "args": {"s": "\ud800"}},
                                         {"task": "t", "delay": -1}]  # fmt: skip
            for kwargs in bad:
                with pytest.raises((TypeError, ValueError)) as grouped:
                    await producer.enqueue(**kwargs)
                with pytest.raises((TypeError, ValueError)) as direct:
                    await trioq.enqueue(conn, **kwargs)
                assert str(grouped.value) == str(direct.value)
            assert producer.statistics().batches == 0
        assert await _count(conn) == 0


async def test_dedup_keys_and_after_keep_their_meaning_in_a_batch(dsn: str) -> None:
    async with migrated(dsn) as conn, Pool(dsn, max_size=2) as pool:
        first = await trioq.enqueue(conn, "parent")
        got: list[trioq.EnqueueResult] = []
        async with trioq.open_group_producer(pool, flushers=1) as producer:

            async def one(kwargs: dict[str, Any]) -> None:
                got.append(await producer.enqueue("t", **kwargs))

            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(one, {"dedup_key": "same"})
                nursery.start_soon(one, {"after": [first.job_id]})
        assert sorted(r.duplicate for r in got) == [False, False, True, True, True, True]
        assert await _count(conn, "state = 'waiting'") == 1
        assert await _count(conn) == 3


async def test_a_caller_cancelled_before_its_job_is_taken_withdraws_it(dsn: str) -> None:
    """One flusher, stuck on the pool's only connection (the test holds it): the first job
    is taken and waits; the second waits in the channel, and its caller gives up."""
    async with migrated(dsn) as conn, Pool(dsn, max_size=1) as pool:
        held = await pool.getconn()
        async with (
            trioq.open_group_producer(pool, flushers=1) as producer,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(producer.enqueue, "first")
            await trio.testing.wait_all_tasks_blocked()
            scope = trio.CancelScope()
            nursery.start_soon(_cancelled, producer, scope)
            await trio.testing.wait_all_tasks_blocked()
            assert producer.statistics().waiting == 1
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            await pool.putconn(held)
        cur = await conn.execute("SELECT task FROM trioq.jobs")
        assert await cur.fetchall() == [("first",)]


async def _cancelled(producer: trioq.GroupProducer, scope: trio.CancelScope) -> None:
    with scope:
        await producer.enqueue("second")


async def test_leaving_the_block_commits_what_was_handed_over(dsn: str) -> None:
    async with migrated(dsn) as conn, Pool(dsn, max_size=2) as pool:
        async with trio.open_nursery() as nursery, trioq.open_group_producer(pool) as producer:
            for i in range(50):
                nursery.start_soon(producer.enqueue, "t", i)
            await trio.testing.wait_all_tasks_blocked()
        assert await _count(conn) == 50
        with pytest.raises(RuntimeError, match="block has ended"):
            await producer.enqueue("late")


async def test_its_settings_are_checked() -> None:
    async with Pool("dbname=unused", max_size=1) as pool:
        with pytest.raises(ValueError, match="max_batch must be at most 100,000"):
            async with trioq.open_group_producer(pool, max_batch=10**6):
                pass
        with pytest.raises(TypeError, match="flushers must be a positive int"):
            async with trioq.open_group_producer(pool, flushers=1.5):  # type: ignore[arg-type]
                pass
    with pytest.raises(TypeError, match=r"pool must be a trioq\.pg\.Pool"):
        async with trioq.open_group_producer("dbname=x"):  # type: ignore[arg-type]
            pass


def test_enqueues_defaults_are_job_specs() -> None:
    """`GroupProducer.enqueue` passes JobSpec only what the caller gave: that is the same job
    as `trioq.enqueue` makes only while their defaults agree."""
    import inspect

    import attrs

    enqueue = inspect.signature(trioq.Queue.enqueue).parameters
    defaults = {name: p.default for name, p in enqueue.items()
                if name not in ("self", "conn", "task", "notify")}  # fmt: skip
    assert set(defaults) == {f.name for f in attrs.fields(trioq.JobSpec) if f.init} - {"task"}
    for name, default in defaults.items():
        assert trioq.JobSpec(task="t", **{name: default}) == trioq.JobSpec(task="t"), name


async def test_a_wrong_call_is_worded_as_enqueues(dsn: str) -> None:
    async with migrated(dsn) as conn, Pool(dsn, max_size=1) as pool:
        async with trioq.open_group_producer(pool) as producer:
            calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
                ((), {}), (("t", 1, 2), {}), (("t",), {"task": "u"}), (("t",), {"bogus": 1})]
            for args, kwargs in calls:
                with pytest.raises(TypeError) as grouped:
                    await producer.enqueue(*args, **kwargs)
                with pytest.raises(TypeError) as direct:
                    await trioq.enqueue(conn, *args, **kwargs)
                assert str(grouped.value) == str(direct.value), args
        assert await _count(conn) == 0
