"""Cron ticks: each entry's last tick, a tick claimed once across processes, its job; and the
entries stored in the database (migration 19): add, replace, remove, read."""

CRON_LAST_TICKS = """
SELECT name, pg_catalog.max(tick) FROM {ticks} WHERE name = ANY(%(names)s::text[]) GROUP BY name
"""

# Claims the tick: only the transaction that inserts the row goes on to enqueue. The same
# statement prunes the entry's old rows (never its latest), so the table stays small. An entry
# of the database gives the version it was read at (its updated_at; NULL for an entry of the
# code): the tick is claimed only if that row is still there, enabled and unchanged, so once
# a removal, a disable or a replacement commits, no process fires the old definition again,
# whenever it hears of the change.
CRON_RECORD_TICK = """
WITH claimed AS (
    INSERT INTO {ticks} (name, tick, fired_at)
    SELECT %(name)s, %(tick)s, {now}
     WHERE %(version)s::timestamptz IS NULL
        OR EXISTS (SELECT 1 FROM {cron_entries} e
                    WHERE e.name = %(name)s AND e.enabled AND e.updated_at = %(version)s)
    ON CONFLICT (name, tick) DO NOTHING
    RETURNING tick
), pruned AS (
    DELETE FROM {ticks}
     WHERE name = %(name)s AND tick < %(tick)s AND fired_at < {now} - %(keep)s
       AND EXISTS (SELECT 1 FROM claimed)
)
SELECT tick FROM claimed
"""

CRON_SET_JOB = """
UPDATE {ticks} SET job_id = %(job_id)s WHERE name = %(name)s AND tick = %(tick)s
"""

# `trioq cron list`: each entry's latest fired tick.
CRON_LAST = """
SELECT DISTINCT ON (name) name, tick, job_id, fired_at FROM {ticks} ORDER BY name, tick DESC
"""

# -- entries stored in the database (migration 19) ----------------------------------------------

# Every entry, by name (at most %(limit)s: the scheduler's bound). args as text and the grace
# as seconds: a row written by hand decodes whatever it holds (the reader judges it). The
# columns are those `trioq._cron_store.StoredCronEntry.from_row` reads, as CRON_ENTRY_ADD
# returns them.
CRON_ENTRIES = """
SELECT name, schedule, task, args::text, queue, priority, max_attempts, misfire,
       pg_catalog.date_part('epoch', misfire_grace), timezone, enabled, created_at, updated_at
  FROM {cron_entries} ORDER BY name LIMIT %(limit)s
"""

# Adds an entry; an existing name is replaced only when %(replace)s (no row comes back
# otherwise: the caller says it exists). Every worker hears of it through one notification.
CRON_ENTRY_ADD = """
WITH up AS (
    INSERT INTO {cron_entries} AS e (name, schedule, task, args, queue, priority, max_attempts,
                                    misfire, misfire_grace, timezone, enabled)
    VALUES (%(name)s, %(schedule)s, %(task)s, %(args)s::jsonb, %(queue)s, %(priority)s,
            %(max_attempts)s, %(misfire)s, %(misfire_grace)s, %(timezone)s, %(enabled)s)
    ON CONFLICT (name) DO UPDATE SET
        schedule = EXCLUDED.schedule, task = EXCLUDED.task, args = EXCLUDED.args,
        queue = EXCLUDED.queue, priority = EXCLUDED.priority,
        max_attempts = EXCLUDED.max_attempts, misfire = EXCLUDED.misfire,
        misfire_grace = EXCLUDED.misfire_grace, timezone = EXCLUDED.timezone,
        enabled = EXCLUDED.enabled,
        updated_at = GREATEST(pg_catalog.now(), e.updated_at + interval '1 microsecond')
     WHERE %(replace)s
    RETURNING name, schedule, task, args::text, queue, priority, max_attempts, misfire,
              pg_catalog.date_part('epoch', misfire_grace), timezone, enabled, created_at,
              updated_at
)
SELECT up.*, pg_catalog.pg_notify(%(channel)s, '@cron')::text FROM up
"""

CRON_ENTRY_REMOVE = """
WITH gone AS (DELETE FROM {cron_entries} WHERE name = %(name)s RETURNING name)
SELECT gone.name, pg_catalog.pg_notify(%(channel)s, '@cron')::text FROM gone
"""
