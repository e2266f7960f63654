"""Scale-out (issue 15): `trioq stress` workers on two "hosts" against one Postgres.

Each host is a network namespace of its own (`netns.two_hosts`: veth links with private
addresses, made and deleted by the test). A dedicated throwaway cluster listens on the
root-side veth addresses only, so the workers reach it over TCP through their own link
(a Unix socket is shared across network namespaces: a worker given one would not be on
another host at all). While the run goes, ``pg_stat_activity`` must show every worker
connection coming from its host's address. One host's processes are SIGKILLed mid-run
and never come back; stress's own verification (the JSON report) must find 0 lost, 0
duplicates, and every job the dead host held completed by the other one.

Without root or ``ip netns`` these tests fail, saying why, unless
``TRIOQ_SKIP_NETNS_TESTS=1`` (for a developer's machine); CI runs as root.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import attrs
import psycopg
import pytest
from clitool import TESTS, cli_env, trioq_cli
from helpers import assert_missing_fails, missing
from netns import NS_PREFIX, Host, sweep_stale, two_hosts, unavailable
from pgcluster import copy_cluster, create_database, scratch_dir, template_cluster
from psycopg.conninfo import make_conninfo

from trioq._stress.report import EXIT_OK
from trioq._stress.run import StressOptions

SKIP_VAR = "TRIOQ_SKIP_NETNS_TESTS"
JOBS = 3000
RUN_TIMEOUT = 120.0
LEASE = 30.0
SECRET = "s3cret-of-the-two-hosts"
_POLL = 0.05
# Connections of the stress workers (application_name trioq-stress-<pid>-w<slot>).
_WORKER_CONNECTIONS = """
SELECT application_name, host(client_addr) FROM pg_stat_activity
 WHERE datname = current_database() AND application_name LIKE 'trioq-stress-%-w%'
"""


def require_netns() -> None:
    """Fail (or skip, if `SKIP_VAR` is 1) when network namespaces cannot be made here."""
    reason = unavailable()
    if reason is not None:
        missing(reason, skip_var=SKIP_VAR,
                needs="the two-host tests need root and `ip netns` (CI runs as root)")  # fmt: skip


def test_without_netns_the_tests_fail_and_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """Missing namespaces are a failure (a skipped test is not a passing one), unless asked."""
    monkeypatch.setattr(sys.modules[__name__], "unavailable", lambda: "no root here")
    assert_missing_fails(monkeypatch, require_netns, skip_var=SKIP_VAR,
                         match=rf"no root here.*{SKIP_VAR}=1 skips")  # fmt: skip


@attrs.frozen
class TcpCluster:
    """A throwaway cluster reachable from each host's namespace over TCP only."""

    dsn: str  # the driver's: the Unix socket, in this (the root) namespace
    host_dsns: tuple[str, ...]  # per host: TCP to its gateway, the root side of its veth


@pytest.fixture(scope="module")
def hosts() -> Iterator[tuple[Host, Host]]:
    require_netns()
    with two_hosts() as pair:
        yield pair


@pytest.fixture(scope="module")
def tcp_cluster(hosts: tuple[Host, Host]) -> Iterator[TcpCluster]:
    """A cluster of its own listening on the gateways (the session's listens on no TCP at
    all), trusting exactly the two hosts' addresses."""
    workdir = scratch_dir()
    try:
        cluster = copy_cluster(template_cluster(), workdir / "data")
        with (cluster.data_dir / "pg_hba.conf").open("a") as hba:
            for host in hosts:
                hba.write(f"host all all {host.address}/32 trust\n")
        listen = ",".join(h.gateway for h in hosts)
        settings = {"listen_addresses": listen, "max_connections": "200"}
        cluster = attrs.evolve(cluster, database="postgres", settings=settings)
        with cluster.running() as status:
            dsn = create_database(status.dsn, "trioq_two_hosts")
            host_dsns = tuple(
                # trust ignores the password; the report must not show it
                make_conninfo(dsn, host=h.gateway, port=str(status.port), password=SECRET)
                for h in hosts
            )
            yield TcpCluster(dsn=dsn, host_dsns=host_dsns)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_host_reaches_postgres_only_over_its_link(
    hosts: tuple[Host, Host], tcp_cluster: TcpCluster
) -> None:
    """The setup itself: from h1 the server answers at h1's gateway, from h1's address;
    h2's gateway is not routable from h1 (no path but its own link)."""
    h1, _ = hosts
    probe = "import psycopg,sys; print(psycopg.connect(sys.argv[1]).execute({!r}).fetchone()[0])"
    query = "SELECT host(inet_client_addr())"
    out = _in_host(h1, probe.format(query), tcp_cluster.host_dsns[0])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == h1.address
    other = make_conninfo(tcp_cluster.host_dsns[1], connect_timeout="2")
    out = _in_host(h1, probe.format(query), other)
    assert out.returncode != 0 and "unreachable" in out.stderr.lower(), out.stdout + out.stderr


