"""The SQL API refuses what the Python API refuses, with the same words (docs/sql-api.md).

Each case is one call, made twice: through the Python API (`trioq.enqueue`,
`trioq.signal`), and through the SQL function with the same values sent by a plain driver
(`sqlapi_driver.refusal`; a value a driver cannot send, such as the numeric 1.5 or JSON nested
1,500 deep, is given as SQL text there). Both run the real code: the messages are compared
as they are built, so a change of a message on either side fails here. The SQLSTATE is the
one of the Python error's kind, and the error's COLUMN names the parameter.

What a Python caller can give but a SQL caller cannot even send (NUL, lone surrogates, a
Python float where Postgres wants a number) is refused before the function runs, by the
driver or by Postgres's types: `BEFORE_THE_FUNCTION` says by what, and that no job was
made. Accepted values make the same row both ways (`ACCEPTED`).
"""

from __future__ import annotations

import datetime as dt
import math
import unicodedata
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pgcluster import create_database, drop_database
from psycopg.types.json import Json, Jsonb
from sqlapi_driver import Refusal, call, refusal

import trioq

MIGRATION = Path(trioq.__file__).parent / "_db" / "migrations" / "0017_sql_api.sql"

#: The SQLSTATE of each kind of error the Python API raises (docs/sql-api.md, "Errors").
SQLSTATE = {
    "ValueError": "22023",
    "TypeError": "42804",
    "PayloadTooLargeError": "54000",
    "JobNotFoundError": "P0002",
}
#: The clock of the accepted cases (both sides run with it: their rows are comparable).
CLOCK = "2030-01-02 03:04:05.123456+00"
UTC_MINUS_5 = dt.timezone(dt.timedelta(hours=-5))
SEC5 = dt.timedelta(seconds=5)


@attrs.frozen
class Case:
    """One call: the Python API's keyword arguments, and the parameters the SQL form gives
    as SQL text instead of a driver's parameter."""

    id: str
    python: Mapping[str, Any]
    literals: Mapping[str, str] = attrs.field(factory=dict)


def case(id: str, literals: Mapping[str, str] | None = None, **python: Any) -> Case:
    return Case(id, {"task": "t", **python}, literals or {})


def signal_case(id: str, literals: Mapping[str, str] | None = None, **python: Any) -> Case:
    return Case(id, {"job_id": "<job>", "name": "approval", **python}, literals or {})


DEEP = "(pg_catalog.repeat('[', 1500) || pg_catalog.repeat(']', 1500))::jsonb"
BIG_INT = "('[' || pg_catalog.repeat('9', 4301) || ']')::jsonb"
LARGE = {"a": "x" * (1 << 20)}  # 8 bytes over the limit as compact JSON
#: Names Python's repr() shows in every way it can: quotes, escapes, unprintable and
#: printable characters beyond ASCII.
HOSTILE_NAMES = [
    "bad name", "it's", 'say "hi"', "both ' and \"", "back\\slash", "tab\there", "new\nline",
    "\r", "\x07bell", "\x7f", "\x80", "\x9f", "\xa0", "\xad", "é", "naïve", "\u200b", "\u2028",
    "\u202e", "\ufeff", "\ue000", "\u0378", "e\u0301", "\U0001f680", "\U000e0001", "\U0010ffff",
    "日本", "\u0430", " ", "-dash", ".dot", "9", "@scheduled", "q'; DROP TABLE jobs; --",
]  # fmt: skip

