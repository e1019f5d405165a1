"""Shared fixtures: a fake clock and hosts over the in-memory store."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import flowx
from flowx.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def memory_store() -> flowx.stores.memory.MemoryStores:  # type: ignore[name-defined]
    return flowx.memory()


@pytest.fixture
async def host_factory(clock: FakeClock, memory_store: object) -> AsyncIterator[object]:
    """Build open hosts on one shared memory store (several hosts = several nodes)."""
    hosts: list[flowx.FlowHost] = []

    async def make(*flows: flowx.Plan, **kw: object) -> flowx.FlowHost:
        kw.setdefault("store", memory_store)
        kw.setdefault("clock", clock)
        kw.setdefault("recovery", False)
        host = flowx.FlowHost(flows=flows, **kw)  # type: ignore[arg-type]
        await host.open()
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        await host.drain(timeout=1)
