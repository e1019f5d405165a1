"""The conformance suites, written once and run against every store (STYLE habit 1).

A store's tests subclass each suite and provide one fixture, ``stores``, yielding an opened
``Stores`` that is empty::

    class TestMyJournal(JournalConformance):
        @pytest.fixture
        async def stores(self):
            s = MyStores(...); await s.open()
            yield s
            await s.close()

A protocol change extends these suites in the same commit.
"""

from flowx.testing.conformance.catalog import InstanceCatalogConformance
from flowx.testing.conformance.journal import JournalConformance
from flowx.testing.conformance.leases import LeaseStoreConformance
from flowx.testing.conformance.outbox import ChangeFeedConformance, OutboxConformance
from flowx.testing.conformance.recovery import RecoveryIndexConformance
from flowx.testing.conformance.retention import RetentionStoreConformance
from flowx.testing.conformance.stops import StopStoreConformance
from flowx.testing.conformance.waits import WaitStoreConformance

__all__ = [
    "ChangeFeedConformance",
    "InstanceCatalogConformance",
    "JournalConformance",
    "LeaseStoreConformance",
    "OutboxConformance",
    "RecoveryIndexConformance",
    "RetentionStoreConformance",
    "StopStoreConformance",
    "WaitStoreConformance",
]