REFUSED = [
    case("task None", task=None),
    case("task empty", task=""),
    case("task 201 characters", task="a" * 201),
    case("task of 10,000 characters", task="é" * 10_000),
    *(case(f"task {name!r}", task=name) for name in HOSTILE_NAMES if name != "9"),
    case("task starting with a digit", task="9"),
    case("queue None", queue=None),
    case("queue empty", queue=""),
    case("queue 65 characters", queue="q" * 65),
    *(case(f"queue {name!r}", queue=name) for name in HOSTILE_NAMES if name != "9"),
    case("priority 101", priority=101),
    case("priority -101", priority=-101),
    case("priority 2**63", priority=2**63),
    case("priority -10**30", priority=-(10**30)),
    case("priority None", priority=None),
    case("priority 1.5", {"priority": "1.5"}, priority=1.5),
    case("priority 5.0", {"priority": "5.0"}, priority=5.0),
    case("priority 1e-07", {"priority": "0.0000001"}, priority=1e-07),
    case("priority nan", {"priority": "'NaN'"}, priority=math.nan),
    case("priority inf", {"priority": "'Infinity'"}, priority=math.inf),
    case("priority -inf", {"priority": "'-Infinity'"}, priority=-math.inf),
    case("max_attempts 0", max_attempts=0),
    case("max_attempts -1", max_attempts=-1),
    case("max_attempts 10001", max_attempts=10_001),
    case("max_attempts 10**30", max_attempts=10**30),
    case("max_attempts 2.5", {"max_attempts": "2.5"}, max_attempts=2.5),
    case("delay -1 s", delay=dt.timedelta(seconds=-1)),
    case("delay -0.5 s", delay=dt.timedelta(seconds=-0.5)),
    case("delay -1 us", delay=dt.timedelta(microseconds=-1)),
    case("delay -1.000005 s (a tie at 6 digits)", delay=dt.timedelta(seconds=-1.000005)),
    case("delay -9999995 s (a tie that rounds up)", delay=dt.timedelta(seconds=-9_999_995)),
    case("delay -123456.789 s", delay=dt.timedelta(seconds=-123_456.789)),
    case("delay -1 day", delay=dt.timedelta(days=-1)),
    case("delay 36501 days", delay=dt.timedelta(days=36_501)),
    case("delay 36500 days and 1 us", delay=dt.timedelta(days=36_500, microseconds=1)),
    case("delay infinite", {"delay": "'infinity'"}, delay=math.inf),
    case("delay -infinite", {"delay": "'-infinity'"}, delay=-math.inf),
    case("run_at and delay", run_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC),
         delay=dt.timedelta(seconds=1)),
    case("dedup_key empty", dedup_key=""),
    case("dedup_key 501 characters", dedup_key="k" * 501),
    case("concurrency_key empty", concurrency_key=""),
    case("concurrency_key 501 characters", concurrency_key="é" * 501),
    case("args too large", args=LARGE),
    case("args too large in UTF-8", args=["é" * 524_288]),
    case("args too large with escapes", args={"k\"ey": ["\n\t\x01" * 200_000, 1, {"b": []}]}),
    case("args nested 1,500 deep", {"args": DEEP}, args=[[[[]]]]),  # Python's: below
    case("args with an int of 4,301 digits", {"args": BIG_INT}, args=[10**4301 - 1]),
    # Two faults: the first the Python API checks is the one both name.
    case("delay before task", task="", delay=dt.timedelta(seconds=-1)),
    case("args before task", {"args": DEEP}, task="", args=[]),
    case("task before queue", task="", queue=""),
    case("priority before run_at and delay", priority=101,
         run_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC), delay=dt.timedelta(seconds=1)),
    case("dedup_key before concurrency_key", dedup_key="", concurrency_key=""),
    case("run_at and delay before the payload", run_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC),
         delay=dt.timedelta(seconds=1), args=LARGE),
    # start_by (migration 21): a time before the job's run time, however that is given.
    case("start_by before run_at", run_at=dt.datetime(2030, 1, 1, 0, 0, 1, tzinfo=dt.UTC),
         start_by=dt.datetime(2030, 1, 1, tzinfo=dt.UTC)),
    case("start_by passed already", start_by=dt.datetime(2001, 1, 1, tzinfo=dt.UTC)),
    case("start_by before now plus the delay", delay=dt.timedelta(days=36_500),
         start_by=dt.datetime(2099, 1, 1, tzinfo=UTC_MINUS_5)),
    case("start_by 1 us before run_at", run_at=dt.datetime(2040, 1, 1, tzinfo=UTC_MINUS_5),
         start_by=dt.datetime(2040, 1, 1, 4, 59, 59, 999_999, tzinfo=dt.UTC)),
    case("run_at and delay before start_by", run_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC),
         delay=dt.timedelta(seconds=1), start_by=dt.datetime(2001, 1, 1, tzinfo=dt.UTC)),
    case("start_by before the payload", start_by=dt.datetime(2001, 1, 1, tzinfo=dt.UTC),
         run_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC), args=LARGE),
    case("delay before start_by", delay=dt.timedelta(seconds=-1),
         start_by=dt.datetime(2001, 1, 1, tzinfo=dt.UTC)),
    # debounce (migration 22): debounce_max_wait is Python's Debounce(..., max_wait=).
    case("debounce without a key", debounce=SEC5),
    case("debounce 0", dedup_key="k", debounce=dt.timedelta(0)),
    case("debounce -1 s", dedup_key="k", debounce=dt.timedelta(seconds=-1)),
    case("debounce -2.5 days", dedup_key="k", debounce=dt.timedelta(days=-2.5)),
    case("debounce 500 us", dedup_key="k", debounce=dt.timedelta(microseconds=500)),
    case("debounce 366 days and 1 us", dedup_key="k",
         debounce=dt.timedelta(days=366, microseconds=1)),
    case("debounce 11574 days", dedup_key="k", debounce=dt.timedelta(seconds=10**9)),
    case("debounce infinite", {"debounce": "'infinity'"}, dedup_key="k", debounce=math.inf),
    case("debounce -infinite", {"debounce": "'-infinity'"}, dedup_key="k", debounce=-math.inf),
    case("debounce_max_wait below the period", dedup_key="k", debounce=SEC5,
         debounce_max_wait=dt.timedelta(seconds=1, microseconds=5)),
    case("debounce_max_wait 0", dedup_key="k", debounce=SEC5, debounce_max_wait=dt.timedelta(0)),
    case("debounce_max_wait infinite", {"debounce_max_wait": "'infinity'"}, dedup_key="k",
         debounce=SEC5, debounce_max_wait=math.inf),
    case("debounce with run_at", dedup_key="k", debounce=SEC5,
         run_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC)),
    case("debounce with a delay", dedup_key="k", debounce=SEC5, delay=dt.timedelta(seconds=1)),
    case("debounce with start_by", dedup_key="k", debounce=SEC5,
         start_by=dt.datetime(2099, 1, 1, tzinfo=dt.UTC)),
    case("debounce with start_by passed", dedup_key="k", debounce=SEC5,
         start_by=dt.datetime(2001, 1, 1, tzinfo=dt.UTC)),
    case("debounce before the payload", debounce=SEC5, args=LARGE),
    case("debounce before args", {"args": DEEP}, dedup_key="k", debounce=dt.timedelta(0),
         args=[]),
    case("start_by passed after the payload", start_by=dt.datetime(2001, 1, 1, tzinfo=dt.UTC),
         args=LARGE),
    # sequence_key (migration 27): the rule of keys, and no dedup_key (SEQUENTIAL_ALONE)
    case("sequence_key empty", sequence_key=""),
    case("sequence_key 501 characters", sequence_key="s" * 501),
    case("sequence_key of 10,000 characters", sequence_key="é" * 10_000),
    case("sequence_key with a dedup_key", sequence_key="s", dedup_key="k"),
    case("sequence_key with a debounce", sequence_key="s", dedup_key="k", debounce=SEC5),
    case("sequence_key before the sequence's refusal", sequence_key="", dedup_key="k"),
    case("concurrency_key before sequence_key", sequence_key="", concurrency_key=""),
    case("sequence_key before the payload", sequence_key="s", dedup_key="k", args=LARGE),
]

