"""One outbox, several brokers: each event is acknowledged once every broker took it.

Brokers are called in turn, each with the prefix the previous ones acknowledged, so no broker
gets an event ahead of an older one of its key. What a later broker refuses goes out again to
the earlier ones too (a duplicate there; consumers deduplicate by ``event_id``).
"""

from __future__ import annotations

from collections.abc import Sequence

from flowx.outbox.publisher import EventPublisher, PublishFailure, PublishResult
from flowx.stores.records import EventRecord


class FanOutPublisher:
    """Publish every event to several brokers, in order: an event counts as published only
    once each of them has acknowledged it, so no broker misses one."""

    def __init__(self, *publishers: EventPublisher) -> None:
        if not publishers:
            raise ValueError("FanOutPublisher needs at least one publisher")
        self.publishers = publishers

    @property
    def name(self) -> str:
        return "+".join(p.name for p in self.publishers)

    async def open(self) -> None:
        for p in self.publishers:
            await p.open()

    async def close(self) -> None:
        for p in self.publishers:
            await p.close()

    async def publish(self, events: Sequence[EventRecord]) -> PublishResult:
        batch = events
        failure: PublishFailure | None = None
        for p in self.publishers:
            if not batch:
                break
            result = await p.publish(batch)
            if result.acknowledged < len(batch):
                batch = batch[: result.acknowledged]
                reason = result.failure.reason if result.failure else "part of the batch"
                failure = PublishFailure(
                    f"{p.name}: {reason}", result.failure.permanent if result.failure else False
                )
        return PublishResult(len(batch), failure)
