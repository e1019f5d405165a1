"""The ingress as one service of a worker: its consumers, fed through one dispatcher.

``flowx.hosting.worker.serve`` starts it once the node is ready and stops it first on a drain
— stop consuming, let the handles in flight commit, close — before the host drains (R7.2), so
no message is taken by a node that can no longer start it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from flowx.hosting.host import FlowHost
from flowx.ingress.core import DEFAULT_MAX_BYTES, IngressDispatcher
from flowx.ingress.urls import IngressConsumer, consumers_from_urls

log = logging.getLogger("flowx.ingress")


class IngressService:
    """Every ``--ingress`` queue of one worker (a ``flowx.hosting.worker.WorkerService``)."""

    def __init__(
        self, consumers: Sequence[IngressConsumer], *, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self.consumers = list(consumers)
        self.max_bytes = max_bytes
        self.dispatcher: IngressDispatcher | None = None
        self._started: list[IngressConsumer] = []

    @classmethod
    def from_urls(
        cls, urls: Sequence[str], *, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> IngressService:
        """One consumer per URL (each value may be comma-separated); ``BadURL`` at once for a
        URL no adapter can use, before the node opens."""
        return cls(consumers_from_urls(urls), max_bytes=max_bytes)

    @property
    def name(self) -> str:
        return "ingress from " + ", ".join(c.name for c in self.consumers)

    async def start(self, host: FlowHost) -> None:
        """Start every consumer; if one refuses, stop those already started and raise."""
        self.dispatcher = dispatcher = IngressDispatcher(host, max_bytes=self.max_bytes)
        for consumer in self.consumers:
            try:
                await consumer.start(dispatcher)
            except BaseException:
                await self.stop(timeout=5.0)
                raise
            self._started.append(consumer)
            log.info("worker %s consuming from %s", host.node_id, consumer.name)

    async def stop(self, timeout: float) -> None:
        """Stop every started consumer (each within ``timeout``)."""
        started, self._started = self._started, []
        for consumer in reversed(started):
            await consumer.stop(timeout)
