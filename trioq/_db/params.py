"""Parameters the statements share: one array per column, and the fence of leased jobs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._job import Lease

__all__ = ["columns", "fence"]


def columns(items: Sequence[Any], **fields: str) -> dict[str, list[Any]]:
    """One parameter array per field: ``{param: [item.field for item in items]}``."""
    return {param: [getattr(item, field) for item in items] for param, field in fields.items()}


def fence(leases: Sequence[Lease]) -> dict[str, list[int]]:
    """The fence's parameters (``{fence}``, ``{fence_by_id}``): the jobs' ids, and the
    attempt of each."""
    return {
        "ids": [lease.job_id for lease in leases],
        "attempts": [lease.attempt for lease in leases],
    }
