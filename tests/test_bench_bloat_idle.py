"""bench/bench_bloat.py and bench/bench_idle.py at tiny sizes: each runs end to end against
real serve processes, prints its table, writes its JSON and drops its schema (smoke tests,
not benchmarks: the numbers are not checked against targets, only that they were taken)."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
from clitool import run_bench as run


def schemas(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        found = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'bench_%'")
        return [r[0] for r in found.fetchall()]


def test_bench_bloat_smoke(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "bloat.json"
    done = run("bench_bloat.py", "--dsn", dsn, "--rate", "400", "--duration", "6", "--pin-at",
               "2", "--pin-for", "2", "--sample", "1", "--processes", "1", "--concurrency",
               "10", "--variants", "autovacuum,vacuumer", "--json", str(out))  # fmt: skip
    assert "| vacuumer " in done.stdout and "| autovacuum " in done.stdout
    results = json.loads(out.read_text())["results"]
    for r in results:
        assert r["sent"] >= 2000 and r["jobs_s"] > 0
        assert r["pin"] is not None and r["pin"][1] - r["pin"][0] >= 2
        assert len(r["samples"]) >= 4 and r["claim_before_pin"]["n"] > 0
        assert r["dead_max_during_pin"] is not None
    assert schemas(dsn) == []


def test_bench_idle_smoke(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "idle.json"
    done = run("bench_idle.py", "--dsn", dsn, "--counts", "1,2", "--seconds", "2", "--settle",
               "0.5", "--poll-interval", "1", "--json", str(out))  # fmt: skip
    assert "Postgres % core" in done.stdout
    results = json.loads(out.read_text())["results"]
    assert [r["count"] for r in results] == [1, 2]
    for r in results:
        # One idle worker costs Postgres about 6 ms of CPU a second: 2 s can read as 0 clock
        # ticks (10 ms each), so the window's share may be 0; the server's total may not.
        assert r["pg_cores"] >= 0 and r["pg_cpu_s_total"] > 0
        assert r["connections"] >= r["count"]
        # An idle worker writes its row every 10 s (its liveness connection's round trips
        # write nothing), so a 2 s window may hold no update; its dead-worker checks (each
        # process every 0.5 s in a fleet this small) are transactions.
        assert r["worker_updates_s"] >= 0 and r["xacts_s"] > 0
    assert schemas(dsn) == []
