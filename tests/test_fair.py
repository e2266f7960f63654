"""Fair share between keys on real Postgres: a queue set ``fair`` claims round-robin across
its jobs' keys (their concurrency key), from claim to claim and worker to worker, so one
key's backlog does not delay another key's few jobs; the jobs without a key are one group
that takes its turn; per-key limits still hold; a claim reads rows in proportion to its batch,
not to any key's backlog. Then the same across two real ``trioq serve`` processes."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from clitool import trioq_cli
from helpers import migrated, rows, scalar

import trioq
from trioq import Queue, QueueConfig

LEASE = dt.timedelta(seconds=60)
Q = Queue()


async def _fill(conn: Any, key: str | None, n: int, queue: str = "q") -> list[int]:
    """``n`` available jobs of ``key`` (in one statement: fast for big backlogs)."""
    cur = await conn.execute(
        "INSERT INTO trioq.jobs (queue, task, args, concurrency_key)"
        " SELECT %s, 't', jsonb_build_object('i', g), %s FROM generate_series(1, %s) AS g"
        " RETURNING id", (queue, key, n))  # fmt: skip
    return sorted(r[0] for r in await cur.fetchall())


async def _claim(conn: Any, limit: int, owner: str = "w", queue: str = "q") -> Any:
    return await Q.claim_limited(conn, queue, owner=owner, limit=limit, lease=LEASE)


async def _keys(conn: Any, jobs: list[trioq.Job]) -> list[Any]:
    """Each claimed job's key, in the order of the claim's rotation (round, then key)."""
    found = dict(await rows(conn, "SELECT id, concurrency_key FROM trioq.jobs WHERE id = ANY(%s)",
                            [j.id for j in jobs]))  # fmt: skip
    return [found[j.id] for j in jobs]


async def test_one_keys_backlog_does_not_delay_anothers(dsn: str) -> None:
    """20,000 jobs of tenant a, then 10 of tenant b: in a fair queue the first claim of 10
    takes 5 of each, and b is done in two claims; without fair share b waits behind a."""
    async with migrated(dsn) as conn:
        await _fill(conn, "tenant=a", 20_000)
        b = await _fill(conn, "tenant=b", 10)
        await Q.set_limits(conn, "q", global_concurrency=1000)  # controlled, not fair
        got = await _claim(conn, 10)
        assert set(await _keys(conn, got.jobs)) == {"tenant=a"}  # priority order: a first
        await conn.execute("UPDATE trioq.jobs SET state = 'available', lease_owner = NULL,"
                           " lease_expires_at = NULL, attempt = 0 WHERE state = 'running'")
        await Q.set_limits(conn, "q", fair=True)
        first = await _claim(conn, 10)
        assert sorted(await _keys(conn, first.jobs)) == ["tenant=a"] * 5 + ["tenant=b"] * 5
        second = await _claim(conn, 10)
        taken_b = {j.id for j in first.jobs + second.jobs} & set(b)
        assert taken_b == set(b)  # the small tenant is through in two claims of 10
        assert (first.reason, second.reason) == (None, None)  # full batches


async def test_the_rotation_goes_on_from_claim_to_claim_and_worker_to_worker(dsn: str) -> None:
    """Keys a, b, c, d with 3 jobs each: claims of one job by alternating workers serve the
    keys in turn; a claim of 3 goes on where the last one stopped; each key's jobs come in
    its own order (priority first)."""
    async with migrated(dsn) as conn:
        ids = {k: await _fill(conn, k, 3) for k in "abcd"}
        await conn.execute("UPDATE trioq.jobs SET priority = -1 WHERE id = %s", (ids["b"][2],))
        await Q.set_limits(conn, "q", fair=True)
        served = []
        for i in range(5):
            got = await _claim(conn, 1, owner=f"w{i % 2}")
            served += await _keys(conn, got.jobs)
        assert served == ["a", "b", "c", "d", "a"]
        got = await _claim(conn, 3)
        assert await _keys(conn, got.jobs) == ["b", "c", "d"]
        # b's best job came first in its turn: priority -1, enqueued last
        b_jobs = await rows(conn, "SELECT id FROM trioq.jobs WHERE concurrency_key = 'b'"
                                  " AND state = 'running' ORDER BY attempt, id")  # fmt: skip
        assert ids["b"][2] in {r[0] for r in b_jobs}
        cursor = await scalar(conn, "SELECT fair_cursor FROM trioq.queues WHERE name = 'q'")
        assert cursor == "d"


async def test_jobs_without_a_key_take_their_turn_as_one_group(dsn: str) -> None:
    """The unkeyed jobs are one group in the rotation, at its start (before the first key)."""
    async with migrated(dsn) as conn:
        await _fill(conn, "a", 3)
        await _fill(conn, None, 3)
        await _fill(conn, "b", 3)
        await Q.set_limits(conn, "q", fair=True)
        served = []
        for _ in range(6):
            served += await _keys(conn, (await _claim(conn, 1)).jobs)
        assert served == [None, "a", "b", None, "a", "b"]
        got = await _claim(conn, 5)  # what is left: one of each, a batch of 3, then drained
        assert (sorted(await _keys(conn, got.jobs), key=lambda k: k or ""), got.reason) == (
            [None, "a", "b"], None)


@pytest.mark.parametrize("cursor", [None, "", "a", "z"])
async def test_jobs_without_a_key_are_served_wherever_the_rotation_stands(
    dsn: str, cursor: str | None
) -> None:
    """Only unkeyed jobs left (the keyed ones all taken), whatever the cursor says: a claim
    takes them (one that found nothing would leave them for ever: the worker waits for news
    that never comes)."""
    async with migrated(dsn) as conn:
        await _fill(conn, None, 3)
        await Q.set_limits(conn, "q", fair=True)
        await conn.execute("UPDATE trioq.queues SET fair_cursor = %s WHERE name = 'q'",
                           (cursor,))  # fmt: skip
        got = await _claim(conn, 5)
        assert (await _keys(conn, got.jobs), got.reason) == ([None] * 3, None)


async def test_keys_with_nothing_due_do_not_hide_the_ones_behind_them(dsn: str) -> None:
    """Twelve keys whose available jobs are not due yet (a row written so, or a clock moved),
    and one key behind them with a due job: claims of 5 visit 5 keys each and go on after
    them, so the due job is taken by the third claim, not never."""
    async with migrated(dsn) as conn:
        for k in "abcdefghijkl":
            ids = await _fill(conn, k, 1)
            await conn.execute("UPDATE trioq.jobs SET run_at = now() + interval '1 hour'"
                               " WHERE id = %s", (ids[0],))  # fmt: skip
        [due] = await _fill(conn, "z", 1)
        await Q.set_limits(conn, "q", fair=True)
        taken = []
        for _ in range(3):
            taken += [j.id for j in (await _claim(conn, 5)).jobs]
        assert taken == [due]


async def test_per_key_limits_hold_in_a_fair_queue(dsn: str) -> None:
    """key_concurrency 1: a fair claim takes at most one job per key, skips a key that is
    full, and says ``keys`` when that held it back."""
    async with migrated(dsn) as conn:
        for k in "abc":
            await _fill(conn, k, 4)
        await Q.set_limits(conn, "q", fair=True, key_concurrency=1)
        got = await _claim(conn, 10)
        assert (sorted(await _keys(conn, got.jobs)), got.reason) == (["a", "b", "c"], "keys")
        got = await _claim(conn, 10)
        assert (got.jobs, got.reason) == ([], "keys")


async def test_a_fair_claim_reads_rows_in_proportion_to_its_batch(dsn: str) -> None:
    """With 20,000 jobs of one key and 10 of another, a fair claim of 10 reads a few dozen
    index entries of jobs, not the backlog (the server's own counters, in the claim's
    transaction); the same claim with 200 jobs of the big key reads as few."""

    async def rows_read(conn: Any) -> int:
        await conn.execute("BEGIN")
        try:  # the counts not flushed yet may include earlier transactions': a difference
            before = int(await scalar(conn, _ROWS_READ))
            await _claim(conn, 10)
            return int(await scalar(conn, _ROWS_READ)) - before
        finally:
            await conn.execute("ROLLBACK")

    async with migrated(dsn) as conn:
        await _fill(conn, "big", 200)
        await _fill(conn, "small", 10)
        await Q.set_limits(conn, "q", fair=True)
        await conn.execute("ANALYZE trioq.jobs")
        small_backlog = await rows_read(conn)
        await _fill(conn, "big", 19_800)
        await conn.execute("ANALYZE trioq.jobs")
        big_backlog = await rows_read(conn)
    assert big_backlog < 200, (small_backlog, big_backlog)
    assert big_backlog <= small_backlog + 20, (small_backlog, big_backlog)


# Rows of jobs fetched by index scans and read by sequential scans (pg_stat_xact_user_tables:
# the backend's counts not yet flushed to the cumulative statistics).
_ROWS_READ = """
SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) FROM pg_stat_xact_user_tables
 WHERE schemaname = 'trioq' AND relname = 'jobs'
