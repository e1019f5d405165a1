"""Every store runs the same suites, unmodified (R1.2). PostgreSQL and Redis join here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from flowx.stores.memory import MemoryStores
from flowx.stores.protocols import Stores
from flowx.stores.sqlite import SqliteStores
from flowx.testing.conformance import (
    JournalConformance,
    LeaseStoreConformance,
    RecoveryIndexConformance,
)


@pytest.fixture(params=["memory", "sqlite"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    backend: Stores = (
        MemoryStores() if request.param == "memory" else SqliteStores(tmp_path / "flowx.db")
    )
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
