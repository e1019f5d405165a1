"""What a Suspended instance is waiting for: a signal, a sub-flow child, or a timer.

This is engine knowledge (how a sealed wait is recorded on the instance row, what
``CHILD_WAIT`` means, how a step id maps to a name in the plan), so it lives here rather than
in the CLI that prints it: anything that shows an instance (the CLI, an HTTP API, a test)
asks the same function and cannot read the row differently.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from flowx.plan.model import Plan, walk
from flowx.stores.records import CHILD_WAIT, InstanceRecord, InstanceState, StepRecord


class WaitKind(StrEnum):
    """What wakes a Suspended instance; the values are what ``flowx show -o json`` prints."""

    SIGNAL = "signal"
    SUB_FLOW = "sub_flow"
    TIMER = "timer"


@dataclass(frozen=True, slots=True)
class Waiting:
    """The wait a Suspended instance is sealed at."""

    kind: WaitKind
    #: The signal's name for a signal wait; ``None`` for a sub-flow child or a timer.
    signal: str | None
    #: When the wait times out (or the timer fires); ``None`` for a wait with no timeout.
    wake_at: datetime | None
    step_id: int | None
    #: The wait step's name, when the plan or a journaled row of that step gives it.
    step: str | None
    scope: str | None


def step_names(plans: Iterable[Plan], record: InstanceRecord) -> dict[int, str]:
    """Step id → name for the plan ``record`` runs, when one of ``plans`` is it, else ``{}``."""
    for plan in plans:
        if (plan.flow_id, plan.version) == (record.flow_id, record.flow_version):
            return {n.step_id: n.name for n in walk(plan.body)}
    return {}


def waiting_for(
    record: InstanceRecord, steps: Iterable[StepRecord], plans: Iterable[Plan] = ()
) -> Waiting | None:
    """What a Suspended instance waits for, or ``None`` for any other state.

    The wait's step name comes from the plan when ``plans`` holds the one the instance runs,
    else from a journaled row of that step; a wait that has committed nothing and whose plan
    is not at hand is named only by its id.
    """
    if record.state is not InstanceState.SUSPENDED:
        return None
    step_id = record.wake_step_id
    name = None
    if step_id is not None:
        name = step_names(plans, record).get(step_id) or next(
            (s.step_name for s in steps if s.step_id == step_id), None
        )
    child = record.wake_signal == CHILD_WAIT
    plain = WaitKind.SIGNAL if record.wake_signal else WaitKind.TIMER
    return Waiting(
        kind=WaitKind.SUB_FLOW if child else plain,
        signal=None if child else record.wake_signal,
        wake_at=record.wake_at,
        step_id=step_id,
        step=name,
        scope=record.wake_scope,
    )
