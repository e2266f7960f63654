"""Sequences on real Postgres: the jobs of one ``sequence_key`` run one at a time, in enqueue
order, through retries, deaths, cancels and deletes; concurrent enqueues and an enqueue racing
the head's end make one head; a sequence whose head is gone without its trigger is freed by the
stranded sweep; every path refuses what a sequence cannot mean in the same words. Then the same
across two real ``trioq serve`` processes, one of them SIGKILLed."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json
from typing import Any

import psycopg
import pytest
import trio
from asgi import call
from clitool import trioq_cli
from helpers import migrated, rows, scalar, wait_until_blocked
from psycopg.types.json import Jsonb

import trioq
import trioq.web
from trioq import Failure, JobSpec, Lease, Queue, producer
from trioq._job import SEQUENTIAL_ALONE
from trioq._pg.pool import Pool
from trioq._worker.services.stranded import Stranded

LEASE = dt.timedelta(seconds=60)
Q = Queue()


async def _enqueue(conn: Any, key: str | None, n: int = 1, **kw: Any) -> list[int]:
    return [(await trioq.enqueue(conn, "t", {"i": i}, sequence_key=key, **kw)).job_id
            for i in range(n)]  # fmt: skip


async def _states(conn: Any, ids: list[int]) -> list[str | None]:
    found = dict(await rows(conn, "SELECT id, state FROM trioq.jobs WHERE id = ANY(%s)", ids))
    return [found.get(i) for i in ids]


async def _claim(conn: Any, limit: int = 10) -> list[trioq.Job]:
    return await Q.claim(conn, "default", owner="w", limit=limit, lease=LEASE)


async def _complete(conn: Any, jobs: list[trioq.Job]) -> None:
    await Q.complete_many(conn, owner="w", leases=[Lease(j.id, j.attempt) for j in jobs])


async def test_the_jobs_of_a_key_run_one_at_a_time_in_enqueue_order(dsn: str) -> None:
    async with migrated(dsn) as conn:
        seq = await _enqueue(conn, "acct-1", 3)
        other = await _enqueue(conn, "acct-2", 1)
        free = await _enqueue(conn, None, 1)
        assert await _states(conn, seq) == ["available", "waiting", "waiting"]
        for head in seq:
            got = await _claim(conn)
            assert {j.id for j in got} >= {head}
            assert {j.id for j in got} & set(seq) == {head}  # never two of the key at once
            await _complete(conn, [j for j in got if j.id == head])
        assert await _states(conn, seq) == [None, None, None]
        assert await _states(conn, other + free) == ["running", "running"]
        assert await scalar(conn, "SELECT count(*) FROM trioq.sequences") == 1  # acct-2's


async def test_a_retrying_or_dead_head_and_what_follows(dsn: str) -> None:
    """A failed head waiting for its retry keeps the others waiting; a dead head (moved to
    dead_jobs) frees the next: the sequence goes on."""
    async with migrated(dsn) as conn:
        seq = await _enqueue(conn, "k", 3, max_attempts=2)
        [head] = await _claim(conn)
        await Q.fail_many(conn, owner="w", failures=[
            Failure(lease=Lease(head.id, head.attempt), error="boom",
                    delay=dt.timedelta(hours=1))])
        assert await _states(conn, seq) == ["scheduled", "waiting", "waiting"]
        assert await _claim(conn) == []
        # while the head waits for its retry: a new job of the key waits too, and a cancelled
        # waiting job frees nothing
        [late] = await _enqueue(conn, "k")
        await Q.cancel(conn, late)
        assert await _states(conn, [*seq, late]) == ["scheduled", "waiting", "waiting",
                                                      "cancelled"]  # fmt: skip
        [solo] = await _enqueue(conn, "solo")  # a key whose only job is a retrying head
        [claimed] = [j for j in await _claim(conn) if j.id == solo]
        await Q.fail_many(conn, owner="w", failures=[
            Failure(lease=Lease(solo, claimed.attempt), error="boom",
                    delay=dt.timedelta(hours=1))])
        [second] = await _enqueue(conn, "solo")
        assert await _states(conn, [solo, second]) == ["scheduled", "waiting"]
        await conn.execute("UPDATE trioq.jobs SET run_at = now(), state = 'available'"
                           " WHERE id = %s", (head.id,))  # fmt: skip
        [again] = await _claim(conn)
        assert again.id == head.id
        await Q.fail_many(conn, owner="w",
                          failures=[Failure(lease=Lease(head.id, 2), error="boom again")])
        assert await scalar(conn, "SELECT count(*) FROM trioq.dead_jobs") == 1
        assert await _states(conn, seq) == [None, "available", "waiting"]


async def test_cancels_and_deletes(dsn: str) -> None:
    """Cancelling a waiting job frees nothing (the head is still there) and takes it out of
    the order; cancelling or deleting the head frees the next."""
    async with migrated(dsn) as conn:
        seq = await _enqueue(conn, "k", 4)
        await Q.cancel(conn, seq[1])
        assert await _states(conn, seq) == ["available", "cancelled", "waiting", "waiting"]
        await Q.cancel(conn, seq[0])
        assert await _states(conn, seq) == ["cancelled", "cancelled", "available", "waiting"]
        await conn.execute("DELETE FROM trioq.jobs WHERE id = %s", (seq[2],))
        assert await _states(conn, seq) == ["cancelled", "cancelled", None, "available"]


async def test_a_scheduled_job_freed_stays_scheduled_until_its_time(dsn: str) -> None:
    async with migrated(dsn) as conn:
        [head] = await _enqueue(conn, "k")
        [later] = await _enqueue(conn, "k", delay=3600)
        assert await _states(conn, [head, later]) == ["available", "waiting"]
        await conn.execute("DELETE FROM trioq.jobs WHERE id = %s", (head,))
        assert await _states(conn, [later]) == ["scheduled"]


async def test_bulk_and_many_keep_the_order(dsn: str) -> None:
    async with migrated(dsn) as conn:
        ids = await trioq.enqueue_bulk(conn, "t", [{"i": i} for i in range(5)], sequence_key="b")
        assert await _states(conn, ids) == ["available"] + ["waiting"] * 4
        specs = [JobSpec(task="t", args={"i": i}, sequence_key="m" if i % 2 else None)
                 for i in range(6)]  # fmt: skip
        many = [r.job_id for r in await trioq.enqueue_many(conn, specs)]
        assert await _states(conn, many) == ["available", "available", "available", "waiting",
                                             "available", "waiting"]  # fmt: skip


async def test_the_sql_api_enqueues_into_a_sequence(dsn: str) -> None:
    """trioq.enqueue(..., sequence_key => ...) in SQL (migration 27): the same sequence as the
    Python API's, behind a Python job and ahead of one; the refusals are the parity test's."""
    async with migrated(dsn) as conn:
        [head] = await _enqueue(conn, "mixed")
        by_sql = await scalar(conn, "SELECT trioq.enqueue('t', sequence_key => 'mixed')")
        later = await scalar(conn, "SELECT trioq.enqueue('t', '{}', 'default', 0, NULL, NULL,"
                                   " NULL, NULL, NULL, true, NULL, NULL, NULL, 'mixed')")
        [tail] = await _enqueue(conn, "mixed")
        alone = await scalar(conn, "SELECT trioq.enqueue('t', sequence_key => 'sql-only')")
        order = [head, by_sql, later, tail]
        assert await _states(conn, [*order, alone]) == ["available", "waiting", "waiting",
                                                         "waiting", "available"]  # fmt: skip
        assert (await trioq.job_status(conn, by_sql)).state == "waiting"
        for i, job_id in enumerate(order):
            got = [j for j in await _claim(conn) if j.id in order]
            assert [j.id for j in got] == [job_id]
            await _complete(conn, got)
            assert await _states(conn, order[i + 1:i + 2]) == ["available"][: len(order) - i - 1]
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="a job of a sequence"):
            await conn.execute("SELECT trioq.enqueue('t', dedup_key => 'd',"
                               " sequence_key => 'k')")  # fmt: skip


def test_the_producers_enqueue_into_a_sequence(dsn: str) -> None:
    """The sync and asyncio producers (trioq.producer) take sequence_key as trioq.enqueue
    does: their jobs join the same sequence, waiting behind its head, and refuse a bad key in
    the same words."""
    async def setup() -> None:
        async with migrated(dsn):
            pass

    trio.run(setup)
    with psycopg.connect(dsn, autocommit=True) as conn:
        head = producer.enqueue(conn, "t", sequence_key="p").job_id
        bulk = producer.enqueue_bulk(conn, "t", [{}, {}], sequence_key="p")
        with pytest.raises(ValueError, match="sequence_key must be a non-empty string"):
            producer.enqueue(conn, "t", sequence_key="")

    async def by_asyncio() -> int:
        aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        async with aconn:
            return (await producer.aenqueue(aconn, "t", sequence_key="p")).job_id

    last = asyncio.run(by_asyncio())
    with psycopg.connect(dsn) as conn:
        found: dict[int, str] = dict(
            conn.execute("SELECT id, state FROM trioq.jobs WHERE sequence_key = 'p'")
        )
    assert [found[i] for i in [head, *bulk, last]] == ["available"] + ["waiting"] * 3


async def test_job_status_and_jobs_show_say_the_sequence(dsn: str) -> None:
    """job_status has the key (a job with none, and a dead one, None); ``trioq jobs show``
    prints it, and its --json has it."""
    async with migrated(dsn) as conn:
        [head, second] = await _enqueue(conn, "acct\n7", 2)
        [plain] = await _enqueue(conn, None)
        assert (await trioq.job_status(conn, second)).sequence_key == "acct\n7"
        assert (await trioq.job_status(conn, plain)).sequence_key is None
        await conn.execute("DELETE FROM trioq.jobs WHERE id = %s", (head,))
        [got] = [j for j in await _claim(conn) if j.id == second]
        await Q.fail_many(conn, owner="w", failures=[
            Failure(lease=Lease(second, got.attempt), error="x", fatal=True)])
        dead = await trioq.job_status(conn, second)
        assert (dead.state, dead.sequence_key) == ("dead", None)
        [third] = await _enqueue(conn, "acct-8", 1)
    out = await trio.to_thread.run_sync(lambda: trioq_cli("jobs", "show", str(third), "--dsn",
                                                          dsn))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "  sequence:  acct-8" in out.stdout.splitlines()
    shown = await trio.to_thread.run_sync(lambda: trioq_cli("jobs", "show", str(third), "--dsn",
                                                            dsn, "--json"))  # fmt: skip
    assert json.loads(shown.stdout)["sequence_key"] == "acct-8"


async def test_the_dashboards_job_page_shows_the_sequence(dsn: str) -> None:
    """A job's page names its sequence (escaped, as every value); a job without one has no
    such line."""
    async with migrated(dsn) as conn:
        [head, second] = await _enqueue(conn, "<b>acct</b>", 2)
        [plain] = await _enqueue(conn, None)
    app = trioq.web.app(dsn)
    try:
        page = (await call(app, "GET", f"/jobs/{second}")).text
        assert 'id="state">waiting<' in page
        assert '<code id="sequence-key">&lt;b&gt;acct&lt;/b&gt;</code>' in page
        assert 'id="sequence-key"' in (await call(app, "GET", f"/jobs/{head}")).text
        assert 'id="sequence-key"' not in (await call(app, "GET", f"/jobs/{plain}")).text
    finally:
        await app.aclose()


def test_a_finish_probes_its_key_by_index(dsn: str) -> None:
    """The statements sequence_advance runs when a job of a sequence ends use their indexes
    (migration 28: the key's collation was the channel name's "C", and every probe scanned its
    whole table). auto_explain shows the plans of the trigger's nested statements."""

    async def setup() -> None:
        async with migrated(dsn) as conn:
            await conn.execute("INSERT INTO trioq.jobs (queue, task, args, sequence_key)"
                               " SELECT 'default', 't', '{}', 'k' || i"
                               "   FROM generate_series(1, 3000) i")  # fmt: skip
            await conn.execute("VACUUM ANALYZE trioq.jobs, trioq.sequences")

    trio.run(setup)
    plans: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
        for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                        "SET auto_explain.log_nested_statements = on",
                        "SET client_min_messages = log"):  # fmt: skip
            conn.execute(setting)
        conn.execute("DELETE FROM trioq.jobs WHERE sequence_key = 'k7'")
    nested = [p for p in plans if "p_key" in p or "= k" in p]
    assert len(nested) >= 3, plans
    assert not [p for p in nested if "Seq Scan" in p], nested


