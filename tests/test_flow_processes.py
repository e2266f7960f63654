"""Flow control with real ``trioq serve`` processes: limits hold across processes while
workers are SIGKILLed, and a pause stops every process within 100 ms.

The proof keeps a ledger on the database clock: a trigger on ``trioq.jobs`` records each
job's every entry into and exit from ``running`` (``clock_timestamp()`` at the write, in the
writing transaction, so a rolled-back claim leaves no trace), and one on ``rate_starts``
copies every start the rate limiter counted. From it the test rebuilds every interval a job
held a slot and checks, exactly:

- at no instant did more jobs of the queue run than its global limit, nor more of one key
  than the per-key limit (a SIGKILLed worker's jobs hold their slots until the sweeper
  returns them: the ledger shows that too);
- in no window of the rate period did the limiter count more starts than the limit, per
  queue and per key, and it counted every start the jobs ledger saw; the same holds on the
  jobs ledger's own clock, less the few milliseconds a claim takes.

The limits, the processes' slots, the jobs and the kill times are drawn at random; the seed
is printed (``TRIOQ_FLOW_SEED`` replays one).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest
import trio

import trioq

pytestmark = pytest.mark.slow

TESTS = pathlib.Path(__file__).parent
LEDGER = """
CREATE TABLE ledger (job_id bigint, attempt int, queue text, key text, event text,
                     at timestamptz, owner text);
CREATE FUNCTION ledger_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.state = 'running' AND OLD.state <> 'running' THEN
        INSERT INTO public.ledger VALUES (NEW.id, NEW.attempt, NEW.queue, NEW.concurrency_key,
                                   'start', clock_timestamp(), NEW.lease_owner);
    END IF;
    IF OLD.state = 'running' AND (TG_OP = 'DELETE' OR NEW.state <> 'running') THEN
        INSERT INTO public.ledger VALUES (OLD.id, OLD.attempt, OLD.queue, OLD.concurrency_key,
                                   'end', clock_timestamp(), OLD.lease_owner);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_jobs AFTER UPDATE OF state OR DELETE ON trioq.jobs
    FOR EACH ROW EXECUTE FUNCTION public.ledger_jobs();
CREATE TABLE ledger_rate (queue text, key text, started_at timestamptz, n int);
CREATE FUNCTION ledger_rate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.ledger_rate VALUES (NEW.queue, NEW.key, NEW.started_at, NEW.n);
    RETURN NULL;
END $$;
CREATE TRIGGER ledger_rate AFTER INSERT ON trioq.rate_starts
    FOR EACH ROW EXECUTE FUNCTION public.ledger_rate();
CREATE TABLE handler_starts (job_id bigint, at timestamptz);
"""
# (Names qualified: trioq's functions run with search_path set to trioq's schema.)
#: A claim's writes come a few ms after the limiter read its clock: slack for checking the
#: rate on the jobs ledger's own timestamps.
CLAIM_SLACK = dt.timedelta(milliseconds=50)


class Workers:
    """Real ``trioq serve`` processes (``flow_app``), started, killed and restarted."""

    #: The ``--app`` they serve (tests/test_workflow_processes.py serves another).
    target = "flow_app:config"

    def __init__(self, dsn: str, logs: pathlib.Path, **app: str) -> None:
        self.dsn = dsn
        self.app = app
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started = 0

    def start(self, concurrency: int) -> str:
        name = f"flow-worker-{self.started}"
        self.started += 1
        env = {k: v for k, v in os.environ.items() if k not in ("TRIOQ_DSN", "DATABASE_URL")}
        env.update(TRIOQ_DSN=self.dsn, PGAPPNAME=name, APP_CONCURRENCY=str(concurrency))
        env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
        env.update({f"APP_{k.upper()}": v for k, v in self.app.items()})
        with (self.logs / f"{name}.log").open("wb") as log:  # the child keeps its own copy
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "trioq._cli", "serve", "--app", self.target],
                env=env, cwd=TESTS, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        return name

    def wait_ready(self, names: Sequence[str], timeout: float = 60) -> None:
        """Until each has its LISTEN active (serve has started)."""
        deadline = time.monotonic() + timeout
        while True:
            rows = query(self.dsn, "SELECT DISTINCT application_name FROM pg_stat_activity"
                                   " WHERE query LIKE 'LISTEN%%'")  # fmt: skip
            ready = {r[0] for r in rows}
            if set(names) <= ready:
                return
            for name in names:
                assert self.procs[name].poll() is None, self.stderr(name)
            assert time.monotonic() < deadline, f"not ready: {set(names) - ready}"
            time.sleep(0.05)

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def stderr(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]

    def alive(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


@pytest.fixture
def workers(dsn: str, tmp_path: pathlib.Path) -> Iterator[Workers]:
    subprocess.run([sys.executable, "-m", "trioq._cli", "migrate", "--dsn", dsn],
                   check=True, timeout=60, capture_output=True)  # fmt: skip
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LEDGER)
    group = Workers(dsn, tmp_path)
    try:
        yield group
    finally:
        group.stop_all()


def query(dsn: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def wait_for(dsn: str, sql: str, expected: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (got := query(dsn, sql)) != expected:
        assert time.monotonic() < deadline, f"{sql!r} gave {got!r}, wanted {expected!r}"
        time.sleep(0.05)


# -- the ledger --------------------------------------------------------------------------------


def intervals(rows: list[tuple[Any, ...]]) -> list[tuple[dt.datetime, dt.datetime, str | None]]:
    """(start, end, key) of every slot held, from the ledger's rows; every start has its end."""
    opened: dict[tuple[int, int], tuple[dt.datetime, str | None]] = {}
    out = []
    for job_id, attempt, key, event, at in sorted(rows, key=lambda r: r[4]):
        if event == "start":
            assert (job_id, attempt) not in opened, f"job {job_id} attempt {attempt} twice"
            opened[(job_id, attempt)] = (at, key)
        else:
            start, held_key = opened.pop((job_id, attempt))
            out.append((start, at, held_key))
    assert not opened, f"{len(opened)} jobs never left running"
    return out


