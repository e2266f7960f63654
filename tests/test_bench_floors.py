"""bench/bench_enqueue_peers.py and bench/bench_pickup_peers.py at a tiny size, with their
floors (trioq's own statements through libpq's calls on trio, `bench/peers/_libpq.py`): every
cell runs and is printed (a smoke test, not a benchmark: no number is checked against a
target, only that each was measured and that the floor's claim took its one job)."""

from __future__ import annotations

import json
from pathlib import Path

from clitool import run_bench


def test_bench_enqueue_peers_smoke_with_its_floor(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "enqueue.json"
    done = run_bench("bench_enqueue_peers.py", "--dsn", dsn, "--shapes", "1x1,1x2,10x1",
                     "--jobs", "40", "--bulk-jobs", "40", "--repeat", "1",
                     "--pgqueuer-python", str(tmp_path / "none"), "--json", str(out),
                     timeout=240)  # fmt: skip
    single, two, bulk = json.loads(out.read_text())
    for shape in (single, two):
        assert {"trioq", "floor"} <= set(shape["medians"])
        for label in ("trioq", "floor"):
            assert shape["medians"][label]["jobs_per_s"] > 0, label
            assert shape["medians"][label]["cpu_us"] > 0, label
    assert "floor" not in bulk["medians"]  # one job per call only
    assert "of the floor" in done.stdout


def test_bench_pickup_peers_smoke_with_its_floor(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "pickup.json"
    done = run_bench("bench_pickup_peers.py", "--dsn", dsn, "--jobs", "15", "--gap", "5",
                     "--repeat", "1", "--quiet-wait", "0",
                     "--pgqueuer-python", str(tmp_path / "none"), "--json", str(out),
                     timeout=240)  # fmt: skip
    medians = json.loads(out.read_text())["medians"]
    assert set(medians) == {"trioq", "floor"}
    for label, cell in medians.items():
        assert 0 < cell["p50"] <= cell["p99"] <= cell["max"], label
        assert label in done.stdout