async def test_concurrent_enqueues_make_one_head(dsn: str) -> None:
    """Twenty connections enqueue five jobs each of one key, each in a transaction of its
    own, all at once: exactly one of the 100 is not waiting. (Which one is the head is the
    first to lock the key: between concurrent producers the order is either; each
    producer's own jobs keep theirs, as their ids do.)"""
    async with migrated(dsn) as conn:
        pass

    async def producer(n: int) -> None:
        async with await trioq.connect(dsn) as c:
            for _ in range(5):
                async with c.transaction():
                    await trioq.enqueue(c, "t", {"n": n}, sequence_key="hot")

    async with trio.open_nursery() as nursery:
        for n in range(20):
            nursery.start_soon(producer, n)
    async with await trioq.connect(dsn, autocommit=True) as conn:
        states = await rows(conn, "SELECT state, count(*) FROM trioq.jobs GROUP BY 1 ORDER BY 1")
        assert states == [("available", 1), ("waiting", 99)]


@pytest.mark.parametrize("first", ["enqueue", "end"])
async def test_an_enqueue_racing_the_heads_end_makes_one_head(dsn: str, first: str) -> None:
    """One transaction enqueues a job of the key while another deletes (completes) the head;
    whichever locks the key first, the other waits for it, and one job is left unwaiting."""
    async with migrated(dsn) as conn:
        [head] = await _enqueue(conn, "k")
        async with await trioq.connect(dsn) as a, await trioq.connect(dsn) as b:
            if first == "enqueue":
                await a.execute("BEGIN")
                await trioq.enqueue(a, "t", sequence_key="k")
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(b.execute, "DELETE FROM trioq.jobs WHERE id = %s",
                                       (head,))  # fmt: skip
                    await wait_until_blocked(conn, b)
                    await a.execute("COMMIT")
            else:
                await b.execute("BEGIN")
                await b.execute("DELETE FROM trioq.jobs WHERE id = %s", (head,))

                async def enqueue() -> None:
                    await trioq.enqueue(a, "t", sequence_key="k")

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(enqueue)
                    await wait_until_blocked(conn, a)
                    await b.execute("COMMIT")
                await a.execute("COMMIT")
            if first == "enqueue":
                await b.execute("COMMIT")
        assert await rows(conn, "SELECT state FROM trioq.jobs") == [("available",)]


