"""``ShardedStores``: one ``Stores`` over N PostgreSQL primaries, sharded by tenant (R6.2,
R9.9).

Why a router with the same protocol, rather than a host that knows about shards: the host and
every service (recovery, timers, the publisher, retention, the CLI, the API) already speak
``Stores``, so they run on shards unchanged, and the store conformance suites hold the router
to the same contract as one database.

What it routes, and how:

- a new instance's id is *placed* on its tenant's shard (``ShardedIds.place``; the host calls
  it at every start) and every call naming an instance goes to the shard its id names — no
  lookup, no broadcast (``flowx.stores.placement``);
- leases, recovery, timers, queued claims, the outbox, the change feed and retention run per
  shard; a sweep goes on with the shards that answer, so a shard that is down holds up only
  its own instances;
- operators' reads (list, count, find by idempotency key) ask every shard and merge.

What it does not offer: ``CommitReleases`` (no shard offers it: PostgreSQL batches releases),
and any order across shards where none exists (the outbox and the change feed are served one
shard at a time; ``flowx.stores.sharded.feeds`` says why).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from flowx.stores.errors import JournalUnavailable
from flowx.stores.placement import MAX_SHARDS, place, tenant_shard
from flowx.stores.protocols import (
    ChangeFeed,
    FlowJournal,
    InstanceCatalog,
    LeasedCreate,
    LeaseStore,
    OutboxStore,
    QueueClaims,
    RecoveryIndex,
    RetentionStore,
    RoundTripBound,
    StopStore,
    StoreClock,
    Stores,
    WaitStore,
    WorkWakeups,
)
from flowx.stores.records import CreateResult, History, Lease, NewInstance
from flowx.stores.sharded.fanout import Router, answering, any_true, every, shares
from flowx.stores.sharded.feeds import ShardedChanges, ShardedOutbox, ShardedRetention
from flowx.stores.sharded.roles import (
    ShardedCatalog,
    ShardedJournal,
    ShardedLeases,
    ShardedRecovery,
    ShardedStops,
    ShardedWaits,
)


@runtime_checkable
class ShardBackend(
    Stores, QueueClaims, LeasedCreate, WorkWakeups, StoreClock, RoundTripBound, Protocol
):
    """What one shard must offer: everything the PostgreSQL store does, so the router can
    honestly offer it too."""

    async def create_roles(
        self, *, prefix: str | None = None, grants: Sequence[tuple[str, str]] = ()
    ) -> dict[str, Any]:
        """The schema's least-privilege roles (R9.8)."""
        ...


