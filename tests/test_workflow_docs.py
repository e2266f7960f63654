"""The runnable examples of docs/workflows.md, docs/durable.md, docs/producers.md,
docs/progress.md and docs/flow-control.md print what the pages say they print.

Each ```python block that ends in ``trio.run(main)`` (or ``asyncio.run(main())``, or
``main()``) is run as a script on a fresh database (``TRIOQ_DSN``; migrated first for the
pages whose examples do not migrate, as a producer's caller has), and its output is compared
with the ```console block the page shows after it."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
import trio

import trioq

DOCS = pathlib.Path(__file__).parent.parent / "docs"
#: The pages, and how many examples each has.
PAGES = {"workflows.md": 5, "durable.md": 2, "producers.md": 2, "progress.md": 1,
         "flow-control.md": 4}
#: The pages whose examples run on a migrated database.
MIGRATED = {"producers.md"}
_EXAMPLE = re.compile(
    r"```python\n((?:(?!```).)*?\n(?:trio\.run\(main\)|asyncio\.run\(main\(\)\)|main\(\))\n)```"
    r"\n\n[^\n]*\n\n```console\n(.*?)```",
    re.S,
)
EXAMPLES = {page: _EXAMPLE.findall((DOCS / page).read_text()) for page in PAGES}


@pytest.mark.parametrize("page", PAGES)
def test_the_page_has_its_examples(page: str) -> None:
    assert len(EXAMPLES[page]) == PAGES[page]


@pytest.mark.parametrize(
    ("page", "code", "output"),
    [(page, *example) for page in PAGES for example in EXAMPLES[page]],
    ids=[f"{page[:-3]}{i}" for page in PAGES for i in range(PAGES[page])],
)
def test_an_example_prints_what_the_page_says(
    dsn: str, tmp_path: pathlib.Path, page: str, code: str, output: str
) -> None:
    if page in MIGRATED:
        trio.run(_migrate, dsn)
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {"TRIOQ_DSN": dsn}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=env, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout == output


async def _migrate(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn)
