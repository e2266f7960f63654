"""The claim semantics, checked by a Hypothesis state machine against real Postgres.

Jobs are enqueued on two queues (due now or later) and promoted when due; three
simulated workers claim, heartbeat, complete, fail (retryable or fatal), release,
give back unknown tasks, stop cancelled jobs, and crash (forget their leases and stop
heartbeating), while time passes (the ``trioq.now`` setting, no sleeping), the sweeper
runs, a lease is expired and its job taken again at once (so the old holder is left
with a stale lease it may still use), a worker is found dead by the liveness check, a
second connection holds row locks while claims run, jobs are cancelled and dead jobs
retried. A small model says what must be true; after every step the invariants compare
the database with it:

- every enqueued job is in exactly one place (available, running, done, dead,
  cancelled, with its attempt and owner): none lost, none duplicated, none in two
  tables, none appearing from nowhere;
- each outcome, heartbeat and give-back returns exactly the jobs the model says the
  given leases still hold: a write under a stale lease (an old attempt, another owner)
  changes nothing; a claim returns exactly the model's due jobs of its queue, in
  priority order, skipping rows another transaction has locked;
- no two workers hold live leases on one job; attempts never exceed max_attempts; a
  job is dead only with its attempts spent or after a fatal error;
- a duplicate is never inserted while its twin is live.

What it does not cover: concurrency between statements (each step is one statement,
run one after another; the row-lock rule holds a lock across one claim), the runtime
above the queue (tests/test_runtime.py and the fault suite), and cron.

How often each path is taken is reported with Hypothesis ``event()`` (run pytest with
``--hypothesis-show-statistics``): stale leases reach every outcome path. Examples per
CI run: 200 machines of up to 50 steps; ``just prove`` (``TRIOQ_HYPOTHESIS=long``) runs
5,000 machines of up to 100 steps. Mutations that made it fail when this was written:
dropping the attempt fence, the owner fence, the attempt refund on release, the
``NOT EXISTS`` twin check of dead-retry, SKIP LOCKED in the claim, the queue in the
claim, or turning ``>=`` into ``>`` in the death condition of fail or sweep.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from machines import LEASE, LeaseMachine, ModelJob, Paths, Q, prove, shrinking_bounded

import trioq
from trioq import DeadFilter, Failure, JobSpec, Lease

WORKERS = ("w0", "w1", "w2")
QUEUES = ("default", "other")
DEDUP_KEYS = (None, None, None, "k1", "k2")
LIVENESS_GRACE = dt.timedelta(seconds=1)
PATHS = Paths()
#: Paths a CI run must take at least once, or it proved less than its docstring says.
MUST_TAKE = (
    "complete: with stale lease",
    "fail: with stale lease",
    "release: with stale lease",
    "unknown task: with stale lease",
    "heartbeat: with stale lease",
    "stop cancelled: with stale lease",
    "claim beside a row lock",
    "expire and reclaim: taken again",
    "worker found dead",
)
ZOMBIE_PATHS = ("complete", "fail", "release", "unknown", "stop", "heartbeat")


@attrs.define(kw_only=True)
class QueueJob(ModelJob):
    """States: scheduled, available, running, done, dead, cancelled."""

    queue: str
    dedup_key: str | None
    fatal: bool = False
    unknown_since: dt.datetime | None = None  # first given back for an unknown task

    @property
    def live(self) -> bool:
        return self.state in ("scheduled", "available", "running")


class QueueMachine(LeaseMachine[QueueJob]):
    """One instance per example; `prove` binds its connections and the trio token."""

    workers = WORKERS
    tables = ("jobs", "dead_jobs", "workers")
    other: Any = None  # a second connection, holding row locks

    def __init__(self) -> None:
        # One worker can hold a stale and a live attempt of the same job (a zombie handler
        # of attempt 1 beside the handler of attempt 2).
        super().__init__()
        self._zombie_only = False

    # -- helpers -------------------------------------------------------------------------------

    def _live_twin(self, key: str | None) -> QueueJob | None:
        if key is None:
            return None
        return next((j for j in self.jobs.values() if j.live and j.dedup_key == key), None)

    def _add(self, job_id: int, spec: JobSpec, key: str | None) -> None:
        self.jobs[job_id] = QueueJob(
            id=job_id,
            queue=spec.queue,
            max_attempts=spec.stored_max_attempts,
            priority=spec.priority,
            run_at=self.clock + spec.delay,
            dedup_key=key,
            state="scheduled" if spec.delay else "available",
        )

    def _due(self, queue: str | None = None) -> list[QueueJob]:
        return [j for j in super()._due() if queue in (None, j.queue)]

    def _stale(self, worker: str) -> list[Lease]:
        held = self._held(worker)
        valid = self._valid_leases(worker, held)
        return [lease for lease in held if lease not in valid]

    def _zombies(self) -> list[str]:
        """Workers that believe they hold a lease that is no longer theirs."""
        return [w for w in WORKERS if self._stale(w)]

    def _pick(self, data: st.DataObject, path: str) -> tuple[str, list[Lease]]:
        """As every machine's, but while `zombie` runs only stale leases (`_zombie_only`);
        the path is noted with or without a stale lease."""
        if self._zombie_only:
            worker = data.draw(st.sampled_from(self._zombies()))
            chosen = self._choose(data, worker, self._stale(worker))
        else:
            worker, chosen = super()._pick(data, path)
        stale = len(chosen) - len(self._valid_leases(worker, chosen))
        PATHS.take(f"{path}: {'with' if stale else 'no'} stale lease")
        return worker, chosen

    # -- rules ---------------------------------------------------------------------------------

    specs = st.builds(
        lambda key, attempts, priority, delay, queue: JobSpec(
            task="t",
            max_attempts=attempts,
            priority=priority,
            delay=delay,
            dedup_key=key,
            queue=queue,
        ),
        st.sampled_from(DEDUP_KEYS),
        st.integers(1, 3),
        st.integers(-1, 1),
        st.sampled_from([0, 0, 0, 5, 40]),
        st.sampled_from(QUEUES),
    )

    @rule(spec=specs)
    def enqueue(self, spec: JobSpec) -> None:
        key = spec.effective_dedup_key()
        twin = self._live_twin(key)
        result = self.call(
            lambda: Q.enqueue(
                self.conn,
                spec.task,
                spec.args,
                queue=spec.queue,
                priority=spec.priority,
                delay=spec.delay,
                max_attempts=spec.max_attempts,
                dedup_key=spec.dedup_key,
            )
        )
        if twin is not None:
            assert result == trioq.EnqueueResult(twin.id, duplicate=True)
        else:
            assert not result.duplicate
            assert result.job_id not in self.jobs
            self._add(result.job_id, spec, key)

    @rule(batch=st.lists(specs, min_size=1, max_size=6))
    def enqueue_many(self, batch: list[JobSpec]) -> None:
        results = self.call(Q.enqueue_many, self.conn, batch)
        for spec, result in zip(batch, results, strict=True):
            key = spec.effective_dedup_key()
            twin = self._live_twin(key)
            if twin is not None:
                assert result == trioq.EnqueueResult(twin.id, duplicate=True)
            else:
                assert not result.duplicate
                self._add(result.job_id, spec, key)

    @initialize(batch=st.lists(specs, min_size=1, max_size=8))
    def prefill(self, batch: list[JobSpec]) -> None:
        self.enqueue_many(batch)

    @precondition(lambda self: bool(self._due()))
    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 4), queue=st.sampled_from(QUEUES))
    def claim(self, worker: str, limit: int, queue: str) -> None:
        self._claim(worker, limit, queue, locked=set())

    @precondition(lambda self: bool(self._due()))
    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 4), data=st.data())
    def claim_beside_a_row_lock(self, worker: str, limit: int, data: st.DataObject) -> None:
        """Another transaction holds some due rows locked: the claim skips them."""
        due = self._due()
        locked = set(data.draw(st.lists(st.sampled_from([j.id for j in due]), unique=True,
                                        min_size=1, max_size=2)))  # fmt: skip
        queue = self.jobs[min(locked)].queue
        self.call(self._lock_rows, sorted(locked))
        try:
            self._claim(worker, limit, queue, locked=locked)
        finally:
            self.call(self.other.rollback)
        PATHS.take("claim beside a row lock")

    async def _lock_rows(self, ids: list[int]) -> None:
        await self.other.execute("SELECT 1 FROM trioq.jobs WHERE id = ANY(%s) FOR UPDATE", (ids,))

    def _claim(self, worker: str, limit: int, queue: str, *, locked: set[int]) -> None:
        expected = [m for m in self._due(queue) if m.id not in locked][:limit]
        jobs = self.call(lambda: Q.claim(self.conn, queue, owner=worker, limit=limit, lease=LEASE))
        self._took(worker, jobs, expected)
        assert all(job.queue == queue for job in jobs)

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        worker = data.draw(st.sampled_from(self._holders()))
        leases = self._held(worker)
        valid = self._valid_leases(worker, leases)
        beat = self.call(lambda: Q.heartbeat(self.conn, owner=worker, leases=leases, lease=LEASE))
        PATHS.take(f"heartbeat: {'with' if set(leases) - valid else 'no'} stale lease")
        assert beat.extended == valid
        assert beat.lost == set(leases) - valid
        assert beat.cancel_requested == {
            lease for lease in valid if self.jobs[lease.job_id].cancel_requested
        }
        for lease in valid:
            self.jobs[lease.job_id].lease_until = self.clock + LEASE
        self.beliefs[worker] -= beat.lost

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        self._complete(*self._pick(data, "complete"))

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data(), fatal=st.booleans(), delay=st.sampled_from([0, 10]))
    def fail(self, data: st.DataObject, fatal: bool, delay: int) -> None:
        worker, leases = self._pick(data, "fail")
        for job_id in self._fail(worker, leases, fatal=fatal, delay=delay):
            self.jobs[job_id].fatal = fatal

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self._release(*self._pick(data, "release"))

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data())
    def give_back_unknown(self, data: st.DataObject) -> None:
        """A worker does not know the task: given back, attempt refunded, after a delay that
        grows with how long it has been unknown (never dead here: the timeout is a day, and
        a machine's clock moves at most 75 minutes)."""
        worker, leases = self._pick(data, "unknown task")
        valid = self._valid(worker, leases)
        failures = [Failure(lease=lease, error="unknown task") for lease in leases]
        result = self.call(lambda: Q.release_unknown_many(
            self.conn, owner=worker, failures=failures, dead_after=dt.timedelta(days=1)
        ))  # fmt: skip
        assert result.dead == frozenset()
        assert result.cancelled == {j for j in valid if self.jobs[j].cancel_requested}
        assert result.retried == valid - result.cancelled
        for job_id in valid:
            model = self.jobs[job_id]
            model.owner = model.lease_until = None
            model.attempt -= 1
            model.unknown_since = model.unknown_since or self.clock
            if model.cancel_requested:
                model.state = "cancelled"
            else:
                waited = (self.clock - model.unknown_since) / 10
                delay = min(max(waited, dt.timedelta(seconds=5)), dt.timedelta(minutes=5))
                model.state, model.run_at = "scheduled", self.clock + delay

    @precondition(lambda self: any(j.state == "running" for j in self.jobs.values()))
    @rule(data=st.data(), taker=st.sampled_from(WORKERS), then=st.sampled_from(ZOMBIE_PATHS))
    def expire_and_reclaim(self, data: st.DataObject, taker: str, then: str) -> None:
        """One running job's lease expires, the sweeper returns it, and a worker (maybe its
        old holder) claims it at once: the old holder keeps a stale lease, and writes
        under it at once (``then``: a zombie's outcome, or heartbeat)."""
        running = sorted(j.id for j in self.jobs.values() if j.state == "running")
        model = self.jobs[data.draw(st.sampled_from(running))]
        self.call(self._expire, model.id)
        model.lease_until = self.clock - dt.timedelta(seconds=1)
        self.sweep()
        if model.state == "available":  # claimed again, with whatever is due before it
            due = [j.id for j in self._due(model.queue)]
            self._claim(taker, due.index(model.id) + 1, model.queue, locked=set())
            PATHS.take("expire and reclaim: taken again")
        if self._zombies():
            self.zombie(data, then)

    async def _expire(self, job_id: int) -> None:
        await self.conn.execute(
            "UPDATE trioq.jobs SET lease_expires_at = %s WHERE id = %s",
            (self.clock - dt.timedelta(seconds=1), job_id),
        )

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data())
    def worker_found_dead(self, data: st.DataObject) -> None:
        """A worker's liveness row went stale, a sweeper suspected it long ago and nobody
        holds its lock: the sweepers return its running jobs at once, leases or not
        (`Queue.reclaim_dead_workers`)."""
        worker = data.draw(st.sampled_from(self._holders()))
        self.call(self._register_stale, worker)
        owned = [j for j in self.jobs.values() if j.state == "running" and j.owner == worker]
        result = self.call(lambda: Q.reclaim_dead_workers(self.conn, grace=LIVENESS_GRACE))
        self._swept(owned, result)
        self.beliefs[worker].clear()  # it is dead
        PATHS.take("worker found dead")

    async def _register_stale(self, worker: str) -> None:
        await self.conn.execute(
            "INSERT INTO trioq.workers (name, host, pid, queues, seen_at, suspected_at)"
            " VALUES (%(name)s, 'h', 1, '{}', %(t)s, %(t)s)"
            " ON CONFLICT (name) DO UPDATE SET seen_at = %(t)s, suspected_at = %(t)s",
            {"name": worker, "t": self.clock - dt.timedelta(seconds=10)},
        )

    @precondition(lambda self: bool(self._zombies()))
    @rule(data=st.data(), path=st.sampled_from(ZOMBIE_PATHS))
    def zombie(self, data: st.DataObject, path: str) -> None:
        """A worker whose lease was taken (expired, swept, claimed again, perhaps by
        itself) writes under it anyway: nothing may change."""
        self._zombie_only = True
        try:
            if path == "heartbeat":
                worker = data.draw(st.sampled_from(self._zombies()))
                stale = self._stale(worker)
                beat = self.call(lambda: Q.heartbeat(self.conn, owner=worker, leases=stale,
                                                     lease=LEASE))  # fmt: skip
                assert beat.extended == frozenset() and beat.lost == set(stale)
                self.beliefs[worker] -= set(stale)
                PATHS.take("heartbeat: with stale lease")
                return
            rule = {"complete": self.complete, "release": self.release,
                    "unknown": self.give_back_unknown, "stop": self.stop_cancelled}  # fmt: skip
            if path == "fail":
                self.fail(data, fatal=data.draw(st.booleans()), delay=0)
            else:
                rule[path](data)
        finally:
            self._zombie_only = False

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """A worker dies: it forgets its leases; the rows stay running until they expire."""
        worker = data.draw(st.sampled_from(self._holders()))
        self.beliefs[worker].clear()

    @rule(seconds=st.sampled_from([1, 10, 29, 31, 45]))
    def time_passes(self, seconds: int) -> None:
        self.advance(seconds)

    @rule()
    def promote(self) -> None:
        due = {
            j.id for j in self.jobs.values() if j.state == "scheduled" and j.run_at <= self.clock
        }
        queues = self.call(Q.promote_due, self.conn)
        assert queues == sorted({self.jobs[j].queue for j in due})
        for job_id in due:
            self.jobs[job_id].state = "available"

    @rule()
    def next_due(self) -> None:
        scheduled = [j.run_at for j in self.jobs.values() if j.state == "scheduled"]
        day = dt.timedelta(days=1)  # the answer is clamped to a day either side
        expected = max(min(min(scheduled) - self.clock, day), -day) if scheduled else None
        assert self.call(Q.next_due, self.conn) == expected

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data())
    def stop_cancelled(self, data: st.DataObject) -> None:
        """The runtime stopped the handlers of jobs it was asked to cancel (the write does
        not look at the flag: any held lease, stale ones included)."""
        worker, leases = self._pick(data, "stop cancelled")
        valid = self._valid(worker, leases)
        stopped = self.call(lambda: Q.cancel_running_many(self.conn, owner=worker, leases=leases))
        assert stopped == valid
        self.beliefs[worker] -= set(leases)
        for job_id in valid:
            self.end(job_id, "cancelled")

    @precondition(lambda self: any(j.state == "dead" for j in self.jobs.values()))
    @rule()
    def retry_dead(self) -> None:
        dead = [j for j in self.jobs.values() if j.state == "dead"]
        expected: set[int] = set()
        for model in sorted(dead, key=lambda j: j.id):
            twin = self._live_twin(model.dedup_key)
            if twin is None or model.dedup_key is None:
                expected.add(model.id)
        # Two dead twins retried together would both become live: the index refuses
        # the statement. Retry one id at a time in that case, as an operator would.
        keys = [self.jobs[j].dedup_key for j in expected if self.jobs[j].dedup_key]
        if len(keys) != len(set(keys)):
            expected = {min(expected)}
        retried = self.call(
            lambda: Q.dead_retry(self.conn, DeadFilter(ids=sorted(expected) or [-1]))
        )
        assert set(retried) == expected
        for job_id in expected:
            model = self.jobs[job_id]
            model.state, model.attempt, model.fatal, model.run_at = (
                "available",
                0,
                False,
                self.clock,
            )
            model.cancel_requested = False  # a retried dead job is a new job: no cancel left
            model.unknown_since = None

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def a_job_is_dead_only_for_a_reason(self) -> None:
        for model in self.jobs.values():
            if model.state == "dead":
                assert model.fatal or model.attempt >= model.max_attempts

    @invariant()
    def at_most_one_live_job_per_dedup_key(self) -> None:
        keys = [j.dedup_key for j in self.jobs.values() if j.live and j.dedup_key]
        assert len(keys) == len(set(keys))