#: What only a Python caller can give, for a case whose SQL form gives it as SQL text.
_PYTHON_ONLY = {"args nested 1,500 deep": "args", "args before task": "args",
                "debounce before args": "args"}


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


REFUSED_SIGNALS = [
    signal_case("no job_id and no key", job_id=None),
    signal_case("no job_id, task only", job_id=None, task="ship"),
    signal_case("no job_id, key only", job_id=None, key="order-1"),
    signal_case("job_id and key", task="ship", key="order-1"),
    signal_case("job_id 2**63", job_id=2**63),
    signal_case("job_id -2**63 - 1", job_id=-(2**63) - 1),
    signal_case("job_id 1.5", {"job_id": "1.5"}, job_id=1.5),
    signal_case("job_id nan", {"job_id": "'NaN'"}, job_id=math.nan),
    signal_case("name None", name=None),
    signal_case("name empty", name=""),
    signal_case("name 201 characters", name="n" * 201),
    signal_case("name with a newline", name="a\nb"),
    signal_case("name with a tab", name="a\tb"),
    signal_case("name DEL", name="\x7f"),
    signal_case("name zero-width space", name="\u200b"),
    signal_case("name private use", name="\ue000"),
    signal_case("payload too large", payload=LARGE),
    signal_case("payload too large, and its name quoted", name="it's", payload=LARGE),
    signal_case("payload nested 1,500 deep", {"payload": DEEP}, payload=[]),
    signal_case("payload with an int of 4,301 digits", {"payload": BIG_INT},
                payload=[10**4301 - 1]),
    signal_case("no such job", job_id=987_654_321),
    signal_case("no job holds the key", job_id=None, task="ship", key="nope"),
    signal_case("the key of another task", job_id=None, task="other", key="order-1"),
    signal_case("a key Python quotes", job_id=None, task="it's", key="a\nb"),
    signal_case("an ended job", job_id="<done>"),
    signal_case("name before the job", job_id=987_654_321, name=""),
]
_PYTHON_ONLY_SIGNALS = {"payload nested 1,500 deep": "payload"}

