"""``--failover-at``: a primary and a synchronous standby of the run's own, and the failover.

A failover needs a second server, which the embedded one is not, so a run with
``--failover-at`` makes its own pair from the embedded binaries in a scratch directory
(removed at the end): a primary, and a standby streaming from it with synchronous
replication (``synchronous_standby_names = '*'``), so that what the primary acknowledged is
on the standby. The driver and the workers connect with one multi-host DSN
(``host=primary,standby target_session_attrs=read-write``), as an application behind a
failover would. At S s the primary's postmaster is SIGKILLed and the standby promoted
(``pg_promote``); the fault ends when the new primary takes writes. What asynchronous
replication can lose is written down in docs/faults.md (scenario 9).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import psycopg
import trio
from psycopg.conninfo import make_conninfo

from .._pg.embedded import EmbeddedPostgres, default_server_user
from .chaos import ChaosLog
from .cpu import ServerMeter
from .faults import Fault

__all__ = ["Pair", "failover_at", "replicated_pair"]

#: How long the standby may take to stream synchronously, and a promotion to finish.
READY_TIMEOUT = 60.0
#: The pair's ports (each server has its own socket directory; these only name the sockets).
PRIMARY_PORT, STANDBY_PORT = 5481, 5482
#: Both servers' (a standby must allow at least as many as its primary).
MAX_CONNECTIONS = 200


@attrs.frozen
class Pair:
    """The primary (an embedded server) and its standby (a postgres process)."""

    primary: EmbeddedPostgres
    standby_dir: Path
    standby: subprocess.Popen[bytes]
    database: str

    def dsn(self, which: str = "both") -> str:
        """A DSN for ``primary``, ``standby``, or ``both`` (whichever takes writes)."""
        hosts = {"primary": [(self.primary.data_dir, PRIMARY_PORT)],
                 "standby": [(self.standby_dir, STANDBY_PORT)],
                 "both": [(self.primary.data_dir, PRIMARY_PORT),
                          (self.standby_dir, STANDBY_PORT)]}[which]  # fmt: skip
        params: dict[str, Any] = {
            "host": ",".join(str(d) for d, _ in hosts),
            "port": ",".join(str(p) for _, p in hosts),
            "user": "postgres",
            "dbname": self.database,
        }
        if which == "both":
            params["target_session_attrs"] = "read-write"
        return make_conninfo("", **params)

    def primary_pid(self) -> int:
        return int((self.primary.data_dir / "postmaster.pid").read_text().split()[0])


def _as_server(cmd: list[str]) -> None:
    done = subprocess.run(cmd, user=default_server_user(), capture_output=True, timeout=120,
                          check=False)  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"{cmd[0]} failed: {done.stderr.decode(errors='replace')[-2000:]}")


@contextlib.contextmanager
def replicated_pair(base: EmbeddedPostgres) -> Iterator[Pair]:
    """A primary (``base`` in a scratch directory: its binaries, account and durability)
    and a standby streaming from it synchronously; the directory is removed at the end.
    Call from the main thread (`EmbeddedPostgres.running`)."""
    workdir = Path(tempfile.mkdtemp(prefix="trioq-failover-"))
    standby: subprocess.Popen[bytes] | None = None
    user = default_server_user()
    if user is not None:
        shutil.chown(workdir, user, user)
    try:
        durable = base.durable
        primary = attrs.evolve(
            base, data_dir=workdir / "primary", port=PRIMARY_PORT, socket_dir=None,
            settings={"synchronous_standby_names": "*", "synchronous_commit": "on",
                      "wal_level": "replica", "max_wal_senders": "5",
                      "wal_sender_timeout": "5s",
                      "max_connections": str(MAX_CONNECTIONS)},
        )  # fmt: skip
        primary.ensure_initialized()
        with primary.running():
            standby_dir = workdir / "standby"
            standby_dir.mkdir(mode=0o700)
            if user is not None:
                shutil.chown(standby_dir, user, user)
            server_bin = primary.bin_dir
            _as_server([str(server_bin / "pg_basebackup"), "-D", str(standby_dir), "-R",
                        "-X", "stream", "--checkpoint=fast", "-h", str(primary.data_dir),
                        "-p", str(PRIMARY_PORT), "-U", "postgres"])  # fmt: skip
            with (standby_dir / "server.log").open("ab") as log:
                standby = subprocess.Popen(
                    [str(server_bin / "postgres"), "-D", str(standby_dir), "-p",
                     str(STANDBY_PORT), "-c", "listen_addresses=",
                     "-c", f"unix_socket_directories={standby_dir}", "-c", "hot_standby=on",
                     "-c", f"max_connections={MAX_CONNECTIONS}",
                     "-c", f"fsync={'on' if durable else 'off'}"],
                    user=user, stdout=log, stderr=log,
                )  # fmt: skip
            pair = Pair(primary, standby_dir, standby, primary.database)
            _wait_streaming(pair)
            yield pair
    finally:
        if standby is not None:
            standby.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                standby.wait(30)
            if standby.poll() is None:
                standby.kill()
                standby.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_streaming(pair: Pair) -> None:
    query = "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
    deadline = time.monotonic() + READY_TIMEOUT
    with psycopg.connect(pair.dsn("primary"), autocommit=True) as conn:
        while (conn.execute(query).fetchone() or (0,))[0] < 1:
            if time.monotonic() > deadline or pair.standby.poll() is not None:
                log = (pair.standby_dir / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the standby did not stream synchronously: {log}")
            time.sleep(0.05)


def _promote(pair: Pair) -> None:
    with psycopg.connect(pair.dsn("standby"), autocommit=True, connect_timeout=10) as conn:
        conn.execute("SELECT pg_promote(wait => true, wait_seconds => %s)", (int(READY_TIMEOUT),))


async def failover_at(
    at: float, pair: Pair, log: ChaosLog, done: trio.Event, meter: ServerMeter
) -> None:
    """SIGKILL the primary ``at`` seconds into the workload and promote the standby; the
    server's CPU (``meter``) is followed on the new primary from then on."""
    try:
        await trio.sleep(at)
        log.note("failover: SIGKILL to the primary")
        started = time.time()
        meter.before_restart()
        os.kill(pair.primary_pid(), signal.SIGKILL)
        await trio.to_thread.run_sync(_promote, pair)
        meter.after_restart(pair.standby.pid)
        ended = time.time()
        log.note(f"failover: the standby promoted {ended - started:.2f} s after the kill")
        detail = f"primary SIGKILLed, standby promoted: {ended - started:.2f} s"
        log.fault(Fault(kind="failover", started=started, ended=ended, detail=detail))
    finally:
        done.set()
