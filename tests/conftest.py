"""Shared fixtures: a fake clock, hosts over the in-memory store, PostgreSQL schemas and a
throwaway Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

import flowx
from flowx.stores.sharded import ShardedStores
from flowx.testing import FakeClock
from tests.support.hosts import fold_settings
from tests.support.servers import ServerUnavailable, ThrowawayPostgres, ThrowawayRedis


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
        kw.setdefault("timers", False)  # tests sweep with host.timers.run_once()
        host = flowx.FlowHost(flows=flows, **fold_settings(kw))  # type: ignore[arg-type]
        await host.open()
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        await host.drain(timeout=1)


@pytest.fixture
def pg_schema() -> Iterator[Callable[[], str]]:
    """Hands out fresh PostgreSQL schema names and drops them after the test.

    Each test gets an empty journal on the real server without touching anyone else's tables.
    """
    import uuid

    import psycopg

    from tests.postgres_support import PG_DSN

    made: list[str] = []

    def make() -> str:
        name = f"flowx_t_{uuid.uuid4().hex[:12]}"
        made.append(name)
        return name

    yield make
    if made:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            for name in made:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')  # type: ignore[arg-type]


@pytest.fixture
def redis() -> Iterator[ThrowawayRedis]:
    """A ``redis-server`` of the test's own, for tests that stop or restart it: the shared
    one on 6379 is never touched."""
    try:
        server = ThrowawayRedis()
    except ServerUnavailable as e:
        pytest.skip(str(e))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def pg_shards() -> Iterator[list[ThrowawayPostgres]]:
    """Three PostgreSQL clusters of this session's own, one per shard of a sharded journal
    (R6.2, R9.9): each on its own port, so a test may stop one without touching the shared
    server. ``fsync`` off: nothing here outlives the session."""
    try:
        clusters = [
            ThrowawayPostgres(f"flowx-shard{i}-", {"fsync": "off", "max_connections": "300"})
            for i in range(3)
        ]
    except ServerUnavailable as e:
        pytest.skip(str(e))
    try:
        # initdb and start are subprocesses: three at once, not one after another.
        with ThreadPoolExecutor(len(clusters)) as pool:
            list(pool.map(ThrowawayPostgres.start, clusters))
        yield clusters
    finally:
        for cluster in clusters:
            cluster.destroy()


@pytest.fixture
def sharded_schema(pg_shards: list[ThrowawayPostgres]) -> Callable[[], ShardedStores]:
    """Builds sharded stores over the three clusters, each test in schemas of its own (the
    clusters are the session's; they are destroyed with it, schemas and all)."""
    import uuid

    from flowx.stores.postgres import PostgresStores

    def make() -> ShardedStores:
        schema = f"flowx_s_{uuid.uuid4().hex[:12]}"
        return ShardedStores([PostgresStores(c.dsn, schema=schema) for c in pg_shards])

    return make


@pytest.fixture
def spread_sharded_schema(pg_shards: list[ThrowawayPostgres]) -> Callable[[], ShardedStores]:
    """As ``sharded_schema``, but unplaced ids (the conformance suites mint v4 ids) are
    spread over the three shards by a stable hash, so the suites exercise the merges across
    shards (issue 18; ``tests/support/spread.py`` says what it keeps of production placement)."""
    import uuid

    from flowx.stores.postgres import PostgresStores
    from tests.support.spread import SpreadShardedStores

    def make() -> ShardedStores:
        schema = f"flowx_s_{uuid.uuid4().hex[:12]}"
        return SpreadShardedStores([PostgresStores(c.dsn, schema=schema) for c in pg_shards])

    return make
