"""Every broker adapter runs the publisher suite on the real server here (R5.4)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from flowx.outbox import RecordingPublisher, RedisStreamsPublisher
from flowx.outbox.publisher import EventPublisher
from flowx.stores.records import EventRecord
from flowx.testing.conformance.publishers import PublisherConformance, Received
from tests.redis_support import REDIS_URL, drop_redis_prefix

DEAD_PORT_URL = "redis://127.0.0.1:1/0"


class RecordingHarness:
    def __init__(self) -> None:
        self.publisher = RecordingPublisher()

    async def received(self) -> list[Received]:
        return [
            Received(e.event_id, e.partition_key, e.type, e.payload, _headers(e))
            for e in self.publisher.received
        ]

    async def take_only_first(self, events: Sequence[EventRecord], count: int) -> None:
        self.publisher.accept_at_most = count

    async def restore(self) -> None:
        self.publisher.accept_at_most = None

    def unreachable(self) -> EventPublisher:
        down = RecordingPublisher()
        down.down = True
        return down


def _headers(e: EventRecord) -> dict[str, str]:
    from flowx.outbox.publisher import headers

    return headers(e)


class RedisHarness:
    """A stream per key. Taking only part of a batch: the stream of ``events[count]`` is made
    a plain string key, which Redis refuses (WRONGTYPE) in the middle of the pipeline."""

    def __init__(self, prefix: str) -> None:
        from redis import asyncio as aioredis

        self.prefix = prefix
        self.publisher = RedisStreamsPublisher(REDIS_URL, prefix=f"{prefix}:")
        self.client: Any = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
        self._blocked: str | None = None

    async def received(self) -> list[Received]:
        out: list[Received] = []
        keys = sorted([k async for k in self.client.scan_iter(match=f"{self.prefix}:*")])
        for key in keys:
            if await self.client.type(key) != "stream":
                continue
            for _id, fields in await self.client.xrange(key):
                headers = {k: v for k, v in fields.items() if k != "payload"}
                out.append(
                    Received(
                        fields["event_id"],
                        fields.get("partition_key"),
                        fields["type"],
                        fields["payload"],
                        headers,
                    )
                )
        return out

    async def take_only_first(self, events: Sequence[EventRecord], count: int) -> None:
        key = self.publisher.stream(events[count].partition_key)
        assert all(e.partition_key != events[count].partition_key for e in events[:count])
        await self.client.set(key, "not a stream")
        self._blocked = key

    async def restore(self) -> None:
        if self._blocked:
            await self.client.delete(self._blocked)
            self._blocked = None

    def unreachable(self) -> EventPublisher:
        return RedisStreamsPublisher(DEAD_PORT_URL, timeout=2.0)

    async def close(self) -> None:
        await self.publisher.close()
        await self.client.aclose()
        await drop_redis_prefix(self.prefix)


@pytest.fixture(params=["recording", "redis"])
async def broker(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    if request.param == "recording":
        yield RecordingHarness()
        return
    harness = RedisHarness(f"flowx-test-{uuid.uuid4().hex[:12]}")
    await harness.publisher.open()
    try:
        yield harness
    finally:
        await harness.close()


class TestPublishers(PublisherConformance):
    pass
