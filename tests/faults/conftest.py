"""Nodes for the PostgreSQL fault tests: in-process hosts on one schema, node A reaching the
journal through a fault proxy, node B reaching it directly."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

import flowx
from flowx.hosting.stores import postgres
from tests.faults import gated_flow
from tests.faults.support import on_node, proxy_to_postgres, via
from tests.postgres_support import PG_DSN
from tests.support.fault_proxy import FaultProxy

#: Short enough that a takeover happens within seconds, long enough for a loaded 2-core box.
TTL = 3.0
SCAN = 0.5

MakeNode = Callable[..., Awaitable[flowx.FlowHost]]


@pytest.fixture(autouse=True)
def _fresh_flow_state() -> Iterator[None]:
    gated_flow.reset()
    yield
    gated_flow.reset()


@pytest.fixture
async def proxy() -> AsyncIterator[FaultProxy]:
    async with proxy_to_postgres() as fault:
        yield fault


@pytest.fixture
def schema(pg_schema: Callable[[], str]) -> str:
    return pg_schema()


@pytest.fixture
async def make_node(proxy: FaultProxy, schema: str) -> AsyncIterator[MakeNode]:
    """``await make_node("A", proxied=True)``: an open host named ``A`` (its runs record
    ``A`` in the ledger), TTL 3 s, no timers; recovery only where asked for."""
    hosts: list[flowx.FlowHost] = []

    async def make(name: str, *, proxied: bool, recovery: bool) -> flowx.FlowHost:
        store = postgres(
            via(proxy) if proxied else PG_DSN,
            schema=schema,
            connect_timeout=2,
            min_size=1,
            max_size=4,
        )
        host = flowx.FlowHost(
            store=store,
            flows=[gated_flow.FLOW],
            settings=flowx.HostSettings(
                lease_ttl=TTL,
                recovery_scan_interval=SCAN,
                node_id=name,
                recovery=recovery,
                timers=False,
            ),
        )
        with on_node(name):  # the recovery loop, and every run it spawns, are this node's
            await host.open()
        hosts.append(host)
        return host

    yield make
    await proxy.forward()  # a withheld reply is delivered, so no run waits for its deadline
    for host in hosts:
        await host.drain(timeout=3)
