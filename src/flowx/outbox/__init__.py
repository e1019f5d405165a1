"""The outbox publisher and its brokers (SPEC §5)."""

from flowx.outbox.fanout import FanOutPublisher
from flowx.outbox.publisher import EventPublisher, PublishFailure, PublishResult
from flowx.outbox.recording import RecordingPublisher
from flowx.outbox.redis_streams import RedisStreamsPublisher
from flowx.outbox.relay import OutboxPublisher, Round

__all__ = [
    "EventPublisher",
    "FanOutPublisher",
    "OutboxPublisher",
    "PublishFailure",
    "PublishResult",
    "RecordingPublisher",
    "RedisStreamsPublisher",
    "Round",
]
