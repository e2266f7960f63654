"""Cron entries of the database (``cron_entries``, migration 19): the Python API, the CLI,
hostile values and rows written by hand, and the scheduler's ``run_once`` over the union of
code and database entries, on the database clock (``trioq.now``).

The process-level promise (two ``trioq serve``: an entry added at run time fires on schedule,
each tick once, and removal stops it) is ``tests/test_cron_processes.py``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from helpers import migrated

import trioq
from trioq._cli.main import main
from trioq._cron import CronEntry
from trioq._worker.services.scheduler import Scheduler, ScheduleRound
from trioq.testing import set_clock
from trioq.testing._drain import SharedConnection

UTC = dt.UTC
T0 = dt.datetime(2030, 1, 1, tzinfo=UTC)  # a Tuesday, midnight
MINUTE = dt.timedelta(minutes=1)
Q = trioq.Queue()
TESTS = Path(__file__).parent


def entry(**overrides: Any) -> CronEntry:
    fields: dict[str, Any] = {"name": "every-minute", "schedule": "* * * * *", "task": "report"}
    return CronEntry(**(fields | overrides))


async def cron_jobs(conn: Any) -> list[tuple[str, str]]:
    """(dedup key, task) of every job, in id order."""
    cur = await conn.execute("SELECT dedup_key, task FROM trioq.jobs ORDER BY id")
    return list(await cur.fetchall())


# -- the Python API ------------------------------------------------------------------------------


async def test_add_list_replace_remove(dsn: str) -> None:
    nightly = entry(name="nightly", schedule="0 3 * * *", args={"k": [1, "x"]}, queue="reports",
                    priority=-3, max_attempts=2, misfire="run_once", misfire_grace=90,
                    timezone="Europe/Paris")  # fmt: skip
    async with migrated(dsn) as conn:
        assert await Q.cron_entries(conn) == []
        stored = await Q.add_cron(conn, nightly)
        assert (stored.name, stored.entry, stored.enabled, stored.error) == (
            "nightly", nightly, True, None)
        assert await Q.cron_entries(conn) == [stored]
        with pytest.raises(ValueError, match=r"^cron entry 'nightly' is already in the database: "
                           r"give replace=True \(trioq cron add --replace\) to change it$"):
            await Q.add_cron(conn, nightly)
        changed = entry(name="nightly", schedule="0 4 * * *")
        replaced = await Q.add_cron(conn, changed, replace=True, enabled=False)
        assert (replaced.entry, replaced.enabled) == (changed, False)
        assert replaced.updated_at > stored.updated_at  # a new version: old reads stop firing
        assert replaced.created_at == stored.created_at
        assert await Q.cron_entries(conn) == [replaced]
        assert await Q.remove_cron(conn, "nightly") is True
        assert await Q.remove_cron(conn, "nightly") is False
        assert await Q.cron_entries(conn) == []


async def test_each_change_notifies_the_schema_channel(dsn: str) -> None:
    async with migrated(dsn) as conn, await trioq.connect(dsn, autocommit=True) as listener:
        await listener.execute("LISTEN trioq_trioq")
        await Q.add_cron(conn, entry())
        await Q.add_cron(conn, entry(), replace=True)
        await Q.remove_cron(conn, "every-minute")
        await Q.remove_cron(conn, "every-minute")  # nothing removed: no notification
        await Q.add_cron(conn, entry(name="other"))
        with pytest.raises(ValueError, match="already in the database"):
            await Q.add_cron(conn, entry(name="other"))  # refused: no notification
        await conn.execute("SELECT pg_notify('trioq_trioq', 'end')")
        payloads = []
        with trio.move_on_after(5):
            async for note in listener.notifies():
                payloads.append(note.payload)
                if note.payload == "end":
                    break
        assert payloads == ["@cron", "@cron", "@cron", "@cron", "end"]  # 3 + the first "other"


#: Values that careless hands give an entry's fields, with the CLI arguments that give them.
HOSTILE: list[tuple[dict[str, Any], list[str]]] = [
    ({"name": ""}, [""]),
    ({"name": "a\x00b"}, ["a\x00b"]),
    ({"name": "a\udc80b"}, ["a\udc80b"]),
    ({"name": "x" * 201}, ["x" * 201]),
    ({"name": "1nightly"}, ["1nightly"]),
    ({"schedule": ""}, ["--schedule="]),
    ({"schedule": "a\x00b * * * *"}, ["--schedule=a\x00b * * * *"]),
    ({"schedule": "\udc80 * * * *"}, ["--schedule=\udc80 * * * *"]),
    ({"schedule": "61 * * * *"}, ["--schedule=61 * * * *"]),
    ({"schedule": "9" * 10_000}, ["--schedule=" + "9" * 10_000]),
    ({"schedule": "H * * * *"}, ["--schedule=H * * * *"]),
    ({"schedule": "0 0 30 2 *"}, ["--schedule=0 0 30 2 *"]),
    ({"task": ""}, ["--task="]),
    ({"task": "a\x00b"}, ["--task=a\x00b"]),
    ({"task": "t" * 201}, ["--task=" + "t" * 201]),
    ({"queue": "-q"}, ["--queue=-q"]),
    ({"queue": "q\udc80"}, ["--queue=q\udc80"]),
    ({"queue": "q" * 65}, ["--queue=" + "q" * 65]),
    ({"timezone": "Mars/Olympus"}, ["--timezone=Mars/Olympus"]),
    ({"timezone": "../../etc/passwd"}, ["--timezone=../../etc/passwd"]),
    ({"timezone": "a\x00b"}, ["--timezone=a\x00b"]),
    ({"timezone": ""}, ["--timezone="]),
    ({"args": {"s": "a\x00b"}}, ['--args={"s": "a\\u0000b"}']),
    ({"args": {"s": "\udc80"}}, ['--args={"s": "\\udc80"}']),
]


def _api_error(overrides: dict[str, Any]) -> str:
    with pytest.raises(ValueError) as caught:
        entry(**({"name": "e"} | overrides))
    return str(caught.value)


@pytest.mark.parametrize(("overrides", "argv"), HOSTILE, ids=range(len(HOSTILE)))
def test_the_cli_refuses_with_the_words_of_the_api(
    dsn: str, overrides: dict[str, Any], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The same hostile value through `trioq.CronEntry` and ``trioq cron add``: the same
    message, and nothing stored (the CLI refuses before it connects)."""
    expected = _api_error(overrides)
    name = argv if "name" in overrides else ["e"]
    flags = [] if "name" in overrides else list(argv)
    for flag in ("--schedule=* * * * *", "--task=report"):
        if not any(f.startswith(flag.split("=")[0] + "=") for f in flags):
            flags.append(flag)
    capsys.readouterr()
    code = main(["cron", "add", *name, *flags, "--dsn", dsn])
    err = capsys.readouterr().err
    assert code == 1
    assert err == f"trioq: error: {expected.splitlines()[0]}\n"


