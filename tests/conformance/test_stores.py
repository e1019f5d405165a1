"""Every store runs the same suites, unmodified (R1.2). PostgreSQL and Redis join here."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from flowx.stores.memory import MemoryStores
from flowx.stores.paired import with_leases
from flowx.stores.postgres import PostgresStores
from flowx.stores.protocols import InstanceQuery, Stores
from flowx.stores.redis import RedisLeaseStore
from flowx.stores.sharded import ShardedStores
from flowx.stores.sqlite import SqliteStores
from flowx.testing.conformance import (
    ChangeFeedConformance,
    InstanceCatalogConformance,
    JournalConformance,
    LeaseStoreConformance,
    OutboxConformance,
    RecoveryIndexConformance,
    RetentionStoreConformance,
    StopStoreConformance,
    WaitStoreConformance,
)
from flowx.testing.conformance._support import at, instance, make_instance
from tests.postgres_support import PG_DSN
from tests.redis_support import REDIS_URL, drop_redis_prefix


@pytest.fixture(params=["memory", "sqlite", "postgres", "sharded"])
async def stores(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: Callable[[], str]
) -> AsyncIterator[Stores]:
    backend: Stores
    if request.param == "memory":
        backend = MemoryStores()
    elif request.param == "sqlite":
        backend = SqliteStores(tmp_path / "flowx.db")
    elif request.param == "sharded":  # three PostgreSQL clusters behind one router (R6.2)
        # The suite's ids are unplaced: spread them, or every instance is on shard 0.
        backend = request.getfixturevalue("spread_sharded_schema")()
    else:
        backend = PostgresStores(PG_DSN, schema=pg_schema())
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()


class TestJournal(JournalConformance):
    pass


class TestLeaseStore(LeaseStoreConformance):
    """Leases run on Redis too, paired with the PostgreSQL journal as in production."""

    @pytest.fixture(params=["memory", "sqlite", "postgres", "sharded", "redis"])
    async def stores(
        self, request: pytest.FixtureRequest, tmp_path: Path, pg_schema: Callable[[], str]
    ) -> AsyncIterator[Stores]:
        prefix = f"flowx-test-{uuid.uuid4().hex[:12]}"
        backend: Stores
        if request.param == "memory":
            backend = MemoryStores()
        elif request.param == "sqlite":
            backend = SqliteStores(tmp_path / "flowx.db")
        elif request.param == "postgres":
            backend = PostgresStores(PG_DSN, schema=pg_schema())
        elif request.param == "sharded":
            backend = request.getfixturevalue("spread_sharded_schema")()
        else:
            backend = with_leases(
                PostgresStores(PG_DSN, schema=pg_schema()),
                RedisLeaseStore(REDIS_URL, prefix=prefix),
            )
        await backend.open()
        try:
            yield backend
        finally:
            await backend.close()
            if request.param == "redis":
                await drop_redis_prefix(prefix)


class TestRecoveryIndex(RecoveryIndexConformance):
    pass


class TestOutbox(OutboxConformance):
    pass


class TestChangeFeed(ChangeFeedConformance):
    pass


class TestWaitStore(WaitStoreConformance):
    pass


class TestStopStore(StopStoreConformance):
    pass


class TestRetentionStore(RetentionStoreConformance):
    pass


class TestInstanceCatalog(InstanceCatalogConformance):
    pass


async def test_the_sharded_variant_spreads_the_suites_ids_over_every_shard(
    spread_sharded_schema: Callable[[], ShardedStores],
    sharded_schema: Callable[[], ShardedStores],
) -> None:
    """The suite's unplaced ids reach every shard (issue 18), counted on each shard's own
    database, not through the router; and a child still lives on its parent's shard and a
    repeated idempotency key still meets the first start (production placement, R6.2)."""
    store = spread_sharded_schema()
    await store.open()
    try:
        # Fixed v5 ids (unplaced, as the suite's v4 ones): the same spread on every run.
        ids = [str(uuid.uuid5(uuid.NAMESPACE_URL, f"flowx-spread-{n}")) for n in range(20)]
        for iid in ids:
            await make_instance(store, instance_id=iid)
        per_shard = [
            sum((await shard.catalog.count_instances(InstanceQuery(), by="flow")).values())
            for shard in store.shards
        ]
        assert sum(per_shard) == len(ids)
        # Only the suite's store spreads them: for real users an unplaced id is shard 0's.
        assert {sharded_schema().shard_of(iid) for iid in ids} == {0}
        assert all(n > 0 for n in per_shard), per_shard
        listed = await store.catalog.list_instances(InstanceQuery(limit=100))
        assert sorted(r.instance_id for r in listed) == sorted(ids)

        for parent in ids[:6]:
            child = await make_instance(
                store, parent_instance_id=parent, parent_scope="", parent_step_id=1
            )
            assert store.shard_of(child) == store.shard_of(parent)
        first = await store.journal.create(
            instance(idempotency_key="spread-key"), token=1, now=at(0)
        )
        again = await store.journal.create(
            instance(idempotency_key="spread-key"), token=1, now=at(1)
        )
        assert again.instance.instance_id == first.instance.instance_id
    finally:
        await store.close()