ACCEPTED = [
    case("defaults"),
    case("every field", args={"user_id": 42, "tags": ["a", "b"], "n": None}, queue="email.v2",
         priority=-100, delay=dt.timedelta(hours=1), max_attempts=10_000, dedup_key="k" * 500,
         concurrency_key="customer:7"),
    case("args None is {}", args=None),
    case("args JSON null is {}", {"args": "'null'::jsonb"}, args=None),
    case("args a list", args=[1, "two", 3.5]),
    case("args a JSON string", args="just text"),
    case("args false", args=False),
    case("args nested 800 deep", {"args": DEEP.replace("1500", "800")}, args=_nested(800)),
    case("args at the limit", args={"a": "x" * ((1 << 20) - 8)}),
    case("task of 200 characters, priority 100", task="T" * 200, priority=100),
    case("queue of 64 characters", queue="0" * 64),
    case("max_attempts 1", max_attempts=1),
    case("run_at in the past", run_at=dt.datetime(2001, 1, 1, tzinfo=dt.UTC)),
    case("run_at at the end of time", run_at=dt.datetime(9999, 12, 31, 23, 59, 59, 999_999,
                                                          tzinfo=dt.UTC)),
    case("run_at with a zero delay", run_at=dt.datetime(2040, 1, 1, tzinfo=UTC_MINUS_5),
         delay=dt.timedelta(0)),
    case("delay of 36500 days", delay=dt.timedelta(days=36_500)),
    case("a dedup_key", dedup_key="order-7"),
    case("priority as a numeric without decimals", {"priority": "1e1"}, priority=10),
    case("start_by", start_by=dt.datetime(2040, 1, 1, tzinfo=UTC_MINUS_5)),
    case("start_by at run_at", run_at=dt.datetime(2040, 1, 1, tzinfo=UTC_MINUS_5),
         start_by=dt.datetime(2040, 1, 1, 5, tzinfo=dt.UTC)),
    case("start_by with a delay", delay=dt.timedelta(hours=1),
         start_by=dt.datetime(2030, 1, 2, 4, 4, 5, 123456, tzinfo=dt.UTC)),
    case("debounce", dedup_key="k", debounce=SEC5, priority=3, queue="d"),
    case("debounce with max_wait", dedup_key="k", debounce=SEC5, debounce_max_wait=SEC5 * 2),
    case("debounce of 366 days", dedup_key="k", debounce=dt.timedelta(days=366)),
    case("debounce with a zero delay", dedup_key="k", debounce=SEC5, delay=dt.timedelta(0)),
    case("sequence_key", sequence_key="account:alice"),
    case("sequence_key of 500 characters, scheduled", sequence_key="é" * 500,
         delay=dt.timedelta(hours=1)),
]

#: (case, what refuses the SQL form before the function runs, the error's type or SQLSTATE).
BEFORE_THE_FUNCTION = [
    (case("task with NUL", task="a\x00b"), "psycopg: text cannot hold NUL", psycopg.DataError),
    (case("queue with NUL", queue="\x00"), "psycopg: text cannot hold NUL", psycopg.DataError),
    (case("task with a lone surrogate", task="a\ud800"), "UTF-8 cannot encode it",
     UnicodeEncodeError),
    (case("sequence_key with NUL", sequence_key="a\x00"), "psycopg: text cannot hold NUL",
     psycopg.DataError),
    (case("sequence_key with a lone surrogate", sequence_key="\udc80"), "UTF-8 cannot encode it",
     UnicodeEncodeError),
    (case("args with NUL", args={"a": "\x00"}), "jsonb cannot hold \\u0000", "22P05"),
    (case("args with a lone surrogate", args=["\udcff"]), "jsonb refuses \\udcff alone",
     "22P02"),
    (case("priority a Python float", priority=1.5), "no function takes a float8", "42883"),
    (case("priority True", priority=True), "no function takes a boolean", "42883"),
    (case("args nested 5,000 deep", args=_nested(5000)), "psycopg's JSON encoder",
     RecursionError),
]


