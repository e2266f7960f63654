"""bench/bench_durable.py at tiny sizes, without its DBOS peer: it runs end to end, prints
its three tables, writes its JSON and leaves no database behind (a smoke test, not a
benchmark: its numbers are not checked against targets)."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
from clitool import run_bench


def test_bench_durable_smoke(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "durable.json"
    args = ["--dsn", dsn, "--repeat", "1", "--workflows", "20", "--concurrency", "2",
            "--signals", "3", "--gap", "1", "--sleepers", "30", "--drain-jobs", "100",
            "--backlog", "200", "--explain-runs", "2", "--quiet-wait", "0",
            "--dbos-python", str(tmp_path / "no-dbos" / "python"), "--json", str(out)]  # fmt: skip
    done = run_bench("bench_durable.py", *args, timeout=120)
    assert "DBOS's cells are skipped" in done.stdout
    assert "steps of a 10-step workflow" in done.stdout
    assert "signal sent -> the woken handler's next line" in done.stdout
    assert "the claim with and without sleeping durable jobs" in done.stdout

    report = json.loads(out.read_text())
    steps = report["steps"]["medians"]
    assert set(steps) == {"trioq job.step, c=2", "trioq job.step_transaction, c=2"}
    assert all(m["steps_s"] > 0 and m["client_us"] > 0 for m in steps.values())
    signal = report["signal"]["medians"]["trioq"]
    assert 0 < signal["send_p50"] <= signal["pickup_p50"] <= signal["p50"] <= signal["max"]
    claim = report["claim"]["medians"]
    assert set(claim) == {"30 sleepers", "no sleepers"}
    assert all(m["jobs_s"] > 0 and m["claim 100 buffers"] > 0 for m in claim.values())

    with psycopg.connect(dsn) as conn:  # every scratch database is gone
        found = conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname LIKE 'trioq\\_durable\\_%'"
        ).fetchone()
        assert found == (0,)
