"""Queue settings (flow control, migration 6): read them, change some of them."""

# A timed pause that has ended on the database's clock reads as no pause (paused false,
# paused_until NULL) whether or not a governor has tidied its row yet; paused_until is in
# microseconds since the Unix epoch (`epoch_us`: a time that got past the CHECK is clamped
# rather than failing the read; NULL is kept apart, as epoch_us would clamp it too).
_COLUMNS = """paused AND NOT {pause_ended}, global_concurrency, rate_limit, rate_period,
       key_concurrency, key_rate_limit, key_rate_period,
       CASE WHEN paused AND NOT {pause_ended} AND paused_until IS NOT NULL
            THEN {epoch_us}(paused_until) END, aging, fair"""
_SETTINGS = """
SELECT name, """ + _COLUMNS + """
  FROM {queues}
"""
QUEUE_SETTINGS = _SETTINGS + """
 WHERE %(names)s::text[] IS NULL OR name = ANY(%(names)s::text[])
 ORDER BY name
"""

# A worker's poll of the queues it serves, once every ``poll_interval`` (the governor's round,
# `trioq._worker.services.governor`): each name's settings (defaults where it has no row) and
# whether it has a job a claim could take now (the claim's own conditions, its limits and
# pause aside), in one round trip for all of them. The fetchers of drained queues wait for a
# notification, or for this poll to find work: one statement a poll per process, whatever
# the number of queues, instead of one claim a queue and a read of the settings.
#
# The work is probed a queue at a time (LATERAL ... LIMIT 1 in the claim's order: the claim's
# index from the queue's name, stopping at the first job), never as one set: written as
# EXISTS, the generic plan hashed a single scan of every queue's due jobs (the whole index
# under a backlog); without the order, the planner chose a sequential scan of the table
# until the first match (all of it, for a queue with none: tests/test_explain.py).
# A name without a row reads NULL settings: `QueueSettings.from_row` takes them as defaults.
QUEUE_POLL = """
SELECT n.queue, """ + _COLUMNS + """, w.work IS NOT NULL
  FROM pg_catalog.unnest(%(names)s::text[]) AS n(queue)
  LEFT JOIN {queues} q ON q.name = n.queue
  LEFT JOIN LATERAL (
    SELECT true AS work FROM {jobs} j
     WHERE j.queue = n.queue AND j.state = 'available' AND j.run_at <= {now}
       AND (j.start_by IS NULL OR j.start_by >= {now})
     ORDER BY j.priority, j.run_at, j.id  -- the claim's order: its index, never a scan
     LIMIT 1
  ) w ON true
 ORDER BY n.queue
"""

# The paused queues only, the first `limit` by name (the dashboard's overview lists them so
# they can be resumed: with 10,000 queues, reading every queue's settings to find them cost
# the page more than all its counts).
PAUSED_SETTINGS = _SETTINGS + """
 WHERE paused AND NOT {pause_ended}
 ORDER BY name LIMIT %(limit)s
"""

# Changes only the settings whose set_* flag is true (atomic: two concurrent changes of
# different settings both land). A pause sets paused_until with it (NULL: until resumed), a
# resume clears it; the time is given (``paused_until``) or a length from the database's
# clock (``paused_for``), and must lie after that clock and at most 100 years ahead: else
# nothing is written and the row that comes back has a NULL name (the caller raises), with
# the clock and the time it was compared with. Clearing a rate limit forgets its counted
# starts. Every worker hears of a change through one notification.
CHANGE_QUEUE = """
WITH at AS (
    SELECT {now} AS now,
           coalesce(%(paused_until)s::timestamptz, {now} + %(paused_for)s::interval) AS until
), up AS (
    INSERT INTO {queues} AS q (name, paused, paused_until, global_concurrency, rate_limit,
                               rate_period, key_concurrency, key_rate_limit, key_rate_period,
                               aging, fair)
    SELECT %(name)s, coalesce(%(paused)s::bool, false), at.until, %(global_concurrency)s::int4,
           %(rate_limit)s::int4, %(rate_period)s::interval, %(key_concurrency)s::int4,
           %(key_rate_limit)s::int4, %(key_rate_period)s::interval, %(aging)s::interval,
           coalesce(%(fair)s::bool, false)
      FROM at
     WHERE at.until IS NULL OR (at.until > at.now AND at.until <= at.now + interval '100 years')
    ON CONFLICT (name) DO UPDATE SET
        paused = CASE WHEN %(set_paused)s THEN EXCLUDED.paused ELSE q.paused END,
        paused_until = CASE WHEN %(set_paused)s THEN EXCLUDED.paused_until
                            ELSE q.paused_until END,
        global_concurrency = CASE WHEN %(set_global_concurrency)s
                                  THEN EXCLUDED.global_concurrency
                                  ELSE q.global_concurrency END,
        rate_limit = CASE WHEN %(set_rate_limit)s THEN EXCLUDED.rate_limit
                          ELSE q.rate_limit END,
        rate_period = CASE WHEN %(set_rate_limit)s THEN EXCLUDED.rate_period
                           ELSE q.rate_period END,
        key_concurrency = CASE WHEN %(set_key_concurrency)s THEN EXCLUDED.key_concurrency
                               ELSE q.key_concurrency END,
        key_rate_limit = CASE WHEN %(set_key_rate_limit)s THEN EXCLUDED.key_rate_limit
                              ELSE q.key_rate_limit END,
        key_rate_period = CASE WHEN %(set_key_rate_limit)s THEN EXCLUDED.key_rate_period
                               ELSE q.key_rate_period END,
        aging = CASE WHEN %(set_aging)s THEN EXCLUDED.aging ELSE q.aging END,
        fair = CASE WHEN %(set_fair)s THEN EXCLUDED.fair ELSE q.fair END,
        updated_at = pg_catalog.now()
    RETURNING q.name, q.paused AND NOT {pause_ended}, q.global_concurrency, q.rate_limit,
              q.rate_period, q.key_concurrency, q.key_rate_limit, q.key_rate_period,
              CASE WHEN q.paused AND NOT {pause_ended} AND q.paused_until IS NOT NULL
                   THEN {epoch_us}(q.paused_until) END, q.aging, q.fair
), cleared AS (
    DELETE FROM {rate_starts} s USING up
     WHERE s.queue = up.name
       AND ((s.key = '' AND up.rate_limit IS NULL) OR (s.key <> '' AND up.key_rate_limit IS NULL))
)
SELECT up.*,
       CASE WHEN up.name IS NOT NULL THEN pg_catalog.pg_notify(%(channel)s, '@queues') END::text,
       at.now, at.until
  FROM at LEFT JOIN up ON true
"""

