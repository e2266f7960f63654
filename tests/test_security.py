"""Security (issue #6): passwords never leak, args are JSON only, SQL is parameterised.

- A DSN's password appears in no output of any command: stdout, stderr, ``--json``, and
  the logs of ``trioq serve``, against a server that rejects it (a private cluster with
  scram-sha-256 authentication) and one that accepts it (the session cluster, trust).
- ``trioq serve --processes N`` passes the DSN to its workers in their environment, never
  on their command lines (readable by every local user in /proc).
- A static audit of ``trioq/``: no pickle, marshal, eval or exec; no SQL text built with
  f-strings, ``%`` or ``str.format``; ``sql.SQL`` is only given constant text.
- Schema names are validated (errors name ``schema``) before they reach SQL, where they
  are quoted with ``sql.Identifier``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
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
from clitool import ServeProcess, cli_env, trioq_cli
from helpers import poll_query
from pgcluster import copy_cluster, scratch_dir, template_cluster
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import trioq
from trioq._cli.serve import RedactingFormatter
from trioq._pg.errors import check_dsn, dsn_secrets, redact, redact_dsn

TESTS = Path(__file__).parent
PACKAGE = TESTS.parent / "trioq"
#: Distinctive, so a hit cannot be a coincidence; '@' and '/' exercise URL quoting.
PASSWORD = "SeCrEt-p4ss@w/rd"
RIGHT_PASSWORD = "R1ght-only-f0r-the-fixture"
READY_TIMEOUT = 60.0


# -- a server that checks passwords ---------------------------------------------------------------


@pytest.fixture(scope="module")
def scram_dsn() -> Iterator[str]:
    """A private cluster that requires scram-sha-256; the DSN carries no password."""
    workdir = scratch_dir()
    try:
        cluster = copy_cluster(template_cluster(), workdir / "data")
        cluster = attrs.evolve(cluster, database="postgres")
        with cluster.running() as status:
            with psycopg.connect(status.dsn, autocommit=True) as conn:
                conn.execute(
                    psycopg.sql.SQL("ALTER ROLE current_user PASSWORD {}").format(
                        psycopg.sql.Literal(RIGHT_PASSWORD)
                    )
                )
                hba = Path(str(conn.execute("SHOW hba_file").fetchone()[0]))  # type: ignore[index]
                hba.write_text("local all all scram-sha-256\n")
                conn.execute("SELECT pg_reload_conf()")
            _wait_for_password_check(status.dsn)
            yield status.dsn
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_for_password_check(dsn: str) -> None:
    """pg_reload_conf() signals the postmaster: poll (bounded) until it asks for passwords."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        try:
            psycopg.connect(dsn).close()
        except psycopg.OperationalError:
            return
        time.sleep(0.05)
    raise AssertionError("the cluster never started checking passwords")


def assert_no_password(*texts: str, password: str = PASSWORD) -> None:
    from urllib.parse import quote

    for text in texts:
        assert password not in text
        assert quote(password, safe="") not in text
        assert "p4ss" not in text  # any fragment of it


COMMANDS = [
    ["migrate"],
    ["migrate", "--json"],
    ["status"],
    ["status", "--json"],
    ["enqueue", "t", "--json"],
    ["cancel", "1", "--json"],
    ["dead", "list", "--json"],
    ["dead", "retry", "--all", "--json"],
    ["jobs", "show", "1", "--json"],
    ["jobs", "list", "--json"],
    ["cron", "list", "--json"],
    ["status", "--watch", "--count", "1", "--json"],
    ["demo", "--json"],
    ["serve", "--app", "serve_app:config"],
]


# -- (a) a server that rejects the password ------------------------------------------------------


async def test_wrong_password_is_a_connect_error_without_the_password(scram_dsn: str) -> None:
    with pytest.raises(trioq.ConnectError) as info:
        await trioq.connect(make_conninfo(scram_dsn, password=PASSWORD))
    message = str(info.value)
    assert message.startswith(f"cannot connect to {redact_dsn(scram_dsn)}: ")
    assert "password authentication failed for user" in message
    assert_no_password(message, repr(info.value))
    async with await trioq.connect(make_conninfo(scram_dsn, password=RIGHT_PASSWORD)):
        pass  # the right one works: the failure above was the password


