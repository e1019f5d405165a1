"""Every wait, saga and composition construct, on the embedded and the production journal.

The engine tests (``tests/engine/test_waits.py``, ``test_compensation_failure.py``,
``test_sub_flows_and_forks.py``, ``test_saga_edges.py``, ``test_unstorable_values.py``,
``test_step_timeouts.py``, ``test_cancel_terminate.py``, ``test_quarantine.py``,
``test_replay_from_step.py``, and ``tests/hosting/test_tracing.py``) are
written against the ``memory_store`` fixture. Here that fixture is a real SQLite file and a real
PostgreSQL schema instead, and the same tests run unmodified: a construct that works only in
memory fails here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

import flowx
from flowx.stores.protocols import Stores
from flowx.testing import FakeClock
from tests.engine.test_cancel_terminate import *  # noqa: F403
from tests.engine.test_cancel_terminate import _reset as _reset_stops  # noqa: F401
from tests.engine.test_compensation_failure import *  # noqa: F403
from tests.engine.test_compensation_failure import _reset as _reset_sagas  # noqa: F401
from tests.engine.test_quarantine import *  # noqa: F403
from tests.engine.test_quarantine import _reset as _reset_quarantine  # noqa: F401
from tests.engine.test_replay_from_step import *  # noqa: F403
from tests.engine.test_replay_from_step import _reset as _reset_replays  # noqa: F401
from tests.engine.test_saga_edges import *  # noqa: F403
from tests.engine.test_saga_edges import _reset as _reset_edges  # noqa: F401
from tests.engine.test_step_timeouts import *  # noqa: F403
from tests.engine.test_step_timeouts import _reset_timeouts  # noqa: F401
from tests.engine.test_sub_flows_and_forks import *  # noqa: F403
from tests.engine.test_sub_flows_and_forks import _reset as _reset_compositions  # noqa: F401
from tests.engine.test_unstorable_values import *  # noqa: F403
from tests.engine.test_unstorable_values import _reset as _reset_unstorable  # noqa: F401
from tests.engine.test_waits import *  # noqa: F403
from tests.engine.test_waits import _reset as _reset_waits  # noqa: F401
from tests.hosting.test_tracing import *  # noqa: F403
from tests.hosting.test_tracing import _reset as _reset_tracing  # noqa: F401
from tests.postgres_support import PG_DSN
from tests.support.hosts import fold_settings


@pytest.fixture(params=["sqlite", "postgres"])
def store_maker(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: Callable[[], str]
) -> Callable[[], Stores]:
    """A fresh store object per host, all on one database: a host closes its store when it
    drains, and several hosts are several nodes."""
    schema = pg_schema()
    if request.param == "sqlite":
        return lambda: flowx.sqlite(tmp_path / "flowx.db")
    return lambda: flowx.postgres(PG_DSN, schema=schema)


@pytest.fixture
def memory_store(store_maker: Callable[[], Stores]) -> Stores:
    """Despite the name (the engine tests' fixture), a real store."""
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
