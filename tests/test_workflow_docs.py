"""The runnable examples of docs/workflows.md print what the page says they print.

Each ```python block that ends in ``trio.run(main)`` is run as a script on a fresh database
(``TRIOQ_DSN``), and its output is compared with the ```console block the page shows
after it."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

PAGE = pathlib.Path(__file__).parent.parent / "docs" / "workflows.md"
_EXAMPLE = re.compile(
    r"```python\n((?:(?!```).)*?trio\.run\(main\)\n)```\n\n[^\n]*\n\n```console\n(.*?)```", re.S
)
EXAMPLES = _EXAMPLE.findall(PAGE.read_text())


def test_the_page_has_its_examples() -> None:
    assert len(EXAMPLES) == 5


@pytest.mark.parametrize(("code", "output"), EXAMPLES, ids=[f"example{i}" for i in range(5)])
def test_an_example_prints_what_the_page_says(
    dsn: str, tmp_path: pathlib.Path, code: str, output: str
) -> None:
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {"TRIOQ_DSN": dsn}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=env, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout == output
