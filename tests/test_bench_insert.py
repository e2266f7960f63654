"""bench/bench_insert_peers.py at a tiny size, without its pgqueuer peer: every trioq cell
runs end to end, writes each job's ledger row once, and reports the worker's and the
server's CPU (a smoke test, not a benchmark: its numbers are not checked against targets)."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
from clitool import run_bench


def test_bench_insert_smoke(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "insert.json"
    args = ["--dsn", dsn, "--repeat", "1", "--jobs", "60", "--concurrency", "10",
            "--pgqueuer-python", "", "--quiet-wait", "0", "--json", str(out)]  # fmt: skip
    done = run_bench("bench_insert_peers.py", *args, timeout=300)
    assert "server CPU/job" in done.stdout
    runs = json.loads(out.read_text())  # label -> its runs
    assert set(runs) == {"trioq", "trioq-shared", "trioq-default", "trioq-one",
                         "trioq-one-shared"}  # fmt: skip
    for label, (run,) in runs.items():
        assert run["rows"] == run["distinct"] == run["jobs"] == 60, label
        assert run["cpu"] > 0, label
        assert run["server_cpu"] is not None and run["server_cpu"] >= 0, label  # local server
    with psycopg.connect(dsn) as conn:  # every scratch database is gone
        found = conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname LIKE 'trioq\\_insert\\_%'"
        ).fetchone()
        assert found == (0,)