def test_queue_state_machine(dsn: str) -> None:
    PATHS.clear()
    prove(QueueMachine, dsn, examples=(200, 5000), steps=(50, 100), other=True)
    PATHS.assert_taken(MUST_TAKE)


class _SlowToShrink(RuleBasedStateMachine):
    """Fails after 15 steps that add up to 5000 or more, each step a sleep (as a round trip
    would be): shrinking it means hundreds of runs of 15 or more steps."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = self.total = 0

    @rule(by=st.integers(0, 1000))
    def add(self, by: int) -> None:
        time.sleep(0.02)
        self.steps += 1
        self.total += by

    @invariant()
    def small(self) -> None:
        assert self.steps < 15 or self.total < 5000


def test_a_failing_machine_reports_within_the_shrink_bound() -> None:
    """The bound on shrinking takes effect: 1 s here, and the whole run took 7 s; unbounded,
    shrinking this machine ran for more than 200 s."""
    config = settings(max_examples=50, stateful_step_count=50, deadline=None, database=None,
                      derandomize=True, suppress_health_check=list(HealthCheck))  # fmt: skip
    started = time.monotonic()
    with shrinking_bounded(SHRINK_TEST_BOUND), pytest.raises(AssertionError):
        run_state_machine_as_test(_SlowToShrink, settings=config)
    assert time.monotonic() - started < 60


SHRINK_TEST_BOUND = 1.0
