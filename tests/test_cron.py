"""Cron entries: validation, tick arithmetic (DST included), and firing against real Postgres."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import trio
from croniter import croniter
from helpers import migrated

import trioq
from trioq._cron import TICK_RETENTION, CronEntry, next_fire_time
from trioq._worker.services.scheduler import Fired, fire_due
from trioq.testing import set_clock

UTC = dt.UTC
T0 = dt.datetime(2030, 1, 1, tzinfo=UTC)  # a Tuesday, midnight
MINUTE = dt.timedelta(minutes=1)
HOUR = dt.timedelta(hours=1)
Q = trioq.Queue()


def entry(**overrides: Any) -> CronEntry:
    fields: dict[str, Any] = {"name": "nightly", "schedule": "0 3 * * *", "task": "report"}
    return CronEntry(**(fields | overrides))


def at(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, *, s: int = 0
) -> dt.datetime:
    return dt.datetime(year, month, day, hour, minute, s, tzinfo=UTC)


# -- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"name": "1nightly"}, r"^cron entry name '1nightly' is invalid"),
        ({"name": ""}, r"^cron entry name must be a non-empty string"),
        (
            {"schedule": "61 * * * *"},
            r"^cron entry 'nightly': schedule '61 \* \* \* \*' is invalid: .*out of range",
        ),
        ({"schedule": "* * * *"}, r"schedule '\* \* \* \*' is invalid: use 5 fields"),
        ({"schedule": "0 0 1 1 * 0 2030"}, r"schedule .* is invalid: use 5 fields"),
        ({"schedule": "0 0 * * xyz"}, r"schedule '0 0 \* \* xyz' is invalid: .*not acceptable"),
        ({"schedule": "R * * * *"}, r"schedule 'R \* \* \* \*' is invalid: hashed .* random"),
        ({"schedule": "H/5 * * * *"}, r"schedule 'H/5 \* \* \* \*' is invalid: hashed"),
        ({"schedule": "0 0 30 2 *"}, r"schedule '0 0 30 2 \*' never matches a date"),
        ({"timezone": "Mars/Olympus"}, r"^cron entry 'nightly': timezone 'Mars/Olympus' is not"),
        ({"timezone": "../../etc/passwd"}, r"timezone '\.\./\.\./etc/passwd' is not a known"),
        ({"task": "bad task"}, r"^cron entry 'nightly': task 'bad task' is invalid"),
        ({"queue": "-q"}, r"^cron entry 'nightly': queue '-q' is invalid"),
        ({"priority": 101}, r"^cron entry 'nightly': priority must be between -100 and 100"),
        ({"max_attempts": 0}, r"^cron entry 'nightly': max_attempts must be between 1"),
        ({"misfire": "later"}, r"^cron entry 'nightly': misfire must be 'skip' or 'run_once'"),
        ({"misfire_grace": 0}, r"^cron entry 'nightly': misfire_grace must be positive"),
        ({"args": {"x": float("nan")}}, r"^cron entry 'nightly': args must be JSON"),
    ],
)
def test_validation_names_entry_and_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        entry(**overrides)


def test_defaults_and_accepted_syntax() -> None:
    e = entry()
    assert (e.args, e.queue, e.priority, e.max_attempts) == ({}, "default", 0, None)
    assert (e.misfire, e.misfire_grace, e.timezone) == ("skip", MINUTE, "UTC")
    assert entry(misfire_grace=90).misfire_grace == dt.timedelta(seconds=90)
    for schedule in ["@daily", "@HOURLY", "0 9 * * mon-fri", "0 0 L * *", "0 0 1 jan,jul *"]:
        assert entry(schedule=schedule).schedule == schedule
    with pytest.raises(ValueError, match="after must be an aware datetime"):
        e.next_tick(dt.datetime(2030, 1, 1))


# -- tick arithmetic ----------------------------------------------------------------------------


def test_next_and_latest_tick_in_utc() -> None:
    e = entry(schedule="*/15 * * * *")
    assert e.next_tick(T0) == T0 + 15 * MINUTE  # strictly after
    assert e.latest_tick(T0) == T0  # at or before
    assert e.latest_tick(T0 + 14 * MINUTE + dt.timedelta(seconds=59.9)) == T0
    seconds = entry(schedule="*/15 * * * * 30")  # croniter: the 6th field is the second
    assert seconds.next_tick(T0) == T0 + dt.timedelta(seconds=30)
    assert seconds.next_tick(T0 + dt.timedelta(seconds=30)) == at(2030, 1, 1, 0, 15, s=30)
    assert seconds.latest_tick(at(2030, 1, 1, 0, 15, s=29)) == at(2030, 1, 1, 0, 0, s=30)


def test_next_fire_time_is_the_earliest_entry() -> None:
    entries = [entry(name="a", schedule="0 3 * * *"), entry(name="b", schedule="*/10 * * * *")]
    assert next_fire_time(entries, T0) == T0 + 10 * MINUTE
    assert next_fire_time(entries, T0 + 2 * HOUR + 55 * MINUTE) == T0 + 3 * HOUR
    assert next_fire_time([], T0) is None
    with pytest.raises(ValueError, match="now must be an aware datetime"):
        next_fire_time(entries, dt.datetime(2030, 1, 1))


def test_local_time_follows_daylight_saving() -> None:
    nine = entry(schedule="0 9 * * *", timezone="Europe/Paris")
    # Clocks go forward on 2030-03-31 and back on 2030-10-27: 09:00 stays 09:00 local.
    assert nine.next_tick(at(2030, 3, 30)) == at(2030, 3, 30, 8)
    assert nine.next_tick(at(2030, 3, 30, 8)) == at(2030, 3, 31, 7)
    assert nine.next_tick(at(2030, 10, 26, 7)) == at(2030, 10, 27, 8)


def test_skipped_wall_time_fires_at_the_jump() -> None:
    # 02:30 does not exist in Paris on 2030-03-31 (02:00 CET -> 03:00 CEST at 01:00 UTC).
    half_two = entry(schedule="30 2 * * *", timezone="Europe/Paris")
    assert half_two.next_tick(at(2030, 3, 30, 12)) == at(2030, 3, 31, 1)
    assert half_two.next_tick(at(2030, 3, 31, 1)) == at(2030, 4, 1, 0, 30)
    # Ticks in the gap (02:00, 02:30) collapse with 03:00 into one tick, at the jump.
    half_hourly = entry(schedule="*/30 * * * *", timezone="Europe/Paris")
    assert ticks_between(half_hourly, at(2030, 3, 31, 0), at(2030, 3, 31, 2)) == [
        at(2030, 3, 31, 0, 30), at(2030, 3, 31, 1), at(2030, 3, 31, 1, 30), at(2030, 3, 31, 2),
    ]  # fmt: skip


def test_repeated_wall_time_fires_once() -> None:
    # 02:00-03:00 happens twice in Paris on 2030-10-27 (03:00 CEST -> 02:00 CET at 01:00 UTC).
    half_two = entry(schedule="30 2 * * *", timezone="Europe/Paris")
    assert half_two.next_tick(at(2030, 10, 26, 12)) == at(2030, 10, 27, 0, 30)
    assert half_two.next_tick(at(2030, 10, 27, 0, 30)) == at(2030, 10, 28, 1, 30)
    half_hourly = entry(schedule="*/30 * * * *", timezone="Europe/Paris")
    assert ticks_between(half_hourly, at(2030, 10, 27, 0), at(2030, 10, 27, 2, 30)) == [
        at(2030, 10, 27, 0, 30), at(2030, 10, 27, 2), at(2030, 10, 27, 2, 30),
    ]  # fmt: skip
    # In the second pass (02:45 CET), the latest tick is the first pass's 02:30.
    assert half_hourly.latest_tick(at(2030, 10, 27, 1, 45)) == at(2030, 10, 27, 0, 30)
    assert half_two.latest_tick(at(2030, 10, 27, 1, 45)) == at(2030, 10, 27, 0, 30)


def ticks_between(e: CronEntry, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    """Ticks in (start, end]."""
    ticks = []
    while (tick := e.next_tick(start)) is not None and tick <= end:
        ticks.append(tick)
        start = tick
    return ticks


def oracle_ticks(schedule: str, zone: ZoneInfo, start: dt.datetime, end: dt.datetime) -> list[Any]:
    """Ticks in (start, end] minute by minute from the documented rule: an instant is a tick
    if its wall time matches and is a first occurrence, or if it ends a gap with a match."""
    ticks = []
    u = start + MINUTE
    while u <= end:
        local = u.astimezone(zone)
        wall = local.replace(tzinfo=None, fold=0)
        if local.fold == 0 and croniter.match(schedule, wall):
            ticks.append(u)
        else:
            before = (u - MINUTE).astimezone(zone).replace(tzinfo=None) + MINUTE
            gap = [before + i * MINUTE for i in range(int((wall - before) / MINUTE))]
            if any(croniter.match(schedule, w) for w in gap):
                ticks.append(u)
        u += MINUTE
    return ticks


def transitions(zone: ZoneInfo, year: int) -> Iterator[dt.datetime]:
    u, end = dt.datetime(year, 1, 1, tzinfo=UTC), dt.datetime(year + 1, 1, 1, tzinfo=UTC)
    while u < end:
        if (u + 30 * MINUTE).astimezone(zone).utcoffset() != u.astimezone(zone).utcoffset():
            yield u + 30 * MINUTE
        u += 30 * MINUTE


@pytest.mark.parametrize("zone", ["Europe/Paris", "America/New_York", "Australia/Lord_Howe"])
@pytest.mark.parametrize(
    "schedule", ["*/30 * * * *", "30 2 * * *", "15,45 1-3 * * *", "*/20 0-4 * * sun"]
)
def test_ticks_match_the_documented_rule_around_every_transition(zone: str, schedule: str) -> None:
    e = entry(schedule=schedule, timezone=zone)
    for jump in transitions(ZoneInfo(zone), 2030):
        start, end = jump - 3 * HOUR, jump + 3 * HOUR
        expected = oracle_ticks(schedule, ZoneInfo(zone), start, end)
        assert ticks_between(e, start, end) == expected
        for u in [start + i * 11 * MINUTE for i in range(6 * 60 // 11)] + expected:
            for probe in (u - dt.timedelta(seconds=1), u, u + dt.timedelta(microseconds=1)):
                latest = max((t for t in expected if t <= probe), default=None)
                if latest is not None:
                    assert e.latest_tick(probe) == latest, probe


# -- firing against Postgres --------------------------------------------------------------------


async def fire(conn: Any, entries: list[CronEntry], now: dt.datetime) -> list[Fired]:
    await set_clock(conn, now)
    return await fire_due(conn, Q, entries, now=now)


async def tick_rows(conn: Any) -> list[tuple[str, dt.datetime, int | None]]:
    cur = await conn.execute("SELECT name, tick, job_id FROM trioq.cron_ticks ORDER BY name, tick")
    return list(await cur.fetchall())


async def jobs(conn: Any) -> list[tuple[Any, ...]]:
    cur = await conn.execute(
        "SELECT id, task, args, queue, priority, max_attempts, state, dedup_key, run_at"
        " FROM trioq.jobs ORDER BY id"
    )
    return list(await cur.fetchall())


async def test_first_sight_records_a_baseline_then_the_next_tick_fires(dsn: str) -> None:
    hourly = entry(name="hourly", schedule="0 * * * *", args={"k": [1, "x"]}, queue="reports",
                   priority=-3, max_attempts=2)  # fmt: skip
    async with migrated(dsn, T0) as conn:
        assert await fire(conn, [hourly], T0 + 30 * MINUTE) == []  # T0's tick is past: not fired
        assert await tick_rows(conn) == [("hourly", T0, None)]
        assert await fire(conn, [hourly], T0 + 59 * MINUTE) == []
        fired = await fire(conn, [hourly], T0 + HOUR + dt.timedelta(seconds=2))
        assert fired == [Fired(name="hourly", tick=T0 + HOUR, job_id=fired[0].job_id)]
        assert await jobs(conn) == [
            (fired[0].job_id, "report", {"k": [1, "x"]}, "reports", -3, 2, "available",
             "key:cron:hourly@2030-01-01T01:00:00Z", T0 + HOUR + dt.timedelta(seconds=2)),
        ]  # fmt: skip
        assert await tick_rows(conn) == [
            ("hourly", T0, None),
            ("hourly", T0 + HOUR, fired[0].job_id),
        ]
        # The same tick never fires twice, even once its job has finished and been deleted.
        assert await fire(conn, [hourly], T0 + HOUR + dt.timedelta(seconds=3)) == []
        await conn.execute("DELETE FROM trioq.jobs")
        assert await fire(conn, [hourly], T0 + HOUR + 30 * MINUTE) == []
        assert await jobs(conn) == []


async def test_a_tick_fires_once_across_concurrent_processes(dsn: str) -> None:
    minutely = [entry(name="m", schedule="* * * * *"), entry(name="n", schedule="*/2 * * * *")]
    now = T0 + 2 * MINUTE + dt.timedelta(seconds=1)
    async with migrated(dsn, T0) as conn:
        await fire(conn, minutely, T0)  # baselines
    results: list[list[Fired]] = []
    ready: list[None] = []
    go = trio.Event()

    async def process() -> None:
        async with await trioq.connect(dsn, autocommit=True) as c:
            await set_clock(c, now)
            ready.append(None)
            if len(ready) == 5:
                go.set()  # all connected: start together
            await go.wait()
            results.append(await fire_due(c, Q, minutely, now=now))

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(process)
    fired = sorted((f.name, f.tick) for r in results for f in r)
    assert fired == [("m", T0 + 2 * MINUTE), ("n", T0 + 2 * MINUTE)]
    async with migrated(dsn, T0) as conn:
        assert [(j[1], j[6]) for j in await jobs(conn)] == [("report", "available")] * 2
        rows = await tick_rows(conn)
        assert [(name, tick) for name, tick, _ in rows] == [
            ("m", T0),
            ("m", T0 + 2 * MINUTE),
            ("n", T0),
            ("n", T0 + 2 * MINUTE),
        ]
        assert {job_id for _, _, job_id in rows} == {None} | {j[0] for j in await jobs(conn)}


async def test_skip_drops_missed_ticks_and_fires_the_next_on_time(dsn: str) -> None:
    hourly = entry(name="hourly", schedule="0 * * * *")
    async with migrated(dsn, T0) as conn:
        await fire(conn, [hourly], T0)
        # Down from just after T0 until 03:30: the 01:00, 02:00 and 03:00 ticks are missed.
        assert await fire(conn, [hourly], T0 + 3 * HOUR + 30 * MINUTE) == []
        assert await tick_rows(conn) == [("hourly", T0, None), ("hourly", T0 + 3 * HOUR, None)]
        assert await fire(conn, [hourly], T0 + 3 * HOUR + 59 * MINUTE) == []
        fired = await fire(conn, [hourly], T0 + 4 * HOUR)
        assert [f.tick for f in fired] == [T0 + 4 * HOUR]
        assert len(await jobs(conn)) == 1


async def test_skip_fires_a_tick_late_within_the_grace(dsn: str) -> None:
    hourly = entry(name="hourly", schedule="0 * * * *", misfire_grace=dt.timedelta(seconds=30))
    async with migrated(dsn, T0) as conn:
        await fire(conn, [hourly], T0)
        late = await fire(conn, [hourly], T0 + 3 * HOUR + dt.timedelta(seconds=30))
        assert [f.tick for f in late] == [T0 + 3 * HOUR]  # only the latest; 01:00, 02:00 dropped
        too_late = await fire(conn, [hourly], T0 + 4 * HOUR + dt.timedelta(seconds=31))
        assert too_late == []
        assert len(await jobs(conn)) == 1


async def test_run_once_fires_one_job_for_all_missed_ticks(dsn: str) -> None:
    hourly = entry(name="hourly", schedule="0 * * * *", misfire="run_once")
    async with migrated(dsn, T0) as conn:
        await fire(conn, [hourly], T0)
        fired = await fire(conn, [hourly], T0 + 3 * HOUR + 30 * MINUTE)
        assert [f.tick for f in fired] == [T0 + 3 * HOUR]
        assert await fire(conn, [hourly], T0 + 3 * HOUR + 31 * MINUTE) == []
        assert [f.tick for f in await fire(conn, [hourly], T0 + 4 * HOUR)] == [T0 + 4 * HOUR]
        assert len(await jobs(conn)) == 2


async def test_daily_entry_in_a_zone_across_daylight_saving(dsn: str) -> None:
    nine = entry(name="nine", schedule="0 9 * * *", timezone="Europe/Paris")
    async with migrated(dsn, T0) as conn:
        await fire(conn, [nine], at(2030, 3, 29, 12))
        assert next_fire_time([nine], at(2030, 3, 29, 12)) == at(2030, 3, 30, 8)  # 09:00 CET
        assert await fire(conn, [nine], at(2030, 3, 30, 7, 59, s=59)) == []
        assert [f.tick for f in await fire(conn, [nine], at(2030, 3, 30, 8))] == [
            at(2030, 3, 30, 8)
        ]
        assert next_fire_time([nine], at(2030, 3, 30, 8)) == at(2030, 3, 31, 7)  # 09:00 CEST
        assert await fire(conn, [nine], at(2030, 3, 31, 6, 59, s=59)) == []
        fired = await fire(conn, [nine], at(2030, 3, 31, 7, 0, s=1))
        assert [f.tick for f in fired] == [at(2030, 3, 31, 7)]


async def test_old_tick_rows_are_pruned_but_never_the_latest(dsn: str) -> None:
    hourly = entry(name="hourly", schedule="0 * * * *")
    async with migrated(dsn, T0) as conn:
        for hours in (0, 1, 2):
            await fire(conn, [hourly], T0 + hours * HOUR)
        await fire(conn, [hourly], T0 + 2 * HOUR + TICK_RETENTION)
        ticks = [tick for _, tick, _ in await tick_rows(conn)]
        assert ticks == [T0 + 2 * HOUR, T0 + 2 * HOUR + TICK_RETENTION]


async def test_entries_are_checked_before_any_sql(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        twins = [entry(name="a"), entry(name="a", schedule="@hourly")]
        with pytest.raises(ValueError, match=r"names must be unique, repeated: \['a'\]"):
            await fire_due(conn, Q, twins, now=T0)
        big = entry(name="big", args={"blob": "x" * 100})
        with pytest.raises(trioq.PayloadTooLargeError, match="cron entry 'big': args are"):
            await fire_due(conn, trioq.Queue(max_payload_bytes=50), [big], now=T0)
        with pytest.raises(ValueError, match="now must be an aware datetime"):
            await fire_due(conn, Q, [big], now=dt.datetime(2030, 1, 1))
        assert await tick_rows(conn) == []
        assert await fire_due(conn, Q, [], now=T0) == []
