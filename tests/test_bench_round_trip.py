"""bench/bench_round_trip.py at a tiny size: every driver's round trip and trio's primitives
are measured and printed, with the backend's CPU for each round trip (a smoke test, not a
benchmark: its numbers are not checked against targets, only that each was measured)."""

from __future__ import annotations

import json
from pathlib import Path

from clitool import run_bench


def test_bench_round_trip_smoke(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "round_trip.json"
    done = run_bench("bench_round_trip.py", "--dsn", dsn, "--calls", "50", "--repeat", "1",
                     "--json", str(out), timeout=120)  # fmt: skip
    medians = json.loads(out.read_text())["medians"]
    assert set(medians) == {
        "libpq exec", "psycopg sync", "psycopg asyncio", "trioq execute",
        "trioq sync (runs nothing)", "trioq pipelined insert",
        "trioq member (savepoint, fence, insert)", "trio checkpoint",
        "trio checkpoint in a cancel scope with a deadline", "trio lock, uncontended",
    }  # fmt: skip
    for label, cell in medians.items():
        assert cell["cpu_us"] > 0 and cell["wall_us"] > 0, label
        assert label in done.stdout
        if not label.startswith("trio "):  # a round trip: its backend's CPU, read locally
            assert cell["server_us"] >= 0, label
