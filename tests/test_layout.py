"""The layout holds: no import cycle in the package, the library apart from its tools, and
public names that report their public module.

Imports are read from the source (every ``import`` statement, at module level or inside
a function or an ``if TYPE_CHECKING:`` block), so a cycle hidden in a function-level
import counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import trioq
import trioq.pg
import trioq.retry

PACKAGE = Path(trioq.__file__).parent
#: Tools built on the library: no library module may import them.
TOOLS = ("trioq._cli", "trioq._stress", "trioq.examples")


def module_name(path: Path) -> str:
    parts = ["trioq", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The trioq modules ``name`` imports (``from x import y`` counts ``x.y`` if it is one)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {module for module in found if module in known and module != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports(name, path, known) for name, path in mods.items()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the list of modules around it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def test_the_walk_sees_the_imports() -> None:
    edges = graph()
    assert "trioq._db.insert" in edges["trioq._queue"]
    assert "trioq._cli.serve" in edges["trioq._cli.main"]  # relative, inside a subpackage
    assert "trioq._worker.serve" in edges["trioq._cli.serve"]  # a function-level import
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle() -> None:
    assert cycle(graph()) is None


def test_the_library_never_imports_its_tools() -> None:
    for name, deps in graph().items():
        if name.startswith(TOOLS):
            continue
        tools = sorted(dep for dep in deps if dep.startswith(TOOLS))
        assert not tools, f"{name} imports {tools}"


def test_public_names_report_their_public_module() -> None:
    for module in (trioq, trioq.pg, trioq.retry):
        for name in dir(module):
            obj = getattr(module, name)
            if name.startswith("_") or not (isinstance(obj, type) or callable(obj)):
                continue
            owner = getattr(obj, "__module__", "")
            if owner.startswith("trioq"):
                assert owner in ("trioq", "trioq.pg", "trioq.retry"), (module.__name__, name)
    assert repr(trioq.FatalError("x")) == "FatalError('x')"
    assert f"{trioq.FatalError.__module__}.{trioq.FatalError.__qualname__}" == "trioq.FatalError"
    assert trioq.pg.Pool.__module__ == "trioq.pg"
    assert trioq.retry.Sidekiq.__module__ == "trioq.retry"
    assert trioq.enqueue.__module__ == "trioq" and trioq.enqueue.__qualname__ == "enqueue"
