"""What a run needs from outside the engine, bundled so ``Execution`` takes two arguments.

The engine does no I/O of its own: it commits through a ``Committer`` (bound by the host to
a journal and a lease for a Durable run, to nothing for an Ephemeral one) and waits through a
``WaitPort`` (signals, timers, sub-flows), which only a Durable run has. ``RunPorts`` is the
set of such seams for one run; ``RunSpec`` (``engine/spec.py``) is the data.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from typing import Protocol

from pydantic import BaseModel

from flowx.capability import CapabilityRegistry
from flowx.clock import Clock
from flowx.engine.stops import StopWatch
from flowx.plan.model import SubFlowNode
from flowx.stores.records import (
    EventWrite,
    InstanceRecord,
    InstanceState,
    SignalRecord,
    StepWrite,
    Wake,
    record,
)


class Committer(Protocol):
    """**Protocol:** write one step boundary; raise ``FencedOut``/``LeaseLost`` if this node
    may no longer write."""

    def __call__(
        self,
        *,
        step: StepWrite | None = None,
        state_bag: str | None = None,
        state: InstanceState | None = None,
        error: str | None = None,
        events: tuple[EventWrite, ...] = (),
        notify_parent: bool = False,
    ) -> Awaitable[None]: ...


class WaitPort(Protocol):
    """**Protocol:** what a run needs to wait: the signal inbox, the seal, the child it waits
    for. The host binds it to the stores and the run's lease; the seal is fenced like a
    commit, and raises ``FencedOut``/``LeaseLost`` the same way."""

    async def signals(self, name: str) -> Sequence[SignalRecord]: ...

    async def suspend(
        self, wake: Wake, *, state_bag: str, consumed: tuple[int, ...], child: str | None
    ) -> bool: ...

    async def child(self, instance_id: str) -> InstanceRecord | None: ...

    async def start_child(
        self, node: SubFlowNode, child_id: str, input_value: BaseModel, scope: str
    ) -> None: ...

    async def compensate_child(self, child_id: str) -> None:
        """Undo a child that completed: run its own compensations. Raises
        ``NonRetryableError`` if they ran out, another error to be tried again."""
        ...


@record
class RunPorts:
    """The seams of one run. Only ``committer`` and ``clock`` are always needed."""

    committer: Committer
    clock: Clock
    #: Where pinned capability versions are resolved (``default_registry`` if ``None``).
    registry: CapabilityRegistry | None = None
    #: The thread pool synchronous capabilities run in.
    executor: Executor | None = None
    #: Durable runs only: signals, seals, children.
    waits: WaitPort | None = None
    #: Asked before each new step attempt: a draining node finishes the step it is in, then
    #: hands the instance back (``Pending``) so a peer takes it without waiting a TTL (R7.2).
    should_yield: Callable[[], bool] | None = None
    #: Called before every capability: raises ``LeaseLost`` once this node may no longer
    #: write, so a zombie stops before an effect, not after (R3.5).
    guard: Callable[[], object] | None = None
    #: Durable runs only: an operator's cancel or terminate, as this node learns of it
    #: (R9.4); asked at every boundary, and cuts an attempt in flight.
    stop: StopWatch | None = None
    #: Told of every step row this run commits (tests and metrics).
    on_step: Callable[[str, StepWrite], None] | None = None
    #: The node running it, written on every step row (the timeline of ``flowx show``).
    node_id: str | None = None