async def test_hostile_api_values(dsn: str) -> None:
    small = trioq.Queue(max_payload_bytes=100)
    async with migrated(dsn) as conn:
        with pytest.raises(TypeError, match=r"^entry must be a trioq.CronEntry, got '\*"):
            await Q.add_cron(conn, "* * * * *")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"^replace must be a bool, got 'yes'"):
            await Q.add_cron(conn, entry(), replace="yes")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"^enabled must be a bool, got 1"):
            await Q.add_cron(conn, entry(), enabled=1)  # type: ignore[arg-type]
        with pytest.raises(trioq.PayloadTooLargeError,
                           match=r"^cron entry 'big': args are \d+ bytes of JSON, over the limit "
                           r"of 100"):  # fmt: skip
            await small.add_cron(conn, entry(name="big", args={"x": "a" * 200}))
        long = entry(schedule=",".join(["0"] * 600) + " * * * *")  # CronEntry takes it
        with pytest.raises(ValueError, match=r"^cron entry 'every-minute': schedule is 1207 "
                           r"characters, over the 1000 the database stores$"):  # fmt: skip
            await Q.add_cron(conn, long)
        with pytest.raises(ValueError, match=r"misfire_grace 36501 days, 0:00:00 is over the "
                           r"100 years the database stores"):  # fmt: skip
            await Q.add_cron(conn, entry(misfire_grace=dt.timedelta(days=36501)))
        for bad, kind, words in [
            ("", ValueError, "cron entry name must be a non-empty string, got ''"),
            ("a\x00b", ValueError, "cron entry name 'a\\x00b' is invalid"),
            ("a\udc80b", ValueError, "cron entry name 'a\\udc80b' is invalid"),
            ("x" * 201, ValueError, "cron entry name 'xxxx"),
            (7, TypeError, "cron entry name must be a string, got 7"),
            (None, TypeError, "cron entry name must be a string, got None"),
        ]:
            with pytest.raises(kind) as caught:
                await Q.remove_cron(conn, bad)  # type: ignore[arg-type]
            assert str(caught.value).startswith(words)
            with pytest.raises(kind) as same:
                entry(name=bad)
            assert str(same.value) == str(caught.value)  # the same words on both paths
        assert await Q.cron_entries(conn) == []


