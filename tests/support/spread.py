"""A sharded store for the store conformance suite that spreads unplaced ids over every shard.

Why: the conformance suites mint their own version-4 ids, which no sharded store placed, and
production keeps every such id on shard 0 (README "Sharding the journal": an unsharded
database can become shard 0). Run as is, the suite's sharded variant therefore puts all of
its instances on one shard and never exercises a merge across shards (recovery scans, due
timers, queued claims, outbox claims, list and count, retention, stop requests). This double
routes an unplaced id by a stable hash instead, so the suite's instances land on all three
shards (issue 18).

It keeps the two invariants production placement gives, or the suite would test a journal
no host can produce:

- a sub-flow child lives on its parent's shard (production: ``placement.inherit``), so a
  child's end waking its parent and a stop reaching descendants stay on one database;
- instances of one named tenant share a shard (production: placed by the tenant), so a suite
  that needs two instances on one shard (order per partition key holds only there) gives
  them a tenant;
- starts with the same idempotency key and tenant meet on one shard (production: the id is
  derived from the key and the tenant, then placed by the tenant).

Both are decided when the instance is created and remembered by the router (one store object
per test, so the memory lives exactly as long as the test's journal). Any other unplaced id,
including one never created (a lookup of an unknown id), goes where its hash says.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta

from flowx.stores.placement import jump, shard_of, tenant_hash
from flowx.stores.postgres import PostgresStores
from flowx.stores.protocols import Stores
from flowx.stores.records import CreateResult, Lease, NewInstance
from flowx.stores.sharded import ShardedStores
from flowx.stores.sharded.fanout import Router
from flowx.stores.sharded.roles import ShardedJournal


def _canonical(instance_id: str) -> str:
    """The id as the journal stores it (``uuid`` columns), so ``ABC…`` and ``abc…`` route
    alike; a string that is no UUID routes as written (the store answers it as unknown)."""
    try:
        return str(uuid.UUID(instance_id))
    except ValueError:
        return instance_id


def spread_shard(text: str, count: int) -> int:
    """The same stable hash placement uses for tenants (never Python's ``hash``)."""
    return jump(tenant_hash(text), count)


class SpreadRouter(Router):
    """``Router`` that sends an unplaced id to a hashed shard, not to shard 0."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self._homes: dict[str, int] = {}

    def shard(self, instance_id: str) -> int:
        if shard_of(instance_id) is not None:
            return super().shard(instance_id)  # a placed id: production routing, unchanged
        iid = _canonical(instance_id)
        home = self._homes.get(iid)
        return home if home is not None else spread_shard(iid, self.count)

    def admit(self, instance: NewInstance) -> None:
        """Decide a new unplaced instance's shard as production placement would group it."""
        iid = _canonical(instance.instance_id)
        if shard_of(iid) is not None or iid in self._homes:
            return
        if instance.parent_instance_id is not None:
            self._homes[iid] = self.shard(instance.parent_instance_id)
        elif instance.tenant_id is not None:
            self._homes[iid] = spread_shard(f"tenant\x00{instance.tenant_id}", self.count)
        elif instance.idempotency_key is not None:
            key = f"{instance.tenant_id or ''}\x00{instance.idempotency_key}"
            self._homes[iid] = spread_shard(key, self.count)


class _AdmittingJournal(ShardedJournal):
    """``ShardedJournal`` that lets the router decide a new instance's shard first."""

    def __init__(self, shards: Sequence[Stores], router: SpreadRouter) -> None:
        super().__init__(shards, router)
        self._spread = router

    async def create(
        self, instance: NewInstance, *, token: int, now: datetime | None
    ) -> CreateResult:
        self._spread.admit(instance)
        return await super().create(instance, token=token, now=now)


class SpreadShardedStores(ShardedStores):
    """``ShardedStores`` over PostgreSQL shards with unplaced ids spread (tests only)."""

    def __init__(self, shards: Sequence[PostgresStores]) -> None:
        super().__init__(shards)
        assert isinstance(self.router, SpreadRouter)
        self._spread = self.router
        self._journal = _AdmittingJournal(self.shards, self.router)

    def make_router(self, count: int) -> Router:
        return SpreadRouter(count)

    async def create_leased(
        self, instance: NewInstance, *, owner: str, ttl: timedelta, now: datetime | None
    ) -> tuple[Lease | None, CreateResult | None]:
        self._spread.admit(instance)
        return await super().create_leased(instance, owner=owner, ttl=ttl, now=now)
