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