REJECTED_CASES = [
    *[pytest.param(command, "--dsn", id=f"{' '.join(command)} --dsn") for command in COMMANDS],
    *[
        pytest.param(command, var, id=f"{' '.join(command)} ${var}")
        for command in (["status", "--json"], ["serve", "--app", "serve_app:config"])
        for var in ("TRIOQ_DSN", "DATABASE_URL")
    ],
]


@pytest.mark.parametrize(("command", "how"), REJECTED_CASES)
def test_rejected_password_never_printed(scram_dsn: str, command: list[str], how: str) -> None:
    dsn = make_conninfo(scram_dsn, password=PASSWORD)
    if how == "--dsn":
        out = trioq_cli(*command, "--dsn", dsn)
    else:
        out = trioq_cli(*command, env={how: dsn})
    assert out.returncode == 1, out.stderr
    assert "password authentication failed" in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("trioq: error: cannot connect to ")
    assert "Traceback" not in out.stderr
    assert_no_password(out.stdout, out.stderr)


def test_check_never_prints_the_password(scram_dsn: str, dsn_with_password: str) -> None:
    """``trioq check`` reports a rejected password as unreachable (exit 1), an accepted one
    as ok, text or JSON, and shows the database without the password either way."""
    rejected = make_conninfo(scram_dsn, password=PASSWORD)
    outputs = []
    for dsn, code in ((rejected, 1), (dsn_with_password, 3), (dsn_with_password, 0)):
        if code == 0:
            assert trioq_cli("migrate", "--dsn", dsn).returncode == 0
        for extra in ([], ["--json"]):
            out = trioq_cli("check", "--dsn", dsn, *extra)
            assert out.returncode == code, (code, out.stderr)
            outputs += [out.stdout, out.stderr]
    assert "password authentication failed" in "".join(outputs)
    assert_no_password(*outputs)


def test_json_logs_and_the_banner_never_show_the_password(dsn_with_password: str) -> None:
    dsn = dsn_with_password
    assert trioq_cli("migrate", "--dsn", dsn).returncode == 0
    worker = ServeProcess(["--app", "serve_app:config", "--dsn", dsn, "--log-format", "json",
                           "--metrics", "127.0.0.1:0"])  # fmt: skip
    try:
        line = worker.read_until('"schema_version"')  # the banner: the worker is ready
        log = worker.stop()
    finally:
        worker.kill()
    assert worker.proc.returncode == 0, log
    assert json.loads(line)["database"] == redact_dsn(dsn)
    assert_no_password(log)


def test_rejected_password_in_a_url_never_printed(scram_dsn: str) -> None:
    """The URL form, with the password %-quoted (it has '@' and '/')."""
    from urllib.parse import quote

    params = conninfo_to_dict(scram_dsn)
    url = (
        f"postgresql://{params['user']}:{quote(PASSWORD, safe='')}@/{params['dbname']}"
        f"?host={params['host']}&port={params['port']}"
    )
    out = trioq_cli("status", "--json", "--dsn", url)
    assert out.returncode == 1
    assert "password authentication failed" in out.stderr
    assert_no_password(out.stdout, out.stderr)


# -- (b) a server that accepts (ignores) the password ------------------------------------------


@pytest.fixture
def dsn_with_password(dsn: str) -> str:
    """The test database (trust authentication) with a password that is sent and ignored."""
    return make_conninfo(dsn, password=PASSWORD)


def test_accepted_password_never_printed(dsn_with_password: str) -> None:
    dsn = dsn_with_password
    outputs = []
    for command in [*COMMANDS[:-1], ["enqueue", "nobody", "--queue", "q"]]:
        out = trioq_cli(*command, "--dsn", dsn)
        assert out.returncode in (0, 4), (command, out.stderr)  # 4: cancel found no job
        outputs += [out.stdout, out.stderr]
        if command[0] == "demo":
            report = json.loads(out.stdout)
            assert report["database"] == redact_dsn(dsn) and report["embedded"] is False
    assert_no_password(*outputs)