async def test_a_sequence_without_its_head_is_freed_by_the_stranded_sweep(dsn: str) -> None:
    """Rows written with the triggers off (a waiting job whose key has no head): the stranded
    sweep frees the earliest, and never moves a sequence's waiting job to dead_jobs."""
    async with migrated(dsn) as conn:
        await conn.execute("SET session_replication_role = replica")  # no triggers
        cur = await conn.execute(
            "INSERT INTO trioq.jobs (queue, task, args, state, sequence_key)"
            " SELECT 'default', 't', '{}', 'waiting', 'lost' FROM generate_series(1, 2)"
            " RETURNING id")  # fmt: skip
        ids = sorted(r[0] for r in await cur.fetchall())
        await conn.execute("INSERT INTO trioq.sequences (key) VALUES ('lost')")
        await conn.execute("SET session_replication_role = origin")
        async with Pool(dsn, max_size=1, connect_kwargs={"autocommit": True}) as pool:
            done = await Stranded(pool, Q.sql, interval=60).run_once()
        assert (done.advanced, done.moved) == (["lost"], {})
        assert await _states(conn, ids) == ["available", "waiting"]


BAD_KEYS: list[tuple[Any, type[Exception], str]] = [
    ("", ValueError, "sequence_key must be a non-empty string of at most 500 characters"),
    ("x" * 501, ValueError, "sequence_key must be a non-empty string of at most 500 characters"),
    (5, TypeError, "sequence_key must be a string or None, got 5"),
    ("a\x00b", ValueError, "sequence_key"),
    ("\ud800", ValueError, "sequence_key"),
]


