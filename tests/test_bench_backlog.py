"""bench/bench_backlog.py at tiny sizes: it runs end to end, prints its tables and writes
the JSON docs/scaling.md is built from, and leaves nothing behind (a smoke test, not a
benchmark: its numbers are not checked against targets)."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
from clitool import run_bench

SIZES = (200, 500)


def test_bench_backlog_smoke(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "backlog.json"
    args = ["--dsn", dsn, "--sizes", ",".join(map(str, SIZES)), "--batches", "1,10",
            "--repeat", "5", "--status-runs", "1", "--serve-seconds", "0.5", "--serve-runs", "1",
            "--quiet-wait", "0", "--json", str(out)]  # fmt: skip
    done = run_bench("bench_backlog.py", *args, timeout=60)
    for size in SIZES:
        assert f"backlog {size:,} jobs" in done.stdout
    assert "claim batch 10 ms (median)" in done.stdout
    assert f"summary: {SIZES[-1]:,} jobs vs {SIZES[0]:,}" in done.stdout

    report = json.loads(out.read_text())
    assert [row["size"] for row in report["sizes"]] == list(SIZES)
    for row in report["sizes"]:
        # claimed jobs were completed and replaced: the backlog kept its size
        assert row["available_after_claims"] == row["size"]
        assert [c["batch"] for c in row["claims"]] == [1, 10]
        for c in row["claims"]:
            assert c["n"] == 5
            assert 0 < c["claim_ms"]["median"] <= c["claim_ms"]["p99"] <= c["claim_ms"]["max"]
        commands = [c["command"] for c in row["operator"]["cli"]]
        assert commands == ["trioq status", "trioq status --json", "trioq status --exact",
                            "trioq jobs list"]  # fmt: skip
        assert all(c["output_bytes"] > 0 for c in row["operator"]["cli"])
        assert all(c["median_s"] > c["beyond_start_s"] for c in row["operator"]["cli"])
        assert [p["batch"] for p in row["claim_plans"]] == [1, 10]
        assert all(p["buffers"] > 0 for p in row["claim_plans"])
        assert set(row["operator"]["depth_ms"]) == {
            "depth_available", "depth_dead", "depth_scheduled_running", "depth_waiting"
        }  # fmt: skip
        serve = row["serve"]
        assert serve["exit"] == 0 and serve["jobs"] > 0 and serve["rss_peak_kib"] > 10_000
        assert serve["pg_backends"] >= 1 and serve["n"] == len(row["serve_runs"]) == 1
        assert row["sizes_bytes"]["total"] >= row["sizes_bytes"]["heap"] > 0
        assert "index jobs_claim_idx" in row["sizes_bytes"]
    assert {s["metric"] for s in report["summary"]} >= {"claim b1 median ms", "serve rss peak MiB"}

    with psycopg.connect(dsn) as conn:  # the scratch schema is gone
        found = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'bench_backlog'"
        ).fetchone()
        assert found == (0,)
