"""The outbox publisher and its brokers (SPEC §5).

``RabbitMQPublisher`` and ``NatsJetStreamPublisher`` import their drivers
(``flowx-runtime[rabbitmq]``, ``flowx-runtime[nats]``) only when one is built.
"""

from flowx.outbox.fanout import FanOutPublisher
from flowx.outbox.nats_jetstream import NatsJetStreamPublisher
from flowx.outbox.publisher import EventPublisher, PublishFailure, PublishResult
from flowx.outbox.rabbitmq import RabbitMQPublisher
from flowx.outbox.recording import RecordingPublisher
from flowx.outbox.redis_streams import RedisStreamsPublisher
from flowx.outbox.relay import OutboxPublisher, RelayPolicy, Round

__all__ = [
    "EventPublisher",
    "FanOutPublisher",
    "NatsJetStreamPublisher",
    "OutboxPublisher",
    "PublishFailure",
    "PublishResult",
    "RabbitMQPublisher",
    "RecordingPublisher",
    "RedisStreamsPublisher",
    "RelayPolicy",
    "Round",
]
