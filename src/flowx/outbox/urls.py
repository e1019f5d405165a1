"""A broker named by one URL, as a worker's ``--publish`` option names it."""

from __future__ import annotations

from flowx.outbox.fanout import FanOutPublisher
from flowx.outbox.publisher import EventPublisher
from flowx.urls import BadURL, check_redis, check_text, redact, split

_CODE = "outbox.bad_publisher_url"
_USAGE = (
    "cannot publish to {url!r}: use redis://host:6379/0, amqp://user:pass@host:5672/ "
    "or nats://host:4222 (TLS: rediss://, amqps://, tls://)"
)


def publisher_from_url(url: str) -> EventPublisher:
    """``redis://…`` (Redis Streams), ``amqp://…`` (RabbitMQ), ``nats://…`` or ``tls://…``
    (JetStream); several, comma-separated, publish to each (``FanOutPublisher``)."""
    check_text(url, "publisher")  # NUL, bytes that are not UTF-8
    parts = [u.strip() for u in url.split(",") if u.strip()]
    if not parts:
        raise BadURL(_USAGE.format(url=redact(url)), url=redact(url), code=_CODE)
    if len(parts) > 1:
        return FanOutPublisher(*(publisher_from_url(p) for p in parts))
    url = parts[0]
    scheme = split(url, "publisher", code=_CODE).scheme
    if scheme in ("redis", "rediss", "unix"):
        check_redis(url, "publisher", code=_CODE)
        from flowx.outbox.redis_streams import RedisStreamsPublisher

        return RedisStreamsPublisher(url)
    if scheme in ("amqp", "amqps"):
        from flowx.outbox.rabbitmq import RabbitMQPublisher

        return RabbitMQPublisher(url)
    if scheme in ("nats", "tls"):
        from flowx.outbox.nats_jetstream import NatsJetStreamPublisher

        return NatsJetStreamPublisher(url)
    raise BadURL(_USAGE.format(url=redact(url)), url=redact(url), code=_CODE)
