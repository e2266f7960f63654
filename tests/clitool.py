"""Running the real ``trioq`` command line from the tests."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TESTS = Path(__file__).parent


def cli_env(
    extra: dict[str, str] | None = None, *, dsn: str | None = None, apps: bool = False
) -> dict[str, str]:
    """This environment without a DSN (so a test's ``--dsn``, ``dsn`` or ``extra`` is what
    counts): ``dsn`` is given as ``TRIOQ_DSN``; with ``apps``, tests/ is first on the
    ``PYTHONPATH`` (so ``--app web_app:config`` imports in any directory, and in workers)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRIOQ_DSN", "DATABASE_URL")}
    if dsn is not None:
        env["TRIOQ_DSN"] = dsn
    if apps:
        env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    env.update(extra or {})
    return env


def run_bench(script: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``python bench/SCRIPT ARGS`` (a smoke test of a benchmark), which must exit 0: its
    output and errors are in the failure."""
    done = subprocess.run(
        [sys.executable, str(TESTS.parent / "bench" / script), *args],
        capture_output=True, text=True, timeout=timeout, env=cli_env(), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


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


def read_until(
    proc: subprocess.Popen[Any], text: str, *, times: int = 1, timeout: float = 30
) -> None:
    """Read ``proc``'s stdout until ``text`` has appeared ``times`` times (bounded; raw reads,
    so what is read is not buffered away from the next call's wait)."""
    assert proc.stdout is not None
    fd, seen, wanted = proc.stdout.fileno(), b"", text.encode()
    deadline = time.monotonic() + timeout
    while seen.count(wanted) < times:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"{text!r} not seen {times} times: {seen.decode(errors='replace')}"
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, f"exited before printing {text!r}: {seen.decode(errors='replace')}"
            seen += chunk


class ServeProcess:
    """A ``trioq serve ARGS`` process run in tests/, whose stderr (its log) is read line by
    line with bounded waits (`read_until`); `stop` sends SIGTERM and returns the whole log."""

    def __init__(self, args: list[str], *, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trioq._cli", "serve", *args],
            env=env if env is not None else cli_env(), cwd=TESTS, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, bufsize=0,
        )  # fmt: skip
        self.lines: list[str] = []
        self._partial = b""

    def read_until(self, text: str, timeout: float = 30) -> str:
        """The first line (read so far or from now on) containing ``text``."""
        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if text in line:
                    return line
            seen = len(self.lines)
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{text!r} not logged:\n" + "".join(self.lines)
            fd = self.proc.stderr.fileno()
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:  # raw reads: a buffered readline would hide lines from select
                chunk = os.read(fd, 65536)
                assert chunk, f"exited before logging {text!r}:\n" + "".join(self.lines)
                *complete, self._partial = (self._partial + chunk).split(b"\n")
                self.lines.extend(line.decode() + "\n" for line in complete)

    def stop(self, timeout: float = 30) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, rest = self.proc.communicate(timeout=timeout)
        text = (self._partial + rest).decode()
        self._partial = b""
        self.lines.extend(text.splitlines(keepends=True))
        return "".join(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=30)
