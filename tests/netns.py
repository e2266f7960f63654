"""Two network namespaces joined to this one by veth pairs: two "hosts" on one machine.

`two_hosts` makes, for this process, namespaces ``trioq-h1-<pid>`` and ``trioq-h2-<pid>``,
each with loopback up and one end of a veth pair (``tqh<N>n<pid>``, address 10.231.X.2/30),
whose other end (``tqh<N>r<pid>``, 10.231.X.1/30) stays here. A process run under
``ip netns exec <ns>`` sees only its loopback and its veth: it reaches this namespace's
servers at the root-side address of its own link, over TCP, and no other way (Unix sockets
are shared across network namespaces, which is why the tests never give workers one).

Names carry the pid (and a count, for a second pair in one process), so a leftover of a
crashed run (SIGKILL skips every cleanup) never collides with the next run; each run
first sweeps leftovers whose pid is gone. The /30
subnets are picked free (under a lock) so two runs at once get different addresses.
Everything is deleted on exit, failure included. Root and ``ip netns`` are required:
`unavailable` says why they are not there.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import shutil
import subprocess
from collections.abc import Iterator

import attrs

from trioq._pg.embedded import _pid_alive  # a zombie is dead too

__all__ = ["NS_PREFIX", "Host", "two_hosts", "unavailable"]

NS_PREFIX = "trioq-h"
LINK_PREFIX = "tqh"
NET = "10.231"
LOCK = "/run/lock/trioq-netns.lock"
_NS_NAME = re.compile(rf"^{NS_PREFIX}\d+-(\d+)$")
_calls = itertools.count()  # a second pair in one process is named h3, h4 (and so on)
_LINK_NAME = re.compile(rf"^{LINK_PREFIX}\d+[rn](\d+)$")


@attrs.frozen
class Host:
    """One namespace: run a command there with ``[*launcher, ...]``."""

    namespace: str
    address: str  # this host's own address, in its namespace
    gateway: str  # the root side of its veth: where it reaches our servers

    @property
    def launcher(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace]


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return f"network namespaces need root (the tests run as uid {os.geteuid()})"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing"
    probe = f"{NS_PREFIX}0-{os.getpid()}"  # swept like the others if we die right here
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "delete", probe, check=False)
    return None


@contextlib.contextmanager
def two_hosts() -> Iterator[tuple[Host, Host]]:
    """Two namespaces with a veth each (see the module docs); deleted on exit."""
    pid = os.getpid()
    call = next(_calls)
    numbers = (2 * call + 1, 2 * call + 2)  # h1, h2; then h3, h4 for a second pair
    made: list[str] = []
    try:
        with _locked():
            sweep_stale(ours_too=call == 0)
            subnets = _free_subnets(2)
            hosts = [
                _make_host(n, third, pid, made) for n, third in zip(numbers, subnets, strict=True)
            ]
        yield hosts[0], hosts[1]
    finally:
        for namespace in reversed(made):  # deleting a namespace deletes its veth pair too
            _ip("netns", "delete", namespace, check=False)
        for n in numbers:
            if _link_exists(f"{LINK_PREFIX}{n}r{pid}"):
                _ip("link", "delete", f"{LINK_PREFIX}{n}r{pid}", check=False)


def _make_host(n: int, third: int, pid: int, made: list[str]) -> Host:
    namespace, root, inner = (
        f"{NS_PREFIX}{n}-{pid}",
        f"{LINK_PREFIX}{n}r{pid}",
        f"{LINK_PREFIX}{n}n{pid}",
    )
    gateway, address = f"{NET}.{third}.1", f"{NET}.{third}.2"
    _ip("netns", "add", namespace)
    made.append(namespace)
    _ip("link", "add", root, "type", "veth", "peer", "name", inner)
    _ip("link", "set", inner, "netns", namespace)
    _ip("addr", "add", f"{gateway}/30", "dev", root)
    _ip("link", "set", root, "up")
    in_ns = ("-n", namespace)
    _ip(*in_ns, "addr", "add", f"{address}/30", "dev", inner)
    _ip(*in_ns, "link", "set", inner, "up")
    _ip(*in_ns, "link", "set", "lo", "up")
    return Host(namespace=namespace, address=address, gateway=gateway)


def sweep_stale(*, ours_too: bool = False) -> list[str]:
    """Delete namespaces and links of ours whose process is gone; their names.
    ``ours_too``: also those named with this process's pid (before it made any: leftovers
    of a dead process whose pid it got)."""
    swept = []

    def stale(pid: int) -> bool:
        return (ours_too and pid == os.getpid()) or not _pid_alive(pid)

    for namespace in _namespaces():
        if (m := _NS_NAME.match(namespace)) and stale(int(m[1])):
            _ip("netns", "delete", namespace, check=False)
            swept.append(namespace)
    for link in _links():
        if (m := _LINK_NAME.match(link)) and stale(int(m[1])):
            _ip("link", "delete", link, check=False)
            swept.append(link)
    return swept


def _free_subnets(count: int) -> list[int]:
    """Third octets of 10.231.X.0/30 subnets no address here is in."""
    used = set(re.findall(rf"inet {re.escape(NET)}\.(\d+)\.", _ip("-o", "addr").stdout))
    free = [n for n in range(1, 255) if str(n) not in used]
    if len(free) < count:
        raise RuntimeError(f"no free {NET}.X.0/30 subnets: {sorted(used)} are taken")
    return free[:count]


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    os.makedirs(os.path.dirname(LOCK), exist_ok=True)
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _links() -> list[str]:
    out = _ip("-o", "link", check=False).stdout
    return [m for m in re.findall(r"^\d+: ([^:@\s]+)", out, flags=re.M)]


def _link_exists(name: str) -> bool:
    return _ip("link", "show", name, check=False).returncode == 0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, check=False, timeout=30)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {out.stderr.strip()}")
    return out
