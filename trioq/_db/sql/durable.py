"""Durable jobs: a job's step records, read at the start of a run and written fenced by its
lease (migration 15, ``docs/durable.md``)."""

# What a run replays: the job's records in the order they were made, and the database's
# clock (a sleep is over when its time has come by the clock that set it).
LOAD_STEPS = """
SELECT s.position, s.name, s.kind, s.result::text, s.attempt, s.recorded_at,
       {now} AS now
  FROM (SELECT {now}) AS clock
  LEFT JOIN {steps} s ON s.job_id = %(id)s::int8
 ORDER BY s.position
"""

# One record, written only while this worker holds the job's lease (the fence locks the
# job's row, so in a step's own transaction nothing can reclaim it before the commit); the
# first marks the job durable. ``until``: a sleep's wake-up, ``now`` + ``delay`` by the
# database's clock unless given. No row: the lease was lost.
RECORD_STEP = """
WITH f AS (
    SELECT id, durable FROM {jobs} WHERE {fence_one} FOR NO KEY UPDATE
), marked AS (
    UPDATE {jobs} j SET durable = true FROM f WHERE j.id = f.id AND NOT f.durable
), v AS (
    SELECT coalesce(%(until)s::timestamptz, {now} + %(delay)s::interval) AS until
), ins AS (
    INSERT INTO {steps} (job_id, position, name, kind, result, attempt, recorded_at)
    SELECT f.id, %(position)s, %(name)s, %(kind)s,
           CASE WHEN %(kind)s = 'sleep'
                THEN pg_catalog.jsonb_build_object('until', v.until)
                ELSE %(result)s::jsonb END,
           %(attempt)s, {now}
      FROM f, v
    RETURNING result::text
)
SELECT ins.result, {now} FROM ins
"""

# What `job.steps()` shows, and `trioq jobs show` prints.
JOB_STEPS = """
SELECT position, name, kind, result::text, attempt, recorded_at
  FROM {steps} WHERE job_id = %(id)s::int8 ORDER BY position
"""

# A wait for a signal, in one statement under the job's row lock (the fence): the signal if
# it came, recorded as the wait's result; else its timeout if it has passed (recorded as
# timed out); else the wait is recorded pending (its timeout) and the job parked: given back
# with its attempt refunded, scheduled at the timeout, waiting for the name (cancelled, if a
# cancel was requested). A pending record is updated when the wait resolves.
WAIT = """
WITH f AS (
    SELECT id, cancel_requested FROM {jobs} WHERE {fence_one} FOR NO KEY UPDATE
), sig AS (
    SELECT s.payload FROM {signals} s, f WHERE s.job_id = f.id AND s.name = %(name)s
), v AS (
    SELECT coalesce(%(until)s::timestamptz, {now} + %(timeout)s::interval) AS until
), decided AS (
    SELECT f.id, f.cancel_requested, v.until,
           CASE WHEN EXISTS (SELECT 1 FROM sig)
                THEN pg_catalog.jsonb_build_object('payload', (SELECT payload FROM sig))
                WHEN v.until <= {now}
                THEN pg_catalog.jsonb_build_object('timed_out', v.until)
                ELSE pg_catalog.jsonb_build_object('until', v.until) END AS result
      FROM f, v
), rec AS (
    INSERT INTO {steps} (job_id, position, name, kind, result, attempt, recorded_at)
    SELECT d.id, %(position)s, %(name)s, 'wait', d.result, %(attempt)s, {now} FROM decided d
    ON CONFLICT (job_id, position) DO UPDATE SET result = EXCLUDED.result
    RETURNING result
), parked AS (
    UPDATE {jobs} j
       SET state = CASE WHEN d.cancel_requested THEN 'cancelled' ELSE 'scheduled' END,
           finished_at = CASE WHEN d.cancel_requested THEN {now} END,
           run_at = d.until, waiting_for = %(name)s, durable = true, attempt = j.attempt - 1,
           lease_owner = NULL, lease_expires_at = NULL
      FROM decided d
     WHERE j.id = d.id AND d.result ? 'until'
    RETURNING j.id
)
SELECT rec.result::text, (SELECT count(*) FROM parked) FROM rec
"""

# A signal, in the sender's transaction: stored for the job (by id, or the live job holding a
# task's dedup key), and the job woken if it waits for it. The job's row is locked first (as
# the wait locks it), so a signal and a wait never miss each other. Returns the job's state
# before (NULL: no such job), whether the signal was stored (false: one of that name was
# already), and whether the job was woken.
SIGNAL = """
WITH j AS (
    SELECT id, state, waiting_for, queue, durable FROM {jobs}
     WHERE id = coalesce(%(id)s::int8, (SELECT x.id FROM {jobs} x
                                         WHERE x.dedup_key = %(key)s AND x.state IN {live}))
       FOR NO KEY UPDATE
), ins AS (
    INSERT INTO {signals} (job_id, name, payload, sent_at)
    SELECT j.id, %(name)s, %(payload)s::jsonb, {now} FROM j
     WHERE j.state NOT IN ('done', 'cancelled')
    ON CONFLICT (job_id, name) DO NOTHING
    RETURNING job_id
), woke AS (
    UPDATE {jobs} x
       SET state = 'available', run_at = {now}, waiting_for = NULL, durable = true
      FROM j
     WHERE x.id = j.id AND EXISTS (SELECT 1 FROM ins)
       AND j.state = 'scheduled' AND j.waiting_for = %(name)s
    RETURNING x.queue
), marked AS (
    UPDATE {jobs} x SET durable = true
      FROM j
     WHERE x.id = j.id AND EXISTS (SELECT 1 FROM ins) AND NOT j.durable
       AND NOT (j.state = 'scheduled' AND j.waiting_for IS NOT DISTINCT FROM %(name)s)
)
SELECT j.id, j.state, EXISTS (SELECT 1 FROM ins),
       (SELECT pg_catalog.count(pg_catalog.pg_notify(%(channel)s, w.queue)) FROM woke w) > 0
  FROM (SELECT 1) AS one LEFT JOIN j ON true
"""

# A job spawned by a durable job (`job.spawn`), in the transaction that inserted it and
# records the spawn: its parent is told when it ends (migration 16's child_ended).
SET_PARENT = """
UPDATE {jobs} SET parent_id = %(parent)s::int8 WHERE id = %(child)s::int8
"""
