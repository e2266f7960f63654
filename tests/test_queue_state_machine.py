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

import collections
import datetime as dt
from typing import Any, TypeVar

import attrs
import trio
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    invariant,
    precondition,
    rule,
)
from machines import TrioMachine, run_machine

import trioq
from trioq import DeadFilter, Failure, JobSpec, Lease, Queue

T = TypeVar("T")
UTC = dt.UTC
LEASE = dt.timedelta(seconds=30)
T0 = dt.datetime(2030, 1, 1, tzinfo=UTC)
WORKERS = ("w0", "w1", "w2")
QUEUES = ("default", "other")
DEDUP_KEYS = (None, None, None, "k1", "k2")
LIVENESS_GRACE = dt.timedelta(seconds=1)
#: How often each path was taken over a run (also reported with Hypothesis ``event()``).
PATHS: collections.Counter[str] = collections.Counter()
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


def note(path: str) -> None:
    event(path)
    PATHS[path] += 1



Q = Queue()


@attrs.define
class ModelJob:
    id: int
    queue: str
    max_attempts: int
    priority: int
    run_at: dt.datetime
    dedup_key: str | None
    state: str = "available"  # scheduled, available, running, done, dead, cancelled
    attempt: int = 0
    owner: str | None = None
    lease_until: dt.datetime | None = None
    cancel_requested: bool = False
    fatal: bool = False
    unknown_since: dt.datetime | None = None  # first given back for an unknown task

    @property
    def live(self) -> bool:
        return self.state in ("scheduled", "available", "running")

    def holds(self, worker: str, attempt: int) -> bool:
        return self.state == "running" and self.owner == worker and self.attempt == attempt


