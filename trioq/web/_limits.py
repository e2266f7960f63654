"""The dashboard's caps: what keeps every page's cost bounded on a table of any size.

Its statements are the library's (`trioq._db.statements`, ``trioq/_db/sql/``); each one has
a bounded cost whatever the backlog, and ``tests/test_web_explain.py`` explains every one of
them, with every filter combination the pages send, on a table of a million jobs and a
million dead jobs, failing on a sequential scan of ``jobs`` or ``dead_jobs``. How:

- counts are exact up to a cap (`COUNT_CAP`) and say "cap+" above it: a ``LIMIT`` inside
  an index scan, never ``count(*)`` over a queue;
- the queue names come from skip scans of the indexes that lead with the queue (the claim
  index, ``dead_jobs_queue_idx``), a recursive CTE that probes each queue once;
- job lists read at most `WINDOW` rows of one index in its order, then filter them and
  take a page (``trioq/_db/sql/lists.py``);
- running jobs (the workers' leases) come from ``jobs_lease_idx``: as many rows as jobs
  are running, which the fleet's slots bound (at most `LEASE_CAP`).

The dashboard's connections never prepare statements (``prepare_threshold=None``), so
each one is planned with its parameter values: ``%(queue)s IS NULL OR queue = ...``
folds away when the filter is not given, and the planner sees the real queue name.
"""

from __future__ import annotations

from .._db.sql.lists import WINDOW

__all__ = ["COUNT_CAP", "LEASE_CAP", "MAX_QUEUES", "STALE_PING", "WINDOW", "WORKER_CAP"]

#: Counts above this show as "1,000+". Each capped count reads up to this many index
#: entries, and on a busy table as many heap pages (the visibility map is rarely set), so
#: the overview of 20 queues with big backlogs costs 20 x 2 x COUNT_CAP row reads.
COUNT_CAP = 1000
#: Running jobs the workers table reads at most (they are bounded by the fleet's slots).
LEASE_CAP = 10_000
#: Registered workers the overview lists at most.
WORKER_CAP = 1_000
#: A registered worker that has not pinged for this long is shown as gone: an idle worker
#: writes its row every 10 s (`trioq._worker.services.liveness.ROW_EVERY`), a busy one every
#: interval; the sweepers take a dead one for dead a couple of seconds after its lock frees.
STALE_PING = 30.0
#: Queues the overview lists at most (each is one probe per index).
MAX_QUEUES = 200

