"""Signal admission as a pure engine function (issue 13): which waits take a signal, whether
the inbox is counted, and when a signal is settled as a redelivery (or too late) without a
write. The host's end-to-end behaviour is covered by tests/engine/test_waits.py; these pin the
decision itself, with no store."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel

import flowx
from flowx import codec
from flowx.engine import admission
from flowx.errors import SignalPayloadInvalid, SignalUnknown
from flowx.plan.model import AwaitSignalNode, walk
from flowx.stores.records import InstanceRecord, InstanceState, Outcome, StepRecord
from tests.engine.kit import instance_row

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class Order(BaseModel):
    name: str = "o"


class Shipment(BaseModel):
    tracking: str


def _plan(looped: bool = False) -> flowx.Plan:
    builder = flowx.flow("adm.ship", version="1", input=Order)
    if looped:
        builder = builder.for_each(
            "each", lambda o, s: [1, 2], lambda b: b.await_signal("shipped", Shipment)
        )
    else:
        builder = builder.await_signal("shipped", Shipment, timeout="2d")
    return builder.build()


def _record(state: InstanceState, **kw: Any) -> InstanceRecord:
    return instance_row(_plan(), state, instance_id="i-1", **kw)


def _ended(plan: flowx.Plan, result: dict[str, Any]) -> StepRecord:
    wait = next(n for n in walk(plan.body) if isinstance(n, AwaitSignalNode))
    return StepRecord(
        instance_id="i-1",
        scope="",
        step_id=wait.step_id,
        attempt=1,
        sequence=7,
        step_name=wait.name,
        outcome=Outcome.SUCCESS,
        result=codec.dumps(result),
        capability_id=None,
        capability_version=None,
        nondeterministic=None,
        duration_ms=0,
        committed_at=NOW,
    )


def test_a_name_the_flow_never_waits_for_is_refused_with_the_names_it_does() -> None:
    with pytest.raises(SignalUnknown, match="it waits for: shipped") as caught:
        admission.target(_plan(), "shiped")
    assert caught.value.code == "signal.unknown"  # the class, and the code scripts branch on


def test_a_payload_is_parsed_as_the_awaited_type_or_refused_by_field() -> None:
    target = admission.target(_plan(), "shipped")
    assert target.parse({"tracking": "t-1"}) == Shipment(tracking="t-1")
    assert target.parse('{"tracking": "t-2"}') == Shipment(tracking="t-2")
    with pytest.raises(SignalPayloadInvalid, match="field 'tracking'") as caught:
        target.parse({})
    assert caught.value.code == "signal.payload_invalid"


def test_a_wait_in_a_for_each_takes_any_number_so_nothing_is_counted() -> None:
    target = admission.target(_plan(looped=True), "shipped")
    assert not target.once
    record = _record(InstanceState.RUNNING)
    assert not admission.needs_steps(target, record)
    assert admission.admit(target, record) == admission.Admission()


def test_a_suspended_instance_at_the_one_wait_takes_one_without_reading_its_steps() -> None:
    target = admission.target(_plan(), "shipped")
    record = _record(InstanceState.SUSPENDED, wake_signal="shipped")
    assert not admission.needs_steps(target, record)
    assert admission.admit(target, record) == admission.Admission(limit=1)


def test_an_ended_wait_settles_a_signal_as_a_duplicate_or_late_without_a_write() -> None:
    plan = _plan()
    target = admission.target(plan, "shipped")
    record = _record(InstanceState.RUNNING)
    assert admission.needs_steps(target, record)
    took = admission.admit(target, record, [_ended(plan, {"seq": 3})])
    assert took.settled is not None
    assert (took.settled.status, took.settled.seq) == ("duplicate", 3)
    late = admission.admit(target, record, [_ended(plan, {"timed_out": True})])
    assert late.settled is not None and late.settled.status == "late"
    assert late.limit == 0


def test_an_ended_instance_is_not_counted_a_keyed_redelivery_is_the_stores_call() -> None:
    target = admission.target(_plan(), "shipped")
    record = _record(InstanceState.COMPLETED)
    assert not admission.needs_steps(target, record)
    assert admission.admit(target, record) == admission.Admission()
