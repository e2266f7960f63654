"""Throwaway Postgres clusters for the test suite: the ones `trioq.testing` gives users
(``trioq/testing/_postgres.py``), so the suite and users' tests share one launcher."""

from __future__ import annotations

from trioq.testing._postgres import (
    copy_cluster,
    create_database,
    drop_database,
    scratch_dir,
    session_cluster,
    sweep_stale_scratch,
    template_cluster,
)

__all__ = [
    "copy_cluster",
    "create_database",
    "drop_database",
    "scratch_dir",
    "session_cluster",
    "sweep_stale_scratch",
    "template_cluster",
]
