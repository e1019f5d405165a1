"""Sub-flows: a child instance started and awaited durably, and undone as a whole.

The child is an instance of its own (its own row, lease, journal and recovery). The parent
derives the child's id from where it starts it, so a parent re-executed after a crash finds
the child it already started instead of starting a second one.
"""

from __future__ import annotations

import uuid
from concurrent.futures import Executor
from typing import Any

from pydantic import BaseModel, ValidationError

from flowx import codec
from flowx.engine.context import StepContext
from flowx.engine.halt import Halt
from flowx.engine.ports import WaitPort
from flowx.engine.run import Run
from flowx.errors import InputInvalid
from flowx.plan.model import SubFlowNode
from flowx.stores.placement import inherit
from flowx.stores.records import CHILD_WAIT, InstanceRecord, InstanceState, Outcome

#: Child instance ids are derived from (parent, scope, step), so a parent re-executed after a
#: crash finds the child it already started instead of starting a second one.
CHILD_NAMESPACE = uuid.UUID("0c5e7a1d-93f4-4b2e-8d6a-5f1b2c3d4e70")


def child_instance_id(parent_id: str, scope: str, step_id: int) -> str:
    """The id of the child a parent starts at ``(scope, step_id)``: derived, never drawn, and
    on its parent's shard when the parent's id is placed on one (R6.2)."""
    return inherit(str(uuid.uuid5(CHILD_NAMESPACE, f"{parent_id}/{scope}/{step_id}")), parent_id)


class ChildUndo:
    """A completed sub-flow's compensation, shaped like a capability: its undo is the child's
    own compensations, run in the child's journal (its attempts are rows there)."""

    idempotent = True

    def __init__(self, waits: WaitPort, child_id: str, node: SubFlowNode) -> None:
        assert node.plan is not None  # nosec B101  # invariant: build() sets a sub-flow's plan
        self._waits = waits
        self._child_id = child_id
        self.id = f"sub_flow:{node.plan.flow_id}"
        self.version = node.plan.version
        self.ref = f"{self.id}@{self.version}"

    async def invoke(self, ctx: StepContext, argument: Any, executor: Executor | None) -> None:
        await self._waits.compensate_child(self._child_id)


async def sub_flow(run: Run, node: SubFlowNode, scope: str, item: Any, has_item: bool) -> Any:
    """The child is an instance of its own (its own row, lease and recovery); the parent
    waits for it durably and its end wakes the parent in the child's last commit."""
    key = (scope, node.step_id)
    a = run.history.of(key)
    if a.success is not None:
        return run.replay_done(node, scope, a.success, None)
    if a.failures:
        raise Halt.failed(node, scope, a.failures[-1])
    run.forward(node, scope)
    assert run.waits is not None and node.plan is not None  # nosec B101  # invariant: build()
    attempt = a.last_attempt + 1
    child_id = child_instance_id(run.instance_id, scope, node.step_id)
    while True:
        child = await run.waits.child(child_id)
        if child is None:
            run.check_deadline(node, scope)
            value = await _child_input(run, node, scope, item, has_item, attempt)
            try:
                await run.waits.start_child(node, child_id, value, scope)
            except InputInvalid as exc:  # the child's partition_key refused its input
                await run.fail_node(node, scope, attempt, str(exc), "sub_flow.input_invalid")
            continue
        if child.state is InstanceState.COMPLETED:
            return await _child_completed(run, node, scope, attempt, child)
        if child.state.terminal:
            # A child that ended badly past our deadline timed out with us (its deadline
            # is capped at ours): the parent is TimedOut, not failed by its child.
            run.check_deadline(node, scope)
            await run.fail_node(
                node,
                scope,
                attempt,
                f"sub_flow {node.name!r}: child instance {child_id} of {node.plan.ref} "
                f"ended {child.state.value}",
                "sub_flow.failed",
                child_instance_id=child_id,
                child_state=child.state.value,
                child_error=codec.loads(child.error) if child.error else None,
            )
        # Past the deadline with the child still going, the parent waits on for it (with
        # no timer: the child's deadline is capped at ours, so it ends soon): only its
        # end says whether there are effects of its to undo with the rest.
        late = run.deadline_at is not None and run.clock.now() >= run.deadline_at
        await run.suspend(node, scope, at=None, signal=CHILD_WAIT, child=child_id, clamp=not late)


async def _child_input(
    run: Run, node: SubFlowNode, scope: str, item: Any, has_item: bool, attempt: int
) -> BaseModel:
    """The child's input, validated against its plan; invalid fails the parent's node."""
    assert node.plan is not None  # nosec B101  # invariant: build() sets a sub-flow's plan
    model: type[BaseModel] = node.plan.input_model
    try:
        raw = node.input(run.source(item, has_item), run.state)
        return raw if isinstance(raw, model) else model.model_validate(raw)
    except Exception as exc:
        await run.fail_node(
            node,
            scope,
            attempt,
            f"sub_flow {node.name!r}: the input for {node.plan.ref} is not valid: {exc}",
            "sub_flow.input_invalid",
        )


async def _child_completed(
    run: Run, node: SubFlowNode, scope: str, attempt: int, child: InstanceRecord
) -> Any:
    """Journal the child's final state as this node's result, kept for compensation."""
    assert node.plan is not None  # nosec B101  # invariant: build() sets a sub-flow's plan
    # Recorded even past the deadline: the child's effects happened, and only a row puts
    # them in this saga, to be undone if the parent now times out.
    at = f"{scope}/{node.step_id}"
    # The child's state, sealed again as this parent's step result (R9.8).
    final = codec.validate_model(
        node.plan.state_model, child.state_bag, root="state", instance=child.instance_id
    )
    text = codec.dumps(final, root="result", at=at, whole=run.seals(node))
    result = codec.loads(text, root="result", at=at)
    try:
        run.applied(node.into, result)
    except ValidationError as exc:
        await run.fail_node(
            node,
            scope,
            attempt,
            f"sub_flow {node.name!r}: the result of {node.plan.ref} does not fit "
            f"state field {node.into!r}: {exc.errors()[0].get('msg')}",
            "sub_flow.result_invalid",
        )
    await run.write(
        (scope, node.step_id),
        run.row(node, None, scope, attempt, Outcome.SUCCESS, text),
        apply=(node.into, result),
        state=InstanceState.RUNNING,
    )
    run.keep(node, scope, None, result)
    run.executed += 1
    return result