# -- rows written by hand ------------------------------------------------------------------------

#: Rows the schema refuses (the CHECK constraint each breaks).
REFUSED = [
    "name = '1bad'", "name = ''", "name = repeat('n', 201)", "task = 'bad task'",
    "task = ''", "queue = '-q'", "queue = repeat('q', 65)", "priority = 101",
    "priority = -101", "max_attempts = 0", "max_attempts = 10001", "misfire = 'later'",
    "misfire_grace = interval '0'", "misfire_grace = interval '-1 second'",
    "misfire_grace = interval '101 years'", "schedule = ''", "schedule = repeat('1', 1001)",
    "timezone = ''", "timezone = repeat('z', 201)", "created_at = 'infinity'",
    "updated_at = '-infinity'", "args = jsonb_build_object('s', repeat('x', 8388608))",
]


@pytest.mark.parametrize("change", REFUSED)
async def test_the_schema_refuses_what_it_can(dsn: str, change: str) -> None:
    async with migrated(dsn) as conn:
        await Q.add_cron(conn, entry())
        with pytest.raises(psycopg.errors.CheckViolation):
            await conn.execute(f"UPDATE trioq.cron_entries SET {change}")


#: Rows the schema lets in that trioq cannot serve, and why each is shown broken.
BROKEN = {
    "bad-schedule": ("schedule = '61 * * * *'", "schedule '61 * * * *' is invalid"),
    "bad-fields": ("schedule = 'H * * * *'", "hashed ('H') and random ('R') fields"),
    "never": ("schedule = '0 0 30 2 *'", "never matches a date"),
    "bad-zone": ("timezone = 'Mars/Olympus'", "timezone 'Mars/Olympus' is not a known IANA"),
    "escape-zone": ("timezone = '../../etc/passwd'", "is not a known IANA zone"),
    "huge-args": ("args = jsonb_build_object('s', repeat('x', 2000000))",
                  "args are 2000008 bytes of JSON, over the limit of 1048576"),
    "deep-args": ("args = (repeat('[', 5000) || repeat(']', 5000))::jsonb",
                  "args are JSON nested too deeply"),
}


async def test_rows_written_by_hand_are_read_as_broken(dsn: str) -> None:
    async with migrated(dsn) as conn:
        for name, (change, _) in BROKEN.items():
            await Q.add_cron(conn, entry(name=name))
            await conn.execute(
                f"UPDATE trioq.cron_entries SET {change} WHERE name = %s", (name,))  # fmt: skip
        await conn.execute("UPDATE trioq.cron_entries SET misfire_grace = interval '1 mon'"
                           " WHERE name = 'bad-zone'")  # months read as 30 days, no error
        await Q.add_cron(conn, entry(name="fine"))
        stored = {s.name: s for s in await Q.cron_entries(conn)}
        assert stored["fine"].error is None and stored["fine"].entry == entry(name="fine")
        for name, (_, why) in BROKEN.items():
            assert stored[name].broken and stored[name].entry is None, name
            assert why in (stored[name].error or ""), (name, stored[name].error)
            assert len(stored[name].error or "") <= 500


