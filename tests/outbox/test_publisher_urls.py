"""``flowx worker --publish URL``: the URL names the broker; a wrong one is refused by name."""

from __future__ import annotations

import pytest

from flowx.errors import FlowXError
from flowx.outbox import (
    FanOutPublisher,
    NatsJetStreamPublisher,
    RabbitMQPublisher,
    RedisStreamsPublisher,
)
from flowx.outbox.urls import publisher_from_url


def test_each_scheme_names_its_broker_and_a_list_publishes_to_each() -> None:
    assert isinstance(publisher_from_url("redis://127.0.0.1:6379/0"), RedisStreamsPublisher)
    assert isinstance(publisher_from_url("amqp://guest:guest@127.0.0.1:5672/"), RabbitMQPublisher)
    assert isinstance(publisher_from_url("nats://127.0.0.1:4222"), NatsJetStreamPublisher)
    both = publisher_from_url("redis://127.0.0.1:6379/0, amqp://guest:guest@127.0.0.1:5672/")
    assert isinstance(both, FanOutPublisher)
    assert both.name == "redis-streams+rabbitmq"


def test_an_unknown_scheme_is_refused_with_the_ones_that_work() -> None:
    with pytest.raises(FlowXError, match=r"cannot publish to 'kafka://x'.*redis://.*amqp://"):
        publisher_from_url("kafka://x")
