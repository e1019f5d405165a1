"""The instance-addressed roles over shards: journal, leases, recovery, catalog, waits, stops.

A call that names an instance goes to the one shard its id names (``Router``): no lookup, no
broadcast. A call that names none (a scan, a list) asks every shard and merges the pages in
the order the protocol promises, so a caller cannot tell N shards from one database — except
``find_due``, whose candidates carry no wake time to merge by: each shard's page is earliest
first, and the pages are interleaved (every one of them is due, so none is taken too early).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from datetime import datetime, timedelta

from flowx.stores.protocols import InstanceQuery, Stores
from flowx.stores.records import (
    CreateResult,
    EventRecord,
    History,
    InstanceRecord,
    Lease,
    NewInstance,
    RecoveryCandidate,
    SignalReceipt,
    SignalRecord,
    StepCommit,
    StepRecord,
    StopReceipt,
    StopRequest,
    SuspendCommit,
)
from flowx.stores.sharded.fanout import Router, answering, every


class _Shards:
    """What every role holds: the shards, in order, and the router over them."""

    def __init__(self, shards: Sequence[Stores], router: Router) -> None:
        self._shards = tuple(shards)
        self._router = router

    def _of(self, instance_id: str) -> Stores:
        return self._shards[self._router.shard(instance_id)]


class ShardedJournal(_Shards):
    """``FlowJournal``: every call names an instance, so it goes to that instance's shard."""

    async def create(
        self, instance: NewInstance, *, token: int, now: datetime | None
    ) -> CreateResult:
        return await self._of(instance.instance_id).journal.create(instance, token=token, now=now)

    async def open(self, instance_id: str, *, token: int, now: datetime | None) -> History:
        return await self._of(instance_id).journal.open(instance_id, token=token, now=now)

    async def commit(self, commit: StepCommit) -> int | None:
        return await self._of(commit.instance_id).journal.commit(commit)

    async def get(self, instance_id: str) -> InstanceRecord | None:
        return await self._of(instance_id).journal.get(instance_id)

    async def find_by_key(self, flow_id: str, idempotency_key: str) -> InstanceRecord | None:
        # The id derives from the key *and* the tenant, which the caller may not know: ask
        # every shard (one indexed read each, concurrently). The oldest start wins a tie.
        found = await every([s.journal.find_by_key(flow_id, idempotency_key) for s in self._shards])
        hits = [r for r in found if r is not None]
        return min(hits, key=lambda r: (r.created_at, r.instance_id)) if hits else None

    async def steps(self, instance_id: str) -> Sequence[StepRecord]:
        return await self._of(instance_id).journal.steps(instance_id)

    async def events(self, instance_id: str) -> Sequence[EventRecord]:
        return await self._of(instance_id).journal.events(instance_id)


class ShardedLeases(_Shards):
    """``LeaseStore``: leases stay per shard, beside the instance they fence (R3.1)."""

    async def acquire(
        self,
        instance_id: str,
        *,
        owner: str,
        ttl: timedelta,
        now: datetime | None,
        floor: int = 0,
    ) -> Lease | None:
        leases = self._of(instance_id).leases
        return await leases.acquire(instance_id, owner=owner, ttl=ttl, now=now, floor=floor)

    async def renew(self, lease: Lease, *, ttl: timedelta, now: datetime | None) -> Lease:
        return await self._of(lease.instance_id).leases.renew(lease, ttl=ttl, now=now)

    async def renew_many(
        self, leases: Sequence[Lease], *, ttl: timedelta, now: datetime | None
    ) -> Sequence[Lease | None]:
        # One round trip per shard, concurrently; answers back in the order asked.
        groups: dict[int, list[int]] = {}
        for position, lease in enumerate(leases):
            groups.setdefault(self._router.shard(lease.instance_id), []).append(position)
        answers: list[Lease | None] = [None] * len(leases)

        async def renew(shard: int, positions: list[int]) -> None:
            renewed = await self._shards[shard].leases.renew_many(
                [leases[p] for p in positions], ttl=ttl, now=now
            )
            for p, lease in zip(positions, renewed, strict=True):
                answers[p] = lease

        # A shard that cannot answer leaves its leases ``None`` (lost): its runs could not
        # commit anyway, and they are recovered once it is back. The others' leases must not
        # lapse for it, so this is the sweep's fan-out, not the operator's.
        await answering([renew(s, ps) for s, ps in groups.items()])
        return answers

    async def release(self, lease: Lease, *, now: datetime | None) -> None:
        await self._of(lease.instance_id).leases.release(lease, now=now)

    async def current(self, instance_id: str) -> Lease | None:
        return await self._of(instance_id).leases.current(instance_id)