def peak(spans: Sequence[tuple[dt.datetime, dt.datetime, Any]]) -> int:
    """The most spans open at one instant (an end at the same instant as a start comes first:
    the start's claim could only count it gone after it committed)."""
    edges = sorted([(s, 1) for s, _, _ in spans] + [(e, -1) for _, e, _ in spans])
    now = most = 0
    for _, delta in edges:
        now += delta
        most = max(most, now)
    return most


def most_in_window(starts: Sequence[tuple[dt.datetime, int]], period: dt.timedelta) -> int:
    """The most starts counted in any window [t, t + period)."""
    starts = sorted(starts)
    most = 0
    for i, (at, _) in enumerate(starts):
        most = max(most, sum(n for t, n in starts[i:] if t < at + period))
    return most


# -- the proof ---------------------------------------------------------------------------------


def test_limits_hold_across_processes_while_workers_are_killed(workers: Workers) -> None:
    seed = int(os.environ.get("TRIOQ_FLOW_SEED", random.randrange(2**32)))
    rnd = random.Random(seed)
    gc, kc = rnd.choice([2, 3, 4]), rnd.choice([1, 2])
    rate = trioq.RateLimit(rnd.choice([5, 8]), rnd.choice([0.5, 1.0]))
    key_rate = trioq.RateLimit(rnd.choice([1, 2]), 0.5)
    slots = [rnd.randint(2, 4) for _ in range(3)]
    plan = {"seed": seed, "global": gc, "per_key": kc, "rate": str(rate),
            "key_rate": str(key_rate), "slots": slots}  # fmt: skip
    print(f"\nflow proof: {json.dumps(plan)}")
    dsn = workers.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO trioq.queues (name, global_concurrency, key_concurrency, rate_limit,"
            " rate_period, key_rate_limit, key_rate_period) VALUES"
            " ('limited', %s, %s, NULL, NULL, NULL, NULL),"
            " ('rated', NULL, NULL, %s, %s, %s, %s)",
            (gc, kc, rate.limit, rate.period, key_rate.limit, key_rate.period),
        )
    names = [workers.start(n) for n in slots]
    workers.wait_ready(names)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for queue, task, n, keys, ms in (
            ("limited", "hold", 160, ["k0", "k1", "k2", "k3", None], (5, 80)),
            ("rated", "call_api", 50, ["r0", "r1", "r2", None], (1, 5)),
        ):
            rows = [(queue, task, json.dumps({"ms": rnd.randint(*ms)}), rnd.choice(keys))
                    for _ in range(n)]  # fmt: skip
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO trioq.jobs (queue, task, args, concurrency_key)"
                    " VALUES (%s, %s, %s::jsonb, %s)", rows,
                )  # fmt: skip
            conn.execute("SELECT pg_notify('trioq_trioq', %s)", (queue,))
    # Chaos: SIGKILL a worker twice, at random moments, and start a fresh one each time.
    kills = 0
    for _ in range(2):
        time.sleep(rnd.uniform(0.5, 1.5))
        victim = rnd.choice(workers.alive())
        held = query(dsn, "SELECT count(*) FROM trioq.jobs WHERE state = 'running'")[0][0]
        workers.kill(victim)
        kills += 1
        workers.wait_ready([workers.start(rnd.randint(2, 4))])
        print(f"killed {victim} ({held} jobs running in all)")
    wait_for(dsn, "SELECT count(*) FROM trioq.jobs", [(0,)], timeout=90)
    assert query(dsn, "SELECT count(*) FROM trioq.dead_jobs") == [(0,)]

    ledger = query(dsn, "SELECT job_id, attempt, queue, key, event, at FROM ledger")
    for queue, limit in (("limited", gc), ("rated", None)):
        spans = intervals([(j, a, k, e, t) for j, a, q, k, e, t in ledger if q == queue])
        if limit is not None:
            assert peak(spans) <= limit, plan
            print(f"{queue}: {len(spans)} runs, at most {peak(spans)} at once (limit {gc})")
            for key in {k for _, _, k in spans if k is not None}:
                assert peak([s for s in spans if s[2] == key]) <= kc, (key, plan)
    reruns = Counter(j for j, a, q, k, e, t in ledger if e == "start" and a > 1)
    print(f"{len(reruns)} jobs ran again after a kill (their slots came back by the sweeper)")
    assert kills == 2

    # Rates: the limiter's own log, then the jobs ledger's starts (less the claim's slack).
    counted = query(dsn, "SELECT key, started_at, n FROM ledger_rate WHERE queue = 'rated'")
    started = [(k, t) for j, a, q, k, e, t in ledger if q == "rated" and e == "start"]
    queue_log = [(t, n) for k, t, n in counted if k == ""]
    assert sum(n for _, n in queue_log) == len(started), "a start the limiter did not count"
    assert most_in_window(queue_log, rate.period) <= rate.limit, plan
    assert most_in_window([(t, 1) for _, t in started], rate.period - CLAIM_SLACK) <= rate.limit
    for key in {k for k, _ in started if k is not None}:
        key_log = [(t, n) for k, t, n in counted if k == key]
        assert sum(n for _, n in key_log) == sum(1 for k, _ in started if k == key)
        assert most_in_window(key_log, key_rate.period) <= key_rate.limit, (key, plan)
        mine = [(t, 1) for k, t in started if k == key]
        assert most_in_window(mine, key_rate.period - CLAIM_SLACK) <= key_rate.limit
    first, last = min(t for _, t in started), max(t for _, t in started)
    print(f"rated: {len(started)} starts in {(last - first).total_seconds():.2f} s "
          f"(at most {rate} and {key_rate} per key)")  # fmt: skip


