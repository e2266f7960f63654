"""The layout holds: no import cycle in the package, the wings stand on what is below them,
only the wiring imports the services, the library apart from its tools, public names that
report their public module, and maps (``docs/architecture.md``, the layout note of
``trioq/__init__.py``) that name every module.

Imports are read from the source (every ``import`` statement, at module level or inside
a function or an ``if TYPE_CHECKING:`` block), so a cycle hidden in a function-level
import counts too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import trioq
import trioq.pg
import trioq.retry

PACKAGE = Path(trioq.__file__).parent
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
#: Tools built on the library: no library module may import them.
TOOLS = ("trioq._cli", "trioq._stress", "trioq.examples", "trioq.web", "trioq.testing")
#: The wings, and what each of them must not import.
WINGS = {
    "trioq._pg": ("trioq._db", "trioq._worker", "trioq._obs"),
    "trioq._db": ("trioq._worker", "trioq._obs"),
}
SERVICES = "trioq._worker.services"
WIRING = "trioq._worker.wiring"


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
            names = [f"{base}.{alias.name}" for alias in node.names]
            found.update(names)
            # ``from pkg import name`` needs pkg's __init__, unless every name is a module of
            # pkg and pkg encloses this module (it is imported first anyway: ``from . import
            # _queries`` in trioq/web/ is no edge to trioq.web).
            if not (all(n in known for n in names) and name.startswith(base + ".")):
                found.add(base)
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
    assert "trioq._worker.services.heartbeat" in edges[WIRING]
    assert "trioq._pg.conn" in edges["trioq._db.insert"]
    # `from . import _queries` inside trioq/web/: an edge to the module, not to the package
    assert "trioq.web._queries" in edges["trioq.web._app"]
    assert "trioq.web" not in edges["trioq.web._app"]
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


def test_the_wings_stand_on_what_is_below_them() -> None:
    for name, deps in graph().items():
        for wing, below in WINGS.items():
            if name == wing or name.startswith(wing + "."):
                wrong = sorted(dep for dep in deps if dep.startswith(below))
                assert not wrong, f"{name} imports {wrong}"


def test_only_the_wiring_imports_the_services() -> None:
    for name, deps in graph().items():
        if name in (WIRING, SERVICES) or name.startswith(SERVICES + "."):
            continue
        services = sorted(dep for dep in deps if dep.startswith(SERVICES + "."))
        assert not services, f"{name} imports {services}"


def drawn_files(text: str) -> set[str]:
    """The files the module map of ``docs/architecture.md`` draws, as paths in the package
    (``_worker/services/loop.py``): each ``|- name`` line at its depth, directories ending
    with ``/``."""
    block = text.split("```\ntrioq/\n", 1)[1].split("```", 1)[0]
    files: set[str] = set()
    folders: list[str] = []
    for line in block.splitlines():
        found = re.match(r"^ ((?:\|   )*)\|- (\S+)", line)
        if found is None:
            continue
        depth = len(found.group(1)) // 4
        name = found.group(2).rstrip(",")
        del folders[depth:]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        else:
            files.update("/".join([*folders, part]) for part in name.split(","))
    return files


def test_the_module_map_draws_every_file_of_the_package() -> None:
    files = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")}
    drawn = drawn_files(ARCHITECTURE.read_text())
    assert "_worker/services/loop.py" in drawn and "pg.py" in drawn  # the parse works
    assert sorted(files - drawn) == [], "files missing from docs/architecture.md"
    assert sorted(drawn - files) == [], "docs/architecture.md draws files that do not exist"


def noted_modules(note: str) -> set[str]:
    """The modules the layout note of ``trioq/__init__.py`` names: in each bullet that opens
    with a folder (````_worker/services/``:``), every ````name```` after it."""
    names: set[str] = set()
    for bullet in re.split(r"\n- ", note):
        head = re.match(r"``(\w+(?:/\w+)*)/``", bullet)
        if head is None:
            continue
        folder = head.group(1).replace("/", ".")
        body = bullet[head.end():]
        names.update(f"{folder}.{name}" for name in re.findall(r"``(\w+)``", body))
    return names


def test_the_layout_note_names_every_library_module() -> None:
    library = {
        name.removeprefix("trioq.") for name in graph()
        if name != "trioq" and not name.startswith(TOOLS) and name.count(".") >= 1
        and not (PACKAGE / name.removeprefix("trioq.").replace(".", "/")).is_dir()
    }  # fmt: skip
    noted = {name.removeprefix("trioq.") for name in noted_modules(trioq.__doc__ or "")}
    flat = {name for name in library if "." not in name}
    assert "_worker.services.loop" in noted and "_job" in noted  # the parse works
    faces = {"pg", "retry", "producer", "_metadata", "_exceptions", "_trio_api"}
    assert sorted(library - noted - faces) == [], "modules missing from the layout note"
    assert sorted(noted - library) == [], "the layout note names modules that do not exist"
    assert flat - faces <= noted


def test_the_limited_claim_returns_jobs_by_the_names_of_jobs_row() -> None:
    """The plain claim's columns are composed from `CLAIMED_COLUMNS` (checked at import);
    the limited claim is PL/pgSQL of migration 6: its RETURNS TABLE must name the same
    columns, in the same order, before its own two."""
    migration = (PACKAGE / "_db" / "migrations" / "0006_flow_control.sql").read_text()
    returns = migration.split("CREATE FUNCTION claim_limited", 1)[1].split("RETURNS TABLE (", 1)[1]
    columns = [part.split()[0] for part in returns.split(")", 1)[0].split(",")]
    assert columns == [*trioq.Job.COLUMNS, "reason", "retry_in"]


def test_the_docs_name_files_and_modules_that_exist() -> None:
    """Every ``trioq/...`` path in the docs is a file or folder of the package, and every
    ``trioq._x.y`` a module or one of its attributes (the maps cannot drift again)."""
    root = PACKAGE.parent
    pages = [*sorted((root / "docs").glob("*.md")), root / "README.md",
             root / "bench" / "README.md"]  # fmt: skip
    paths: set[str] = set()
    dotted: set[str] = set()
    for page in pages:
        text = page.read_text()
        # the package's files (not data directories such as ~/.local/share/trioq/pg18)
        paths.update(re.findall(r"(?<![\w/.-])trioq/[\w/]*\w(?:\.py|\.sql)?/?", text))
        dotted.update(re.findall(r"\btrioq\._[\w.]*\w", text))
    assert "trioq/_db/sql/leases.py" in paths and "trioq._db.statements.rendered" in dotted
    missing = sorted(p for p in paths
                     if not (root / p.rstrip("/")).exists() and "NNNN" not in p)  # fmt: skip
    assert missing == [], "the docs name files that do not exist"
    unresolved = sorted(name for name in dotted if not _resolves(name))
    assert unresolved == [], "the docs name modules or attributes that do not exist"


def _resolves(name: str) -> bool:
    import importlib

    parts = name.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False
