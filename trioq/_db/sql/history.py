"""The per-minute job history: the completer's upsert, retention, and the charts' reads."""

# One row per (minute, queue, task) in the batch, sorted by the caller: concurrent writers
# then lock shared rows in the same order and cannot deadlock. The histograms come as one
# flat array, `buckets` elements per row (sliced by the row's ordinal), and are merged
# element-wise into an existing row.
HISTORY_UPSERT = """
INSERT INTO {history} AS h (minute, queue, task, completed, retried, dead, cancelled, runs,
                            exec_us_sum, exec_us_max, exec_hist,
                            wait_us_sum, wait_us_max, wait_hist)
SELECT to_timestamp(u.minute), u.queue, u.task, u.completed, u.retried, u.dead, u.cancelled,
       u.runs, u.exec_us_sum, u.exec_us_max,
       (%(exec_hists)s::int8[])[(u.o - 1) * %(buckets)s + 1 : u.o * %(buckets)s],
       u.wait_us_sum, u.wait_us_max,
       (%(wait_hists)s::int8[])[(u.o - 1) * %(buckets)s + 1 : u.o * %(buckets)s]
  FROM unnest(%(minutes)s::int8[], %(queues)s::text[], %(tasks)s::text[],
              %(completed)s::int8[], %(retried)s::int8[], %(dead)s::int8[],
              %(cancelled)s::int8[], %(runs)s::int8[], %(exec_us_sum)s::int8[],
              %(exec_us_max)s::int8[], %(wait_us_sum)s::int8[], %(wait_us_max)s::int8[])
       WITH ORDINALITY AS u(minute, queue, task, completed, retried, dead, cancelled, runs,
                            exec_us_sum, exec_us_max, wait_us_sum, wait_us_max, o)
 ORDER BY u.o
ON CONFLICT (minute, queue, task) DO UPDATE SET
    completed = h.completed + EXCLUDED.completed,
    retried = h.retried + EXCLUDED.retried,
    dead = h.dead + EXCLUDED.dead,
    cancelled = h.cancelled + EXCLUDED.cancelled,
    runs = h.runs + EXCLUDED.runs,
    exec_us_sum = h.exec_us_sum + EXCLUDED.exec_us_sum,
    exec_us_max = greatest(h.exec_us_max, EXCLUDED.exec_us_max),
    exec_hist = ARRAY(SELECT a + b FROM unnest(h.exec_hist, EXCLUDED.exec_hist)
                                        WITH ORDINALITY AS x(a, b, i) ORDER BY i),
    wait_us_sum = h.wait_us_sum + EXCLUDED.wait_us_sum,
    wait_us_max = greatest(h.wait_us_max, EXCLUDED.wait_us_max),
    wait_hist = ARRAY(SELECT a + b FROM unnest(h.wait_hist, EXCLUDED.wait_hist)
                                        WITH ORDINALITY AS x(a, b, i) ORDER BY i)
"""

# Rows older than the retention, at most `limit` per statement (SKIP LOCKED: every worker
# prunes, none waits for another).
HISTORY_PRUNE = """
WITH old AS (
    SELECT minute, queue, task FROM {history}
     WHERE minute < {now} - %(retention)s
     ORDER BY minute
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), pruned AS (
    DELETE FROM {history} h USING old
     WHERE h.minute = old.minute AND h.queue = old.queue AND h.task = old.task
    RETURNING 1
)
SELECT count(*) FROM pruned
"""

# Per-minute totals since `since` (optionally of one queue): counts, sums, maxima and the
# histograms summed element-wise (24 columns each, from constant text).
HISTORY_MINUTES = """
SELECT extract(epoch FROM minute)::int8, sum(completed)::int8, sum(retried)::int8,
       sum(dead)::int8, sum(cancelled)::int8, sum(runs)::int8,
       sum(exec_us_sum)::int8, max(exec_us_max), sum(wait_us_sum)::int8, max(wait_us_max),
       ARRAY[{exec_sums}], ARRAY[{wait_sums}]
  FROM {history}
 WHERE minute >= to_timestamp(%(since)s) AND (%(queue)s::text IS NULL OR queue = %(queue)s)
 GROUP BY minute ORDER BY minute
"""

HISTORY_QUEUES = """
SELECT DISTINCT queue FROM {history} WHERE minute >= to_timestamp(%(since)s) ORDER BY 1
"""

# `trioq status --watch`: per queue, the outcomes of the last `minutes` minutes (the job
# history's rows of those minutes: its primary key leads with the minute).
RECENT_RATES = """
SELECT queue, pg_catalog.sum(completed)::int8, pg_catalog.sum(retried)::int8,
       pg_catalog.sum(dead)::int8
  FROM {history}
 WHERE minute >= pg_catalog.date_trunc('minute', {now}) - %(minutes)s * interval '1 minute'
 GROUP BY queue ORDER BY queue
"""


def bucket_sums(column: str, buckets: int = 24) -> str:
    """``sum(column[1])::int8, ..., sum(column[buckets])::int8``: a histogram summed
    element-wise (`HISTORY_MINUTES`)."""
    return ", ".join(f"sum({column}[{i}])::int8" for i in range(1, buckets + 1))
