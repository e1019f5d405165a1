"""A broker named by one URL, as a worker's ``--publish`` option names it."""

from __future__ import annotations

from urllib.parse import urlsplit

from flowx.errors import FlowXError
from flowx.outbox.fanout import FanOutPublisher
from flowx.outbox.publisher import EventPublisher


def publisher_from_url(url: str) -> EventPublisher:
    """``redis://…`` (Redis Streams), ``amqp://…`` (RabbitMQ), ``nats://…`` (JetStream);
    several, comma-separated, publish to each (``FanOutPublisher``)."""
    parts = [u.strip() for u in url.split(",") if u.strip()]
    if len(parts) > 1:
        return FanOutPublisher(*(publisher_from_url(p) for p in parts))
    scheme = urlsplit(url).scheme
    if scheme in ("redis", "rediss", "unix"):
        from flowx.outbox.redis_streams import RedisStreamsPublisher

        return RedisStreamsPublisher(url)
    if scheme in ("amqp", "amqps"):
        from flowx.outbox.rabbitmq import RabbitMQPublisher

        return RabbitMQPublisher(url)
    if scheme == "nats":
        from flowx.outbox.nats_jetstream import NatsJetStreamPublisher

        return NatsJetStreamPublisher(url)
    raise FlowXError(
        f"cannot publish to {url!r}: use redis://host:6379/0, amqp://user:pass@host:5672/ "
        "or nats://host:4222",
        code="outbox.bad_publisher_url",
    )
