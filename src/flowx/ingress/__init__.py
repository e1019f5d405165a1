"""Broker ingress: work that enters a node from a broker queue (R6.1, R9.9).

``flowx.ingress.core`` says what a message does, whatever the broker; each adapter
(``flowx.ingress.rabbitmq``, ``flowx.ingress.nats_jetstream``) consumes its broker and is
imported only when a URL names it, so a node without that broker's driver still loads.
"""

from __future__ import annotations

from flowx.ingress.core import (
    Dead,
    Delivery,
    IngressDispatcher,
    IngressRetry,
    Signalled,
    Started,
    Verdict,
)

__all__ = [
    "Dead",
    "Delivery",
    "IngressDispatcher",
    "IngressRetry",
    "Signalled",
    "Started",
    "Verdict",
]
