"""``flowx.engine.waiting``: what a Suspended instance waits for, read from its row, named from
its plan or, without the plan, from a journaled row of the wait step."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import BaseModel

import flowx
from flowx.engine.waiting import WaitKind, waiting_for
from flowx.plan.model import walk
from flowx.stores.records import CHILD_WAIT, InstanceRecord, InstanceState, Outcome, StepRecord
from tests.engine.kit import T0, instance_row


class Parcel(BaseModel):
    parcel_id: str = "p1"


class Shipped(BaseModel):
    carrier: str


@flowx.capability("waiting.pack", version="1.0.0")
def pack(ctx: flowx.StepContext, parcel: Parcel) -> str:
    return "packed"


PLAN = (
    flowx.flow("waiting.ship", version="1.0.0", input=Parcel)
    .step(pack)
    .await_signal("shipped", Shipped, timeout="2d")
    .build()
)
WAIT_STEP = next(n.step_id for n in walk(PLAN.body) if n.name != "pack")


def suspended(**wake: Any) -> InstanceRecord:
    return instance_row(PLAN, InstanceState.SUSPENDED, next_sequence=2, **wake)


def step_row(step_id: int, name: str) -> StepRecord:
    return StepRecord(
        instance_id="i1",
        scope="",
        step_id=step_id,
        attempt=1,
        sequence=1,
        step_name=name,
        outcome=Outcome.SUCCESS,
        result="null",
        capability_id=None,
        capability_version=None,
        nondeterministic=None,
        duration_ms=0,
        committed_at=T0,
    )


def test_only_a_suspended_instance_waits() -> None:
    running = replace(suspended(wake_signal="shipped"), state=InstanceState.RUNNING)
    assert waiting_for(running, [], [PLAN]) is None


def test_a_signal_wait_is_named_from_the_plan() -> None:
    record = suspended(wake_signal="shipped", wake_step_id=WAIT_STEP, wake_at=T0, wake_scope="")
    waiting = waiting_for(record, [], [PLAN])
    assert waiting is not None
    assert (waiting.kind, waiting.signal, waiting.wake_at) == (WaitKind.SIGNAL, "shipped", T0)
    assert (waiting.step_id, waiting.scope) == (WAIT_STEP, "")
    assert waiting.step == next(n.name for n in walk(PLAN.body) if n.step_id == WAIT_STEP)


def test_without_the_plan_a_journaled_row_names_the_step_else_only_its_id() -> None:
    record = suspended(wake_signal="shipped", wake_step_id=7)
    named = waiting_for(record, [step_row(7, "wait here")])
    assert named is not None and named.step == "wait here"
    unnamed = waiting_for(record, [step_row(3, "other")])
    assert unnamed is not None and (unnamed.step, unnamed.step_id) == (None, 7)


def test_a_child_wait_and_a_timer_say_so() -> None:
    child = waiting_for(suspended(wake_signal=CHILD_WAIT, wake_step_id=1), [])
    assert child is not None and (child.kind, child.signal) == (WaitKind.SUB_FLOW, None)
    timer = waiting_for(suspended(wake_at=T0), [])
    assert timer is not None and (timer.kind, timer.signal, timer.step_id) == (
        WaitKind.TIMER,
        None,
        None,
    )
