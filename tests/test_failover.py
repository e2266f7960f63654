"""Postgres fails over (issue #22): a primary and a streaming standby started from the embedded
binaries, a worker (``trioq serve``) and a producer on a multi-host DSN
(``host=a,b target_session_attrs=read-write``), the primary SIGKILLed under load and the
standby promoted.

With synchronous replication (``synchronous_standby_names = '*'``) every enqueue and every
completion the primary acknowledged is on the standby: nothing acknowledged is lost, no
effect commits twice (each job writes a ledger row in its own transaction), and the worker
reaches the new primary and completes jobs within 5 s of the promotion. What asynchronous
replication can lose is written down in docs/faults.md (scenario 9).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import attrs
import psycopg
from clitool import cli_env
from helpers import poll_until

from trioq._pg.embedded import EmbeddedPostgres
from trioq._stress.failover import Pair, replicated_pair

#: Within this long of the promotion the worker completes jobs on the new primary.
REACH_WITHIN = 5.0


@contextlib.contextmanager
def _pair() -> Iterator[Pair]:
    """A primary (SIGKILLable) and a standby streaming from it synchronously: the pair
    ``trioq stress --failover-at`` runs on (fsync off, as the suite's other servers)."""
    base = attrs.evolve(EmbeddedPostgres.from_env(), durable=False)
    with replicated_pair(base) as pair:
        yield pair


class Producer(threading.Thread):
    """Enqueues a job every ``interval`` s on the multi-host DSN, reconnecting on errors; what
    the server acknowledged is in ``acknowledged``."""

    def __init__(self, dsn: str, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.dsn, self.interval = dsn, interval
        self.acknowledged: list[int] = []
        self.errors = 0
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=2) as conn:
                    while not self.stop.wait(self.interval):
                        n += 1
                        row = conn.execute(
                            "INSERT INTO trioq.jobs (queue, task, args) VALUES ('default', 'pay',"
                            " jsonb_build_object('n', %s::int)) RETURNING id", (n,),
                        ).fetchone()  # fmt: skip
                        conn.execute("SELECT pg_notify('trioq_trioq', 'default')")
                        assert row is not None
                        self.acknowledged.append(row[0])
            except psycopg.Error:
                self.errors += 1
                time.sleep(0.05)


def test_failover_to_a_synchronous_standby_loses_nothing_and_runs_nothing_twice() -> None:
    with _pair() as pair:
        migrate = subprocess.run([sys.executable, "-m", "trioq._cli", "migrate"],
                                 env=cli_env(dsn=pair.dsn("primary")), capture_output=True,
                                 text=True, timeout=60, check=False)  # fmt: skip
        assert migrate.returncode == 0, migrate.stderr
        with psycopg.connect(pair.dsn("primary"), autocommit=True) as conn:
            conn.execute("CREATE TABLE ledger (job_id bigint, n int,"
                         " at timestamptz NOT NULL DEFAULT clock_timestamp())")  # fmt: skip
        worker = subprocess.Popen(
            [sys.executable, "-m", "trioq._cli", "serve", "--app", "failover_app:config"],
            env=cli_env(dsn=pair.dsn("both"), apps=True), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        producer = Producer(pair.dsn("both"))
        try:
            producer.start()
            with psycopg.connect(pair.dsn("primary"), autocommit=True) as conn:
                poll_until(lambda: conn.execute("SELECT count(*) >= 100 FROM ledger")
                           .fetchone() == (True,), timeout=30, what="100 jobs done")  # fmt: skip
            # The failover: the primary dies, the standby is promoted.
            os.kill(pair.primary_pid(), signal.SIGKILL)
            with psycopg.connect(pair.dsn("standby"), autocommit=True) as conn:
                conn.execute("SELECT pg_promote(wait => true)")
                (promoted,) = conn.execute("SELECT clock_timestamp()").fetchone() or (None,)
            time.sleep(3)  # production goes on against the new primary
            producer.stop.set()
            producer.join(10)
            acknowledged = set(producer.acknowledged)
            with psycopg.connect(pair.dsn("standby"), autocommit=True) as conn:
                drained = ("SELECT count(*) = 0 FROM trioq.jobs"
                           " WHERE state IN ('available', 'running')")
                poll_until(lambda: conn.execute(drained).fetchone() == (True,), timeout=60,
                           what="the queue drained on the new primary")  # fmt: skip
                ledger = conn.execute("SELECT job_id FROM ledger").fetchall()
                (first_after,) = conn.execute(
                    "SELECT min(at) - %s FROM ledger WHERE at > %s", (promoted, promoted)
                ).fetchone() or (None,)
                dead = conn.execute("SELECT id, reason FROM trioq.dead_jobs").fetchall()
        finally:
            producer.stop.set()
            worker.send_signal(signal.SIGTERM)
            try:
                output, _ = worker.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                output, _ = worker.communicate()
        done = [row[0] for row in ledger]
        assert len(done) == len(set(done)), "an effect committed twice"
        missing = acknowledged - set(done)
        assert not missing, f"{len(missing)} acknowledged jobs not done: {sorted(missing)[:10]}"
        assert dead == [], dead
        assert first_after is not None, output[-3000:]
        reached = first_after.total_seconds()
        print(f"{len(acknowledged)} jobs acknowledged, {len(done)} done once each, "
              f"{producer.errors} producer errors; first completion {reached:.2f} s after "
              "the promotion")  # fmt: skip
        assert reached < REACH_WITHIN, output[-3000:]

