"""Hosts on one machine: each a Linux network namespace with a network stack of its own, joined
to the root namespace by a veth pair (issue 18).

Why: worker processes on one machine share its loopback, its files and its address; a test
that runs them so cannot show that nothing relies on any of that. A worker in a namespace of
its own has its own ``127.0.0.1`` (nothing listens there) and reaches the journal only at the
address the test hands it, over a link the test can cut.

A *partition* is a pair of DROP rules inside the host's namespace (input and output on its
veth). It is silent, as a dead link is: TCP retransmits into nothing and no error comes back —
not a refused connection, and no request slips through one way only (half a partition would
let lease renewals land and the lease would never run out). Healing deletes the rules; TCP
then delivers what it was still retransmitting, late.

Addresses: one ``10.231.K.0/24`` per run, ``K`` taken among the /24s no interface of the root
namespace uses, under a lock file so that two runs at once take two. Host ``i`` is the /30
``10.231.K.4i``: ``.4i+1`` on the root side (where its services listen: ``gateway``) and
``.4i+2`` inside. Namespace and interface names carry the pid of the run; what a run killed
before its teardown left behind is deleted by the next run.

Needs root, ``ip`` (iproute2) and ``nft`` or ``iptables`` (``scripts/test-tools.sh`` installs
iptables); ``unavailable()`` says which is missing, for a skip.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

#: The /16 every run's /24 is taken from: private, and used by nothing else on this machine.
NETWORK = "10.231"
_LOCK = Path(tempfile.gettempdir()) / "flowx-netns.lock"
_OURS = re.compile(r"^fx-(\d+)-[a-z0-9]+$")
#: The nft table a partition adds inside a namespace (``firewall = "nft"``).
_TABLE = "flowx_partition"


class NamespacesUnavailable(RuntimeError):
    """This machine cannot make network namespaces: the tests that need them skip on it."""


def unavailable() -> str | None:
    """Why hosts cannot be made here (for ``pytest.skip``), or ``None`` if they can."""
    if os.geteuid() != 0:
        return f"network namespaces need root (this run is uid {os.geteuid()})"
    if shutil.which("ip") is None:
        return "no 'ip' on PATH: install iproute2 to run workers in network namespaces"
    if _firewall() is None:
        return (
            "neither iptables nor nft is installed, so no partition can be made: "
            "run scripts/test-tools.sh (it installs iptables)"
        )
    return None


@contextlib.contextmanager
def hosts_or_skip(names: Sequence[str]) -> Iterator[NetworkHosts]:
    """``NetworkHosts(names)``, created, and destroyed on the way out whatever happened; a
    ``pytest.skip`` naming what is missing where this machine cannot make namespaces."""
    try:
        hosts = NetworkHosts(names)
    except NamespacesUnavailable as e:
        pytest.skip(str(e))
    try:
        hosts.create()
    except NamespacesUnavailable as e:
        hosts.destroy()
        pytest.skip(str(e))
    try:
        yield hosts
    finally:
        hosts.destroy()


def _firewall() -> str | None:
    for tool in ("iptables", "nft"):
        if shutil.which(tool) is not None:
            return tool
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


@dataclass(frozen=True)
class Host:
    """One namespace: its name, its veth ends, the address the root side answers on
    (``gateway``, where the services are reached) and its own ``address``."""

    name: str
    netns: str
    outer: str
    inner: str
    gateway: str
    address: str


class NetworkHosts:
    """``create()`` makes one namespace per name; ``destroy()`` removes all of them (and
    their veths), whatever ``create()`` got to. Use as a context manager."""

    def __init__(self, names: Sequence[str]) -> None:
        reason = unavailable()
        if reason is not None:
            raise NamespacesUnavailable(reason)
        self.names = list(names)
        self.hosts: dict[str, Host] = {}
        self.firewall = _firewall() or ""
        self._made: list[str] = []
        self.subnet = ""

    def __enter__(self) -> NetworkHosts:
        try:
            self.create()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    @property
    def gateways(self) -> list[str]:
        """The root-side addresses: what a server must listen on to be reached by the hosts."""
        return [h.gateway for h in self.hosts.values()]

    def create(self) -> None:
        pid = os.getpid()
        with _locked():
            _remove_leftovers()
            third = _free_third_octet()
            self.subnet = f"{NETWORK}.{third}.0/24"
            for i, name in enumerate(self.names):
                host = Host(
                    name=name,
                    netns=f"fx-{pid}-{name}",
                    outer=f"fxr{pid}{name}"[:15],
                    inner=f"fxn{pid}{name}"[:15],
                    gateway=f"{NETWORK}.{third}.{4 * i + 1}",
                    address=f"{NETWORK}.{third}.{4 * i + 2}",
                )
                self.hosts[name] = host  # first: ``destroy()`` removes what ``_add`` made
                self._add(host)

    def _add(self, host: Host) -> None:
        made = _ip("netns", "add", host.netns, check=False)
        if made.returncode != 0:
            if not self._made:  # the very first one: this machine cannot, say so
                raise NamespacesUnavailable(
                    f"'ip netns add' failed: {made.stderr.strip() or made.returncode}"
                )
            made.check_returncode()
        self._made.append(host.netns)
        _ip("link", "add", host.outer, "type", "veth", "peer", "name", host.inner)
        _ip("link", "set", host.inner, "netns", host.netns)
        _ip("addr", "add", f"{host.gateway}/30", "dev", host.outer)
        _ip("link", "set", host.outer, "up")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/30", "dev", host.inner)
        _ip("-n", host.netns, "link", "set", host.inner, "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")

    def destroy(self) -> None:
        """Every namespace and veth this object made; safe to call twice. A namespace goes
        with its last process, so a caller stops the processes in it first."""
        for host in self.hosts.values():
            _ip("link", "del", host.outer, check=False)
        for netns in self._made:
            _ip("netns", "del", netns, check=False)
        self._made.clear()

    def command(self, name: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside host ``name`` (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.hosts[name].netns, *argv]

    def run(self, name: str, argv: Sequence[str], stdin: str | None = None) -> str:
        done = subprocess.run(
            self.command(name, argv), input=stdin, capture_output=True, text=True, timeout=30
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} in {name} failed: {done.stderr.strip()}")
        return done.stdout

    def connect_ex(self, name: str, address: str, port: int, timeout: float = 2.0) -> int:
        """A TCP connect from inside host ``name``: 0 if something answers, else the errno
        (``ECONNREFUSED`` for a port nobody listens on, ``EAGAIN`` when no answer came within
        ``timeout``: the silence of a partition)."""
        probe = (
            "import socket; s = socket.socket(); "
            f"s.settimeout({timeout}); print(s.connect_ex(({address!r}, {port})))"
        )
        return int(self.run(name, [sys.executable, "-c", probe]).strip())

    def partition(self, name: str) -> None:
        """Cut host ``name`` off: every packet in or out of its veth is dropped, silently."""
        host = self.hosts[name]
        if self.firewall == "nft":
            self.run(name, ["nft", "-f", "-"], stdin=_nft_rules(host))
        else:
            for rule in _iptables_rules(host):
                self.run(name, ["iptables", "-w", "-I", *rule])

    def heal(self, name: str) -> None:
        """Undo ``partition``: packets flow again, and TCP delivers what it held."""
        if self.firewall == "nft":
            self.run(name, ["nft", "delete", "table", "inet", _TABLE])
        else:
            for rule in _iptables_rules(self.hosts[name]):
                self.run(name, ["iptables", "-w", "-D", *rule])


def _nft_rules(host: Host) -> str:
    chains = "".join(
        f'  chain {hook} {{ type filter hook {hook} priority 0; {match} "{host.inner}" drop; }}\n'
        for hook, match in (("input", "iifname"), ("output", "oifname"))
    )
    return f"table inet {_TABLE} {{\n{chains}}}\n"


def _iptables_rules(host: Host) -> list[list[str]]:
    return [
        ["INPUT", "-i", host.inner, "-j", "DROP"],
        ["OUTPUT", "-o", host.inner, "-j", "DROP"],
    ]


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One run at a time picks its /24 and adds its addresses."""
    with _LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _free_third_octet() -> int:
    """A ``K`` such that no root-namespace address lies in ``10.231.K.0/24``."""
    used: set[int] = set()
    for line in _ip("-o", "-4", "addr", "show").stdout.splitlines():
        for word in line.split():
            if word.startswith(f"{NETWORK}.") and "/" in word:
                used.add(int(ipaddress.ip_interface(word).ip.packed[2]))
    start = os.getpid() % 250
    for k in range(250):
        third = (start + k) % 250 + 1
        if third not in used:
            return third
    raise NamespacesUnavailable(f"every /24 of {NETWORK}.0.0/16 is in use")


def _remove_leftovers() -> None:
    """Namespaces (and their veths) of runs whose process is gone: killed before teardown."""
    for line in _ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        match = _OURS.match(name)
        if match is None or Path(f"/proc/{match.group(1)}").exists():
            continue
        pid, host = match.group(1), name.rsplit("-", 1)[1]
        _ip("link", "del", f"fxr{pid}{host}"[:15], check=False)
        _ip("netns", "del", name, check=False)
