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
    """The stop request of one run, and the attempts in flight it may cut.

    An attempt is cut by cancelling the task that awaits it and, where that cancellation
    comes out of the attempt, taking it back (``Task.uncancel``) and raising
    ``StopReached`` instead — what ``asyncio.timeout`` does, without building a timeout per
    attempt on the hot path: arming costs a dict entry."""

    def __init__(self, request: StopRequest | None = None) -> None:
        self.request = request
        # Every task awaiting an attempt (fork branches run several), with whether a cancel
        # cuts it (a compensation is cut by a terminate only) and how many cancellations it
        # had pending when armed (a drain's must not be mistaken for ours, nor taken back).
        self._armed: dict[asyncio.Task[Any], tuple[bool, int]] = {}
        self._cut: set[asyncio.Task[Any]] = set()
        # Once the run is ending the instance (failing, timing out) or a fork sibling has
        # failed, a cancel has nothing left to stop: an attempt still running is not cut.
        self._forward = True
        # The run's loop, found at the first attempt: ``asyncio.current_task()`` without it
        # asks for the running loop, a ``getpid`` system call on CPython 3.11, every attempt.
        self._loop: asyncio.AbstractEventLoop | None = None

    def tell(self, request: StopRequest) -> bool:
        """A request for this run's instance; ``False`` if it changes nothing (an equal or
        stronger one is already here). Cuts every attempt it applies to."""
        if not request.outranks(self.request):
            return False
        self.request = request
        for task, (by_cancel, _) in list(self._armed.items()):
            self._fire(task, by_cancel)
        return True

    def forward_over(self) -> None:
        """The run stops going forward (it is ending the instance, or a fork branch
        failed): from now on only a terminate cuts an attempt."""
        self._forward = False

    def _fire(self, task: asyncio.Task[Any], by_cancel: bool) -> None:
        request = self.request
        if request is None or task in self._cut:
            return
        if request.mode == "cancel" and not (by_cancel and self._forward):
            return
        self._cut.add(task)
        task.cancel(f"{request.mode} requested by {request.by}")

    def arm(self, *, by_cancel: bool) -> asyncio.Task[Any]:
        """The calling task begins an attempt: a stop that applies cuts it (one already
        here, at its first await). Pair with ``disarm``."""
        loop = self._loop
        task = asyncio.current_task(loop) if loop is not None else None
        if task is None:  # the first attempt (or a watch a test carried to another loop)
            loop = self._loop = asyncio.get_running_loop()
            task = asyncio.current_task(loop)
        assert task is not None  # nosec B101  # invariant: called from a task
        self._armed[task] = (by_cancel, task.cancelling())
        if self.request is not None:  # almost never: not a call on every attempt
            self._fire(task, by_cancel)
        return task

    def cut(self, task: asyncio.Task[Any]) -> StopRequest | None:
        """On a cancellation out of the attempt: the request that cut it (our cancellation
        taken back), or ``None`` if it came from elsewhere too (a drain) and must go on."""
        if task not in self._cut:
            return None
        self._cut.discard(task)
        _, before = self._armed.get(task, (True, 0))
        if task.uncancel() > before:
            return None  # cancelled by someone else as well: that cancellation wins
        return self.request

    def disarm(self, task: asyncio.Task[Any]) -> None:
        """The attempt is over. A cut it finished despite (a capability that swallowed the
        cancellation) is taken back: the next boundary stops the run instead."""
        self._armed.pop(task, None)
        if self._cut and task in self._cut:
            self._cut.discard(task)
            task.uncancel()
