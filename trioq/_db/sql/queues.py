"""Queue settings (flow control, migration 6): read them, change some of them."""

QUEUE_SETTINGS = """
SELECT name, paused, global_concurrency, rate_limit, rate_period, key_concurrency,
       key_rate_limit, key_rate_period, aging
  FROM {queues}
 WHERE %(names)s::text[] IS NULL OR name = ANY(%(names)s::text[])
 ORDER BY name
"""

# Changes only the settings whose set_* flag is true (atomic: two concurrent changes of
# different settings both land). Clearing a rate limit forgets its counted starts. Every
# worker hears of it through one notification.
CHANGE_QUEUE = """
WITH up AS (
    INSERT INTO {queues} AS q (name, paused, global_concurrency, rate_limit, rate_period,
                               key_concurrency, key_rate_limit, key_rate_period, aging)
    VALUES (%(name)s, coalesce(%(paused)s::bool, false), %(global_concurrency)s::int4,
            %(rate_limit)s::int4, %(rate_period)s::interval, %(key_concurrency)s::int4,
            %(key_rate_limit)s::int4, %(key_rate_period)s::interval, %(aging)s::interval)
    ON CONFLICT (name) DO UPDATE SET
        paused = CASE WHEN %(set_paused)s THEN EXCLUDED.paused ELSE q.paused END,
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
        updated_at = now()
    RETURNING q.name, q.paused, q.global_concurrency, q.rate_limit, q.rate_period,
              q.key_concurrency, q.key_rate_limit, q.key_rate_period, q.aging
), cleared AS (
    DELETE FROM {rate_starts} s USING up
     WHERE s.queue = up.name
       AND ((s.key = '' AND up.rate_limit IS NULL) OR (s.key <> '' AND up.key_rate_limit IS NULL))
)
SELECT up.*, pg_notify(%(channel)s, '@queues')::text FROM up
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
