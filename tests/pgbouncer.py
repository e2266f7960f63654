"""A real PgBouncer (Debian's ``/usr/sbin/pgbouncer``) in transaction mode, in front of the
suite's throwaway cluster, for tests/test_pgbouncer.py.

``.ci/run`` installs the package when it is missing. Without it the tests fail, saying so,
unless ``TRIOQ_SKIP_PGBOUNCER_TESTS=1`` (for a developer's machine). PgBouncer refuses to
run as root: as root it is started with ``-u`` the cluster's server user.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import attrs
import psycopg
from helpers import installed
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from trioq._pg.embedded import default_server_user

PGBOUNCER = pathlib.Path("/usr/sbin/pgbouncer")
SKIP_VAR = "TRIOQ_SKIP_PGBOUNCER_TESTS"
#: Bound on PgBouncer's start (it takes about 50 ms).
START_TIMEOUT = 15.0


def pgbouncer_binary() -> str:
    """The binary, or a failure that says how to get it (a skip only when asked)."""
    return installed(PGBOUNCER, skip_var=SKIP_VAR, needs="the pooling tests need PgBouncer "
                     "(apt-get install -y pgbouncer; .ci/run does this)")  # fmt: skip


@attrs.frozen
class Bouncer:
    """A running PgBouncer: ``dsn(db)`` connects through it to database ``db``."""

    host: str
    port: int
    user: str
    log: pathlib.Path

    def dsn(self, direct_dsn: str) -> str:
        """The DSN of ``direct_dsn``'s database, through this pooler."""
        params = conninfo_to_dict(direct_dsn)
        return make_conninfo(
            "", host=self.host, port=self.port, user=self.user, dbname=params["dbname"]
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ini(server: Mapping[str, object], port: int, userlist: pathlib.Path, pool_size: int) -> str:
    return f"""\
[databases]
* = host={server["host"]} port={server.get("port") or 5432}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {userlist}
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 1000
max_db_connections = 0
server_lifetime = 3600
logfile =
pidfile =
"""


@contextmanager
def running_pgbouncer(admin_dsn: str, *, pool_size: int) -> Iterator[Bouncer]:
    """PgBouncer in transaction mode before ``admin_dsn``'s server (every database), with
    ``pool_size`` server connections per database and user; stopped when the block ends."""
    binary = pgbouncer_binary()
    server = conninfo_to_dict(admin_dsn)
    user = str(server.get("user") or "postgres")
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="trioq-pgbouncer-"))
    try:
        workdir.chmod(0o755)  # the unprivileged PgBouncer reads its files here
        userlist = workdir / "userlist.txt"
        userlist.write_text(f'"{user}" ""\n')
        port = _free_port()
        ini = workdir / "pgbouncer.ini"
        ini.write_text(_ini(server, port, userlist, pool_size))
        for path in (userlist, ini):
            path.chmod(0o644)
        command = [binary]
        if os.geteuid() == 0:
            command += ["-u", default_server_user() or "postgres"]
        log = workdir / "pgbouncer.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*command, str(ini)], stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        try:
            bouncer = Bouncer(host="127.0.0.1", port=port, user=user, log=log)
            _wait_until_up(proc, bouncer, admin_dsn)
            yield bouncer
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_until_up(proc: subprocess.Popen[bytes], bouncer: Bouncer, admin_dsn: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    error: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with psycopg.connect(bouncer.dsn(admin_dsn), connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError as ex:
            error = ex
            time.sleep(0.05)
    raise RuntimeError(
        f"pgbouncer did not start (exit code {proc.poll()}, last error {error}); "
        f"its log:\n{bouncer.log.read_text(errors='replace')}"
    )
