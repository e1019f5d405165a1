"""A journal from one backend and leases from another (PostgreSQL journal, Redis leases).

Why pairing is safe: the fence is enforced by the journal, not by the lease store. The journal
raises its fence to a lease's token when the instance is opened or created and refuses every
commit under a lower one (R2.4), so a lease store that forgets or lags can cost a retry but
never a write past a fence. Because the two are separate, the pair does not offer
``LeasedCreate``: a start takes the lease, then writes the row.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Protocol

from flowx.stores.placement import ShardedIds
from flowx.stores.protocols import (
    ChangeFeed,
    FlowJournal,
    InstanceCatalog,
    LeaseStore,
    OutboxStore,
    RecoveryIndex,
    RetentionStore,
    RoundTripBound,
    StopStore,
    StoreClock,
    Stores,
    WaitStore,
    WorkWakeups,
)


class OpenableLeaseStore(LeaseStore, Protocol):
    """A lease store with a connection of its own to open and close."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    def describe(self) -> str: ...


class PairedStores:
    """``Stores`` whose leases come from ``leases`` and everything else from ``journal``."""

    def __init__(self, journal: Stores, leases: OpenableLeaseStore) -> None:
        self._base = journal
        self._leases = leases

    @property
    def journal(self) -> FlowJournal:
        return self._base.journal

    @property
    def leases(self) -> LeaseStore:
        return self._leases

    @property
    def recovery(self) -> RecoveryIndex:
        return self._base.recovery

    @property
    def catalog(self) -> InstanceCatalog:
        return self._base.catalog

    @property
    def outbox(self) -> OutboxStore:
        return self._base.outbox

    @property
    def changes(self) -> ChangeFeed:
        return self._base.changes

    @property
    def waits(self) -> WaitStore:
        return self._base.waits

    @property
    def stops(self) -> StopStore:
        return self._base.stops

    @property
    def retention(self) -> RetentionStore:
        return self._base.retention

    async def open(self) -> None:
        await self._base.open()
        try:
            await self._leases.open()
        except BaseException:
            await self._base.close()
            raise

    async def close(self) -> None:
        try:
            await self._leases.close()
        finally:
            await self._base.close()

    def describe(self) -> str:
        return f"{self._base.describe()}; {self._leases.describe()}"

    def bound_round_trips(self, seconds: float) -> None:
        for part in (self._base, self._leases):
            if isinstance(part, RoundTripBound):
                part.bound_round_trips(seconds)

    async def store_clock(self) -> list[tuple[str, datetime]]:
        """The journal's clock (recovery, ``updated_at``) and the lease store's (expiry)."""
        clocks: list[tuple[str, datetime]] = []
        for part in (self._base, self._leases):
            if isinstance(part, StoreClock):
                clocks.extend(await part.store_clock())
        return clocks

    async def schema_version(self) -> int | None:
        return await self._base.schema_version()

    def place(self, instance_id: str, tenant: str | None) -> str:
        """``ShardedIds`` from the journal when it places ids (a sharded one, its leases in
        Redis); any other journal keeps the id as drawn."""
        if isinstance(self._base, ShardedIds):
            return self._base.place(instance_id, tenant)
        return instance_id

    async def wait_work(self, timeout: float) -> bool:
        """``WorkWakeups`` from the journal, which is where work is made; a journal that
        cannot tell just waits ``timeout`` (the sweeps find the work)."""
        if isinstance(self._base, WorkWakeups):
            return await self._base.wait_work(timeout)
        await asyncio.sleep(timeout)
        return False


def with_leases(journal: Stores, leases: OpenableLeaseStore) -> PairedStores:
    """Pair a journal backend with a separate lease store."""
    return PairedStores(journal, leases)
