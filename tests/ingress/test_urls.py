"""``--ingress`` URLs: the scheme picks the adapter; a URL no adapter can use is one clear line
naming what to write, never a traceback, never its password."""

from __future__ import annotations

import importlib.util

import pytest

from flowx.errors import FlowXError
from flowx.ingress.rabbitmq import RabbitMQIngress
from flowx.ingress.urls import consumer_from_url, consumers_from_urls, split_urls
from flowx.urls import BadURL


def test_an_amqp_url_is_a_rabbitmq_consumer_and_values_may_be_comma_separated() -> None:
    consumers = consumers_from_urls(
        ["amqp://guest:guest@h:5672/?queue=a, amqps://guest:guest@h/?queue=b", "amqp://h/?queue=c"]
    )
    assert [type(c) for c in consumers] == [RabbitMQIngress] * 3
    assert [c.name for c in consumers] == [
        "rabbitmq queue 'a'",
        "rabbitmq queue 'b'",
        "rabbitmq queue 'c'",
    ]
    assert split_urls([" , "]) == []


def test_an_unknown_scheme_is_refused_naming_the_ones_there_are() -> None:
    with pytest.raises(
        BadURL, match=r"cannot consume from 'kafka://u:\*\*\*@h'.*amqp://.*nats://"
    ) as caught:
        consumer_from_url("kafka://u:s3cret@h")
    assert caught.value.code == "ingress.bad_url"
    assert "s3cret" not in str(caught.value)


@pytest.mark.skipif(
    importlib.util.find_spec("flowx.ingress.nats_jetstream") is not None,
    reason="the NATS JetStream adapter is in this build",
)
def test_a_nats_url_says_nats_ingress_is_not_available_without_its_adapter() -> None:
    with pytest.raises(FlowXError, match="NATS ingress not available") as caught:
        consumer_from_url("nats://127.0.0.1:4222?stream=X")
    assert caught.value.code == "ingress.not_available"