def _oldest_first(
    pages: Sequence[Sequence[RecoveryCandidate]], limit: int, offset: int
) -> Sequence[RecoveryCandidate]:
    merged = heapq.merge(*pages, key=lambda c: (c.updated_at, c.instance_id))
    return tuple(itertools.islice(merged, offset, offset + limit))


class ShardedRecovery(_Shards):
    """``RecoveryIndex``: each shard's page from its start, merged oldest first, then the
    caller's window cut out of the merge (a global offset is no shard's offset)."""

    async def find_abandoned(
        self, *, now: datetime | None, idle_for: timedelta, limit: int, offset: int = 0
    ) -> Sequence[RecoveryCandidate]:
        pages = await answering(
            [
                s.recovery.find_abandoned(now=now, idle_for=idle_for, limit=limit + offset)
                for s in self._shards
            ]
        )
        return _oldest_first(pages, limit, offset)

    async def find_queued(self, *, limit: int, offset: int = 0) -> Sequence[RecoveryCandidate]:
        pages = await answering(
            [s.recovery.find_queued(limit=limit + offset) for s in self._shards]
        )
        return _oldest_first(pages, limit, offset)


class ShardedCatalog(_Shards):
    """``InstanceCatalog``: every shard's page merged newest first; counts summed. The keyset
    ``before`` is global (``created_at``, id), so each shard applies it as it is."""

    async def list_instances(self, query: InstanceQuery) -> Sequence[InstanceRecord]:
        pages = await every([s.catalog.list_instances(query) for s in self._shards])
        merged = heapq.merge(*pages, key=lambda r: (r.created_at, r.instance_id), reverse=True)
        return tuple(itertools.islice(merged, query.limit))

    async def count_instances(self, query: InstanceQuery, *, by: str) -> dict[str, int]:
        counts = await every([s.catalog.count_instances(query, by=by) for s in self._shards])
        total: dict[str, int] = {}
        for count in counts:
            for key, n in count.items():
                total[key] = total.get(key, 0) + n
        return dict(sorted(total.items()))


class ShardedWaits(_Shards):
    """``WaitStore``: a wait is on its instance's shard; the timer scan asks every shard."""

    async def suspend(self, commit: SuspendCommit) -> bool:
        return await self._of(commit.instance_id).waits.suspend(commit)

    async def signal(
        self,
        instance_id: str,
        name: str,
        payload: str,
        *,
        key: str | None,
        now: datetime,
        limit: int | None = None,
    ) -> SignalReceipt:
        waits = self._of(instance_id).waits
        return await waits.signal(instance_id, name, payload, key=key, now=now, limit=limit)

    async def signals(self, instance_id: str, name: str) -> Sequence[SignalRecord]:
        return await self._of(instance_id).waits.signals(instance_id, name)

    async def find_due(
        self, *, now: datetime, limit: int, flows: Sequence[str] | None = None
    ) -> Sequence[RecoveryCandidate]:
        pages = await answering(
            [s.waits.find_due(now=now, limit=limit, flows=flows) for s in self._shards]
        )
        interleaved = itertools.chain.from_iterable(itertools.zip_longest(*pages))
        return tuple(itertools.islice((c for c in interleaved if c is not None), limit))

    async def next_wake(self, *, flows: Sequence[str] | None = None) -> datetime | None:
        wakes = await answering([s.waits.next_wake(flows=flows) for s in self._shards])
        return min((w for w in wakes if w is not None), default=None)

    async def rearm(
        self,
        instance_id: str,
        *,
        token: int,
        now: datetime,
        from_step: int,
        rerun_from: int | None = None,
        deadline: datetime | None = None,
        resume: bool = False,
    ) -> InstanceRecord:
        return await self._of(instance_id).waits.rearm(
            instance_id,
            token=token,
            now=now,
            from_step=from_step,
            rerun_from=rerun_from,
            deadline=deadline,
            resume=resume,
        )


class ShardedStops(_Shards):
    """``StopStore``: a stop reaches the instance and its descendants, all on one shard (a
    child is placed on its parent's), in that shard's one write."""

    async def request_stop(self, instance_id: str, request: StopRequest) -> StopReceipt:
        return await self._of(instance_id).stops.request_stop(instance_id, request)

    async def stop_requests(self, instance_ids: Sequence[str]) -> dict[str, str]:
        groups = self._router.group(instance_ids)
        # Asked at every renewal: one shard down must not hide the others' stops.
        found = await answering(
            [self._shards[s].stops.stop_requests(ids) for s, ids in groups.items()]
        )
        return {k: v for part in found for k, v in part.items()}
