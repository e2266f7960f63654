"""Exactly-once verification of a stress run, in SQL over the ledger and the queue's tables.

For every job the driver enqueued (the ids the queue handed back, as `IdRanges`):

- completed: it has a ledger row. The row commits with the job's fenced completion, so
  two rows would be two completions (``duplicate_completions``: must be 0).
- dead: it is in ``dead_jobs`` (must be 0: the workload never fails, so only attempts
  spent by chaos can kill a job).
- left: it is still in the job table as scheduled, available or running (must be 0 once
  the run has drained; non-zero after a timeout).
- lost: none of the above (must be 0): the queue dropped it.

Re-executions are completions on an attempt above 1: allowed, since a crash or a lost
lease spends an attempt, but each must carry the reason the previous attempt ended (the
job's ``last_error`` at the re-run). Ledger rows of jobs the driver never saw enqueued
(``phantoms``) are only possible when an enqueue's commit was in doubt.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
from psycopg import sql

from .._db.statements import qualified
from .ledger import LEDGER_TABLE
from .load import IdRanges

__all__ = ["Verification", "judge", "verify"]

EXAMPLES = 10

_WITH = """
WITH enq AS MATERIALIZED (
    SELECT generate_series(r.lo, r.hi) AS id
      FROM unnest(%(los)s::int8[], %(his)s::int8[]) AS r(lo, hi)
), done AS MATERIALIZED (
    SELECT job_id, count(*) AS completions, array_agg(attempt ORDER BY attempt) AS attempts
      FROM {ledger} GROUP BY job_id
), lost AS (
    SELECT id FROM enq
     WHERE NOT EXISTS (SELECT 1 FROM done WHERE done.job_id = enq.id)
       AND NOT EXISTS (SELECT 1 FROM {dead} d WHERE d.id = enq.id)
       AND NOT EXISTS (SELECT 1 FROM {jobs} j WHERE j.id = enq.id)
)
"""

_COUNTS = """
SELECT (SELECT count(*) FROM enq),
       (SELECT count(*) FROM done),
       (SELECT count(*) FROM done WHERE completions > 1),
       (SELECT count(*) FROM done WHERE NOT EXISTS (SELECT 1 FROM enq WHERE enq.id = done.job_id)),
       (SELECT count(*) FROM lost),
       (SELECT array_agg(id) FROM (SELECT id FROM lost ORDER BY id LIMIT %(n)s) AS l),
       (SELECT array_agg(job_id::text || ' x' || completions || ' (attempts '
                         || array_to_string(attempts, ',') || ')')
          FROM (SELECT * FROM done WHERE completions > 1 ORDER BY job_id LIMIT %(n)s) AS d)
"""

_RERUNS = """
SELECT coalesce(prior_error, '(no reason recorded)'), count(*), sum(attempt - 1),
       array_agg(job_id ORDER BY job_id)
  FROM {ledger} WHERE attempt > 1
 GROUP BY 1 ORDER BY 2 DESC
"""

_DEAD = "SELECT reason || ': ' || coalesce(last_error, ''), count(*) FROM {dead} GROUP BY 1"

_LEFT = """
SELECT state, count(*), (array_agg(id ORDER BY id))[1:%(n)s]
  FROM {jobs} WHERE state IN ('scheduled', 'available', 'running') GROUP BY state