LISTENING = (
    "SELECT {select} FROM pg_stat_activity"
    " WHERE query LIKE 'LISTEN%%' AND datname = current_database()"
)


def test_serve_logs_never_show_the_password(dsn_with_password: str) -> None:
    """A worker that starts, runs a job of a task it does not know (logged as an error),
    loses its listener connection (logged) and stops on SIGTERM."""
    dsn = dsn_with_password
    assert trioq_cli("migrate", "--dsn", dsn).returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "trioq._cli", "serve", "--app", "serve_app:config", "--dsn", dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=TESTS,
        env=cli_env(),
    )
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            poll_query(conn, LISTENING.format(select="1"), READY_TIMEOUT)
            conn.execute(LISTENING.format(select="pg_terminate_backend(pid)"))
            enqueued = trioq_cli("enqueue", "nobody", "--max-attempts", "1", "--dsn", dsn)
            assert enqueued.returncode == 0
            # given back for a worker that knows the task (issue #10; it used to go dead)
            given_back = "SELECT 1 FROM trioq.jobs WHERE last_error LIKE 'unknown task%%'"
            poll_query(conn, given_back, READY_TIMEOUT)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert "unknown task 'nobody'" in stderr  # the logs were captured
    assert "listener lost its connection" in stderr
    assert_no_password(stdout, stderr)


def test_serve_processes_keep_the_dsn_off_command_lines(dsn_with_password: str) -> None:
    dsn = dsn_with_password
    assert trioq_cli("migrate", "--dsn", dsn).returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "trioq._cli", "serve", "--app", "serve_app:config",
         "--processes", "2", "--dsn", dsn],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=TESTS, env=cli_env(),
    )  # fmt: skip
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            poll_query(conn, LISTENING.format(select="1") + " HAVING count(*) = 2", READY_TIMEOUT)
        children = _children(proc.pid)
        assert len(children) == 2
        for pid in children:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
            assert "serve_app:config" in cmdline
            assert_no_password(cmdline)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.returncode is None:  # the workers have their own sessions: kill them too
            for pid in _children(proc.pid):
                os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert_no_password(stdout, stderr)


def _children(parent: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(stat.parent.name))
    return found


# -- redaction helpers --------------------------------------------------------------------------


def test_redaction_helpers() -> None:
    url = "postgresql://app:p%40ss%2Fw@db.example:6432/app"
    assert dsn_secrets([url, None, "host=x password='a b'", "[unparseable"]) == ["p@ss/w", "a b"]
    assert redact(f"at {url}: p@ss/w", ["p@ss/w"]) == (
        "at postgresql://app:***@db.example:6432/app: ***"
    )
    assert redact_dsn(url) == "postgresql://app@db.example:6432/app"
    assert redact_dsn("[unparseable") == "<unparseable DSN>"
    config = trioq.Config(registry=trioq.Registry(), dsn=url)
    assert "p%40ss" not in repr(config) and "db.example:6432" in repr(config)
    with pytest.raises(ValueError, match="DSN is invalid") as info:
        check_dsn("postgresql://app:p%40ss@[::1/app")
    assert "p%40ss" not in str(info.value)


def test_serve_log_formatter_scrubs_messages_and_tracebacks() -> None:
    import logging

    formatter = RedactingFormatter("%(message)s")
    formatter.add_dsns([f"host=db password={PASSWORD}"])
    try:
        raise RuntimeError(f"failed with {PASSWORD}")
    except RuntimeError:
        record = logging.LogRecord(
            "trioq", logging.ERROR, __file__, 1, "dsn %s", (PASSWORD,), sys.exc_info()
        )
    line = formatter.format(record)
    assert line.startswith("dsn ***") and "RuntimeError: failed with ***" in line
    assert_no_password(line)


# -- schema names -------------------------------------------------------------------------------


BAD_SCHEMAS = [
    "",
    "Trioq",
    "1abc",
    "a-b",
    'x"; DROP TABLE jobs; --',
    "x; DROP SCHEMA public",
    "a" * 64,
    "tri oq",
    "trioq\n",
    "trioq\x00",
    "pg_catalog.x",
]


