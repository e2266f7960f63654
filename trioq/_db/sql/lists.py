"""The job lists, one statement per state: the dashboard's pages and ``trioq jobs list``.

Each reads at most ``%(window)s`` rows of the index that serves its state, in that index's
order, then filters them (task, args search, and the queue where no index leads with it)
and takes a page. A filter that matches nothing in the window finds nothing, and the page
says so; the cost is bounded on a table of any size (``tests/test_web_explain.py``).
"""

#: Rows of one index a job list reads at most before filtering.
WINDOW = 10_000

# The columns of a list row: id, queue, task, state, priority, attempt, max_attempts, run_at,
# enqueued_at, lease_owner, lease_expires_at, finished (finished_at / died_at), error (first
# 200 characters), args (first 200 characters of the JSON).
JOB_ROW = (
    "id, queue, task, state, priority, attempt, max_attempts, run_at, enqueued_at, "
    "lease_owner, lease_expires_at, finished_at, left(last_error, 200), left(args::text, 200)"
)

DEAD_ROW = (
    "id, queue, task, 'dead', priority, attempt, max_attempts, NULL::timestamptz, enqueued_at, "
    "NULL::text, NULL::timestamptz, died_at, left(last_error, 200), left(args::text, 200)"
)

# The filters applied to a window: task, args containing a JSON value, args text containing
# a string, and (where the window's index does not lead with it) the queue.
FILTERS = """
   AND (%(task)s::text IS NULL OR task = %(task)s)
   AND (%(contains)s::jsonb IS NULL OR args @> %(contains)s::jsonb)
   AND (%(text)s::text IS NULL OR strpos(args::text, %(text)s) > 0)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
"""

# One statement per state: the window is read from the index that serves that state.
LISTS = {
    "available": """
SELECT {job_row} FROM (
    SELECT * FROM {jobs}
     WHERE state = 'available' AND (%(queue)s::text IS NULL OR queue = %(queue)s)
     ORDER BY queue, priority, run_at, id LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY queue, priority, run_at, id LIMIT %(limit)s OFFSET %(offset)s
""",
    "scheduled": """
SELECT {job_row} FROM (
    SELECT * FROM {jobs} WHERE state = 'scheduled' ORDER BY run_at LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY run_at, id LIMIT %(limit)s OFFSET %(offset)s
""",
    "running": """
SELECT {job_row} FROM (
    SELECT * FROM {jobs} WHERE lease_expires_at IS NOT NULL AND state = 'running'
     ORDER BY lease_expires_at LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY lease_expires_at, id LIMIT %(limit)s OFFSET %(offset)s
""",
    "waiting": """
SELECT {job_row} FROM (
    SELECT * FROM {jobs}
     WHERE state = 'waiting' AND (%(queue)s::text IS NULL OR queue = %(queue)s)
     ORDER BY queue, id LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY queue, id LIMIT %(limit)s OFFSET %(offset)s
""",
    "done": """
SELECT {job_row} FROM (
    SELECT * FROM {jobs} WHERE state = 'done' ORDER BY finished_at DESC LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY finished_at DESC, id DESC LIMIT %(limit)s OFFSET %(offset)s
""",
    "cancelled": """
SELECT {job_row} FROM (
    SELECT * FROM {jobs} WHERE state = 'cancelled' ORDER BY finished_at DESC LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY finished_at DESC, id DESC LIMIT %(limit)s OFFSET %(offset)s
""",
    "dead": """
SELECT {dead_row} FROM (
    SELECT * FROM {dead}
     WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
     ORDER BY died_at DESC LIMIT %(window)s
) AS w WHERE true {filters}
 ORDER BY died_at DESC, id DESC LIMIT %(limit)s OFFSET %(offset)s
""",
}