"""

NO_REASON = "(no reason recorded)"


@attrs.frozen(kw_only=True)
class Verification:
    enqueued: int
    completed: int  # distinct jobs with a ledger row
    lost: int
    lost_examples: list[int]
    duplicate_completions: int
    duplicate_examples: list[str]
    reexecuted: int  # completed jobs whose completing attempt was not the first
    extra_attempts: int  # attempts spent beyond one by the completed jobs
    reexecuted_reasons: dict[str, int]
    reexecuted_examples: dict[str, list[int]]
    dead: int
    dead_reasons: dict[str, int]
    left: dict[str, int]  # state -> jobs still in the queue
    left_examples: list[int]
    phantoms: int  # ledger rows of jobs the driver never saw enqueued
    failures: list[str]
    warnings: list[str]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def left_total(self) -> int:
        return sum(self.left.values())

    @property
    def only_left(self) -> bool:
        """The one failure is jobs left in the queue (a run that did not drain in time)."""
        return self.left_total > 0 and len(self.failures) == 1


@functools.cache
def _statements(schema: str) -> dict[str, sql.Composed]:
    names = {
        "jobs": qualified(schema, "jobs"),
        "dead": qualified(schema, "dead_jobs"),
        "ledger": qualified(schema, LEDGER_TABLE),
    }
    with_ = _WITH.strip() + "\n"
    texts = {"counts": with_ + _COUNTS, "reruns": _RERUNS, "dead": _DEAD, "left": _LEFT}
    return {k: sql.SQL(v.strip()).format(**names) for k, v in texts.items()}


async def verify(
    conn: Any, schema: str, ids: IdRanges, *, chaos: bool, enqueue_errors: int = 0
) -> Verification:
    """Check the ledger against the enqueued ids; see the module docs."""
    statements = _statements(schema)
    params = {"los": ids.los, "his": ids.his, "n": EXAMPLES}
    cur = await conn.execute(statements["counts"], params)
    row = await cur.fetchone()
    assert row is not None
    enqueued, completed, duplicates, phantoms, lost, lost_ex, dup_ex = row
    reruns = await (await conn.execute(statements["reruns"])).fetchall()
    dead = await (await conn.execute(statements["dead"])).fetchall()
    left = await (await conn.execute(statements["left"], params)).fetchall()
    facts: dict[str, Any] = {
        "enqueued": enqueued,
        "completed": completed,
        "lost": lost,
        "lost_examples": list(lost_ex or []),
        "duplicate_completions": duplicates,
        "duplicate_examples": list(dup_ex or []),
        "reexecuted": sum(r[1] for r in reruns),
        "extra_attempts": int(sum(r[2] for r in reruns)),
        "reexecuted_reasons": {r[0]: r[1] for r in reruns},
        "reexecuted_examples": {r[0]: list(r[3][:EXAMPLES]) for r in reruns},
        "dead": sum(r[1] for r in dead),
        "dead_reasons": {r[0]: r[1] for r in dead},
        "left": {r[0]: r[1] for r in left},
        "left_examples": [i for r in left for i in r[2]][:EXAMPLES],
        "phantoms": phantoms,
    }
    failures, warnings = judge(facts, chaos=chaos, enqueue_errors=enqueue_errors)
    return Verification(**facts, failures=failures, warnings=warnings)


def judge(
    facts: dict[str, Any], *, chaos: bool, enqueue_errors: int = 0
) -> tuple[list[str], list[str]]:
    """The failures and warnings that ``facts`` (`Verification`'s fields) amount to."""
    failures: list[str] = []
    warnings: list[str] = []
    if facts["lost"]:
        failures.append(
            f"{facts['lost']} jobs lost: enqueued, never completed, not dead, gone from the "
            f"queue (e.g. {facts['lost_examples']})"
        )
    if facts["duplicate_completions"]:
        failures.append(
            f"{facts['duplicate_completions']} jobs completed more than once "
            f"(e.g. {facts['duplicate_examples']})"
        )
    if facts["dead"]:
        failures.append(f"{facts['dead']} jobs dead: {facts['dead_reasons']}")
    left = sum(facts["left"].values())
    if left:
        failures.append(f"{left} jobs left in the queue {facts['left']}")
    if facts["phantoms"] and not enqueue_errors:
        failures.append(f"{facts['phantoms']} jobs completed that were never enqueued")
    elif facts["phantoms"]:
        warnings.append(
            f"{facts['phantoms']} jobs completed whose enqueue reported an error "
            "(the commit went through before the connection broke)"
        )
    unexplained = facts["reexecuted_reasons"].get(NO_REASON, 0)
    if unexplained:
        failures.append(f"{unexplained} jobs re-executed with no recorded reason")
    if facts["reexecuted"] and not chaos:
        warnings.append(
            f"{facts['reexecuted']} jobs re-executed without chaos: "
            f"{facts['reexecuted_reasons']} (leases expired: were the workers starved?)"
        )
    return failures, warnings
