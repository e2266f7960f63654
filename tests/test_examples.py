"""The example app's own test suite (examples/shop, on trioq.testing) passes, run the way its
users would run theirs: ``python -m pytest`` in its directory, with its own pytest config
(pytest-trio, the trioq.testing.pytest plugin) and its own throwaway Postgres."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SHOP = Path(__file__).parent.parent / "examples" / "shop"
SHOP_TESTS = 8


def test_the_shop_examples_suite_passes() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=SHOP, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    report = out.stdout + out.stderr
    assert out.returncode == 0, report
    summary = re.search(r"^(\d+) passed", report.splitlines()[-1])
    assert summary is not None, report
    assert int(summary[1]) == SHOP_TESTS, report
