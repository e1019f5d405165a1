"""Sub-flows, forks, cancel and terminate on the sharded journal (R6.2, R9.9).

The engine's tests for the constructs that touch more than one instance — a child's end
waking its parent, a stop reaching every descendant, each in one transaction — run here
unmodified on three PostgreSQL clusters behind ``ShardedStores``. They pass only if a child is
placed on its parent's shard (``flowx.stores.placement.inherit``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

import flowx
from flowx.stores.protocols import Stores
from tests.engine.test_cancel_terminate import *  # noqa: F403
from tests.engine.test_cancel_terminate import _reset as _reset_stops  # noqa: F401
from tests.engine.test_sub_flows_and_forks import *  # noqa: F403
from tests.engine.test_sub_flows_and_forks import _reset as _reset_compositions  # noqa: F401

# The engine tests' hosts, over this module's store_maker (fixtures resolve from the test).
from tests.hosting.test_constructs_on_stores import host_factory, memory_store  # noqa: F401
from tests.support.servers import ThrowawayPostgres


@pytest.fixture
def store_maker(pg_shards: list[ThrowawayPostgres]) -> Callable[[], Stores]:
    """A fresh store object per host, all on the same three schemas: several hosts are
    several nodes."""
    schema = f"flowx_c_{uuid.uuid4().hex[:12]}"
    return lambda: flowx.sharded([c.dsn for c in pg_shards], schema=schema)