@pytest.mark.parametrize("name", BAD_SCHEMAS)
async def test_bad_schema_names_are_refused_before_any_sql(dsn: str, name: str) -> None:
    """(Also ``tests/test_migrate.py::test_bad_schema_names_are_rejected``.)"""
    conn = await trioq.connect(dsn, autocommit=True)
    await conn.close()  # any SQL would raise OperationalError
    for build in (
        lambda: trioq.Queue(schema=name),
        lambda: trioq.Config(registry=trioq.Registry(), schema=name),
    ):
        with pytest.raises(ValueError, match="schema name"):
            build()
    with pytest.raises(ValueError, match="schema name"):
        await trioq.migrate(conn, name)
    with pytest.raises(ValueError, match="schema name"):
        await trioq.check_schema(conn, name, 1)


@pytest.mark.parametrize("command", [["migrate"], ["status", "--json"], ["enqueue", "t"]])
def test_bad_schema_name_on_the_command_line(dsn: str, command: list[str]) -> None:
    out = trioq_cli(*command, "--schema", 'x"; DROP TABLE y; --', "--dsn", dsn)
    assert out.returncode == 2  # a usage error, before connecting
    assert "error: argument --schema: schema name 'x\"; DROP TABLE y; --' is" in out.stderr
    with psycopg.connect(dsn) as conn:
        namespaces = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%%'"
            " AND nspname NOT IN ('public', 'information_schema')"
        ).fetchone()
        assert namespaces == (0,)


async def test_job_args_are_stored_as_jsonb(dsn: str) -> None:
    async with await trioq.connect(dsn, autocommit=True) as conn:
        await trioq.migrate(conn, "sec")
        cur = await conn.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = 'sec' AND column_name IN ('args', 'result')"
            " ORDER BY 1, 2"
        )
        assert await cur.fetchall() == [
            ("cron_entries", "args", "jsonb"),
            ("dead_jobs", "args", "jsonb"),
            ("job_steps", "result", "jsonb"),
            ("jobs", "args", "jsonb"),
            ("jobs", "result", "jsonb"),
        ]
    await trio.lowlevel.checkpoint()


# -- the static audit ---------------------------------------------------------------------------

#: An SQL statement's first word, upper case (as trioq writes SQL; English prose is not).
SQL_START = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|LISTEN|UNLISTEN|NOTIFY|CREATE|DROP|ALTER|COPY|SET|"
    r"RESET|LOCK|TRUNCATE|VACUUM|ANALYZE|GRANT|REVOKE|BEGIN|COMMIT|ROLLBACK|EXPLAIN|DO)\b"
)
FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}
EXECUTORS = {"execute", "executemany", "copy", "stream"}
SOURCES = sorted(PACKAGE.rglob("*.py"))
#: Files that fail the audit, each with why (bugs in files this test's author does not own).
KNOWN_HOLES: dict[str, str] = {}


def _audited(path: Path) -> Any:
    reason = KNOWN_HOLES.get(path.name)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(path, marks=marks, id=str(path.relative_to(PACKAGE.parent)))


def _is_sql_text(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and bool(SQL_START.match(node.value))
    )


def _fstring_is_sql(node: ast.JoinedStr) -> bool:
    head = node.values[0] if node.values else None
    return head is not None and _is_sql_text(head)


