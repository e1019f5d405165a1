"""A queue of the test's own on the shared RabbitMQ: made unique, fed, read, deleted after."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aio_pika

RABBITMQ_URL = os.environ.get("FLOWX_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/")


class TestQueue:
    """``name`` (and ``name.dead``, ``name.in``) on the broker; ``url`` is the ingress URL."""

    __test__ = False  # not a test class, despite its name

    def __init__(self, channel: aio_pika.abc.AbstractChannel, name: str) -> None:
        self.channel = channel
        self.name = name
        self.dead = f"{name}.dead"
        self.exchange_name = f"{name}.in"
        self.exchange: aio_pika.abc.AbstractExchange | None = None

    def url(self, **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"queue": self.name, **params}.items())
        return f"{RABBITMQ_URL}?{query}"

    async def declare(self, arguments: dict[str, Any] | None = None) -> None:
        """The queue, bound to a topic exchange for ``shop.#`` so a routing key can name a
        flow (the default exchange routes by queue name only)."""
        queue = await self.channel.declare_queue(self.name, durable=True, arguments=arguments)
        self.exchange = await self.channel.declare_exchange(
            self.exchange_name, aio_pika.ExchangeType.TOPIC, durable=True
        )
        await queue.bind(self.exchange, "shop.#")

    async def publish(
        self,
        body: Any,
        *,
        message_id: str,
        routing_key: str = "shop.ing.order",
        headers: dict[str, str] | None = None,
    ) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        if self.exchange is None:
            await self.declare()
        assert self.exchange is not None
        await self.exchange.publish(
            aio_pika.Message(raw, message_id=message_id, headers=headers or {}),
            routing_key=routing_key,
        )

    async def depth(self, name: str | None = None) -> int:
        queue = await self.channel.declare_queue(name or self.name, durable=True, passive=True)
        count = queue.declaration_result.message_count
        return int(count or 0)

    async def take_dead(self, n: int, *, within: float = 20.0) -> list[Any]:
        """The first ``n`` dead letters (acked), waiting for them up to ``within`` seconds."""
        queue = await self.channel.declare_queue(self.dead, durable=True, passive=True)
        got: list[Any] = []
        async with asyncio.timeout(within):
            async with queue.iterator() as messages:
                async for message in messages:
                    await message.ack()
                    got.append(message)
                    if len(got) == n:
                        break
        return got


@asynccontextmanager
async def own_queue() -> AsyncIterator[TestQueue]:
    connection = await aio_pika.connect(RABBITMQ_URL)
    channel = await connection.channel()
    made = TestQueue(channel, f"flowx_t_ing_{uuid.uuid4().hex[:10]}")
    try:
        yield made
    finally:
        cleanup = await connection.channel()
        for queue in (made.name, made.dead):
            await cleanup.queue_delete(queue)
        for exchange in (made.dead, made.exchange_name):
            await cleanup.exchange_delete(exchange)
        await connection.close()


class Partitioned:
    """The exchange ``name`` and its queues on the broker, deleted after the test."""

    def __init__(self, channel: aio_pika.abc.AbstractChannel, name: str, n: int) -> None:
        self.channel = channel
        self.name = name
        self.n = n

    def url(self) -> str:
        return f"{RABBITMQ_URL}?queue={self.name}&partitions={self.n}"

    async def publish(self, tenant: str, key: str, routing_key: str = "shop.ing.order") -> None:
        exchange = await self.channel.get_exchange(self.name, ensure=False)
        body = json.dumps({"order_id": key}).encode()
        message = aio_pika.Message(body, message_id=key, headers={"flowx-tenant": tenant})
        await exchange.publish(message, routing_key=routing_key, mandatory=True)


def per_tenant(keys: list[str]) -> dict[str, list[str]]:
    """The keys (``<tenant>.<rest>``) grouped by tenant, each group in the order given."""
    found: dict[str, list[str]] = {}
    for key in keys:
        found.setdefault(key.split(".")[0], []).append(key)
    return found
