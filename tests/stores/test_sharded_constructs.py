"""Sub-flows, forks, cancel and terminate on the sharded journal (R6.2, R9.9).

The engine's tests for the constructs that touch more than one instance — a child's end
waking its parent, a stop reaching every descendant, each in one transaction — run here
unmodified on three PostgreSQL clusters behind ``ShardedStores``. They pass only if a child is
placed on its parent's shard (``flowx.stores.placement.inherit``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import flowx
from flowx.stores.protocols import Stores
from flowx.testing import FakeClock
from tests.engine.test_cancel_terminate import *  # noqa: F403
from tests.engine.test_cancel_terminate import _reset as _reset_stops  # noqa: F401
from tests.engine.test_sub_flows_and_forks import *  # noqa: F403
from tests.engine.test_sub_flows_and_forks import _reset as _reset_compositions  # noqa: F401
from tests.support.hosts import fold_settings
from tests.support.servers import ThrowawayPostgres


@pytest.fixture
def store_maker(pg_shards: list[ThrowawayPostgres]) -> Callable[[], Stores]:
    """A fresh store object per host, all on the same three schemas: several hosts are
    several nodes."""
    schema = f"flowx_c_{uuid.uuid4().hex[:12]}"
    return lambda: flowx.sharded([c.dsn for c in pg_shards], schema=schema)


@pytest.fixture
def memory_store(store_maker: Callable[[], Stores]) -> Stores:
    """Despite the name (the engine tests' fixture), the sharded store."""
    return store_maker()


@pytest.fixture
async def host_factory(
    clock: FakeClock, store_maker: Callable[[], Stores]
) -> AsyncIterator[Callable[..., Any]]:
    hosts: list[flowx.FlowHost] = []

    async def make(*flows: flowx.Plan, **kw: Any) -> flowx.FlowHost:
        kw.setdefault("store", store_maker())
        kw.setdefault("clock", clock)
        kw.setdefault("recovery", False)
        kw.setdefault("timers", False)
        host = flowx.FlowHost(flows=flows, **fold_settings(kw))
        await host.open()
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        await host.drain(timeout=1)