"""


async def test_a_broken_cursor_written_by_hand_does_not_stop_the_queue(dsn: str) -> None:
    """A cursor naming no key, a cursor past every key, or '' all just start the rotation
    somewhere: the claim serves every key."""
    async with migrated(dsn) as conn:
        for k in ("k1", "k2"):
            await _fill(conn, k, 5)
        await Q.set_limits(conn, "q", fair=True)
        for cursor in ("zzz", "k1x", "", "\uffff"):
            await conn.execute("UPDATE trioq.queues SET fair_cursor = %s WHERE name = 'q'",
                               (cursor,))  # fmt: skip
            got = await _claim(conn, 2)
            assert sorted(await _keys(conn, got.jobs)) == ["k1", "k2"], cursor
        with pytest.raises(psycopg.errors.CheckViolation):
            await conn.execute("UPDATE trioq.queues SET fair_cursor = %s WHERE name = 'q'",
                               ("x" * 501,))  # fmt: skip


async def test_fair_is_set_on_every_path_and_refused_in_the_same_words(dsn: str) -> None:
    async with migrated(dsn) as conn:
        settings = await Q.set_limits(conn, "q", fair=True)
        assert (settings.fair, settings.controlled) == (True, True)
        assert (await Q.set_limits(conn, "q", fair=False)).controlled is False
        for bad in (1, "yes", None):
            with pytest.raises(TypeError, match=f"fair must be True or False, got {bad!r}"):
                await Q.set_limits(conn, "q", fair=bad)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match=f"fair must be True or False, got {bad!r}"):
                QueueConfig(fair=bad)  # type: ignore[arg-type]
        assert QueueConfig(fair=True).limits() == {"fair": True}
        assert QueueConfig().limits() == {}
    done = trioq_cli("queue", "set", "q", "--fair", "--dsn", dsn)
    assert done.returncode == 0 and "fair share" in done.stdout, done.stderr
    listed = trioq_cli("queue", "list", "--dsn", dsn)
    assert listed.returncode == 0 and " fair " in listed.stdout.splitlines()[0]
    done = trioq_cli("queue", "set", "q", "--no-fair", "--dsn", dsn)
    assert done.returncode == 0 and "fair share" not in done.stdout, done.stderr


@pytest.mark.slow
def test_two_serve_processes_serve_the_small_tenant_first(dsn: str, tmp_path: Any) -> None:
    """Two ``trioq serve`` processes (2 slots each) drain a fair queue holding 400 jobs of
    tenant a, enqueued first, and 8 of tenant b: every b job starts before a's 40th start
    (they would start after all of a's without fair share: they are behind in the queue's
    order). The handlers record their starts on the database's clock."""
    from test_flow_processes import Workers, wait_for

    assert trioq_cli("migrate", "--dsn", dsn).returncode == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE handler_starts (job_id bigint, at timestamptz)")
        conn.execute("INSERT INTO trioq.queues (name, fair) VALUES ('limited', true)")
        conn.execute("INSERT INTO trioq.jobs (queue, task, args, concurrency_key)"
                     " SELECT 'limited', 'hold', '{\"ms\": 5}', 'tenant=a'"
                     " FROM generate_series(1, 400)")  # fmt: skip
        b = [r[0] for r in conn.execute(
            "INSERT INTO trioq.jobs (queue, task, args, concurrency_key)"
            " SELECT 'limited', 'hold', '{\"ms\": 5}', 'tenant=b' FROM generate_series(1, 8)"
            " RETURNING id").fetchall()]  # fmt: skip
    workers = Workers(dsn, tmp_path, record_starts="1")
    try:
        names = [workers.start(2), workers.start(2)]
        workers.wait_ready(names)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_notify('trioq_trioq', 'limited')")
        wait_for(dsn, "SELECT count(*) FROM trioq.jobs WHERE state <> 'done'", [(0,)],
                 timeout=120)  # fmt: skip
    finally:
        workers.stop_all()
    with psycopg.connect(dsn) as conn:
        order = [r[0] for r in conn.execute(
            "SELECT job_id FROM handler_starts ORDER BY at, job_id").fetchall()]  # fmt: skip
    assert len(order) == 408
    last_b = max(order.index(job_id) for job_id in b)
    print(f"\nfair share across processes: the last of b's 8 jobs was start {last_b + 1} of 408")
    assert last_b < 8 + 40, last_b


def test_the_cli_refuses_fair_with_a_value(dsn: str) -> None:
    done = subprocess.run([sys.executable, "-m", "trioq._cli", "queue", "set", "q", "--fair=1",
                           "--dsn", dsn], capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 2 and "--fair" in done.stderr
