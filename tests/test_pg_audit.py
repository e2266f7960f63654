"""Source audit: fail loudly if psycopg moves its asyncio touch points.

trioq.pg relies on psycopg reaching I/O only through ``conn.lock`` and
``conn.wait()`` (and a few methods trioq overrides). If a new psycopg release
adds an asyncio call somewhere else, this test names it.
"""

from __future__ import annotations

import ast
import inspect
import pathlib

import psycopg

from trioq.pg import TrioConnection

ASYNCIO_MARKERS = (
    "asyncio",
    "wait_async",
    "wait_conn_async",
    "conninfo_attempts_async",
    "ALock",
    "AQueue",
    "AWorker",
    "AEvent",
    "ACondition",
    "aspawn",
    "agather",
    "asleep",
    "_INTERRUPTED",
)

# Every function in psycopg's async modules that touches asyncio, and why that is safe.
KNOWN = {
    # overridden by TrioConnection
    ("connection_async", "AsyncConnection.__init__"): "overridden",
    ("connection_async", "AsyncConnection.connect"): "overridden",
    ("connection_async", "AsyncConnection.cancel_safe"): "overridden",
    ("connection_async", "AsyncConnection.wait"): "overridden",
    # COPY's queued writer spawns tasks; trioq never selects it (default writer is used)
    ("_copy_async", "AsyncQueuedLibpqWriter.__init__"): "unused writer",
    ("_copy_async", "AsyncQueuedLibpqWriter.write"): "unused writer",
    ("_copy_async", "AsyncQueuedLibpqWriter.finish"): "unused writer",
}

ASYNC_MODULES = (
    "connection_async",
    "cursor_async",
    "_server_cursor_async",
    "_copy_async",
    "_pipeline_async",
    "transaction",
    "_typeinfo",
    "raw_cursor",
    "client_cursor",
)


def _touch_points(module: str) -> set[tuple[str, str]]:
    path = pathlib.Path(psycopg.__file__).parent / f"{module}.py"
    tree = ast.parse(path.read_text())
    found: set[tuple[str, str]] = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                src = ast.get_source_segment(path.read_text(), child) or ""
                if any(marker in src for marker in ASYNCIO_MARKERS):
                    found.add((module, f"{prefix}{child.name}"))

    visit(tree, "")
    return found


def test_psycopg_asyncio_touch_points_are_known() -> None:
    found: set[tuple[str, str]] = set()
    for module in ASYNC_MODULES:
        found |= _touch_points(module)
    unknown = found - set(KNOWN)
    assert not unknown, f"psycopg touches asyncio in new places: {sorted(unknown)}"
    # Anything marked overridden really is.
    for (_module, qualname), why in KNOWN.items():
        if why == "overridden":
            name = qualname.split(".", 1)[1]
            assert name in vars(TrioConnection), f"TrioConnection must override {name}"


def test_known_touch_points_still_exist() -> None:
    """A stale entry means psycopg changed shape here: re-read it before trusting the list."""
    found: set[tuple[str, str]] = set()
    for module in ASYNC_MODULES:
        found |= _touch_points(module)
    assert set(KNOWN) - found == set()


def test_lock_type_is_replaced() -> None:
    import trioq.pg

    assert "ALock" in inspect.getsource(psycopg.AsyncConnection.__init__)
    assert "ConnectionLock()" in inspect.getsource(TrioConnection.__init__)
    assert trioq.pg.ConnectionLock.__aenter__ is not None
