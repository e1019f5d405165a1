"""The outbox, the change feed and retention over shards: each shard keeps its own.

An event is staged in its instance's step commit, so it lives on the instance's shard, and
what orders it (``staged_seq``, the change cursor's ``(staged_xid, staged_seq)``) is one
server's sequence and transaction ids: there is no order *across* shards to merge by. So these
stay per shard and are served one shard at a time, in rotation:

- a publisher's claim is one shard's claim (the first, in rotation, with events pending), so
  order per partition key holds as on one database for every key whose events are staged on
  one shard — a key within one tenant always is;
- a change-feed read is one shard's batch, and its position names the shard: the consumer
  keeps one cursor row on every shard, and ``commit`` moves the named shard's.
Purges, subscriptions and retention run on every shard.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime

from flowx.stores.errors import JournalUnavailable, UnknownConsumer
from flowx.stores.placement import MAX_SHARDS
from flowx.stores.protocols import OutboxClaim, StagedWakeups, Stores
from flowx.stores.records import (
    ArchivedInstance,
    ChangeBatch,
    EventRecord,
    ExpiredInstance,
    InstanceState,
    OutboxBacklog,
    OutboxPurge,
    RetentionPolicy,
)
from flowx.stores.sharded.fanout import Router, answering, any_true, every

__all__ = ["ShardedChanges", "ShardedOutbox", "ShardedRetention"]

_SHARD_BITS = 8
_EARLIEST = datetime.min.replace(tzinfo=UTC)


class _Rotation:
    """Shard indexes in turn, so no shard's events always wait behind another's."""

    def __init__(self, shards: Sequence[Stores]) -> None:
        self._shards = tuple(shards)
        self._next = 0

    def order(self) -> list[int]:
        start = self._next
        self._next = (self._next + 1) % len(self._shards)
        return [(start + i) % len(self._shards) for i in range(len(self._shards))]


class _NoEvents:
    """The claim of an outbox with nothing pending on any shard."""

    @property
    def events(self) -> Sequence[EventRecord]:
        return ()

    def published(self, count: int) -> None:
        """Nothing was claimed, so nothing is marked."""

    def refused(self, event_id: str, *, reason: str, dead: bool) -> None:
        """Nothing was claimed, so nothing is refused."""


class ShardedOutbox(_Rotation):
    """``OutboxStore`` (and ``StagedWakeups``): one shard's claim at a time, in rotation."""

    @contextlib.asynccontextmanager
    async def claim(
        self, *, limit: int, now: datetime, owner: str, dead_letters_hold_keys: bool = False
    ) -> AsyncIterator[OutboxClaim]:
        failed: list[JournalUnavailable] = []
        for index in self.order():
            outbox = self._shards[index].outbox
            async with contextlib.AsyncExitStack() as stack:
                try:
                    claim = await stack.enter_async_context(
                        outbox.claim(
                            limit=limit,
                            now=now,
                            owner=owner,
                            dead_letters_hold_keys=dead_letters_hold_keys,
                        )
                    )
                except JournalUnavailable as exc:  # a shard down holds up only its own events
                    failed.append(exc)
                    continue
                if claim.events:
                    yield claim  # the caller's errors leave through this shard's claim
                    return
        if len(failed) == len(self._shards):
            raise failed[0]  # not one shard answered: the publisher must hear it
        yield _NoEvents()

    async def pending_count(self) -> int:
        return sum(await every([s.outbox.pending_count() for s in self._shards]))

    async def backlog(self) -> OutboxBacklog:
        parts = await every([s.outbox.backlog() for s in self._shards])
        oldest = [p.oldest_staged_at for p in parts if p.oldest_staged_at is not None]
        return OutboxBacklog(
            pending=sum(p.pending for p in parts),
            oldest_staged_at=min(oldest, default=None),
            dead=sum(p.dead for p in parts),
        )

    async def dead_letters(self, *, limit: int = 100) -> Sequence[EventRecord]:
        pages = await every([s.outbox.dead_letters(limit=limit) for s in self._shards])
        rows = sorted(
            itertools.chain.from_iterable(pages),
            key=lambda e: (e.dead_at or e.staged_at or _EARLIEST, e.event_id),
        )
        return tuple(rows[:limit])

    async def retry_dead_letter(self, event_id: str) -> bool:
        # An event id names no shard; the dead letter is on one of them.
        found = await every([s.outbox.retry_dead_letter(event_id) for s in self._shards])
        return any(found)

    async def wait_staged(self, timeout: float) -> bool:
        """``StagedWakeups``: told when any shard staged events."""
        outboxes = [s.outbox for s in self._shards]
        waits = [o.wait_staged(timeout) for o in outboxes if isinstance(o, StagedWakeups)]
        return await any_true(waits, timeout)


