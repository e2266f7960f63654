"""Public names show their public module: ``trioq.FatalError``, not ``trioq._exceptions...``.

trio does the same (``trio._util.fixup_module_metadata``): each public module calls
`fixup_module_metadata` on its namespace once its re-exports are in place, so reprs,
tracebacks, ``help()`` and pickles name the module users import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["fixup_module_metadata"]


def fixup_module_metadata(module_name: str, namespace: Mapping[str, Any]) -> None:
    """Set ``__module__`` of every public class and function of ``namespace`` defined in a
    private ``trioq`` module to ``module_name``; methods of those classes follow."""
    seen: set[int] = set()

    def fix(qualname: str, obj: Any) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        module = getattr(obj, "__module__", None)
        if not isinstance(module, str) or not _private_trioq(module):
            return
        obj.__module__ = module_name
        if isinstance(obj, type):
            obj.__qualname__ = qualname
            for attr_name, attr in vars(obj).items():
                if not attr_name.startswith("_") and callable(attr):
                    fix(f"{qualname}.{attr_name}", attr)

    for name, obj in namespace.items():
        if not name.startswith("_") and (isinstance(obj, type) or callable(obj)):
            fix(name, obj)


def _private_trioq(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "trioq" and any(part.startswith("_") for part in parts[1:])
