"""Every store runs the same suites, unmodified (R1.2). PostgreSQL and Redis join here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from flowx.stores.memory import MemoryStores
from flowx.stores.postgres import PostgresStores
from flowx.stores.protocols import Stores
from flowx.stores.sqlite import SqliteStores
from flowx.testing.conformance import (
    JournalConformance,
    LeaseStoreConformance,
    RecoveryIndexConformance,
)
from tests.postgres_support import PG_DSN


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def stores(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: Callable[[], str]
) -> AsyncIterator[Stores]:
    backend: Stores
    if request.param == "memory":
        backend = MemoryStores()
    elif request.param == "sqlite":
        backend = SqliteStores(tmp_path / "flowx.db")
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
    pass


class TestRecoveryIndex(RecoveryIndexConformance):
    pass
