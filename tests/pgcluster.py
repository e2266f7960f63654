"""Throwaway Postgres clusters for the test suite.

A pytest session gets its own cluster: initdb runs once per PostgreSQL version into a cache
(``$XDG_CACHE_HOME/trioq-test``, or ``/var/lib/trioq/test-cache`` as root), and each session
copies that template (``cp -a``, ~40 MB) into a fresh temp dir and starts it with durability off.
The server is a child of pytest with PR_SET_PDEATHSIG, so a killed pytest leaves no server
behind (only its temp dir). Set ``TRIOQ_TEST_DSN`` to use an existing server instead.

In ``conftest.py``::

    @pytest.fixture(scope="session")
    def admin_dsn() -> Iterator[str]:
        with pgcluster.session_cluster() as dsn:
            yield dsn
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from trioq._embedded import (
    ROOT_STATE_DIR,
    EmbeddedPostgres,
    binary_version,
    default_server_user,
    find_bin_dir,
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

TEMPLATE_FORMAT = 1  # bump when the template's initdb options change
SESSION_SETTINGS = {"max_connections": "200"}
SCRATCH_PREFIX = "trioq-pg-"
STALE_AFTER = 3600.0
TMPFS = "/dev/shm"
TMPFS_MIN_FREE = 2 * 2**30  # Docker's default /dev/shm is 64 MB: too small, use the disk


@contextmanager
def session_cluster() -> Iterator[str]:
    """Yield the admin DSN (database ``postgres``) of a cluster that lives for the block."""
    dsn = os.environ.get("TRIOQ_TEST_DSN")
    if dsn:
        yield dsn
        return
    sweep_stale_scratch()
    workdir = scratch_dir()
    try:
        cluster = copy_cluster(template_cluster(), workdir / "data")
        cluster = attrs.evolve(cluster, database="postgres", settings=SESSION_SETTINGS)
        with cluster.running() as status:
            yield status.dsn
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def scratch_dir(prefix: str = SCRATCH_PREFIX) -> Path:
    """A fresh temp dir for a throwaway cluster, mode 0711 so the server user can traverse it
    (pytest's tmp dirs are 0700 under root).

    It is on tmpfs (/dev/shm) when that has room: copying the template to a VM disk was measured
    10x slower (1.4 s vs 0.13 s). ``$TRIOQ_TEST_TMPDIR`` overrides the location.
    """
    root = os.environ.get("TRIOQ_TEST_TMPDIR") or _tmpfs_with_room()
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    path.chmod(0o711)
    return path


def sweep_stale_scratch(max_age: float = STALE_AFTER) -> None:
    """Delete our scratch dirs left by killed sessions: older than ``max_age`` seconds and with
    no live postmaster (on tmpfs they would hold RAM until reboot)."""
    root = Path(os.environ.get("TRIOQ_TEST_TMPDIR") or _tmpfs_with_room() or tempfile.gettempdir())
    for path in root.glob(f"{SCRATCH_PREFIX}*"):
        try:
            info = path.lstat()
        except OSError:
            continue
        if info.st_uid != os.geteuid() or time.time() - info.st_mtime < max_age:
            continue
        pid_files = [*path.glob("*/postmaster.pid"), *path.glob("*/*/postmaster.pid")]
        if not any(_alive(pid_file) for pid_file in pid_files):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text().split()[0]), 0)
    except PermissionError:
        return True  # someone else's live process
    except (OSError, ValueError, IndexError):
        return False  # no such process, or no readable pid
    return True


def _tmpfs_with_room() -> str | None:
    try:
        fs = os.statvfs(TMPFS)
    except OSError:
        return None
    roomy = fs.f_bavail * fs.f_frsize >= TMPFS_MIN_FREE
    return TMPFS if roomy and os.access(TMPFS, os.W_OK | os.X_OK) else None


def template_cluster() -> EmbeddedPostgres:
    """The initialized, never started template cluster for this PostgreSQL version."""
    bin_dir = find_bin_dir()
    cache = _cache_root() / f"initdb-{binary_version(bin_dir)}-v{TEMPLATE_FORMAT}"
    template = EmbeddedPostgres(
        data_dir=cache, bin_dir=bin_dir, run_as=default_server_user(), durable=False
    )
    template.ensure_initialized()  # atomic: racing sessions are fine
    return template


def copy_cluster(template: EmbeddedPostgres, data_dir: Path) -> EmbeddedPostgres:
    """Copy ``template``'s data dir (keeping ownership) to ``data_dir``, whose parent must be
    traversable by the server user."""
    subprocess.run(["cp", "-a", str(template.data_dir), str(data_dir)], check=True)
    return attrs.evolve(template, data_dir=data_dir)


def create_database(admin_dsn: str, name: str, *, template: str | None = None) -> str:
    """Create database ``name`` (optionally from ``template``) and return its DSN."""
    query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        query += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(query)
    return make_conninfo(admin_dsn, dbname=name)


def drop_database(admin_dsn: str, name: str) -> None:
    """Drop database ``name`` if it exists, disconnecting its sessions."""
    query = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(query)


def _cache_root() -> Path:
    if os.geteuid() == 0:
        return ROOT_STATE_DIR / "test-cache"
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "trioq-test"
