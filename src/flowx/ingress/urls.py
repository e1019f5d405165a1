"""A broker queue named by one URL, as ``flowx worker --ingress`` names it.

The scheme picks the adapter, imported only then, so a node without a broker's driver (or,
for NATS, without the adapter's module) still loads. Every adapter is an ``IngressConsumer``:
the worker starts it with the node's ``IngressDispatcher`` once the node is ready and stops it
first on a drain, before the host's own drain (R7.2).

An adapter module for a new scheme provides a class taking the URL as its only positional
argument and satisfying ``IngressConsumer``: ``flowx.ingress.rabbitmq.RabbitMQIngress``,
``flowx.ingress.nats_jetstream.NatsJetStreamIngress``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from flowx.errors import FlowXError
from flowx.ingress.core import IngressDispatcher
from flowx.urls import BadURL, check_text, redact, split

CODE = "ingress.bad_url"
USAGE = (
    "cannot consume from {url!r}: use amqp://user:pass@host:5672/vhost?queue=orders "
    "(RabbitMQ; amqps:// for TLS) or nats://host:4222/<stream>/<consumer> (NATS JetStream)"
)


@runtime_checkable
class IngressConsumer(Protocol):
    """**Protocol:** one broker queue feeding a node.

    ``start`` declares what it needs and begins consuming; it returns once consuming (a broker
    that cannot be reached at all raises, and the worker stops with that error). Each message
    goes through ``dispatcher.handle``: acked after a verdict, a ``Dead`` one dead-lettered
    first, an ``IngressRetry`` left unacked for a redelivery after a backoff. ``stop`` stops
    taking messages, lets the handles in flight finish within ``timeout`` seconds, and closes:
    what is still unacked then is redelivered to another worker."""

    @property
    def name(self) -> str:
        """What logs call it: the broker and the queue, never the URL's secrets."""
        ...

    async def start(self, dispatcher: IngressDispatcher) -> None: ...

    async def stop(self, timeout: float) -> None: ...


#: Scheme -> (module, class) of its adapter.
ADAPTERS: dict[str, tuple[str, str]] = {
    "amqp": ("flowx.ingress.rabbitmq", "RabbitMQIngress"),
    "amqps": ("flowx.ingress.rabbitmq", "RabbitMQIngress"),
    "nats": ("flowx.ingress.nats_jetstream", "NatsJetStreamIngress"),
    "tls": ("flowx.ingress.nats_jetstream", "NatsJetStreamIngress"),
}


def split_urls(urls: Iterable[str]) -> list[str]:
    """Each ``--ingress`` value may hold several URLs, comma-separated."""
    found: list[str] = []
    for value in urls:
        check_text(value, "ingress")
        found.extend(u.strip() for u in value.split(",") if u.strip())
    return found


def consumer_from_url(url: str) -> IngressConsumer:
    """The adapter for ``url``; ``BadURL`` (code ``ingress.bad_url``) for one it cannot use."""
    check_text(url, "ingress")
    shown = redact(url)
    scheme = split(url, "ingress", code=CODE).scheme
    if scheme not in ADAPTERS:
        raise BadURL(USAGE.format(url=shown), url=shown, code=CODE)
    module_name, class_name = ADAPTERS[scheme]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        what = "NATS" if scheme in ("nats", "tls") else scheme
        raise FlowXError(
            f"{what} ingress not available in this FlowX build ({module_name} is missing); "
            "use an amqp:// queue",
            code="ingress.not_available",
        ) from exc
    consumer: IngressConsumer = getattr(module, class_name)(url)
    return consumer


def consumers_from_urls(urls: Iterable[str]) -> list[IngressConsumer]:
    """One consumer per URL of every ``--ingress`` value (each may be comma-separated)."""
    return [consumer_from_url(url) for url in split_urls(urls)]