def _is_sql_call(node: ast.AST) -> bool:
    """``sql.SQL(...)`` or ``psycopg.sql.SQL(...)``."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "SQL"
    )


def _dynamic_text(arg: ast.AST) -> bool:
    """Whether ``arg`` splices run-time values into text (f-string, ``+``, ``%``, ``.format``).

    Names in UPPER_CASE (module constants) and comprehension variables are fixed text;
    ``sql.SQL("SELECT " + NOW)`` and ``sql.SQL(", ".join(f"j.{c}" for c in COLUMNS))`` pass.
    """
    fixed = {
        name.id
        for comp in ast.walk(arg)
        if isinstance(comp, ast.comprehension)
        for name in ast.walk(comp.target)
        if isinstance(name, ast.Name)
    }
    for sub in ast.walk(arg):
        splices = (
            isinstance(sub, ast.JoinedStr)
            or (isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Add | ast.Mod))
            or (isinstance(sub, ast.Call) and getattr(sub.func, "attr", "") == "format")
        )
        names = {n.id for n in ast.walk(sub) if isinstance(n, ast.Name)} if splices else set()
        if any(not (n.lstrip("_").isupper() or n in fixed) for n in names):
            return True
    return False


def audit(path: Path) -> list[str]:
    """Every problem in one source file, as 'line: what'."""
    tree = ast.parse(path.read_text(), filename=str(path))
    problems: list[str] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import | ast.ImportFrom):
            problems += [f"{line}: {p}" for p in _import_problems(node)]
        elif isinstance(node, ast.Call):
            problems += [f"{line}: {p}" for p in _call_problems(node)]
        elif isinstance(node, ast.JoinedStr) and _fstring_is_sql(node):
            problems.append(f"{line}: SQL built with an f-string")
        elif (
            isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and _is_sql_text(node.left)
        ):
            problems.append(f"{line}: SQL built with %")
    return problems


def _import_problems(node: ast.Import | ast.ImportFrom) -> list[str]:
    names = [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module:
        names.append(node.module)
    return [f"imports {names}"] if any(n.split(".")[0] in FORBIDDEN_MODULES for n in names) else []


def _call_problems(node: ast.Call) -> list[str]:
    func = node.func
    problems = []
    if isinstance(func, ast.Name) and func.id in FORBIDDEN_CALLS:
        problems.append(f"calls {func.id}()")
    if isinstance(func, ast.Attribute) and func.attr == "format" and _is_sql_text(func.value):
        problems.append("SQL built with str.format")
    if _is_sql_call(node) and node.args and _dynamic_text(node.args[0]):
        problems.append("sql.SQL() of text built at run time")
    if (
        isinstance(func, ast.Attribute)
        and func.attr in EXECUTORS
        and node.args
        and isinstance(node.args[0], ast.JoinedStr | ast.BinOp)
    ):
        problems.append(f"{func.attr}() of a string built at run time")
    return problems


def test_the_audit_catches_what_it_looks_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle\n"
        "from marshal import loads\n"
        "eval('1')\n"
        "q = f'SELECT * FROM {table}'\n"
        "r = 'DELETE FROM %s' % table\n"
        "s = 'UPDATE {} SET x = 1'.format(table)\n"
        "conn.execute('SELECT ' + name)\n"
        "sql.SQL('x = ' + user_text)\n"
        "sql.SQL(text.strip())\n"  # allowed: composing constant statements
        "sql.SQL('SELECT ' + NOW)\n"  # allowed: a module constant
        "conn.execute(sql.SQL('SELECT {}').format(sql.Identifier(schema)))\n"  # allowed
        "msg = f'Select a queue: {name}'\n"  # allowed: prose
    )
    found = [p.split(": ", 1)[1] for p in audit(bad)]
    assert found == [
        "imports ['pickle']",
        "imports ['loads', 'marshal']",
        "calls eval()",
        "SQL built with an f-string",
        "SQL built with %",
        "SQL built with str.format",
        "execute() of a string built at run time",
        "sql.SQL() of text built at run time",
    ]


@pytest.mark.parametrize("path", [_audited(p) for p in SOURCES])
def test_static_audit(path: Path) -> None:
    assert audit(path) == []


def test_schema_name_reaches_sql_only_through_identifier() -> None:
    """No f-string in trioq/ puts a schema name right after an SQL keyword."""
    keyword = re.compile(r"\b(FROM|INTO|TABLE|SCHEMA|JOIN|UPDATE|LISTEN|NOTIFY)\s+\"?$")
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.JoinedStr):
                continue
            for before, value in zip(node.values, node.values[1:], strict=False):
                if (
                    isinstance(before, ast.Constant)
                    and isinstance(value, ast.FormattedValue)
                    and "schema" in ast.unparse(value.value)
                    and keyword.search(str(before.value))
                ):
                    raise AssertionError(f"{path}:{node.lineno}: a schema spliced into SQL")