class QueueMachine(TrioMachine):
    """One instance per example; `bind` gives it the connection and the trio token."""

    conn: Any = None
    other: Any = None  # a second connection, holding row locks

    def __init__(self) -> None:
        super().__init__()
        self.jobs: dict[int, ModelJob] = {}
        self.clock = T0
        # The leases each worker believes it holds. Stale ones stay until used or reported
        # lost, and one worker can hold a stale and a live attempt of the same job (a
        # zombie handler of attempt 1 beside the handler of attempt 2).
        self.beliefs: dict[str, set[Lease]] = {w: set() for w in WORKERS}
        self._zombie_only = False
        self.call(self._reset)

    async def _reset(self) -> None:
        await self.conn.execute("TRUNCATE trioq.jobs, trioq.dead_jobs, trioq.workers")
        await self._set_clock()

    async def _set_clock(self) -> None:
        await self.conn.execute(
            "SELECT set_config('trioq.now', %s, false)", (self.clock.isoformat(),)
        )

    # -- helpers -------------------------------------------------------------------------------

    def _live_twin(self, key: str | None) -> ModelJob | None:
        if key is None:
            return None
        return next((j for j in self.jobs.values() if j.live and j.dedup_key == key), None)

    def _add(self, job_id: int, spec: JobSpec, key: str | None) -> None:
        self.jobs[job_id] = ModelJob(
            id=job_id,
            queue=spec.queue,
            max_attempts=spec.max_attempts,
            priority=spec.priority,
            run_at=self.clock + spec.delay,
            dedup_key=key,
            state="scheduled" if spec.delay else "available",
        )

    def _due(self, queue: str | None = None) -> list[ModelJob]:
        due = [
            j for j in self.jobs.values()
            if j.state == "available" and j.run_at <= self.clock and queue in (None, j.queue)
        ]  # fmt: skip
        return sorted(due, key=lambda j: (j.priority, j.run_at, j.id))

    def _held(self, worker: str) -> list[Lease]:
        return sorted(self.beliefs[worker], key=lambda lease: (lease.job_id, lease.attempt))

    def _holders(self) -> list[str]:
        return [w for w in WORKERS if self.beliefs[w]]

    def _stale(self, worker: str) -> list[Lease]:
        held = self._held(worker)
        valid = self._valid_leases(worker, held)
        return [lease for lease in held if lease not in valid]

    def _zombies(self) -> list[str]:
        """Workers that believe they hold a lease that is no longer theirs."""
        return [w for w in WORKERS if self._stale(w)]

    def _pick(self, data: st.DataObject, path: str) -> tuple[str, list[Lease]]:
        """A worker that holds leases, and some of them (maybe stale) to write an outcome
        for; while `zombie` runs, only stale ones (`_zombie_only`)."""
        if self._zombie_only:
            worker = data.draw(st.sampled_from(self._zombies()))
            held = self._stale(worker)
        else:
            worker = data.draw(st.sampled_from(self._holders()))
            held = self._held(worker)
        chosen = data.draw(st.lists(st.sampled_from(held), unique=True, min_size=1, max_size=3))
        self.beliefs[worker] -= set(chosen)
        stale = len(chosen) - len(self._valid_leases(worker, chosen))
        note(f"{path}: {'with' if stale else 'no'} stale lease")
        return worker, chosen

    def _valid_leases(self, worker: str, leases: list[Lease]) -> set[Lease]:
        return {lease for lease in leases if self.jobs[lease.job_id].holds(worker, lease.attempt)}

    def _valid(self, worker: str, leases: list[Lease]) -> set[int]:
        return {lease.job_id for lease in self._valid_leases(worker, leases)}

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
        note("claim beside a row lock")

    async def _lock_rows(self, ids: list[int]) -> None:
        await self.other.execute("SELECT 1 FROM trioq.jobs WHERE id = ANY(%s) FOR UPDATE", (ids,))

    def _claim(self, worker: str, limit: int, queue: str, *, locked: set[int]) -> None:
        expected = [m for m in self._due(queue) if m.id not in locked][:limit]
        jobs = self.call(lambda: Q.claim(self.conn, queue, owner=worker, limit=limit, lease=LEASE))
        assert [j.id for j in jobs] == [m.id for m in expected]
        for job, model in zip(jobs, expected, strict=True):
            model.state, model.owner = "running", worker
            model.attempt += 1
            model.lease_until = self.clock + LEASE
            assert job.attempt == model.attempt and job.queue == queue
            self.beliefs[worker].add(Lease(job.id, job.attempt))

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        worker = data.draw(st.sampled_from(self._holders()))
        leases = self._held(worker)
        valid = self._valid_leases(worker, leases)
        beat = self.call(lambda: Q.heartbeat(self.conn, owner=worker, leases=leases, lease=LEASE))
        note(f"heartbeat: {'with' if set(leases) - valid else 'no'} stale lease")
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
        worker, leases = self._pick(data, "complete")
        valid = self._valid(worker, leases)
        done = self.call(lambda: Q.complete_many(self.conn, owner=worker, leases=leases))
        assert done == valid
        for job_id in valid:
            self.jobs[job_id].state = "done"

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data(), fatal=st.booleans(), delay=st.sampled_from([0, 10]))
    def fail(self, data: st.DataObject, fatal: bool, delay: int) -> None:
        worker, leases = self._pick(data, "fail")
        valid = self._valid(worker, leases)
        failures = [
            Failure(lease=lease, error="boom", delay=dt.timedelta(seconds=delay), fatal=fatal)
            for lease in leases
        ]
        result = self.call(lambda: Q.fail_many(self.conn, owner=worker, failures=failures))
        expect_dead = {
            j for j in valid if fatal or self.jobs[j].attempt >= self.jobs[j].max_attempts
        }
        expect_cancelled = {j for j in valid - expect_dead if self.jobs[j].cancel_requested}
        assert result.dead == expect_dead
        assert result.cancelled == expect_cancelled
        assert result.retried == valid - expect_dead - expect_cancelled
        for job_id in valid:
            model = self.jobs[job_id]
            model.owner = model.lease_until = None
            if job_id in expect_dead:
                model.state, model.fatal = "dead", fatal
            elif job_id in expect_cancelled:
                model.state = "cancelled"
            else:
                model.state = "scheduled" if delay else "available"
                model.run_at = self.clock + dt.timedelta(seconds=delay)

    @precondition(lambda self: bool(self._holders()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        worker, leases = self._pick(data, "release")
        valid = self._valid(worker, leases)
        released = self.call(lambda: Q.release_many(self.conn, owner=worker, leases=leases))
        assert released == valid
        for job_id in valid:
            model = self.jobs[job_id]
            model.state = "cancelled" if model.cancel_requested else "available"
            model.owner = model.lease_until = None
            model.attempt -= 1
            model.run_at = self.clock

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
            note("expire and reclaim: taken again")
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
        """A worker's liveness row went stale and nobody holds its lock: the sweepers
        return its running jobs at once, leases or not (`Queue.reclaim_dead_workers`)."""
        worker = data.draw(st.sampled_from(self._holders()))
        self.call(self._register_stale, worker)
        owned = [j for j in self.jobs.values() if j.state == "running" and j.owner == worker]
        result = self.call(lambda: Q.reclaim_dead_workers(self.conn, grace=LIVENESS_GRACE))
        self._swept(owned, result)
        self.beliefs[worker].clear()  # it is dead
        note("worker found dead")

    async def _register_stale(self, worker: str) -> None:
        await self.conn.execute(
            "INSERT INTO trioq.workers (name, host, pid, queues, seen_at)"
            " VALUES (%s, 'h', 1, '{}', %s) ON CONFLICT (name) DO UPDATE SET seen_at = %s",
            (worker, self.clock - dt.timedelta(seconds=10), self.clock - dt.timedelta(seconds=10)),
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
                note("heartbeat: with stale lease")
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
        self.clock += dt.timedelta(seconds=seconds)
        self.call(self._set_clock)

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
        expected = min(scheduled) - self.clock if scheduled else None
        assert self.call(Q.next_due, self.conn) == expected

    @rule()
    def sweep(self) -> None:
        expired = [
            j for j in self.jobs.values()
            if j.state == "running" and j.lease_until is not None and j.lease_until < self.clock
        ]  # fmt: skip
        self._swept(expired, self.call(lambda: Q.sweep(self.conn)))

    def _swept(self, expired: list[ModelJob], result: Any) -> None:
        """The sweeper's verdict on ``expired`` (lease expired, or owner dead)."""
        assert result.cancelled == {j.id for j in expired if j.cancel_requested}
        assert result.dead == {
            j.id for j in expired if not j.cancel_requested and j.attempt >= j.max_attempts
        }
        assert result.returned == {
            j.id for j in expired if not j.cancel_requested and j.attempt < j.max_attempts
        }
        for model in expired:
            model.owner = model.lease_until = None
            if model.cancel_requested:
                model.state = "cancelled"
            elif model.attempt >= model.max_attempts:
                model.state = "dead"
            else:
                model.state, model.run_at = "available", self.clock

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        model = self.jobs[data.draw(st.sampled_from(sorted(self.jobs)))]
        outcome = self.call(Q.cancel, self.conn, model.id)
        if model.state in ("scheduled", "available"):
            assert outcome.status == "cancelled"
            model.state = "cancelled"
        elif model.state == "running":
            assert outcome.status == "requested"
            model.cancel_requested = True
        else:
            assert outcome.status == "not_found"

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
            model = self.jobs[job_id]
            model.state, model.owner, model.lease_until = "cancelled", None, None

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
    def database_matches_model(self) -> None:
        live, dead = self.call(self._fetch)
        assert not set(live) & set(dead), "a job is in two tables"
        for job_id, model in self.jobs.items():
            if model.state == "done":
                assert job_id not in live and job_id not in dead, f"done job {job_id} still there"
            elif model.state == "dead":
                assert job_id in dead, f"dead job {job_id} lost"
                assert dead[job_id] == model.attempt
            else:
                assert job_id in live, f"job {job_id} ({model.state}) lost"
                state, attempt, owner = live[job_id]
                assert (state, attempt, owner) == (model.state, model.attempt, model.owner)
        assert set(live) | set(dead) <= set(self.jobs), "a job appeared from nowhere"

    @invariant()
    def attempts_and_deaths_are_bounded(self) -> None:
        for model in self.jobs.values():
            assert 0 <= model.attempt <= model.max_attempts
            if model.state == "dead":
                assert model.fatal or model.attempt >= model.max_attempts

    @invariant()
    def at_most_one_live_job_per_dedup_key(self) -> None:
        keys = [j.dedup_key for j in self.jobs.values() if j.live and j.dedup_key]
        assert len(keys) == len(set(keys))

    @invariant()
    def no_two_workers_hold_one_job(self) -> None:
        for job_id, model in self.jobs.items():
            holders = [
                (w, lease.attempt)
                for w in WORKERS
                for lease in self.beliefs[w]
                if lease.job_id == job_id and model.holds(w, lease.attempt)
            ]
            assert len(holders) <= 1

    async def _fetch(self) -> tuple[dict[int, tuple[str, int, str | None]], dict[int, int]]:
        cur = await self.conn.execute("SELECT id, state, attempt, lease_owner FROM trioq.jobs")
        live = {r[0]: (r[1], r[2], r[3]) for r in await cur.fetchall()}
        cur = await self.conn.execute("SELECT id, attempt FROM trioq.dead_jobs")
        dead = {r[0]: r[1] for r in await cur.fetchall()}
        return live, dead


def test_queue_state_machine(dsn: str) -> None:
    async def main() -> None:
        async with (
            await trioq.connect(dsn, autocommit=True) as conn,
            await trioq.connect(dsn) as other,
        ):
            await trioq.migrate(conn)
            await run_machine(
                QueueMachine, {"conn": conn, "other": other}, examples=(200, 5000), steps=(50, 100)
            )

    PATHS.clear()
    trio.run(main)
    print("\npaths taken:", ", ".join(f"{path} {n}" for path, n in sorted(PATHS.items())))
    missing = [path for path in MUST_TAKE if not PATHS[path]]
    assert not missing, f"the machines never took: {missing}"