# -- the scheduler: run_once on the database clock -----------------------------------------------


class Clocked(SharedConnection):
    """The scheduler's "pool": the test's connection, its clock at ``now``."""

    def __init__(self, conn: Any) -> None:
        super().__init__(conn)
        self.now = T0

    async def at(self, when: dt.datetime) -> None:
        self.now = when
        await set_clock(self._conn, when)


def scheduler(pool: Clocked, code: tuple[CronEntry, ...] = (), poll: float = 3600.0) -> Scheduler:
    return Scheduler(pool, Q, code, poll_interval=poll, on_due=lambda _queue: None)


async def round_at(sched: Scheduler, pool: Clocked, when: dt.datetime) -> ScheduleRound:
    await pool.at(when)
    return await sched.run_once()


async def test_database_entries_fire_beside_the_code_entries(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        pool = Clocked(conn)
        sched = scheduler(pool, (entry(name="code"),))
        await Q.add_cron(conn, entry(name="db", args={"from": "db"}))
        first = await round_at(sched, pool, T0 + dt.timedelta(seconds=1))  # baselines
        assert first.read_entries and first.fired == ()
        assert first.cron is not None and [e.name for e in first.cron.entries] == ["code", "db"]
        second = await round_at(sched, pool, T0 + MINUTE + dt.timedelta(seconds=1))
        assert not second.read_entries  # within the poll interval: the entries read before
        assert sorted(f.name for f in second.fired) == ["code", "db"]
        assert await cron_jobs(conn) == [
            ("key:cron:code@2030-01-01T00:01:00Z", "report"),
            ("key:cron:db@2030-01-01T00:01:00Z", "report"),
        ]
        assert second.sleep <= 60


async def test_a_change_is_read_when_notified_or_after_the_poll_interval(dsn: str) -> None:
    async with migrated(dsn, T0) as conn:
        pool = Clocked(conn)
        sched = scheduler(pool)
        await round_at(sched, pool, T0)
        await Q.add_cron(conn, entry(name="late"))
        assert not (await round_at(sched, pool, T0 + dt.timedelta(seconds=5))).read_entries
        sched.cron_changed()  # what the runtime does on '@cron' and when LISTEN reconnects
        read = await round_at(sched, pool, T0 + dt.timedelta(seconds=6))
        assert read.read_entries and read.cron is not None
        assert [e.name for e in read.cron.entries] == ["late"]
        polled = scheduler(pool, poll=0.0)  # every round is a poll interval later
        assert (await polled.run_once()).read_entries and (await polled.run_once()).read_entries


async def test_removal_stops_ticks_even_in_a_scheduler_that_has_not_heard(dsn: str) -> None:
    """The tick of a database entry is claimed only while its row is the one the scheduler
    read: a removal, a disable or a replacement stops the old definition at commit."""
    async with migrated(dsn, T0) as conn:
        pool = Clocked(conn)
        sched = scheduler(pool)
        for name in ("removed", "disabled", "replaced", "kept"):
            await Q.add_cron(conn, entry(name=name))
        await round_at(sched, pool, T0 + dt.timedelta(seconds=1))  # read, baselines
        await Q.remove_cron(conn, "removed")
        await Q.add_cron(conn, entry(name="disabled"), replace=True, enabled=False)
        await Q.add_cron(conn, entry(name="replaced", schedule="0 * * * *"), replace=True)
        stale = await round_at(sched, pool, T0 + MINUTE + dt.timedelta(seconds=1))
        assert not stale.read_entries  # not notified: it still has the old rows
        assert [f.name for f in stale.fired] == ["kept"]
        sched.cron_changed()
        fresh = await round_at(sched, pool, T0 + 2 * MINUTE + dt.timedelta(seconds=1))
        assert fresh.cron is not None and fresh.cron.disabled == ("disabled",)
        assert [e.name for e in fresh.cron.entries] == ["kept", "replaced"]
        assert [f.name for f in fresh.fired] == ["kept"]  # 'replaced' is hourly now
        assert [k for k, _ in await cron_jobs(conn)] == [
            "key:cron:kept@2030-01-01T00:01:00Z", "key:cron:kept@2030-01-01T00:02:00Z"]


async def test_a_broken_row_is_skipped_and_logged_once(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trioq.cron")
    async with migrated(dsn, T0) as conn:
        pool = Clocked(conn)
        sched = scheduler(pool, poll=0.0)  # reads every round
        for name in ("a-before", "broken", "z-after"):
            await Q.add_cron(conn, entry(name=name))
        for name, (change, _) in BROKEN.items():
            await Q.add_cron(conn, entry(name=name))
            await conn.execute(
                f"UPDATE trioq.cron_entries SET {change} WHERE name = %s", (name,))  # fmt: skip
        await conn.execute("UPDATE trioq.cron_entries SET schedule = '0 0 31 2 *'"
                           " WHERE name = 'broken'")  # fmt: skip
        for minute in range(4):
            result = await round_at(sched, pool, T0 + minute * MINUTE + dt.timedelta(seconds=1))
        assert result.cron is not None
        assert sorted(result.cron.broken) == sorted([*BROKEN, "broken"])
        assert [f.name for f in result.fired] == ["a-before", "z-after"]
        warnings = [r.getMessage() for r in caplog.records if "is skipped" in r.getMessage()]
        assert len(warnings) == len(BROKEN) + 1  # once each, not every round
        assert any("'broken'" in w and "never matches a date" in w for w in warnings)
        # Fixed by hand (a new version of the row): it runs, and a new break is logged again.
        await Q.add_cron(conn, entry(name="broken"), replace=True)
        fixed = await round_at(sched, pool, T0 + 4 * MINUTE + dt.timedelta(seconds=1))
        assert fixed.cron is not None and "broken" not in fixed.cron.broken
        assert [f.name for f in fixed.fired] == ["a-before", "z-after"]  # 'broken': baseline
        fired = await round_at(sched, pool, T0 + 5 * MINUTE + dt.timedelta(seconds=1))
        assert [f.name for f in fired.fired] == ["a-before", "broken", "z-after"]


async def test_a_code_entry_wins_over_a_database_entry_of_its_name(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trioq.cron")
    code = entry(name="shared", args={"from": "code"})
    async with migrated(dsn, T0) as conn:
        pool = Clocked(conn)
        sched = scheduler(pool, (code,), poll=0.0)
        await Q.add_cron(conn, entry(name="shared", args={"from": "db"}, schedule="*/2 * * * *"))
        for minute in range(4):
            result = await round_at(sched, pool, T0 + minute * MINUTE + dt.timedelta(seconds=1))
        assert result.cron is not None and result.cron.shadowed == ("shared",)
        assert result.cron.entries == (code,)
        cur = await conn.execute("SELECT args FROM trioq.jobs ORDER BY id")
        assert [a for (a,) in await cur.fetchall()] == [{"from": "code"}] * 3  # every minute
        shadowed = [r for r in caplog.records if "the code's wins" in r.getMessage()]
        assert len(shadowed) == 1


async def test_too_many_rows_run_the_first_by_name(
    dsn: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trioq._worker.services import scheduler as module

    monkeypatch.setattr(module, "MAX_STORED_ENTRIES", 3)
    async with migrated(dsn, T0) as conn:
        for n in range(5):
            await Q.add_cron(conn, entry(name=f"e{n}"))
        result = await scheduler(Clocked(conn)).run_once()
        assert result.cron is not None
        assert [e.name for e in result.cron.entries] == ["e0", "e1", "e2"]
        assert any("more than 3 entries" in r.getMessage() for r in caplog.records)


# -- the CLI -------------------------------------------------------------------------------------


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_add_list_remove(
    dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:  # fmt: skip
    assert main(["migrate", "--dsn", dsn]) == 0
    monkeypatch.syspath_prepend(str(TESTS))
    code, out, err = cli(capsys, "cron", "add", "nightly", "--schedule", "0 3 * * *", "--task",
                         "report", "--args", '{"kind": "sales"}', "--queue", "reports",
                         "--priority", "-5", "--max-attempts", "3", "--timezone",
                         "Europe/Paris", "--misfire", "run_once", "--misfire-grace", "5m",
                         "--dsn", dsn)  # fmt: skip
    assert code == 0, err
    assert out.startswith("cron entry 'nightly' added: '0 3 * * *' (Europe/Paris) enqueues "
                          "report on reports; next tick ")  # fmt: skip
    code, _, err = cli(capsys, "cron", "add", "nightly", "--schedule", "0 4 * * *", "--task",
                       "report", "--dsn", dsn)  # fmt: skip
    assert (code, err) == (1, "trioq: error: cron entry 'nightly' is already in the database: "
                           "give replace=True (trioq cron add --replace) to change it\n")
    code, out, err = cli(capsys, "cron", "add", "hourly-db", "--schedule", "@hourly", "--task",
                         "ok", "--disabled", "--dsn", dsn, "--json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["status"] == "disabled" and json.loads(out)["next_tick"] is None
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE trioq.cron_entries SET timezone = 'Mars/Olympus'"
                     " WHERE name = 'hourly-db'")  # fmt: skip
    code, out, err = cli(capsys, "cron", "list", "--dsn", dsn, "--json", "--app",
                         "obs_app:with_cron")  # fmt: skip
    assert code == 0, err
    rows = {(r["name"], r["source"]): r for r in json.loads(out)}
    stored = rows[("nightly", "database")]
    assert (stored["status"], stored["args"], stored["priority"], stored["max_attempts"]) == (
        "shadowed", {"kind": "sales"}, -5, 3)  # obs_app's code has an entry of this name
    assert (stored["misfire"], stored["misfire_grace"], stored["queue"]) == (
        "run_once", 300.0, "reports")
    assert rows[("nightly", "app")]["status"] == "ok"  # it wins: the database's is not run
    assert stored["next_tick"] is None
    broken = rows[("hourly-db", "database")]
    assert broken["status"] == "broken" and "Mars/Olympus" in broken["error"]
    code, out, _ = cli(capsys, "cron", "list", "--dsn", dsn, "--app", "obs_app:with_cron")
    assert "not run: the app's entry of this name wins" in out
    assert "broken: cron entry 'hourly-db': timezone 'Mars/Olympus'" in out
    code, out, _ = cli(capsys, "cron", "list", "--dsn", dsn)
    assert "nightly                  database" in out and "give --app" in out
    code, out, err = cli(capsys, "cron", "remove", "nightly", "--dsn", dsn)
    assert (code, out, err) == (0, "cron entry 'nightly' removed\n", "")
    code, out, err = cli(capsys, "cron", "remove", "nightly", "--dsn", dsn)
    assert (code, out, err) == (4, "", "no cron entry named 'nightly' in the database\n")
    code, out, _ = cli(capsys, "cron", "remove", "nightly", "--dsn", dsn, "--json")
    assert (code, json.loads(out)) == (4, {"name": "nightly", "removed": False})
    code, out, err = cli(capsys, "cron", "add", "x", "--schedule", "* * * * *", "--task", "t",
                         "--args", "{nope", "--dsn", dsn)  # fmt: skip
    assert code == 1 and err.startswith("trioq: error: --args is not JSON: ")
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"x": "a" * 1_100_000}))
    code, out, err = cli(capsys, "cron", "add", "big", "--schedule", "* * * * *", "--task", "t",
                         f"--args=@{big}", "--dsn", dsn)  # fmt: skip
    assert (code, err) == (1, "trioq: error: cron entry 'big': args are 1100008 bytes of JSON, "
                           "over the limit of 1048576 (max_payload_bytes)\n")