# -- pause -------------------------------------------------------------------------------------


def test_pause_stops_every_worker_at_once(workers: Workers) -> None:
    """A pause stops the claims of every process when it commits, and the handlers of what
    they had buffered; resume restarts them. The delays are printed (flow-control.md quotes
    them: a few ms); the bounds asserted are loose, so a loaded CI machine cannot fail a
    correct build: what must hold exactly is that nothing starts once the pause is seen."""
    workers.app.update(record_starts="1", poll="5")
    dsn = workers.dsn
    names = [workers.start(4), workers.start(4)]
    workers.wait_ready(names)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO trioq.jobs (queue, task, args) SELECT 'limited', 'hold',"
            " '{\"ms\": 5}' FROM generate_series(1, 5000)"
        )
        conn.execute("SELECT pg_notify('trioq_trioq', 'limited')")
    wait_for(dsn, "SELECT count(*) > 200 FROM handler_starts", [(True,)], timeout=60)
    before = query(dsn, "SELECT clock_timestamp()")[0][0]
    out = cli("queue", "pause", "limited", "--dsn", dsn, "--json")
    assert json.loads(out)["paused"] is True
    time.sleep(1.0)  # let anything that would still start, start
    claims = query(dsn, "SELECT max(at) FROM ledger WHERE event = 'start'")[0][0]
    handlers = query(dsn, "SELECT max(at) FROM handler_starts")[0][0]
    # `before` is taken before the CLI process even starts: the delays are upper bounds.
    claim_lag, start_lag = (claims - before).total_seconds(), (handlers - before).total_seconds()
    print(f"\npause: last claim {claim_lag * 1000:.0f} ms, last handler start "
          f"{start_lag * 1000:.0f} ms after the pause command began")  # fmt: skip
    status = json.loads(cli("status", "--dsn", dsn, "--json"))
    assert status["paused"] == ["limited"]
    # The CLI's own start-up (a Python process) precedes the pause's commit: measure from
    # the commit instead, as recorded by the queues row.
    committed = query(dsn, "SELECT updated_at FROM trioq.queues WHERE name = 'limited'")[0][0]
    print(f"pause: last claim {(claims - committed).total_seconds() * 1000:.1f} ms, last "
          f"handler start {(handlers - committed).total_seconds() * 1000:.1f} ms after the "
          "pause's commit")  # fmt: skip
    # A claim statement already running at the commit may still finish after it.
    assert (claims - committed).total_seconds() <= LOOSE, (claims, committed)
    assert (handlers - committed).total_seconds() <= LOOSE, (handlers, committed)
    waiting = query(dsn, "SELECT count(*), max(attempt) FROM trioq.jobs")[0]
    assert waiting[0] > 0 and waiting[1] == 0  # nothing running, nothing spent an attempt
    cli("enqueue", "hold", "--queue", "limited", "--args", '{"ms": 1}', "--dsn", dsn)
    # The pause is stored: a worker started now (a restart) claims nothing either.
    workers.kill(names[0])
    workers.wait_ready([workers.start(4)])
    time.sleep(0.5)
    assert query(dsn, "SELECT max(at) FROM ledger WHERE event = 'start'")[0][0] == claims

    resumed = json.loads(cli("queue", "resume", "limited", "--dsn", dsn, "--json"))
    assert resumed["paused"] is False
    committed = query(dsn, "SELECT updated_at FROM trioq.queues WHERE name = 'limited'")[0][0]
    deadline = time.monotonic() + 10
    while (first := query(dsn, "SELECT min(at) FROM ledger WHERE event = 'start' AND at > %s",
                          committed)[0][0]) is None:  # fmt: skip
        assert time.monotonic() < deadline, "no job started after the resume"
        time.sleep(0.05)
    lag = (first - committed).total_seconds()
    print(f"resume: first claim {lag * 1000:.0f} ms after the resume committed")
    assert lag <= LOOSE


