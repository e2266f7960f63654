"""Prototypes of changes to trioq's durable steps, measured before anyone makes them
(``trioq_durable.py --prototype NAME[+NAME]``; monkeypatched in that process only, nothing
under trioq/ is changed). Each is a sketch for a measurement: it skips checks and error
paths the real change would need.

- ``rendered``: the durable statements (``load_steps``, ``record_step``, ``lock_one``,
  ``wait``, ``signal``) rendered to bytes once, as `trioq._db.statements.rendered` does for
  the claim and the completions; psycopg renders an `sql.Composed` on every execute.
- ``no-reset``: ``job.step``'s record on a pool of its own that does not reset the session
  for each user. A record is trioq's own statement: no handler code ran on its connection,
  so the app pool's reset (``BEGIN; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; SELECT
  reset_session(); COMMIT``, 11 statements on the server with what the function runs) is
  not needed for it.
- ``one-trip-tx``: ``job.step_transaction`` with its ``BEGIN`` deferred to the function's
  first statement (as ``job.transaction()`` does) and the record and ``COMMIT`` sent
  together in one round trip (pipeline mode): a step whose function runs no statement
  costs one round trip instead of four (the prelude, ``BEGIN``, the record, ``COMMIT``).
"""

from __future__ import annotations

import json
from typing import Any

NAMES = ("rendered", "no-reset", "one-trip-tx")
DURABLE_STATEMENTS = ("load_steps", "record_step", "lock_one", "wait", "signal")


def apply(names: list[str], dsn: str, pool_size: int) -> None:
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        raise SystemExit(f"unknown prototypes {unknown}; known: {', '.join(NAMES)}")
    if "rendered" in names:
        _rendered()
    if "no-reset" in names:
        _no_reset(dsn, pool_size)
    if "one-trip-tx" in names:
        _one_trip_tx()


def _rendered() -> None:
    from trioq._db.statements import rendered, statements

    sql = statements("trioq")
    for name in DURABLE_STATEMENTS:
        sql.__dict__[name] = rendered("trioq", name)  # the instance attribute wins


def _no_reset(dsn: str, pool_size: int) -> None:
    from trioq._durable import DurableRun, StepRecord
    from trioq._exceptions import LeaseLostError
    from trioq._pg.pool import Pool

    pools: list[Pool] = []  # made in the first run, inside trio.run; closed at the exit

    async def record(self: Any, position: int, step: str, kind: str, *,
                     result: str | None = None, delay: Any = None, until: Any = None,
                     conn: Any = None) -> tuple[str, Any]:  # fmt: skip
        if conn is not None:
            return await original(self, position, step, kind, result=result, delay=delay,
                                  until=until, conn=conn)  # fmt: skip
        of = self._of
        if not pools:
            pools.append(Pool(dsn, max_size=pool_size, connect_kwargs={"autocommit": True}))
        params = {"id": self._id, "attempt": of.lease.attempt, "owner": of.owner,
                  "position": position, "name": step, "kind": kind, "result": result,
                  "delay": delay, "until": until}  # fmt: skip
        async with pools[0].connection() as own:
            cur = await own.execute(of.sql.record_step, params)
            row = await cur.fetchone()
        if row is None:
            raise LeaseLostError(f"job {self._id}: lease lost")
        text, now = row
        self._records.append(StepRecord(position=position, name=step, kind=kind,
                                        result=json.loads(text) if text else None,
                                        attempt=of.lease.attempt, recorded_at=now))  # fmt: skip
        return text, now

    original = DurableRun._record
    setattr(DurableRun, "_record", record)  # noqa: B010 - a method, replaced for the process


def _one_trip_tx() -> None:
    from trioq._durable import DurableRun, StepRecord
    from trioq._exceptions import LeaseLostError
    from trioq._pg.pipeline import execute_pipelined

    async def step_transaction(self: Any, step: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        position, record = await self._next(step, "step")
        if record is not None:
            return record.result
        of = self._of
        async with of.pool.connection() as conn:
            conn.defer(b"BEGIN")
            try:
                result = await fn(conn, *args, **kwargs)
                text = self._encode(step, result)
                params = {"id": self._id, "attempt": of.lease.attempt, "owner": of.owner,
                          "position": position, "name": step, "kind": "step",
                          "result": text, "delay": None, "until": None}  # fmt: skip
                if conn.discard_deferred():  # no statement ran: BEGIN and COMMIT with it
                    conn.defer(b"BEGIN")
                (cur,) = await execute_pipelined(conn, [(of.sql.record_step, params)],
                                                 then=[b"COMMIT"])  # fmt: skip
                row = await cur.fetchone()
            except BaseException:
                if not conn.discard_deferred():
                    await conn.execute("ROLLBACK")
                raise
        if row is None:
            raise LeaseLostError(f"job {self._id}: lease lost")
        recorded, now = row
        self._records.append(StepRecord(position=position, name=step, kind="step",
                                        result=json.loads(recorded), attempt=of.lease.attempt,
                                        recorded_at=now))  # fmt: skip
        return json.loads(text)

    setattr(DurableRun, "step_transaction", step_transaction)  # noqa: B010