@pytest.mark.parametrize(("key", "kind", "words"), BAD_KEYS)
async def test_bad_keys_are_refused_with_the_same_words_on_every_path(
    dsn: str, key: Any, kind: type[Exception], words: str
) -> None:
    async with migrated(dsn) as conn:
        for call in (lambda: trioq.enqueue(conn, "t", sequence_key=key),
                     lambda: trioq.enqueue_bulk(conn, "t", [{}], sequence_key=key),
                     lambda: trioq.enqueue_many(conn, [JobSpec(task="t", sequence_key=key)])):
            with pytest.raises(kind) as caught:
                await call()
            assert words in str(caught.value)
        assert await scalar(conn, "SELECT count(*) FROM trioq.jobs") == 0


async def test_what_a_sequence_cannot_mean_is_refused(dsn: str) -> None:
    async with migrated(dsn) as conn:
        [dep] = await _enqueue(conn, None)
        for options in ({"after": [dep]}, {"dedup_key": "d"}, {"unique": True},
                        {"dedup_key": "d", "debounce": 5}):
            with pytest.raises(ValueError, match="a job of a sequence"):
                await trioq.enqueue(conn, "t", sequence_key="k", **options)
        with pytest.raises(ValueError, match="a job of a sequence"):
            await trioq.Batch(jobs=[JobSpec(task="t", sequence_key="k")],
                              callback=JobSpec(task="done")).enqueue(conn)
        with pytest.raises(psycopg.errors.CheckViolation):
            await conn.execute("INSERT INTO trioq.jobs (queue, task, args, sequence_key)"
                               " VALUES ('default', 't', '{}', '')")  # fmt: skip
    assert "a job of a sequence" in SEQUENTIAL_ALONE