def _encode(shard: int, position: tuple[int, int]) -> tuple[int, int]:
    return ((position[0] << _SHARD_BITS) | shard, position[1])


def _decode(position: tuple[int, int]) -> tuple[int, tuple[int, int]]:
    return position[0] & (MAX_SHARDS - 1), (position[0] >> _SHARD_BITS, position[1])


class ShardedChanges(_Rotation):
    """``ChangeFeed``: a consumer has a cursor on every shard; a read returns one shard's
    batch, the first in rotation with events, its position naming the shard (opaque to the
    caller, as the protocol says)."""

    async def subscribe(self, consumer: str, *, now: datetime, from_start: bool = True) -> bool:
        made = await every(
            [s.changes.subscribe(consumer, now=now, from_start=from_start) for s in self._shards]
        )
        return any(made)

    async def read(self, consumer: str, *, limit: int = 500) -> ChangeBatch:
        first: ChangeBatch | None = None
        first_index = 0
        failed: JournalUnavailable | None = None
        for index in self.order():
            try:
                batch = await self._shards[index].changes.read(consumer, limit=limit)
            except JournalUnavailable as exc:  # a shard down holds up only its own events
                failed = exc
                continue
            if batch.events:
                return ChangeBatch(
                    consumer=consumer, events=batch.events, position=_encode(index, batch.position)
                )
            if first is None:
                first, first_index = batch, index
        if first is None:
            assert failed is not None  # nosec B101  # invariant: a store has at least one shard
            raise failed
        return ChangeBatch(
            consumer=consumer, events=(), position=_encode(first_index, first.position)
        )

    async def commit(self, consumer: str, position: tuple[int, int], *, now: datetime) -> None:
        shard, own = _decode(position)
        if shard >= len(self._shards):
            raise UnknownConsumer(consumer)
        await self._shards[shard].changes.commit(consumer, own, now=now)

    async def unsubscribe(self, consumer: str) -> bool:
        gone = await every([s.changes.unsubscribe(consumer) for s in self._shards])
        return any(gone)

    async def purge_published(self, *, before: datetime) -> OutboxPurge:
        parts = await answering([s.changes.purge_published(before=before) for s in self._shards])
        return OutboxPurge(
            deleted=sum(p.deleted for p in parts), held_back=sum(p.held_back for p in parts)
        )


class ShardedRetention:
    """``RetentionStore``: policies are written to every shard (each sweeps by its own copy);
    expired pages are merged oldest first; deletes go to the shards the instances are on."""

    def __init__(self, shards: Sequence[Stores], router: Router) -> None:
        self._shards = tuple(shards)
        self._router = router

    async def policies(self) -> Sequence[RetentionPolicy]:
        return await self._shards[0].retention.policies()

    async def set_policy(self, policy: RetentionPolicy) -> None:
        await every([s.retention.set_policy(policy) for s in self._shards])

    async def expired(
        self,
        *,
        flow_id: str | None,
        states: Sequence[InstanceState],
        ended_before: datetime,
        skip_flows: Sequence[str] = (),
        after: tuple[datetime, str] | None = None,
        limit: int,
    ) -> Sequence[ExpiredInstance]:
        pages = await answering(
            [
                s.retention.expired(
                    flow_id=flow_id,
                    states=states,
                    ended_before=ended_before,
                    skip_flows=skip_flows,
                    after=after,
                    limit=limit,
                )
                for s in self._shards
            ]
        )
        merged = heapq.merge(*pages, key=lambda e: (e.updated_at, e.instance_id))
        return tuple(itertools.islice(merged, limit))

    async def contents(self, instance_ids: Sequence[str]) -> Sequence[ArchivedInstance]:
        groups = self._router.group(instance_ids)
        parts = await every([self._shards[s].retention.contents(ids) for s, ids in groups.items()])
        return tuple(itertools.chain.from_iterable(parts))

    async def delete(self, expired: Sequence[ExpiredInstance]) -> int:
        groups: dict[int, list[ExpiredInstance]] = {}
        for e in expired:
            groups.setdefault(self._router.shard(e.instance_id), []).append(e)
        deleted = await every(
            [self._shards[s].retention.delete(rows) for s, rows in groups.items()]
        )
        return sum(deleted)
