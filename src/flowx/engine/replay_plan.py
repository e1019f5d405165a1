"""What ``flowx replay --instance ID --from STEP`` would re-run, decided from the journal alone.

A replay never rewrites history (R2.2): it re-arms the instance (``WaitStore.rearm``) so that
failures journaled before that point stop counting against retry budgets, and the ordinary
step loop does the rest, journaling every try as a new attempt. Only two shapes are
replayable, because only for them is "run it again" unambiguous:

* ``CompensationFailed``: the compensations still owed are run again, newest first, starting
  with the one that ran out. Compensations that succeeded stay done.
* ``Failed`` with no compensation begun: the failed step is run again with a fresh budget,
  and the flow goes on from there. (Once a compensation has run, the effects are being
  undone; re-running forward would redo half of them — start a new instance instead.)
* ``Quarantined`` (its journal did not match its plan): it resumes from where it stopped,
  once the code it was started with runs again. Nothing failed, so nothing re-runs that
  had finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from flowx.engine.history import journal_order
from flowx.engine.saga import compensable, compensation_order
from flowx.errors import IllegalState
from flowx.plan.model import Node, Plan, StepNode, SubFlowNode, walk
from flowx.stores.records import InstanceRecord, InstanceState, Outcome, StepRecord

ReplayMode = Literal["compensation", "forward", "resume"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayPlan:
    """A replay: where it starts and what it will run (``--dry-run`` prints this)."""

    instance_id: str
    state: InstanceState
    mode: ReplayMode
    step: str
    step_id: int
    scope: str
    #: What will run, in order: compensations as ``"undo <step>"``, forward steps by name.
    reruns: tuple[str, ...]


def _illegal(message: str) -> IllegalState:
    return IllegalState(message)


def plan_replay(
    plan: Plan, record: InstanceRecord, steps: Sequence[StepRecord], from_step: str | int
) -> ReplayPlan:
    """Check that ``from_step`` is where the instance stopped, and list what would re-run."""
    names = {n.step_id: n for n in walk(plan.body)}
    wanted = names.get(from_step) if isinstance(from_step, int) else plan.node_named(from_step)
    if wanted is None:
        known = ", ".join(n.name for n in walk(plan.body))
        raise _illegal(f"{plan.ref} has no step {from_step!r} (its steps: {known})")
    comp_rows = [
        r for r in steps if r.outcome in (Outcome.COMPENSATED, Outcome.COMPENSATION_FAILURE)
    ]
    if record.state is InstanceState.COMPENSATION_FAILED:
        last = next((r for r in reversed(steps) if r.outcome is Outcome.COMPENSATION_FAILURE), None)
        if last is None:  # a compensation exhausted with no row: impossible, but say so
            raise _illegal(f"instance {record.instance_id} has no failed compensation to replay")
        if wanted.step_id != last.step_id:
            raise _illegal(
                f"instance {record.instance_id} stopped compensating at step "
                f"{last.step_name!r}; replay --from {last.step_name!r}"
            )
        undone = {(r.scope, r.step_id) for r in steps if r.outcome is Outcome.COMPENSATED}
        # What a real run's compensation would undo, in the order it would: the same
        # ``compensable`` and ``compensation_order`` (``engine/saga.py``).
        done = compensation_order(
            (
                r
                for r in steps
                if r.outcome is Outcome.SUCCESS
                and isinstance(node := names.get(r.step_id), StepNode | SubFlowNode)
                and compensable(node)
                and (r.scope, r.step_id) not in undone
            ),
            journal_order,
        )
        return ReplayPlan(
            instance_id=record.instance_id,
            state=record.state,
            mode="compensation",
            step=last.step_name,
            step_id=last.step_id,
            scope=last.scope,
            reruns=tuple(
                f"undo {r.step_name}" + (f" [{r.scope}]" if r.scope else "") for r in done
            ),
        )
    if record.state is InstanceState.FAILED:
        if comp_rows:
            raise _illegal(
                f"instance {record.instance_id} has already compensated; a forward replay "
                "would redo half-undone effects. Start a new instance instead"
            )
        last = next((r for r in reversed(steps) if r.outcome is Outcome.FAILURE), None)
        if last is None or not isinstance(names.get(last.step_id), StepNode):
            raise _illegal(
                f"instance {record.instance_id} did not fail in a step (a wait, a sub-flow or "
                "the flow deadline ended it); only a failed step can be replayed"
            )
        if wanted.step_id != last.step_id:
            raise _illegal(
                f"instance {record.instance_id} failed at step {last.step_name!r}; replay "
                f"--from {last.step_name!r}"
            )
        ran = {r.step_id for r in steps if r.outcome is Outcome.SUCCESS}
        after = [
            n.name for n in walk(plan.body) if n.step_id >= last.step_id and n.step_id not in ran
        ]
        return ReplayPlan(
            instance_id=record.instance_id,
            state=record.state,
            mode="forward",
            step=last.step_name,
            step_id=last.step_id,
            scope=last.scope,
            reruns=tuple(after),
        )
    if record.state is InstanceState.QUARANTINED:
        return _resume(plan, record, steps, wanted)
    raise _illegal(
        f"instance {record.instance_id} is {record.state.value}; only CompensationFailed, "
        "Failed and Quarantined instances can be replayed"
    )


def _resume(
    plan: Plan, record: InstanceRecord, steps: Sequence[StepRecord], wanted: Node
) -> ReplayPlan:
    """A quarantined instance resumes at its frontier: the first step with no success."""
    ran = {r.step_id for r in steps if r.outcome is Outcome.SUCCESS}
    left = [n for n in walk(plan.body) if n.step_id not in ran]
    frontier = left[0] if left else plan.body[-1]
    if wanted.step_id != frontier.step_id:
        raise _illegal(
            f"instance {record.instance_id} stopped before step {frontier.name!r}; replay "
            f"--from {frontier.name!r}"
        )
    return ReplayPlan(
        instance_id=record.instance_id,
        state=record.state,
        mode="resume",
        step=frontier.name,
        step_id=frontier.step_id,
        scope="",
        reruns=tuple(n.name for n in left),
    )
