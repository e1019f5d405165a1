"""Shared builders for the conformance suites."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from flowx.stores.records import EventWrite, NewInstance, Outcome, StepWrite

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def new_id() -> str:
    return str(uuid.uuid4())


def instance(instance_id: str | None = None, **kw: object) -> NewInstance:
    fields: dict[str, object] = {
        "instance_id": instance_id or new_id(),
        "flow_id": "conformance.flow",
        "flow_version": "1.0.0",
        "input": '{"order_id":"o-1"}',
        "state_bag": "{}",
    }
    fields.update(kw)
    return NewInstance(**fields)  # type: ignore[arg-type]


def step(
    step_id: int,
    attempt: int = 1,
    *,
    outcome: Outcome = Outcome.SUCCESS,
    scope: str = "",
    result: str = '"ok"',
) -> StepWrite:
    return StepWrite(
        scope=scope,
        step_id=step_id,
        attempt=attempt,
        step_name=f"step-{step_id}",
        outcome=outcome,
        result=result,
        capability_id="conformance.cap",
        capability_version="1.0.0",
        duration_ms=3,
    )


def event(key: str | None = "k", payload: str = '{"n":1}') -> EventWrite:
    return EventWrite(
        event_id=new_id(),
        type="conformance.happened",
        schema_version="1",
        partition_key=key,
        payload=payload,
    )