async def test_a_task_derives_its_sequence(dsn: str) -> None:
    tasks = trioq.Registry()

    @tasks.task(sequential=True)
    async def whole(n: int) -> None: ...

    @tasks.task(sequential="account")
    async def per_account(account: int, n: int) -> None: ...

    assert whole.spec(n=1).sequence_key == "whole"
    assert per_account.spec(account=7, n=1).sequence_key == "per_account|account=7"
    with pytest.raises(TypeError, match="sequential must be True, a field name"):
        trioq.Registry().task(sequential=5)(whole.fn)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="a job of a sequence"):
        trioq.Registry().task(sequential=True, unique=trioq.Unique())(whole.fn)
    with pytest.raises(ValueError, match="sequential field"):
        per_account.spec(n=1)
    async with migrated(dsn) as conn:
        a = (await per_account.enqueue(conn, account=1, n=1)).job_id
        b = (await per_account.enqueue(conn, account=1, n=2)).job_id
        c = (await per_account.enqueue(conn, account=2, n=1)).job_id
        assert await _states(conn, [a, b, c]) == ["available", "waiting", "available"]


RUNS = """
CREATE TABLE seq_runs (job_id bigint, attempt int, worker text, started timestamptz,
                       ended timestamptz)
"""


@pytest.mark.slow
def test_two_serve_processes_run_each_sequence_in_order_one_at_a_time(
    dsn: str, tmp_path: Any
) -> None:
    """Three keys of 12 jobs each, interleaved, a fifth failing its first attempt, one
    waiting job per key cancelled; two ``trioq serve`` processes of 4 slots, one SIGKILLed
    once a third of the jobs have run and another started. For each key, every run of a
    job starts after the last run of the job before it ended, and the jobs first start in
    enqueue order."""
    import os
    import random

    from clitool import trioq_cli
    from test_flow_processes import Workers, query, wait_for

    class Seq(Workers):
        target = "seq_app:config"

    seed = int(os.environ.get("TRIOQ_SEQ_SEED", random.randrange(2**32)))
    rnd = random.Random(seed)
    assert trioq_cli("migrate", "--dsn", dsn).returncode == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RUNS)
        ids: dict[str, list[int]] = {f"acct-{k}": [] for k in range(3)}
        for n in range(12):
            for key, mine in ids.items():
                args = {"key": key, "n": n, "ms": rnd.randint(5, 30), "fail": rnd.random() < 0.2}
                cur = conn.execute(
                    "INSERT INTO trioq.jobs (queue, task, args, sequence_key)"
                    " VALUES ('seq', 'step', %s, %s) RETURNING id",
                    (Jsonb(args), key))  # fmt: skip
                fetched = cur.fetchone()
                assert fetched is not None
                mine.append(fetched[0])
        cancelled = {key: mine[rnd.randint(3, 10)] for key, mine in ids.items()}
        for job_id in cancelled.values():
            conn.execute("UPDATE trioq.jobs SET state = 'cancelled', finished_at = now()"
                         " WHERE id = %s AND state = 'waiting'", (job_id,))  # fmt: skip
    workers = Seq(dsn, tmp_path)
    try:
        names = [workers.start(4), workers.start(4)]
        workers.wait_ready(names)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_notify('trioq_trioq', 'seq')")
        wait_for(dsn, "SELECT count(*) >= 12 FROM seq_runs WHERE ended IS NOT NULL",
                 [(True,)], timeout=60)  # fmt: skip
        workers.kill(names[0])
        workers.wait_ready([workers.start(4)])
        wait_for(dsn, "SELECT count(*) FROM trioq.jobs WHERE state NOT IN ('done', 'cancelled')",
                 [(0,)], timeout=120)  # fmt: skip
    finally:
        workers.stop_all()
    runs = query(dsn, "SELECT job_id, attempt, started, ended FROM seq_runs")
    dead = query(dsn, "SELECT count(*) FROM trioq.dead_jobs")
    assert dead == [(0,)], seed
    by_job: dict[int, list[tuple[Any, Any]]] = {}
    for job_id, _, started, ended in runs:
        by_job.setdefault(job_id, []).append((started, ended))
    for key, mine in ids.items():
        order = [j for j in mine if j != cancelled[key]]
        assert cancelled[key] not in by_job, (key, seed)
        assert set(order) <= set(by_job), (key, seed)
        firsts = sorted(order, key=lambda j: min(s for s, _ in by_job[j]))
        assert firsts == order, (key, seed)
        for before, after in itertools.pairwise(order):
            ends = [e for _, e in by_job[before] if e is not None]
            assert ends, (before, seed)
            assert max(ends) <= min(s for s, _ in by_job[after]), (key, before, after, seed)
    killed = sum(1 for _, _, _, ended in runs if ended is None)
    print(f"\nsequences across processes: seed {seed}, {len(runs)} runs, "
          f"{killed} cut by the SIGKILL")
