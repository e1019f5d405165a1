"""Every broker adapter runs the publisher suite on the real server here (R5.4)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from flowx.outbox import RecordingPublisher, RedisStreamsPublisher
from flowx.outbox.nats_jetstream import NatsJetStreamPublisher
from flowx.outbox.publisher import EventPublisher
from flowx.outbox.rabbitmq import RabbitMQPublisher
from flowx.stores.records import EventRecord
from flowx.testing.conformance.publishers import PublisherConformance, Received
from tests.redis_support import REDIS_URL, drop_redis_prefix

DEAD_PORT_URL = "redis://127.0.0.1:1/0"
RABBITMQ_URL = os.environ.get("FLOWX_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("FLOWX_TEST_NATS", "nats://127.0.0.1:4222")


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


class RabbitHarness:
    """An exchange and one queue bound to everything. Taking only part of a batch: the queue
    is declared again holding at most ``count`` messages with ``x-overflow: reject-publish``,
    so the broker nacks the rest."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.publisher = RabbitMQPublisher(RABBITMQ_URL, exchange=name)
        self._connection: Any = None
        self._channel: Any = None
        self._drained: list[Received] = []

    async def open(self) -> None:
        import aio_pika

        self._connection = await aio_pika.connect(RABBITMQ_URL, timeout=5)
        self._channel = await self._connection.channel()
        await self._channel.declare_exchange(self.name, aio_pika.ExchangeType.TOPIC, durable=True)
        await self._declare_queue(None)
        await self.publisher.open()

    async def _declare_queue(self, arguments: dict[str, Any] | None) -> Any:
        queue = await self._channel.declare_queue(self.name, durable=True, arguments=arguments)
        await queue.bind(self.name, routing_key="#")
        return queue

    async def _drain(self) -> None:
        queue = await self._channel.get_queue(self.name, ensure=False)
        while (message := await queue.get(no_ack=True, fail=False, timeout=5)) is not None:
            headers = {
                k: v.decode() if isinstance(v, bytes) else str(v)
                for k, v in (message.headers or {}).items()
            }
            self._drained.append(
                Received(
                    message.message_id,
                    headers.get("partition_key"),
                    message.type,
                    message.body.decode(),
                    headers,
                )
            )

    async def received(self) -> list[Received]:
        await self._drain()
        return list(self._drained)

    async def _redeclare(self, arguments: dict[str, Any] | None) -> None:
        await self._drain()
        await self._channel.queue_delete(self.name)
        await self._declare_queue(arguments)

    async def take_only_first(self, events: Sequence[EventRecord], count: int) -> None:
        await self._redeclare({"x-max-length": count, "x-overflow": "reject-publish"})

    async def restore(self) -> None:
        await self._redeclare(None)

    def unreachable(self) -> EventPublisher:
        return RabbitMQPublisher("amqp://guest:guest@127.0.0.1:1/", timeout=2.0)

    async def close(self) -> None:
        await self.publisher.close()
        if self._channel is not None:
            await self._channel.queue_delete(self.name)
            await self._channel.exchange_delete(self.name)
        if self._connection is not None:
            await self._connection.close()


class NatsHarness:
    """A stream over ``{prefix}.>``. Taking only part of a batch: the stream is limited to
    ``count`` more messages with ``discard: new``, so JetStream refuses the rest."""

    def __init__(self, name: str) -> None:
        self.stream = name.replace("-", "_").upper()
        self.prefix = name
        self.publisher = NatsJetStreamPublisher(NATS_URL, subject_prefix=name)
        self._nc: Any = None
        self._js: Any = None

    async def open(self) -> None:
        import nats

        self._nc = await nats.connect(NATS_URL, connect_timeout=5, allow_reconnect=False)
        self._js = self._nc.jetstream()
        await self._js.add_stream(name=self.stream, subjects=[f"{self.prefix}.>"])
        await self.publisher.open()

    async def received(self) -> list[Received]:
        info = await self._js.stream_info(self.stream)
        out: list[Received] = []
        if not info.state.messages:
            return out
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await self._js.get_msg(self.stream, seq)
            headers = dict(msg.headers or {})
            out.append(
                Received(
                    headers["event_id"],
                    headers.get("partition_key"),
                    headers["type"],
                    msg.data.decode(),
                    headers,
                )
            )
        return out

    async def _limit(self, max_msgs: int) -> None:
        from dataclasses import replace

        from nats.js.api import DiscardPolicy

        info = await self._js.stream_info(self.stream)
        await self._js.update_stream(
            replace(info.config, max_msgs=max_msgs, discard=DiscardPolicy.NEW)
        )

    async def take_only_first(self, events: Sequence[EventRecord], count: int) -> None:
        info = await self._js.stream_info(self.stream)
        await self._limit(info.state.messages + count)

    async def restore(self) -> None:
        await self._limit(-1)

    def unreachable(self) -> EventPublisher:
        return NatsJetStreamPublisher("nats://127.0.0.1:1", timeout=2.0)

    async def close(self) -> None:
        await self.publisher.close()
        if self._js is not None:
            await self._js.delete_stream(self.stream)
        if self._nc is not None:
            await self._nc.close()


@pytest.fixture(params=["recording", "redis", "rabbitmq", "nats"])
async def broker(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    if request.param == "recording":
        yield RecordingHarness()
        return
    name = f"flowx-test-{uuid.uuid4().hex[:12]}"
    if request.param in ("rabbitmq", "nats"):
        other = RabbitHarness(name) if request.param == "rabbitmq" else NatsHarness(name)
        try:
            await other.open()
            yield other
        finally:
            await other.close()
        return
    harness = RedisHarness(name)
    await harness.publisher.open()
    try:
        yield harness
    finally:
        await harness.close()


class TestPublishers(PublisherConformance):
    pass
