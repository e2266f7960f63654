"""Cron entries of the database with real ``trioq serve`` processes: an entry added with
``trioq cron add`` while two workers run fires on its schedule, each tick enqueued by exactly
one process; ``trioq cron remove`` stops it everywhere; a broken row stops nothing else.

The workers' poll interval is 300 s: what they learn within the test's deadlines they learn
from the ``@cron`` notification. A ledger on the database records every job inserted and
every tick a process went on to enqueue (the ``job_id`` written into its ``cron_ticks`` row
by the one process that claimed it), each at ``clock_timestamp()``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import pathlib
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest
import trio
from test_flow_processes import Workers, query

import trioq

pytestmark = pytest.mark.slow

TESTS = pathlib.Path(__file__).parent
LEDGER = """
CREATE TABLE ledger_jobs (job_id bigint, dedup_key text, at timestamptz);
CREATE FUNCTION ledger_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.ledger_jobs VALUES (NEW.id, NEW.dedup_key, clock_timestamp());
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_jobs AFTER INSERT ON trioq.jobs
    FOR EACH ROW EXECUTE FUNCTION public.ledger_jobs();
CREATE TABLE ledger_ticks (name text, tick timestamptz, job_id bigint, at timestamptz);
CREATE FUNCTION ledger_ticks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.ledger_ticks VALUES (NEW.name, NEW.tick, NEW.job_id, clock_timestamp());
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_ticks AFTER UPDATE OF job_id ON trioq.cron_ticks
    FOR EACH ROW EXECUTE FUNCTION public.ledger_ticks();
"""
#: Every 2 seconds (croniter's 6th field is the seconds).
EVERY_2S = "* * * * * */2"
TICK = dt.timedelta(seconds=2)


@pytest.fixture
def workers(dsn: str, tmp_path: pathlib.Path) -> Iterator[Workers]:
    async def migrate() -> None:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            await trioq.migrate(conn)

    trio.run(migrate)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LEDGER)
    group = Workers(dsn, tmp_path)
    group.target = "cron_app:config"
    try:
        yield group
    finally:
        group.stop_all()


def cli(dsn: str, *argv: str) -> str:
    """``trioq ARGV`` in a process of its own, as an operator runs it; its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRIOQ_DSN", "DATABASE_URL")}
    done = subprocess.run([sys.executable, "-m", "trioq._cli", *argv, "--dsn", dsn], env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def fired(dsn: str, name: str) -> list[tuple[dt.datetime, int]]:
    """(tick, job id) of every tick of ``name`` some process enqueued, by tick."""
    rows = query(dsn, "SELECT tick, job_id FROM public.ledger_ticks WHERE name = %s"
                      " ORDER BY tick", name)  # fmt: skip
    return [(tick, job_id) for tick, job_id in rows]


def wait_fired(dsn: str, name: str, count: int, timeout: float) -> list[tuple[dt.datetime, int]]:
    deadline = time.monotonic() + timeout
    while len(got := fired(dsn, name)) < count:
        assert time.monotonic() < deadline, f"{name}: {len(got)} ticks fired, wanted {count}"
        time.sleep(0.05)
    return got


def db_now(dsn: str) -> dt.datetime:
    value = query(dsn, "SELECT clock_timestamp()")[0][0]
    assert isinstance(value, dt.datetime)
    return value


def test_an_entry_added_at_run_time_fires_once_per_tick_until_removed(
    workers: Workers, dsn: str
) -> None:
    names = [workers.start(2), workers.start(2)]
    workers.wait_ready(names)
    # A row trioq cannot serve, written by hand, before the others: it must stop nothing.
    query(dsn, "INSERT INTO trioq.cron_entries (name, schedule, task)"
               " VALUES ('a-broken', '61 * * * *', 'beat') RETURNING name")  # fmt: skip
    added = db_now(dsn)
    out = cli(dsn, "cron", "add", "heartbeat", "--schedule", EVERY_2S, "--task", "beat")
    assert out.startswith("cron entry 'heartbeat' added")
    # Notified, both schedulers read it at once: its first tick after the baseline fires.
    ticks = wait_fired(dsn, "heartbeat", 5, timeout=30)
    first_tick = ticks[0][0]
    assert first_tick - added <= 2 * TICK + dt.timedelta(seconds=1), (added, first_tick)
    # On schedule: consecutive ticks, none dropped, none twice.
    gaps = {b - a for (a, _), (b, _) in itertools.pairwise(ticks)}
    assert gaps == {TICK}, ticks

    removed = db_now(dsn)
    cli(dsn, "cron", "remove", "heartbeat")
    # Both schedulers keep running (a second entry keeps firing) and fire no heartbeat after
    # the removal: wait for three ticks of the marker, added after the removal.
    cli(dsn, "cron", "add", "marker", "--schedule", EVERY_2S, "--task", "beat")
    wait_fired(dsn, "marker", 3, timeout=30)
    after = [tick for tick, _ in fired(dsn, "heartbeat") if tick > removed]
    assert after == [], f"ticks fired after the removal at {removed}: {after}"

    # Exactly once: one process went on to enqueue each tick, and one job has each tick's key.
    enqueued = Counter(tick for tick, _ in fired(dsn, "heartbeat") + fired(dsn, "marker"))
    assert max(enqueued.values()) == 1, enqueued
    keys = Counter(key for (key,) in query(dsn, "SELECT dedup_key FROM public.ledger_jobs"))
    assert max(keys.values()) == 1, keys
    assert sum(keys.values()) == len(fired(dsn, "heartbeat")) + len(fired(dsn, "marker"))
    # The broken row is there, listed as broken, and logged once per worker (not per round).
    listing = cli(dsn, "cron", "list")
    assert "broken: cron entry 'a-broken': schedule '61 * * * *' is invalid" in listing
    for name in names:
        log = (workers.logs / f"{name}.log").read_text(errors="replace")
        assert log.count("cron entry 'a-broken' of the database is skipped") == 1, log[-2000:]


def test_an_entry_added_while_the_listener_was_cut_is_read_when_it_reconnects(
    workers: Workers, dsn: str
) -> None:
    """The notification of this add reaches no one: it commits in the same round trip that
    ends the worker's LISTEN session, before the worker can know. The worker reads the
    entries again when its listener is back (its poll interval is 300 s)."""
    name = workers.start(1)
    workers.wait_ready([name])
    cut = f"""
        BEGIN;
        SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE application_name = '{name}' AND query LIKE 'LISTEN%';
        INSERT INTO trioq.cron_entries (name, schedule, task) VALUES ('cut', '{EVERY_2S}', 'beat');
        NOTIFY trioq_trioq, '@cron';
        COMMIT"""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(cut.encode())  # one round trip (the simple query protocol)
    wait_fired(dsn, "cut", 2, timeout=30)
