"""The namespace hosts the multi-host test stands on (``tests/support/netns.py``): a host
reaches a server at its gateway and nothing at its own loopback; a partition is silence (a
connect gets no answer, not a refusal) and a heal ends it; teardown leaves nothing behind.

The partition's silence matters: a refused connection would tell a worker at once that its
journal is gone, which is not what a cut link does, and the worker would then never be tested
against the hard case — a lease running out while its holder still thinks it can write.
"""

from __future__ import annotations

import errno
import socket
import subprocess
from collections.abc import Iterator

import pytest

from tests.support.netns import NetworkHosts, hosts_or_skip


@pytest.fixture
def net() -> Iterator[NetworkHosts]:
    with hosts_or_skip(["a", "b"]) as hosts:
        yield hosts


def _listening(address: str) -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind((address, 0))
    server.listen()
    return server, int(server.getsockname()[1])


def test_a_host_reaches_its_gateway_and_has_a_loopback_of_its_own(net: NetworkHosts) -> None:
    server, port = _listening(net["a"].gateway)
    loopback, loopback_port = _listening("127.0.0.1")
    with server, loopback:
        assert net.connect_ex("a", net["a"].gateway, port) == 0
        # The root namespace's loopback is not the host's: nothing listens on the host's own.
        assert net.connect_ex("a", "127.0.0.1", loopback_port) == errno.ECONNREFUSED
        # Each host has an address of its own, in the run's /24.
        addresses = {h.address for h in net.hosts.values()} | set(net.gateways)
        assert len(addresses) == 4
        prefix = net.subnet.rsplit(".", 1)[0] + "."
        assert all(a.startswith(prefix) for a in addresses)


def test_a_partition_is_silent_and_a_heal_ends_it(net: NetworkHosts) -> None:
    server, port = _listening(net["b"].gateway)
    other, other_port = _listening(net["a"].gateway)
    with server, other:
        net.partition("b")
        assert net.connect_ex("b", net["b"].gateway, port, timeout=1.0) == errno.EAGAIN
        assert net.connect_ex("a", net["a"].gateway, other_port) == 0  # only B is cut off
        net.heal("b")
        assert net.connect_ex("b", net["b"].gateway, port) == 0


def test_teardown_removes_every_namespace_and_veth(net: NetworkHosts) -> None:
    made = [(h.netns, h.outer) for h in net.hosts.values()]
    net.destroy()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for netns, outer in made:
        assert netns not in listed
        link = subprocess.run(["ip", "link", "show", outer], capture_output=True, text=True)
        assert link.returncode != 0, f"{outer} left behind"
