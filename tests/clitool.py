"""Running the real ``trioq`` command line from the tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without a DSN (so a test's ``--dsn`` or ``extra`` is what counts)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRIOQ_DSN", "DATABASE_URL")}
    env.update(extra or {})
    return env


def trioq_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m trioq._cli ARGS``, run in tests/ (so ``--app serve_app:config`` imports)."""
    return subprocess.run(
        [sys.executable, "-m", "trioq._cli", *args],
        capture_output=True,
        text=True,
        env=cli_env(env),
        cwd=TESTS,
        timeout=timeout,
        check=False,
    )