# -- the two sides ------------------------------------------------------------------------------


def python_outcome(dsn: str, function: str, kwargs: Mapping[str, Any]) -> tuple[str, str] | None:
    """What the Python API raised for ``kwargs`` ((kind, message)), or None: accepted (in a
    transaction rolled back)."""

    async def run() -> tuple[str, str] | None:
        async with await trioq.connect(dsn) as conn, conn.transaction(force_rollback=True):
            try:
                if function == "enqueue":
                    await trioq.enqueue(conn, **python_form(kwargs))
                else:
                    await trioq.signal(conn, **kwargs)
            except (ValueError, TypeError, trioq.JobNotFoundError) as ex:
                return type(ex).__name__, str(ex)
        return None

    return trio.run(run)


def python_form(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The Python API's arguments of a case: ``debounce_max_wait`` (the SQL parameter) is
    ``debounce=trioq.Debounce(debounce, max_wait=...)`` there (which may raise)."""
    given = dict(kwargs)
    if "debounce_max_wait" in given:
        given["debounce"] = trioq.Debounce(given.pop("debounce"),
                                           max_wait=given.pop("debounce_max_wait"))  # fmt: skip
    return given


def python_row(dsn: str, kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    async def run() -> tuple[Any, ...]:
        async with await trioq.connect(dsn) as conn, conn.transaction(force_rollback=True):
            await conn.execute("SELECT pg_catalog.set_config('trioq.now', %s, true)", (CLOCK,))
            result = await trioq.enqueue(conn, **python_form(kwargs))
            cur = await conn.execute(ROW, (result.job_id,))
            row = await cur.fetchone()
            assert row is not None
            return tuple(row)

    return trio.run(run)


ROW = (
    "SELECT queue, task, args, priority, run_at, state, attempt, max_attempts,"
    " max_attempts_unset, dedup_key, concurrency_key, trace_context, durable, start_by,"
    " debounce_key, debounce_deadline, sequence_key"
    " FROM trioq.jobs WHERE id = %s"
)


def sql_values(c: Case) -> dict[str, Any]:
    """The values the SQL form sends as parameters: the Python ones, less those given as
    SQL text."""
    return {k: v for k, v in c.python.items() if k not in c.literals}


def assert_same_refusal(python: tuple[str, str] | None, sql: Refusal | None) -> None:
    assert python is not None, "the Python API accepted it"
    assert sql is not None, f"the SQL API accepted what Python refuses: {python}"
    kind, message = python
    assert sql.message == message
    assert sql.sqlstate == SQLSTATE[kind], (kind, sql)


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """A migrated database the refusals share (they change nothing), with two jobs to
    signal: ``ship`` holding the dedup key ``order-1``, and one that ended (done)."""
    name = f"trioq_test_sql_parity_{id(object())}"
    dsn = create_database(pg_admin_dsn, name)

    async def setup() -> None:
        async with await trioq.connect(dsn, autocommit=True) as conn:
            await trioq.migrate(conn)
            await trioq.enqueue(conn, "ship", dedup_key="order-1")
            done = await trioq.enqueue(conn, "old")
            await conn.execute("UPDATE trioq.jobs SET state = 'done', finished_at = now()"
                               " WHERE id = %s", (done.job_id,))  # fmt: skip

    trio.run(setup)
    yield dsn
    drop_database(pg_admin_dsn, name)


@pytest.fixture(scope="module")
def driver(api_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(api_dsn) as conn:
        yield conn


@pytest.fixture(scope="module")
def jobs(driver: psycopg.Connection[Any]) -> dict[str, int]:
    """The placeholders of the signal cases: ``<job>`` (live) and ``<done>``."""
    with driver.transaction():
        live = driver.execute("SELECT id FROM trioq.jobs WHERE task = 'ship'").fetchone()
        done = driver.execute("SELECT id FROM trioq.jobs WHERE state = 'done'").fetchone()
    assert live is not None and done is not None
    return {"<job>": live[0], "<done>": done[0]}


def _with_jobs(values: Mapping[str, Any], jobs: Mapping[str, int]) -> dict[str, Any]:
    return {k: jobs.get(v, v) if isinstance(v, str) else v for k, v in values.items()}


def _count(driver: psycopg.Connection[Any]) -> int:
    with driver.transaction():
        row = driver.execute("SELECT count(*) FROM trioq.jobs").fetchone()
    assert row is not None
    return int(row[0])


# -- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("c", REFUSED, ids=[c.id for c in REFUSED])
def test_enqueue_refuses_as_python_does(
    api_dsn: str, driver: psycopg.Connection[Any], c: Case
) -> None:
    python_kwargs = dict(c.python)
    if c.id in _PYTHON_ONLY:  # the Python form of JSON a driver cannot send
        python_kwargs["args"] = _nested(1500)
    before = _count(driver)
    python = python_outcome(api_dsn, "enqueue", python_kwargs)
    sql = refusal(driver, "enqueue", sql_values(c), c.literals)
    assert_same_refusal(python, sql)
    assert sql is not None and python is not None
    assert sql.column == _parameter(python[1])
    assert _count(driver) == before


def _parameter(message: str) -> str:
    """The parameter a Python message is about: the COLUMN field of the SQL error."""
    for prefix, parameter in (("args", "args"), ("give run_at or delay", "delay"),
                              ("debounce max_wait", "debounce_max_wait"),
                              ("give start_by or debounce", "debounce"),
                              ("a job of a sequence", "sequence_key"),
                              ("the payload of signal", "payload"), ("signal name", "name"),
                              ("give a job_id", "job_id"), ("job", "job_id")):  # fmt: skip
        if message.startswith(prefix):
            return parameter
    if "no such job to signal" in message:
        return "job_id"
    return message.split(" ", 1)[0]


@pytest.mark.parametrize("c", REFUSED_SIGNALS, ids=[c.id for c in REFUSED_SIGNALS])
def test_signal_refuses_as_python_does(
    api_dsn: str, driver: psycopg.Connection[Any], jobs: dict[str, int], c: Case
) -> None:
    python_kwargs = _with_jobs(c.python, jobs)
    if c.id in _PYTHON_ONLY_SIGNALS:
        python_kwargs["payload"] = _nested(1500)
    python = python_outcome(api_dsn, "signal", python_kwargs)
    sql = refusal(driver, "signal", _with_jobs(sql_values(c), jobs), c.literals)
    assert_same_refusal(python, sql)
    assert sql is not None and python is not None
    assert sql.column == _parameter(python[1])


@pytest.mark.parametrize("c", ACCEPTED, ids=[c.id for c in ACCEPTED])
def test_an_accepted_enqueue_makes_the_same_row(
    api_dsn: str, driver: psycopg.Connection[Any], c: Case
) -> None:
    python = python_row(api_dsn, c.python)
    with driver.transaction(force_rollback=True):
        driver.execute("SELECT pg_catalog.set_config('trioq.now', %s, true)", (CLOCK,))
        job_id = call(driver, "enqueue", sql_values(c), c.literals)
        sql = driver.execute(ROW, (job_id,)).fetchone()
    assert sql == python


def test_an_accepted_signal_is_stored_both_ways(
    api_dsn: str, driver: psycopg.Connection[Any], jobs: dict[str, int]
) -> None:
    by_id = {"job_id": jobs["<job>"], "name": "approval", "payload": {"ok": True}}
    by_key = {"job_id": None, "name": "approval", "task": "ship", "key": "order-1"}
    for values in (by_id, by_key):
        python = trio.run(_python_signal, api_dsn, values)
        with driver.transaction(force_rollback=True):
            sql = call(driver, "signal", values)
            again = call(driver, "signal", values)
        assert (sql, again) == python == ("stored", "duplicate")


async def _python_signal(dsn: str, values: Mapping[str, Any]) -> tuple[str, str]:
    async with await trioq.connect(dsn) as conn, conn.transaction(force_rollback=True):
        return await trioq.signal(conn, **values), await trioq.signal(conn, **values)


@pytest.mark.parametrize(("c", "by", "error"), BEFORE_THE_FUNCTION,
                         ids=[c.id for c, _, _ in BEFORE_THE_FUNCTION])  # fmt: skip
def test_what_no_sql_caller_can_send_is_refused_before_the_function(
    api_dsn: str, driver: psycopg.Connection[Any], c: Case, by: str, error: Any
) -> None:
    """Python refuses these (ValueError or TypeError); a SQL caller cannot send them at all,
    and is refused by ``by``: no job either way."""
    before = _count(driver)
    python = python_outcome(api_dsn, "enqueue", c.python)
    assert python is not None and python[0] in ("ValueError", "TypeError")
    if isinstance(error, str):
        found = refusal(driver, "enqueue", sql_values(c), c.literals)
        assert found is not None and found.sqlstate == error, (by, found)
    else:
        with pytest.raises(error):
            refusal(driver, "enqueue", sql_values(c), c.literals)
    assert _count(driver) == before


def test_a_delay_is_an_interval(api_dsn: str, driver: psycopg.Connection[Any]) -> None:
    """Python takes a delay in seconds too; SQL only as an interval (a float8 matches no
    function), so a driver sends a timedelta, or the SQL says '5 seconds'."""
    assert python_outcome(api_dsn, "enqueue", {"task": "t", "delay": 5.0}) is None
    found = refusal(driver, "enqueue", {"task": "t", "delay": 5.0})
    assert found is not None and found.sqlstate == "42883"
    assert refusal(driver, "enqueue", {"task": "t", "delay": dt.timedelta(seconds=5)}) is None
    assert refusal(driver, "enqueue", {"task": "t"}, {"delay": "'5 seconds'"}) is None


def test_args_are_jsonb(driver: psycopg.Connection[Any]) -> None:
    """jsonb, or an untyped parameter Postgres reads as jsonb; a json value matches no
    function (json casts to jsonb only on assignment)."""
    query = "SELECT trioq.enqueue('t', %s)"
    with driver.transaction(force_rollback=True):
        assert driver.execute(query, (Jsonb({"a": 1}),)).fetchone() is not None
        assert driver.execute(query, ('{"a": 1}',)).fetchone() is not None  # untyped text
    with pytest.raises(psycopg.errors.UndefinedFunction), driver.transaction():
        driver.execute(query, (Json({"a": 1}),))


def test_a_time_out_of_range_is_refused_both_ways_the_sql_one_shown_in_utc(
    api_dsn: str, driver: psycopg.Connection[Any]
) -> None:
    """A timestamptz holds the instant, not the offset it was written with: where Python
    quotes the datetime as given, the SQL function quotes the instant in UTC."""
    late = dt.datetime(9999, 12, 31, 23, tzinfo=UTC_MINUS_5)
    python = python_outcome(api_dsn, "enqueue", {"task": "t", "run_at": late})
    assert python == ("ValueError", "run_at 9999-12-31T23:00:00-05:00 is outside the years 1 "
                      "to 9999 in UTC (the times the schema holds)")  # fmt: skip
    sql = refusal(driver, "enqueue", {"task": "t", "run_at": late})
    assert sql == Refusal("22023", "run_at", "run_at 10000-01-01T04:00:00+00:00 is outside "
                          "the years 1 to 9999 in UTC (the times the schema holds)")  # fmt: skip
    for literal, shown in (("'infinity'", "infinity"), ("'-infinity'", "-infinity"),
                           ("'0001-01-01 00:00:00+00'::timestamptz - interval '1 us'",
                            "0001-12-31T23:59:59.999999+00:00 BC")):  # fmt: skip
        sql = refusal(driver, "enqueue", {"task": "t"}, {"run_at": literal})
        assert sql is not None and sql.message == (
            f"run_at {shown} is outside the years 1 to 9999 in UTC (the times the schema holds)"
        )
    # start_by (migration 21) alike
    python = python_outcome(api_dsn, "enqueue", {"task": "t", "start_by": late})
    assert python == ("ValueError", "start_by 9999-12-31T23:00:00-05:00 is outside the years "
                      "1 to 9999 in UTC (the times the schema holds)")  # fmt: skip
    sql = refusal(driver, "enqueue", {"task": "t", "start_by": late})
    assert sql == Refusal("22023", "start_by", "start_by 10000-01-01T04:00:00+00:00 is "
                          "outside the years 1 to 9999 in UTC (the times the schema holds)")
    for literal, shown in (("'infinity'", "infinity"), ("'-infinity'", "-infinity")):
        sql = refusal(driver, "enqueue", {"task": "t"}, {"start_by": literal})
        assert sql is not None and sql.message == (
            f"start_by {shown} is outside the years 1 to 9999 in UTC (the times the schema "
            "holds)"
        )


# Hostile names at random: whatever the text, both refuse it with the same words or both
# take it. The alphabet is every character but NUL and lone surrogates (no SQL caller can
# send those), less any whose printability this Python judges otherwise than the migration's
# table (characters assigned after Unicode 14; none on Python 3.11).
def unprintable_ranges() -> list[tuple[int, int]]:
    """The code points Python's str.isprintable() refuses, from U+0001, as ranges, lone
    surrogates folded into their neighbours: the table of migration 17's py_unprintable."""
    ranges: list[tuple[int, int]] = []
    start = None
    for code in range(1, 0x110000):
        printable = not 0xD800 <= code <= 0xDFFF and chr(code).isprintable()
        if not printable and start is None:
            start = code
        elif printable and start is not None:
            ranges.append((start, code - 1))
            start = None
    if start is not None:
        ranges.append((start, 0x10FFFF))
    return ranges


def _migration_ranges() -> list[tuple[int, int]]:
    text = MIGRATION.read_text()
    numbers = text.split("FROM (SELECT '{", 1)[1].split("}'::integer[]", 1)[0]
    values = [int(n) for n in numbers.replace("\n", "").replace(" ", "").split(",")]
    return list(zip(values[::2], values[1::2], strict=True))


def test_the_migration_knows_which_characters_python_prints() -> None:
    if unicodedata.unidata_version != "14.0.0":
        pytest.skip(f"the table is Unicode 14.0's (Python 3.11); this Python has "
                    f"{unicodedata.unidata_version}")  # fmt: skip
    assert _migration_ranges() == unprintable_ranges()


_RANGES = _migration_ranges()


def _sql_printable(char: str) -> bool:
    code = ord(char)
    return not any(lo <= code <= hi for lo, hi in _RANGES)


_NAMES = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00").filter(
        lambda c: _sql_printable(c) == c.isprintable()
    ),
    max_size=12,
) | st.from_regex(r"[A-Za-z0-9_.:'\"\\ -]{0,70}", fullmatch=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task=_NAMES, queue=_NAMES)
def test_any_task_and_queue_are_judged_alike(
    api_dsn: str, driver: psycopg.Connection[Any], task: str, queue: str
) -> None:
    python = python_outcome(api_dsn, "enqueue", {"task": task, "queue": queue})
    sql = refusal(driver, "enqueue", {"task": task, "queue": queue})
    if python is None:
        assert sql is None
    else:
        assert_same_refusal(python, sql)