#: Seconds: far above what a pause or resume takes (milliseconds), far below the 5 s poll
#: that would apply had the notification been missed.
LOOSE = 2.0


def test_a_timed_pause_ends_by_itself_in_every_worker(workers: Workers) -> None:
    """Paused until a moment ahead: no handler starts in any process before it (nor in one
    started during the pause), and all of them start again by themselves after it, with
    nobody calling resume and a 60 s poll: a governor tidied the row and its notification
    (seen here) reached them, as each fetcher's own wait for the end (``retry_in``) does."""
    workers.app.update(record_starts="1", poll="60")
    dsn = workers.dsn
    began = time.monotonic()
    names = [workers.start(4), workers.start(4)]
    workers.wait_ready(names)
    # Long enough to start a third worker inside the pause, on this machine as loaded now.
    length = max(2.0, 2 * (time.monotonic() - began))
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN trioq_trioq")
        until = trio.run(pause_for, dsn, length)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO trioq.jobs (queue, task, args) SELECT 'limited', 'hold',"
                " '{\"ms\": 100}' FROM generate_series(1, 60)"
            )
            conn.execute("SELECT pg_notify('trioq_trioq', 'limited')")  # wake them: paused
        names.append(workers.start(4))
        workers.wait_ready(names[2:])
        assert query(dsn, "SELECT clock_timestamp()")[0][0] < until, (
            f"the third worker took longer than the {length:.1f} s pause to start"
        )
        notes = []  # the governor's @queues after the end: nobody else writes the queue
        for note in listener.notifies(timeout=length + 10):
            at = query(dsn, "SELECT clock_timestamp()")[0][0]
            if note.payload == "@queues" and at >= until:
                notes.append(at)
                break
        assert notes, "no @queues notification after the pause ended"
    wait_for(dsn, "SELECT count(*) FROM handler_starts", [(60,)], timeout=60)
    first_claim = query(dsn, "SELECT min(at) FROM ledger WHERE event = 'start'")[0][0]
    first_handler = query(dsn, "SELECT min(at) FROM handler_starts")[0][0]
    owners = query(dsn, "SELECT count(DISTINCT owner) FROM ledger WHERE event = 'start'")[0][0]
    row = query(dsn, "SELECT paused, paused_until, updated_at FROM trioq.queues")
    lag = (first_claim - until).total_seconds()
    print(f"\ntimed pause of {length:.1f} s: first claim {lag * 1000:.1f} ms after its end, "
          f"the notification {(notes[0] - until).total_seconds() * 1000:.1f} ms after; "
          f"{owners} workers claimed")  # fmt: skip
    assert first_claim >= until and first_handler >= until
    assert lag <= LOOSE  # far below the 60 s poll
    assert owners == 3, "a worker did not resume by itself"
    [(paused, paused_until, tidied)] = row
    assert (paused, paused_until) == (False, None) and tidied >= until  # a governor's tidy


async def pause_for(dsn: str, seconds: float) -> dt.datetime:
    """Pause ``limited`` for ``seconds`` from the database's clock; when it ends."""
    async with await trioq.connect(dsn, autocommit=True) as conn:
        settings = await trioq.Queue().pause(conn, "limited", until=dt.timedelta(seconds=seconds))
    assert settings.paused_until is not None
    return settings.paused_until


def cli(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("TRIOQ_DSN", "DATABASE_URL")}
    out = subprocess.run([sys.executable, "-m", "trioq._cli", *args], capture_output=True,
                         text=True, env=env, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout
