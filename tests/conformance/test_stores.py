"""Every store runs the same suites, unmodified (R1.2). PostgreSQL and Redis join here."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from flowx.stores.memory import MemoryStores
from flowx.stores.paired import with_leases
from flowx.stores.postgres import PostgresStores
from flowx.stores.protocols import Stores
from flowx.stores.redis import RedisLeaseStore
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
        backend = request.getfixturevalue("sharded_schema")()
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
            backend = request.getfixturevalue("sharded_schema")()
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