# -- the formatting the messages need, against Python's own ----------------------------------

G_VALUES = [
    "1", "0.5", "1.000005", "1.0000049", "9999995", "9999994", "123456.789", "1234565", "0.0001",
    "0.00001", "0.000012345", "1e-6", "86400", "3153600000", "3153600000.000001", "0.1",
    "0.3", "2.5", "100000", "999999.5", "999998.5", "1e15", "5.625e15", "12345678901234.5",
    "0.0000015", "0.00001250", "1.0000150",
]  # fmt: skip


def test_py_format_g_is_pythons_g(driver: psycopg.Connection[Any]) -> None:
    with driver.transaction(force_rollback=True):
        for text in G_VALUES:
            for sign in ("", "-"):
                row = driver.execute("SELECT trioq.py_format_g(%s::numeric)", (sign + text,))
                assert row.fetchone() == (format(float(sign + text), "g"),), sign + text


@settings(max_examples=300, deadline=None)
@given(st.decimals(min_value=-(10**16), max_value=10**16, places=6, allow_nan=False))
def test_py_format_g_of_any_interval(driver: psycopg.Connection[Any], seconds: Any) -> None:
    with driver.transaction(force_rollback=True):
        row = driver.execute("SELECT trioq.py_format_g(%s::numeric)", (seconds,)).fetchone()
    assert row == (format(float(seconds), "g"),)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != int(x)))
def test_py_number_of_a_number_with_decimals_is_pythons_float_repr(
    driver: psycopg.Connection[Any], x: float
) -> None:
    with driver.transaction(force_rollback=True):
        row = driver.execute("SELECT trioq.py_number(%s::numeric)", (repr(x),)).fetchone()
    assert row == (repr(x),)
