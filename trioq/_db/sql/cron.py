"""Cron ticks: each entry's last tick, a tick claimed once across processes, its job."""

CRON_LAST_TICKS = """
SELECT name, pg_catalog.max(tick) FROM {ticks} WHERE name = ANY(%(names)s::text[]) GROUP BY name
"""

# Claims the tick: only the transaction that inserts the row goes on to enqueue. The same
# statement prunes the entry's old rows (never its latest), so the table stays small.
CRON_RECORD_TICK = """
WITH claimed AS (
    INSERT INTO {ticks} (name, tick, fired_at) VALUES (%(name)s, %(tick)s, {now})
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
