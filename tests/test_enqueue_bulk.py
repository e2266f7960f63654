"""The fast enqueue paths against real Postgres: `enqueue_bulk`, and `enqueue_many` when its
jobs differ only in args. Same rows as one `enqueue` per job, validation before any SQL,
the caller's transaction, one notification per queue."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest

import trioq
import trioq._db.insert
from trioq import JobSpec, Queue

UTC = dt.UTC
T0 = dt.datetime(2030, 1, 1, tzinfo=UTC)
Q = Queue()
ROW = "task, queue, args, priority, run_at, max_attempts, state, attempt"
WEIRD = {"s": 'new\nline\ttab\\slash \u2028 é "q" \\u0000 not a NUL', "n": [1, 2.5, None, True]}


@asynccontextmanager
async def migrated(dsn: str) -> AsyncIterator[Any]:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
        await conn.execute("SELECT set_config('trioq.now', %s, false)", (T0.isoformat(),))
        yield conn


async def rows(conn: Any, ids: list[int]) -> list[tuple[Any, ...]]:
    """The rows of ``ids``, in that order."""
    order = "ORDER BY array_position(%(ids)s, id)"
    cur = await conn.execute(
        f"SELECT {ROW} FROM trioq.jobs WHERE id = ANY(%(ids)s) {order}", {"ids": ids}
    )
    result: list[tuple[Any, ...]] = await cur.fetchall()
    return result


async def count(conn: Any) -> int:
    cur = await conn.execute("SELECT count(*) FROM trioq.jobs")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


ARGS = [{"i": 0}, None, [1, "two"], "s", 3, WEIRD, {"é": "ü", "x": {"y": [None]}}]
SHARED: list[dict[str, Any]] = [
    {},
    {"queue": "mail", "priority": -7, "max_attempts": 3},
    {"delay": 90},
    {"delay": dt.timedelta(0)},
    {"run_at": T0 - dt.timedelta(hours=1)},
    {"run_at": T0 + dt.timedelta(hours=1), "queue": "later"},
    {"run_at": dt.datetime(2030, 1, 1, 3, tzinfo=dt.timezone(dt.timedelta(hours=5)))},
]


@pytest.mark.parametrize("shared", SHARED)
async def test_same_rows_as_one_enqueue_per_job(dsn: str, shared: dict[str, Any]) -> None:
    async with migrated(dsn) as conn:
        slow = [(await trioq.enqueue(conn, "t.x", a, **shared)).job_id for a in ARGS]
        bulk = await trioq.enqueue_bulk(conn, "t.x", ARGS, **shared)
        many = await trioq.enqueue_many(conn, [JobSpec(task="t.x", args=a, **shared) for a in ARGS])
        expected = await rows(conn, slow)
        assert [r[2] for r in expected] == [{} if a is None else a for a in ARGS]
        assert await rows(conn, bulk) == expected
        assert await rows(conn, [r.job_id for r in many]) == expected
        assert not any(r.duplicate for r in many)
        assert len(set(slow + bulk + [r.job_id for r in many])) == 3 * len(ARGS)


async def test_copy_path_same_rows_as_one_enqueue_per_job(dsn: str) -> None:
    """Jobs that differ in more than args go through COPY; same rows again."""
    specs: list[dict[str, Any]] = [
        {"task": "a", "args": WEIRD},
        {"task": "b", "args": None, "queue": "q2", "priority": 5},
        {"task": "a", "args": [1], "delay": 30},
        {"task": "c", "args": "x", "run_at": T0 - dt.timedelta(seconds=1), "max_attempts": 1},
    ]
    async with migrated(dsn) as conn:
        slow = [(await trioq.enqueue(conn, **s)).job_id for s in specs]
        many = await trioq.enqueue_many(conn, [JobSpec(**s) for s in specs])
        assert await rows(conn, [r.job_id for r in many]) == await rows(conn, slow)


async def test_ids_in_input_order_even_when_not_consecutive(dsn: str) -> None:
    async with migrated(dsn) as conn:
        first = await trioq.enqueue_bulk(conn, "t", [{"k": k} for k in range(50)])
        assert first == list(range(first[0], first[0] + 50))
        # Ids drawn by other sessions meanwhile leave gaps; an increment of 3 does the same.
        await conn.execute("ALTER SEQUENCE trioq.jobs_id_seq INCREMENT BY 3")
        gapped = await trioq.enqueue_bulk(conn, "t", [{"k": k} for k in range(50, 100)])
        assert gapped == sorted(gapped) and gapped[1] - gapped[0] == 3
        assert [r[2] for r in await rows(conn, first + gapped)] == [{"k": k} for k in range(100)]


async def test_accepts_any_iterable_and_nothing_for_nothing(dsn: str) -> None:
    async with migrated(dsn) as conn:
        assert await trioq.enqueue_bulk(conn, "t", []) == []
        assert await trioq.enqueue_many(conn, []) == []
        ids = await trioq.enqueue_bulk(conn, "t", ({"k": k} for k in range(3)))
        assert [r[2] for r in await rows(conn, ids)] == [{"k": 0}, {"k": 1}, {"k": 2}]


BAD_BULK: list[tuple[Callable[[list[Any]], dict[str, Any]], type[Exception], str]] = [
    (lambda a: {"args": [*a, {"x": object()}]}, ValueError, r"args\[1500\] must be JSON"),
    (lambda a: {"args": [*a, float("nan")]}, ValueError, r"args\[1500\] must be JSON"),
    (lambda a: {"args": [*a, {"x": "a\x00b"}]}, ValueError, r"args\[1500\] must not contain NUL"),
    (lambda a: {"args": [*a, ["x" * 300]]}, trioq.PayloadTooLargeError, r"args\[1500\] of task"),
    (lambda a: {"args": {"not": "a list"}}, TypeError, "one job's args per item"),
    (lambda a: {"args": "abc"}, TypeError, "one job's args per item"),
    (lambda a: {"args": a, "task": "a b"}, ValueError, "task 'a b' is invalid"),
    (lambda a: {"args": a, "queue": "x'; --"}, ValueError, "queue"),
    (lambda a: {"args": a, "priority": 101}, ValueError, "priority must be between"),
    (lambda a: {"args": a, "run_at": dt.datetime(2030, 1, 1)}, ValueError, "naive datetime"),
    (lambda a: {"args": a, "delay": -1}, ValueError, "delay must not be negative"),
    (lambda a: {"args": a, "run_at": T0, "delay": 1}, ValueError, "run_at or delay"),
    (lambda a: {"args": a, "max_attempts": 0}, ValueError, "max_attempts must be between"),
]


@pytest.mark.parametrize(("bad", "error", "message"), BAD_BULK)
async def test_bulk_validation_names_field_and_index_and_writes_nothing(
    dsn: str, bad: Callable[[list[Any]], dict[str, Any]], error: type[Exception], message: str
) -> None:
    good = [{"i": i} for i in range(1500)]  # the bad one is in the second encoding chunk
    kwargs = {"task": "t", **bad(good)}
    queue = Queue(max_payload_bytes=200) if error is trioq.PayloadTooLargeError else Q
    async with migrated(dsn) as conn:
        with pytest.raises(error, match=message):
            await queue.enqueue_bulk(conn, **kwargs)
        assert await count(conn) == 0


async def test_payload_limit_is_per_job_not_per_batch(dsn: str) -> None:
    async with migrated(dsn) as conn:
        small = Queue(max_payload_bytes=100)
        ids = await small.enqueue_bulk(conn, "t", [["x" * 90]] * 2000)  # 188 kB, 94 B each
        assert len(ids) == 2000
        under = ["é" * 48]  # 100 bytes of UTF-8 in 52 characters
        assert len(await small.enqueue_bulk(conn, "t", [under] * 3)) == 3
        with pytest.raises(trioq.PayloadTooLargeError, match=r"args\[1\] of task 't' are 102 b"):
            await small.enqueue_bulk(conn, "t", [under, ["é" * 49]])
        assert await count(conn) == 2003


async def test_enqueue_many_errors_name_the_job_and_write_nothing(dsn: str) -> None:
    async with migrated(dsn) as conn:
        small = Queue(max_payload_bytes=100)
        specs = [JobSpec(task="t"), JobSpec(task="t", args=["x" * 200])]
        with pytest.raises(trioq.PayloadTooLargeError, match=r"jobs\[1\]\.args of task 't'"):
            await small.enqueue_many(conn, specs)
        with pytest.raises(TypeError, match=r"jobs\[2\] must be a JobSpec"):
            await Q.enqueue_many(conn, [JobSpec(task="t"), JobSpec(task="t"), {"task": "t"}])  # type: ignore[list-item]
        assert await count(conn) == 0


async def test_rolled_back_with_the_callers_transaction(dsn: str) -> None:
    async with migrated(dsn) as conn, await trioq.connect(dsn, autocommit=True) as other:
        await other.execute("LISTEN trioq_trioq")
        async with conn.transaction(force_rollback=True):
            await trioq.enqueue_bulk(conn, "t", [{"i": i} for i in range(100)], queue="q1")
            await trioq.enqueue_many(conn, [JobSpec(task="t", args=i) for i in range(10)])
            assert await count(conn) == 110
            assert await count(other) == 0  # not visible before commit
        assert await count(other) == 0
        assert [n.payload async for n in other.notifies(timeout=0.3)] == []


async def test_one_notification_per_queue_per_transaction(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trioq._db.insert, "_BULK_STATEMENT_JOBS", 7)  # several statements per call
    async with migrated(dsn) as conn, await trioq.connect(dsn, autocommit=True) as other:
        await other.execute("LISTEN trioq_trioq")
        async with conn.transaction():
            await trioq.enqueue_bulk(conn, "t", [{"i": i} for i in range(50)], queue="q1")
            await trioq.enqueue_bulk(conn, "t", [1, 2], queue="q1")
            await trioq.enqueue_bulk(conn, "t", [1, 2], queue="q2", delay=60)
            await trioq.enqueue_many(
                conn, [JobSpec(task="t", args=i, queue="q3") for i in range(20)]
            )
            await Q.enqueue_bulk(conn, "t", [1, 2], queue="q4", notify=False)
        notes = sorted([n.payload async for n in other.notifies(timeout=0.5)])
        assert notes == ["@scheduled", "q1", "q3"]
        assert await count(other) == 76


async def test_several_statements_in_autocommit_are_one_transaction(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trioq._db.insert, "_BULK_STATEMENT_JOBS", 10)
    async with migrated(dsn) as conn:
        await conn.execute("ALTER TABLE trioq.jobs ADD CHECK (args->>'bad' IS NULL)")
        args: list[Any] = [{"i": i} for i in range(25)]
        ids = await trioq.enqueue_bulk(conn, "t", args)
        assert [r[2] for r in await rows(conn, ids)] == args
        with pytest.raises(psycopg.errors.CheckViolation):
            await trioq.enqueue_bulk(conn, "t", [*args, {"bad": 1}])  # fails in the third
        assert await count(conn) == 25
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


async def test_long_args_are_split_across_statements(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trioq._db.insert, "_BULK_STATEMENT_CHARS", 100)
    args: list[Any] = [{"i": i, "pad": "x" * (i % 40)} for i in range(30)]
    async with migrated(dsn) as conn, await trioq.connect(dsn, autocommit=True) as other:
        await other.execute("LISTEN trioq_trioq")
        async with conn.transaction():
            bulk = await trioq.enqueue_bulk(conn, "t", args)
            many = await trioq.enqueue_many(conn, [JobSpec(task="t", args=a) for a in args])
        assert [r[2] for r in await rows(conn, bulk)] == args
        assert [r[2] for r in await rows(conn, [r.job_id for r in many])] == args
        assert [n.payload async for n in other.notifies(timeout=0.3)] == ["default"]