def test_two_hosts_lose_nothing_when_one_is_killed(
    hosts: tuple[Host, Host], tcp_cluster: TcpCluster, tmp_path: pathlib.Path
) -> None:
    path = tmp_path / "report.json"
    args = [
        "--dsn", tcp_cluster.dsn, "--jobs", str(JOBS), "--processes", "4",
        "--concurrency", "10", "--work-ms", "20", "--kill-host-at", "0.5",
        # The library's defaults, not stress's short chaos ones: the dead host's jobs must
        # come back by the liveness check, long before a 30 s lease could expire.
        "--lease", str(LEASE), "--heartbeat", "5", "--sweep", "5",
        "--quiet", "--json", str(path),
    ]  # fmt: skip
    for host, host_dsn in zip(hosts, tcp_cluster.host_dsns, strict=True):
        args += ["--launcher", " ".join(host.launcher), "--host-dsn", host_dsn]
    proc = subprocess.Popen(
        [sys.executable, "-m", "trioq._cli", "stress", *args], cwd=TESTS, env=cli_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        seen = _worker_addresses_while(proc, tcp_cluster.dsn)
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stdout + stderr
    assert SECRET not in path.read_text() + stdout + stderr
    report: dict[str, Any] = json.loads(path.read_text())

    # Every worker connection came through its own host's link: slot i runs on host i % 2.
    assert seen, "no worker connection was seen in pg_stat_activity"
    wrong = {
        (app, addr) for app, addr in seen if addr != hosts[int(app.rsplit("w", 1)[1]) % 2].address
    }
    assert not wrong, f"worker connections not from their host's address: {wrong}"
    assert {addr for _, addr in seen} == {h.address for h in hosts}

    v = report["verification"]
    assert v["passed"] is True, v
    assert (v["enqueued"], v["completed"]) == (JOBS, JOBS)
    assert (v["lost"], v["duplicate_completions"], v["dead"], v["phantoms"]) == (0, 0, 0, 0)
    assert v["left"] == {} and report["exit_code"] == EXIT_OK

    chaos = report["chaos"]
    assert (chaos["host_kills"], chaos["kills"]) == (1, 2)
    [fault] = [f for f in chaos["faults"] if f["kind"] == "host kill"]
    assert fault["held"] > 0, fault  # it was killed mid-batch
    assert len(fault["held_ids"]) == fault["held"]
    # The other host's sweeper took them back (the liveness check), not their leases' end.
    assert fault["held_released_s"] is not None and fault["held_released_s"] < LEASE
    assert fault["held_completed"] == fault["held"] and fault["held_completed_by_victim"] == 0

    by_name = {h["name"]: h for h in report["workers"]["hosts"]}
    [dead] = [h for h in by_name.values() if h["lost"]]
    [alive] = [h for h in by_name.values() if not h["lost"]]
    assert sorted(dead["pids"]) == sorted(fault["pids"]) and len(dead["pids"]) == 2
    assert alive["completed"] + dead["completed"] == JOBS and alive["completed"] > 0
    # The dead host's held jobs were finished by the surviving host: its ledger rows say so.
    with psycopg.connect(tcp_cluster.dsn) as conn:
        rows = conn.execute(
            "SELECT worker_pid, count(*) FROM trioq_stress.stress_ledger"
            " WHERE job_id = ANY(%s) GROUP BY 1",
            (fault["held_ids"],),
        ).fetchall()
    assert sum(n for _, n in rows) == fault["held"]
    assert {pid for pid, _ in rows} <= set(alive["pids"]), (rows, alive)
    reasons = v["reexecuted_reasons"]
    assert v["reexecuted"] >= fault["held"]
    assert set(reasons) == {"worker died (its liveness lock was free)"}, reasons
    print(json.dumps({"drain": report["drain"], "fault": fault}, indent=1))


def test_namespaces_are_swept_and_unique(hosts: tuple[Host, Host]) -> None:
    """Names carry the pid (and a live run's are never swept); addresses differ per host;
    a leftover of a dead process is swept."""
    assert all(str(os.getpid()) in h.namespace for h in hosts)
    assert hosts[0].gateway != hosts[1].gateway
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    leftover = f"{NS_PREFIX}9-{dead.stdout.strip()}"
    subprocess.run(["ip", "netns", "add", leftover], check=True)
    swept = sweep_stale()
    assert leftover in swept and not any(h.namespace in swept for h in hosts)
    assert leftover not in _namespaces() and {h.namespace for h in hosts} <= set(_namespaces())


def test_a_failure_inside_still_deletes_everything(hosts: tuple[Host, Host]) -> None:
    """A second pair beside the first (h3, h4), deleted though the block raised."""
    with pytest.raises(RuntimeError, match="planted"), two_hosts() as pair:
        assert {h.namespace for h in pair} <= set(_namespaces())
        assert "-h3-" in pair[0].namespace and pair[0].gateway not in {h.gateway for h in hosts}
        raise RuntimeError("planted")
    assert not {h.namespace for h in pair} & set(_namespaces())
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    assert f"tqh3r{os.getpid()}" not in links.stdout
    assert {h.namespace for h in hosts} <= set(_namespaces())  # the first pair is untouched


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def _worker_addresses_while(proc: subprocess.Popen[str], dsn: str) -> set[tuple[str, str]]:
    """(application_name, client address) of every worker connection seen until ``proc``
    exits (bounded by `RUN_TIMEOUT`)."""
    seen: set[tuple[str, str]] = set()
    deadline = time.monotonic() + RUN_TIMEOUT
    with psycopg.connect(dsn, autocommit=True) as conn:
        while proc.poll() is None and time.monotonic() < deadline:
            for app, addr in conn.execute(_WORKER_CONNECTIONS).fetchall():
                seen.add((app, addr or "(unix socket)"))
            time.sleep(_POLL)  # a poll interval: the bound is the deadline
    return seen


def _in_host(host: Host, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*host.launcher, sys.executable, "-c", code, *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_host_options_are_checked() -> None:
    """Hostile and inconsistent host options get errors naming the flag."""
    two = ("ip netns exec a", "ip netns exec b")
    cases = [
        ({"launchers": ("",), "processes": 1}, "--launcher must not be empty"),
        ({"launchers": ("ip 'netns",)}, '--launcher "ip \'netns": No closing quotation'),
        ({"launchers": two, "host_dsns": ("host=x",)}, "--host-dsn is given 1 times"),
        ({"launchers": two, "processes": 1}, r"--processes \(1\) must be at least"),
        ({"launchers": two[:1], "kill_host_at": 1}, "--kill-host-at needs two or more"),
        ({"kill_host_at": 1}, "--kill-host-at needs two or more"),
        ({"launchers": two, "kill_host_at": -1}, "--kill-host-at must be from 0 to 1e"),
        ({"launchers": ("ip\x00x",), "processes": 1}, "--launcher must not hold a NUL"),
        ({"launchers": ("ip \udcff",), "processes": 1}, "is not valid UTF-8 text"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            StressOptions(**kwargs)  # type: ignore[arg-type]
    hosts = StressOptions(launchers=two, host_dsns=("host=a", "host=b"), kill_host_at=0).hosts
    assert [(h.name, h.prefix, h.dsn) for h in hosts] == [
        ("h1", ("ip", "netns", "exec", "a"), "host=a"),
        ("h2", ("ip", "netns", "exec", "b"), "host=b"),
    ]
    assert StressOptions(launchers=two, kill_host_at=0).chaos


def test_host_dsns_do_not_go_with_a_pooler() -> None:
    out = trioq_cli(
        "stress", "--dsn", "host=/nonexistent dbname=x", "--pooler-dsn", "host=/nowhere",
        "--launcher", "env", "--host-dsn", "host=/elsewhere", "--processes", "1",
    )  # fmt: skip
    assert out.returncode == 1 and "--pooler-dsn and --host-dsn together" in out.stderr
