"""What one run of one instance is about: the data, named by the intent that builds it.

A run is started, resumed or replayed from an instance record (``from_record``), run to undo
a completed child for its parent's compensation (``undo_child``), or run with no journal at
all (``ephemeral``). Each intent fills a different subset of the fields; naming the intent
keeps every caller from hand-picking that subset again.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel

from flowx import codec
from flowx.plan.model import Plan
from flowx.stores.records import InstanceRecord, InstanceState, StepRecord, Wake, record

#: Takeovers without a step commit in between before the step about to run is failed (R4.3).
DEFAULT_MAX_RESUMES = 10


@record
class RunSpec:
    """The plan, the instance and its journal: everything a run reads but does not own."""

    plan: Plan
    instance_id: str
    input_value: BaseModel
    #: The instance's journal rows, oldest first (empty for a fresh start).
    history: Sequence[StepRecord] = ()
    #: R4.3 hazard: a step that kills its process would be resumed for ever. Past
    #: ``max_resumes`` takeovers without progress, the step about to run is failed instead.
    resume_count: int = 0
    max_resumes: int = DEFAULT_MAX_RESUMES
    tenant_id: str | None = None
    deadline_at: datetime | None = None
    #: The wait the instance was last sealed at: a run that reaches the same wait again keeps
    #: its deadline instead of starting the timeout (or the sleep) over.
    last_wake: Wake | None = None
    #: ``flowx replay``: rows before this sequence stop counting against retry budgets.
    replay_sequence: int | None = None
    #: ``flowx replay --from STEP`` re-running forward: that step and later ones re-run
    #: (their earlier rows are superseded, ``engine/history.py``).
    replay_from: int | None = None
    #: A sub-flow child: its terminal commit wakes its parent.
    is_child: bool = False
    state: InstanceState | None = None
    #: A completed child undone by its parent's compensation: replay it whole, then compensate.
    undo: bool = False

    @classmethod
    def from_record(
        cls,
        plan: Plan,
        record: InstanceRecord,
        history: Sequence[StepRecord],
        *,
        max_resumes: int = DEFAULT_MAX_RESUMES,
    ) -> RunSpec:
        """Start, resume or replay the instance ``record`` describes (R2.8: one loop)."""
        last_wake = (
            Wake(
                step_id=record.wake_step_id,
                scope=record.wake_scope or "",
                at=record.wake_at,
                signal=record.wake_signal,
            )
            if record.wake_step_id is not None
            else None
        )
        return cls(
            plan=plan,
            instance_id=record.instance_id,
            input_value=codec.validate_model(plan.input_model, record.input, root="input"),
            history=history,
            resume_count=record.resume_count,
            max_resumes=max_resumes,
            tenant_id=record.tenant_id,
            deadline_at=record.deadline_at,
            last_wake=last_wake,
            replay_sequence=record.replay_sequence,
            replay_from=record.replay_from,
            is_child=record.parent_instance_id is not None,
            state=record.state,
        )

    @classmethod
    def undo_child(
        cls, plan: Plan, record: InstanceRecord, history: Sequence[StepRecord]
    ) -> RunSpec:
        """Undo a completed sub-flow child: replay it whole, then run its compensations.
        No deadline, wake or poison count: nothing forward runs."""
        return cls(
            plan=plan,
            instance_id=record.instance_id,
            input_value=codec.validate_model(plan.input_model, record.input, root="input"),
            history=history,
            tenant_id=record.tenant_id,
            replay_sequence=record.replay_sequence,
            is_child=True,
            state=record.state,
            undo=True,
        )

    @classmethod
    def ephemeral(cls, plan: Plan, instance_id: str, input_value: BaseModel) -> RunSpec:
        """An Ephemeral flow: no journal, no waits, nothing to resume."""
        return cls(plan=plan, instance_id=instance_id, input_value=input_value)
