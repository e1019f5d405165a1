"""An operator's cancel or terminate, as the run carrying out the instance sees it (R9.4).

The request is kept in the journal (``StopStore``); the node running the instance is told
of it — at once when the command ran on the same node, at its next lease renewal otherwise,
and on a resume from the instance row — through this one ``StopWatch`` per run. The run asks
it at every boundary (``Run.forward``, ``Run.live``), and an attempt in flight is cut the
way a step timeout cuts it: its ``asyncio.timeout`` is rescheduled to now.

A cancel stops forward progress only: once the instance is compensating (for any reason)
it has nothing left to cancel. A terminate stops everything, compensation included.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from flowx.engine.failures import error_payload
from flowx.errors import FlowXError
from flowx.stores.records import StopRequest

#: The error code an instance cancelled by an operator ends with (its state: ``Cancelled``).
CANCELLED = "flow.cancelled"
#: The error code an instance terminated by an operator ends with (``Terminated``).
TERMINATED = "flow.terminated"


class StopReached(Exception):
    """An attempt was cut because an operator stopped its instance."""

    def __init__(self, request: StopRequest) -> None:
        super().__init__(f"{request.mode} requested by {request.by}: {request.reason}")
        self.request = request


def stop_error(request: StopRequest) -> dict[str, Any]:
    """The error an instance stopped by ``request`` ends with: who, why, when."""
    verb = "cancelled" if request.mode == "cancel" else "terminated"
    payload = error_payload(
        FlowXError(
            f"{verb} by {request.by}: {request.reason}",
            code=CANCELLED if request.mode == "cancel" else TERMINATED,
        ),
        retryable=False,
    )
    return {**payload, "by": request.by, "reason": request.reason, "at": request.at.isoformat()}


class StopWatch:
    """The stop request of one run, and the attempts it may cut."""

    def __init__(self, request: StopRequest | None = None) -> None:
        self.request = request
        # Every attempt in flight (fork branches run several), with whether a cancel cuts it
        # (a compensation is cut by a terminate only).
        self._armed: dict[asyncio.Timeout, bool] = {}
        self._cut: set[asyncio.Timeout] = set()

    def tell(self, request: StopRequest) -> bool:
        """A request for this run's instance; ``False`` if it changes nothing (an equal or
        stronger one is already here). Cuts every attempt it applies to."""
        if not request.outranks(self.request):
            return False
        self.request = request
        for timeout, cut_by_cancel in list(self._armed.items()):
            self._fire(timeout, cut_by_cancel)
        return True

    def _fire(self, timeout: asyncio.Timeout, cut_by_cancel: bool) -> None:
        request = self.request
        if request is None or (request.mode == "cancel" and not cut_by_cancel):
            return
        if timeout.expired() or timeout in self._cut:
            return
        self._cut.add(timeout)
        timeout.reschedule(asyncio.get_running_loop().time())

    @contextlib.contextmanager
    def cutting(self, timeout: asyncio.Timeout, *, by_cancel: bool) -> Iterator[None]:
        """While an attempt runs under ``timeout``, a stop that applies cuts it (one
        already here, at once)."""
        self._armed[timeout] = by_cancel
        self._fire(timeout, by_cancel)
        try:
            yield
        finally:
            del self._armed[timeout]

    def cut(self, timeout: asyncio.Timeout) -> StopRequest | None:
        """The request that cut this attempt, or ``None`` if its own time ran out."""
        if timeout in self._cut:
            self._cut.discard(timeout)
            return self.request
        return None
