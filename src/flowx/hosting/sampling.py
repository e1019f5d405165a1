"""``/metrics`` for a node: prometheus-client's server, and a sampler for the gauges that are
read rather than counted (R9.6).

Counters and histograms are fed where things happen (``flowx.metrics`` names the seams). What
is a level — instances in flight, leases held, whether the journal answers, the outbox
backlog — is read here every ``metrics_interval``, off every hot path: one outbox read per
interval, which doubles as the journal's liveness probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from flowx.errors import FlowXError
from flowx.hosting.context import NodeContext
from flowx.metrics import (
    IN_FLIGHT,
    JOURNAL_UP,
    LEASES_HELD,
    OUTBOX_DEAD_LETTERS,
    OUTBOX_LAG_SECONDS,
    OUTBOX_PENDING,
    available,
    serve,
)

log = logging.getLogger("flowx.host")


class MetricsService:
    """Serves ``/metrics`` while the node is open (when ``metrics_port`` is set) and keeps
    the sampled gauges fresh."""

    def __init__(self, ctx: NodeContext, in_flight: Callable[[], int]) -> None:
        self._ctx = ctx
        self._in_flight = in_flight
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    @property
    def port(self) -> int | None:
        """The port ``/metrics`` is served on (the one bound, for ``metrics_port=0``)."""
        return int(self._server.server_port) if self._server is not None else None

    def start(self) -> None:
        """Bind the endpoint and start sampling; nothing when ``metrics_port`` is unset.
        Raises ``FlowXError`` when the library is missing or the port cannot be bound."""
        settings = self._ctx.settings
        if settings.metrics_port is None:
            return
        if self._server is not None:  # left from a drain that did not finish: serve anew
            self._close_server()
        if not available():
            raise FlowXError(
                "metrics_port is set but prometheus-client is not installed: "
                "pip install 'flowx-runtime[prometheus]', or unset metrics_port",
                code="settings.metrics_unavailable",
            )
        try:
            self._server = serve(settings.metrics_port, settings.metrics_host)
        except OSError as exc:
            raise FlowXError(
                f"cannot serve metrics on {settings.metrics_host}:{settings.metrics_port} "
                f"({exc}); choose another --metrics-port",
                code="settings.metrics_port_unavailable",
            ) from exc
        log.info("metrics on http://%s:%d/metrics", settings.metrics_host, self.port)
        self._stop = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(
            self._sample_forever(), name="flowx-metrics"
        )

    async def stop(self) -> None:
        """Stop sampling and close the endpoint (on drain)."""
        self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            await asyncio.to_thread(self._close_server)

    def _close_server(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    async def sample(self) -> None:
        """Read every sampled gauge once."""
        ctx = self._ctx
        node = ctx.node_id
        IN_FLIGHT.set(node, self._in_flight())
        LEASES_HELD.set(node, ctx.keeper.held if ctx.keeper is not None else 0)
        stores = ctx.store
        if stores is None:
            return
        if not ctx.store_ready:
            JOURNAL_UP.set(node, 0)
            return
        try:
            backlog = await stores.outbox.backlog()
        except Exception as exc:  # the journal does not answer: that is the measurement
            log.debug("metrics: the journal did not answer (%s)", exc)
            JOURNAL_UP.set(node, 0)
            return
        JOURNAL_UP.set(node, 1)
        OUTBOX_PENDING.set((), backlog.pending)
        OUTBOX_DEAD_LETTERS.set((), backlog.dead)
        lag = 0.0
        if backlog.oldest_staged_at is not None:
            lag = max((ctx.journal_clock.now() - backlog.oldest_staged_at).total_seconds(), 0.0)
        OUTBOX_LAG_SECONDS.set((), lag)

    async def _sample_forever(self) -> None:
        every = self._ctx.settings.metrics_interval.total_seconds()
        while not self._stop.is_set():
            try:
                await self.sample()
            except Exception:  # a sample that fails must not end sampling (stale gauges)
                log.exception("metrics: sampling failed; trying again next interval")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=every)