class ShardedStores:
    """``Stores`` routing over ``shards`` (index = shard number, fixed for the data's life).

    ``pins`` places named tenants on a chosen shard instead of their hash's (README
    "Sharding the journal": moving a tenant, adding a shard)."""

    def __init__(self, shards: Sequence[Stores], *, pins: Mapping[str, int] | None = None) -> None:
        if not 1 <= len(shards) <= MAX_SHARDS:
            raise ValueError(f"a sharded store has 1 to {MAX_SHARDS} shards, not {len(shards)}")
        for index, shard in enumerate(shards):
            if not isinstance(shard, ShardBackend):
                raise TypeError(
                    f"shard {index} ({shard.describe()}) is not a PostgreSQL store; every "
                    "shard must be one (flowx.postgres(...))"
                )
        self._pins = dict(pins or {})
        for tenant, index in self._pins.items():
            if not 0 <= index < len(shards):
                raise ValueError(
                    f"tenant {tenant!r} is pinned to shard {index}, but there are "
                    f"{len(shards)} shards (0..{len(shards) - 1})"
                )
        self.shards: tuple[ShardBackend, ...] = tuple(shards)  # type: ignore[arg-type]
        self.router = self.make_router(len(shards))
        self._journal = ShardedJournal(self.shards, self.router)
        self._leases = ShardedLeases(self.shards, self.router)
        self._recovery = ShardedRecovery(self.shards, self.router)
        self._catalog = ShardedCatalog(self.shards, self.router)
        self._waits = ShardedWaits(self.shards, self.router)
        self._stops = ShardedStops(self.shards, self.router)
        self._outbox = ShardedOutbox(self.shards)
        self._changes = ShardedChanges(self.shards)
        self._retention = ShardedRetention(self.shards, self.router)
        self._claim_turn = 0

    @property
    def journal(self) -> FlowJournal:
        return self._journal

    @property
    def leases(self) -> LeaseStore:
        return self._leases

    @property
    def recovery(self) -> RecoveryIndex:
        return self._recovery

    @property
    def catalog(self) -> InstanceCatalog:
        return self._catalog

    @property
    def outbox(self) -> OutboxStore:
        return self._outbox

    @property
    def changes(self) -> ChangeFeed:
        return self._changes

    @property
    def waits(self) -> WaitStore:
        return self._waits

    @property
    def stops(self) -> StopStore:
        return self._stops

    @property
    def retention(self) -> RetentionStore:
        return self._retention

    # -- placement ----------------------------------------------------------------------

    def make_router(self, count: int) -> Router:
        """The one router every role shares. The seam exists for the store conformance
        suite, which mints unplaced ids: its sharded variant (``tests/support/spread.py``)
        routes them over every shard so the merges are exercised. Real users keep
        ``Router``: an unplaced id lives on shard 0 (README "Sharding the journal")."""
        return Router(count)

    def shard_for_tenant(self, tenant: str | None) -> int:
        """The shard new instances of ``tenant`` are placed on."""
        return tenant_shard(tenant, len(self.shards), self._pins)

    def shard_of(self, instance_id: str) -> int:
        """The shard ``instance_id`` lives on (what every call naming it is routed by)."""
        return self.router.shard(instance_id)

    def place(self, instance_id: str, tenant: str | None) -> str:
        """``ShardedIds``: ``instance_id`` placed on ``tenant``'s shard."""
        return place(instance_id, self.shard_for_tenant(tenant))

    # -- lifecycle ----------------------------------------------------------------------

    async def open(self) -> None:
        results = await asyncio.gather(*(s.open() for s in self.shards), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            opened = [s for s, r in zip(self.shards, results, strict=True) if r is None]
            await asyncio.gather(*(s.close() for s in opened), return_exceptions=True)
            raise failed[0]

    async def close(self) -> None:
        results = await asyncio.gather(*(s.close() for s in self.shards), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def describe(self) -> str:
        parts = "; ".join(f"shard {i}: {s.describe()}" for i, s in enumerate(self.shards))
        return f"sharded by tenant over {len(self.shards)} ({parts})"

    async def schema_version(self) -> int | None:
        """The oldest shard's: the code must know every shard's schema."""
        versions = await every([s.schema_version() for s in self.shards])
        known = [v for v in versions if v is not None]
        return min(known) if known else None

    # -- capabilities -------------------------------------------------------------------

    async def create_roles(
        self, *, prefix: str | None = None, grants: Sequence[tuple[str, str]] = ()
    ) -> dict[str, Any]:
        """``flowx migrate --roles`` (R9.8) on every shard: the same group roles and grants
        on each, so a login works wherever its instances are. What shard 0 made is returned
        (the others made the same names)."""
        made = await every([s.create_roles(prefix=prefix, grants=grants) for s in self.shards])
        return made[0]

    def bound_round_trips(self, seconds: float) -> None:
        """``RoundTripBound``: every shard's round trips."""
        for shard in self.shards:
            shard.bound_round_trips(seconds)

    async def store_clock(self) -> list[tuple[str, datetime]]:
        """``StoreClock``: each shard's server decides its own leases and recovery."""
        clocks = await every([s.store_clock() for s in self.shards])
        return [(f"shard {i}: {what}", now) for i, each in enumerate(clocks) for what, now in each]

    async def wait_work(self, timeout: float) -> bool:
        """``WorkWakeups``: wake when any shard says an instance became runnable."""
        return await any_true([s.wait_work(timeout) for s in self.shards], timeout)

    async def create_leased(
        self, instance: NewInstance, *, owner: str, ttl: timedelta, now: datetime | None
    ) -> tuple[Lease | None, CreateResult | None]:
        """``LeasedCreate``: on the instance's shard, in one statement there."""
        shard = self.shards[self.router.shard(instance.instance_id)]
        return await shard.create_leased(instance, owner=owner, ttl=ttl, now=now)

    async def claim_queued(
        self,
        *,
        owner: str,
        ttl: timedelta,
        limit: int,
        flows: Sequence[str] | None,
        now: datetime | None,
    ) -> list[tuple[Lease, History]]:
        """``QueueClaims``: the page split over the shards (one claim each, concurrently,
        the remainder rotating); what a shard with less queued leaves over goes to the
        others in turn, each asked once more, until the page is full or every shard has
        come up short. A shard that cannot answer is passed over."""
        count = len(self.shards)
        self._claim_turn = (self._claim_turn + 1) % count
        wanted = shares(limit, count, self._claim_turn)

        async def claim(index: int, n: int) -> tuple[int, int, list[tuple[Lease, History]]]:
            if n <= 0:
                return index, n, []
            got = await self.shards[index].claim_queued(
                owner=owner, ttl=ttl, limit=n, flows=flows, now=now
            )
            return index, n, list(got)

        first = await answering([claim(i, n) for i, n in enumerate(wanted)])
        taken = list(itertools.chain.from_iterable(page for _, _, page in first))
        short = {i for i, n, page in first if len(page) < n}
        short |= set(range(count)) - {i for i, _, _ in first}  # did not answer
        for index in (i % count for i in range(self._claim_turn, self._claim_turn + count)):
            left = limit - len(taken)
            if left <= 0:
                break
            if index in short:
                continue
            try:
                _, _, page = await claim(index, left)
            except JournalUnavailable:
                continue
            taken.extend(page)
        return taken
