"""Every way rows get in: one job, many (unnest or COPY, ids reserved first), many that share
everything but args (one statement), a unique window (a function of migration 6), and the
notifications that wake the workers. `trioq._db.insert` runs them."""

INSERT = """
WITH v AS (
    SELECT coalesce(%(run_at)s, {now} + %(delay)s) AS run_at,
           coalesce(%(start_by_at)s::timestamptz, {now} + %(start_by_in)s::interval) AS start_by
), ins AS (
    INSERT INTO {jobs} (queue, task, args, priority, run_at, state, max_attempts,
                        max_attempts_unset, dedup_key, concurrency_key, start_by, cost,
                        sequence_key {trace_column})
    SELECT %(queue)s, %(task)s, %(args)s::jsonb, %(priority)s, v.run_at,
           CASE WHEN v.run_at > {now} THEN 'scheduled' ELSE 'available' END,
           %(max_attempts)s, %(max_attempts_unset)s, %(dedup_key)s, %(concurrency_key)s,
           v.start_by, %(cost)s::int2, %(sequence_key)s::text {trace_value}
      FROM v
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL AND state IN {live} DO NOTHING
    RETURNING id, queue, state
)
SELECT id, CASE WHEN %(notify)s THEN pg_catalog.pg_notify(
           %(channel)s, CASE WHEN state = 'scheduled' THEN '@scheduled' ELSE queue END)::text
       END
  FROM ins
"""

# Rows carry ids reserved with _RESERVE_IDS, so the caller knows which spec got which id.
INSERT_MANY = """
INSERT INTO {jobs} (id, queue, task, args, priority, run_at, state, max_attempts,
                    max_attempts_unset, dedup_key, concurrency_key, start_by, cost, sequence_key
                    {trace_column})
SELECT i, q, t, a::jsonb, p, r, CASE WHEN r > {now} THEN 'scheduled' ELSE 'available' END, m,
       mu, k, ck, sb, c, sk {trace_value}
  FROM unnest(%(ids)s::int8[], %(queues)s::text[], %(tasks)s::text[], %(args)s::text[],
              %(priorities)s::int2[], %(run_ats)s::timestamptz[], %(max_attempts)s::int4[],
              %(max_attempts_unset)s::bool[], %(dedup_keys)s::text[],
              %(concurrency_keys)s::text[], %(start_bys)s::timestamptz[], %(costs)s::int2[],
              %(sequence_keys)s::text[])
              AS u(i, q, t, a, p, r, m, mu, k, ck, sb, c, sk)
 ORDER BY k, i  -- one lock order for every transaction (overlapping batches wait, never
              -- deadlock); among twins in one batch the first (lowest reserved id) wins
ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL AND state IN {live} DO NOTHING
RETURNING id
"""

# The sequence is looked up once (MATERIALIZED), not once per reserved id.
RESERVE_IDS = """
WITH s AS MATERIALIZED (SELECT pg_catalog.pg_get_serial_sequence(%(jobs)s, 'id') AS seq)
SELECT {now}, pg_catalog.array_agg(pg_catalog.nextval(s.seq))
  FROM s, pg_catalog.generate_series(1, %(n)s)
"""

COPY_JOBS = """
COPY {jobs} (id, queue, task, args, priority, run_at, state, max_attempts, max_attempts_unset
             {trace_column})
FROM STDIN
"""

