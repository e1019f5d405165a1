"""``FlowHandle``: a started instance, and the way to wait for its result.

A handle works whichever node finishes its instance: it waits on this node's own task when
the instance runs here, takes an Ephemeral run's result from itself (or from the few the
node keeps), and otherwise watches the journal. It knows its host only through the small
``HandleHost`` protocol, so this module does not import the host.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

from flowx import codec
from flowx.engine.runner import RunResult
from flowx.errors import FlowFailed
from flowx.plan.model import Plan
from flowx.sealing import Sealing
from flowx.stores.records import InstanceRecord, InstanceState


class RunsHere(Protocol):
    """What a handle asks of the node's runner."""

    @property
    def outcomes(self) -> Mapping[str, asyncio.Future[RunResult | None]]: ...

    def ephemeral_result(self, instance_id: str) -> RunResult | None: ...


class HandleHost(Protocol):
    """What a handle asks of its host: the instance's row, and the runs on this node."""

    @property
    def _runner(self) -> RunsHere: ...

    async def get(self, instance_id: str) -> InstanceRecord: ...

    def sealing_for(self, instance_id: str) -> Sealing | None: ...


S = TypeVar("S", bound=BaseModel)


class FlowHandle(Generic[S]):
    """A started instance. ``await handle.result()`` waits for it to end."""

    def __init__(
        self, host: HandleHost, plan: Plan[Any, S], instance_id: str, *, created: bool
    ) -> None:
        self._host = host
        self.plan = plan
        self.instance_id = instance_id
        #: False when an idempotency key matched an instance that already existed (R4.1).
        self.created = created
        #: An Ephemeral run's result, held by the handle its start returned.
        self._ephemeral: RunResult | None = None

    def __repr__(self) -> str:
        return f"FlowHandle({self.plan.ref}, {self.instance_id})"

    async def status(self) -> InstanceRecord:
        """The instance's current record (state, step, error) from the journal, whichever
        node runs it."""
        return await self._host.get(self.instance_id)

    async def result(self, *, timeout: float | None = None, poll: float = 0.1) -> S:
        """The final state of a Completed instance (the plan's state model); raises
        ``FlowFailed`` for a failed one.

        Waits on this node's own run when it runs the instance here (its outcome, settled
        once committed, before the run's lease is released), and otherwise watches the
        journal, so a handle works whichever node finishes the instance.
        """
        if timeout is None:  # no ``wait_for`` around it: one frame and loop lookup fewer
            return await self._result(poll)
        return await asyncio.wait_for(self._result(poll), timeout)

    async def _result(self, poll: float) -> S:
        runner = self._host._runner
        ephemeral = self._ephemeral
        if ephemeral is None:
            ephemeral = runner.ephemeral_result(self.instance_id)
        if ephemeral is not None:
            return _finish(self._host, self.plan, self.instance_id, ephemeral)
        running = runner.outcomes.get(self.instance_id)
        if running is not None:
            outcome: RunResult | None = None
            with contextlib.suppress(Exception):
                outcome = await asyncio.shield(running)
            if outcome is not None and outcome.final_state is not None:
                # This node ran it to the end: its result is what it committed.
                return _finish(self._host, self.plan, self.instance_id, outcome)
        while True:
            record = await self._host.get(self.instance_id)
            if record.state.terminal:
                if record.state is InstanceState.COMPLETED:
                    return _final(self._host, self.plan, self.instance_id, record.state_bag)
                raise FlowFailed(
                    self.instance_id,
                    record.state.value,
                    codec.loads(record.error) if record.error else None,
                )
            await asyncio.sleep(poll)


def _final(host: HandleHost, plan: Plan[Any, S], instance_id: str, state_bag: str) -> S:
    """The final state, its sensitive members opened for the caller (R9.8)."""
    with codec.sealing(host.sealing_for(instance_id)):
        return codec.validate_model(plan.state_model, state_bag, root="state")


def _finish(host: HandleHost, plan: Plan[Any, S], instance_id: str, result: RunResult) -> S:
    """A run's result as ``FlowHandle.result`` gives it: the final state, or ``FlowFailed``."""
    if result.outcome == "completed":
        return _final(host, plan, instance_id, result.state_bag)
    state = result.final_state
    raise FlowFailed(instance_id, state.value if state else result.outcome, result.error)