# A governor's tidying of the timed pauses that have ended among ``names`` (the queues it
# serves): each becomes unpaused, and every worker hears of it by one notification (none if
# nothing was due). Guarded by the pause's own end: a newer pause written meanwhile (until
# later, or until resumed) no longer matches once this waits for its row lock, and stays.
# Also returns in how many seconds the next timed pause of ``names`` ends (NULL: none; the end
# clamped as `epoch_us` does, since Postgres before 17 cannot subtract an infinite time).
RESUME_DUE = """
WITH due AS (
    UPDATE {queues} SET paused = false, paused_until = NULL, updated_at = pg_catalog.now()
     WHERE name = ANY(%(names)s::text[]) AND paused AND {pause_ended}
    RETURNING name
), told AS (
    SELECT pg_catalog.pg_notify(%(channel)s, '@queues') FROM (SELECT 1 FROM due LIMIT 1) AS d
)
SELECT ARRAY(SELECT name FROM due ORDER BY name),
       (SELECT pg_catalog.date_part('epoch', least(
                   min(paused_until), '9999-12-31 23:59:59+00'::timestamptz) - {now})
          FROM {queues}
         WHERE name = ANY(%(names)s::text[]) AND paused AND NOT {pause_ended}),
       (SELECT count(*) FROM told)
"""

# Whether anything knows a queue (``trioq queue pause|resume|set`` refuse a name nothing
# knows: a typo would make a row that no job uses): a row of settings, a live worker that
# serves it, a job in a live state or dead, or runs in the last day of the job history.
# Each probe goes through an index that bounds it: the primary keys, the claim and waiting
# indexes and dead_jobs_queue_idx (which lead with the queue), the scheduled and lease
# indexes (as many rows as jobs are scheduled or running), the history's minutes.
QUEUE_KNOWN = """
SELECT EXISTS (SELECT 1 FROM {queues} WHERE name = %(name)s)
    OR EXISTS (SELECT 1 FROM {workers} WHERE pg_catalog.jsonb_exists(queues, %(name)s))
    OR EXISTS (SELECT 1 FROM {jobs} WHERE queue = %(name)s AND state = 'available')
    OR EXISTS (SELECT 1 FROM {jobs} WHERE queue = %(name)s AND state = 'waiting')
    OR EXISTS (SELECT 1 FROM {jobs} WHERE state = 'scheduled' AND queue = %(name)s)
    OR EXISTS (SELECT 1 FROM {jobs}
                WHERE lease_expires_at IS NOT NULL AND state = 'running' AND queue = %(name)s)
    OR EXISTS (SELECT 1 FROM {dead} WHERE queue = %(name)s)
    OR EXISTS (SELECT 1 FROM {history}
                WHERE minute >= {now} - interval '1 day' AND queue = %(name)s)
"""

# The queues known from the small tables (settings, live workers, the last day of the job
# history), for the message that refuses an unknown one; the queues with jobs come from the
# depth sample.
QUEUE_NAMES = """
SELECT name FROM {queues}
UNION SELECT pg_catalog.jsonb_object_keys(queues) FROM {workers}
       WHERE pg_catalog.jsonb_typeof(queues) = 'object'
UNION SELECT queue FROM {history} WHERE minute >= {now} - interval '1 day'
"""