# Many jobs sharing every field but args: one statement, args as one JSON array (encoded by
# one json call on the client). Ids are drawn in a MATERIALIZED CTE next to each job's
# position, so the mapping is exact; when they are consecutive (the usual case) only the
# offset comes back, else the array in input order. pg_notify payloads are deduplicated per
# transaction by Postgres, so several statements in one transaction still notify once.
INSERT_BULK = """
WITH v AS (
    SELECT coalesce(%(run_at)s::timestamptz, {now} + %(delay)s::interval) AS run_at, {now} AS now,
           coalesce(%(start_by_at)s::timestamptz, {now} + %(start_by_in)s::interval) AS start_by
), s AS MATERIALIZED (
    SELECT pg_catalog.pg_get_serial_sequence(%(jobs)s, 'id')::regclass AS seq
), a AS MATERIALIZED (
    SELECT pg_catalog.nextval(s.seq) AS id, x.args, x.o
      FROM s, pg_catalog.jsonb_array_elements(%(args)s::jsonb) WITH ORDINALITY AS x(args, o)
), ins AS (
    INSERT INTO {jobs} (id, queue, task, args, priority, run_at, state, max_attempts,
                        max_attempts_unset, start_by, cost, sequence_key {trace_column})
    SELECT a.id, %(queue)s, %(task)s, a.args, %(priority)s, v.run_at,
           CASE WHEN v.run_at > v.now THEN 'scheduled' ELSE 'available' END, %(max_attempts)s,
           %(max_attempts_unset)s, v.start_by, %(cost)s::int2, %(sequence_key)s::text
           {trace_value}
      FROM a, v
     ORDER BY a.o  -- inserted in input order: a sequence's first job is its head
)
SELECT pg_catalog.count(*), pg_catalog.min(a.id - a.o),
       CASE WHEN pg_catalog.min(a.id - a.o) <> pg_catalog.max(a.id - a.o)
            THEN (SELECT pg_catalog.array_agg(id ORDER BY o) FROM a) END,
       (SELECT pg_catalog.count(pg_catalog.pg_notify(%(channel)s,
                               CASE WHEN v.run_at > v.now THEN '@scheduled' ELSE %(queue)s END))
          FROM v WHERE %(notify)s)
  FROM a
"""

# The deadline of a job `enqueue_unique` just inserted (its function predates start_by), in
# the same transaction: a time, or an offset from the clock.
SET_START_BY = """
UPDATE {jobs} SET start_by = coalesce(%(start_by_at)s::timestamptz,
                                      {now} + %(start_by_in)s::interval)
 WHERE id = %(id)s
"""

# The cost of a job `enqueue_unique` just inserted (its function predates weighted slots), in
# the same transaction (migration 24; NULL: its task's).
SET_COST = """
UPDATE {jobs} SET cost = %(cost)s::int2 WHERE id = %(id)s
"""

# A debounced enqueue (`trioq._db.insert.debounced`): the key's job that has not started
# takes these args and runs the period after now (never after its deadline, the first
# enqueue's time plus max_wait), or a new job is inserted. One statement on the unique index
# of migration 22: an enqueue racing one whose transaction is open waits for its commit,
# then updates its job (or inserts, if it rolled back or its job started meanwhile).
# Returns the job's id and whether it was there already.
DEBOUNCE = """
WITH up AS (
    INSERT INTO {jobs} AS j (queue, task, args, priority, run_at, state, max_attempts,
                             max_attempts_unset, concurrency_key, debounce_key,
                             debounce_deadline, cost {trace_column})
    SELECT %(queue)s, %(task)s, %(args)s::jsonb, %(priority)s, {now} + %(period)s::interval,
           'scheduled', %(max_attempts)s, %(max_attempts_unset)s, %(concurrency_key)s,
           %(key)s, {now} + %(max_wait)s::interval, %(cost)s::int2 {trace_value}
    ON CONFLICT (debounce_key) WHERE debounce_key IS NOT NULL
                                 AND state IN ('scheduled', 'available')
    DO UPDATE SET
        args = excluded.args,
        run_at = least({now} + %(period)s::interval, j.debounce_deadline),
        state = CASE WHEN least({now} + %(period)s::interval, j.debounce_deadline) > {now}
                     THEN 'scheduled' ELSE 'available' END
    RETURNING j.id, j.xmax <> 0 AS updated, j.state, j.queue
)
SELECT id, updated, CASE WHEN %(notify)s THEN pg_catalog.pg_notify(
           %(channel)s, CASE WHEN state = 'scheduled' THEN '@scheduled' ELSE queue END)::text
       END
  FROM up
"""

LIVE_TWINS = """
SELECT dedup_key, id FROM {jobs} WHERE dedup_key = ANY(%(keys)s) AND state IN {live}
"""

NOTIFY = """
SELECT pg_catalog.pg_notify(%(channel)s, q) FROM pg_catalog.unnest(%(queues)s::text[]) AS q
"""

ENQUEUE_UNIQUE = """
SELECT * FROM {enqueue_unique}(
    %(key)s, %(period)s::interval, %(states)s::text[], %(queue)s, %(task)s, %(args)s,
    %(priority)s::int2, %(run_at)s::timestamptz, %(delay)s::interval,
    %(chosen_max_attempts)s::int4,
    %(concurrency_key)s, %(notify)s, %(channel)s)
"""
