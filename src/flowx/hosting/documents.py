"""One JSON document per journal record: what ``flowx -o json``, the HTTP API and the web UI
show of an instance, a step, a signal, an event, a stop or a replay.

Kept in one place, below both front ends, so the CLI and the API cannot describe the same
record differently; each front end only formats (text lines, JSON, HTML) what these return.
Stored payloads are decoded, so a reader gets values, not JSON text inside JSON.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from flowx import codec, sealing
from flowx.engine.replay_plan import ReplayPlan
from flowx.engine.waiting import Waiting, waiting_for
from flowx.hosting.stopping import StopOutcome
from flowx.plan.model import Plan
from flowx.stores.records import (
    ArchivedInstance,
    EventRecord,
    InstanceRecord,
    InstanceState,
    Outcome,
    SignalReceipt,
    SignalRecord,
    StepRecord,
)


def payload(text: str | None) -> Any:
    """Decode a stored JSON payload for ``-o json``, so scripts get values, not strings.
    Sealed members are shown as ``**********``: no display holds the keys (R9.8)."""
    if not text:
        return None
    return sealing.masked(codec.loads(text)) if sealing.MARK in text else codec.loads(text)


def shown(text: str) -> str:
    """A stored payload as text for a person: sealed members as ``**********`` (R9.8)."""
    return codec.dumps(sealing.masked(codec.loads(text))) if sealing.MARK in text else text


def instance_dict(r: InstanceRecord) -> dict[str, Any]:
    """An instance row as JSON, with its payloads decoded."""
    data = dataclasses.asdict(r)
    data["state"] = r.state.value
    for field in ("input", "state_bag", "error", "stop_request"):
        data[field] = payload(data[field])
    return data


def step_dict(s: StepRecord) -> dict[str, Any]:
    """A step row as JSON, with its result decoded and in full."""
    data = dataclasses.asdict(s)
    data["outcome"] = s.outcome.value
    data["result"] = payload(s.result)
    return data


def waiting_dict(w: Waiting | None) -> dict[str, Any] | None:
    """What a Suspended instance waits for (``flowx.engine.waiting``), or ``None``."""
    if w is None:
        return None
    return {
        "kind": w.kind.value,
        "signal": w.signal,
        "wake_at": w.wake_at.isoformat() if w.wake_at else None,
        "step_id": w.step_id,
        "step": w.step,
        "scope": w.scope,
    }


def parent_dict(record: InstanceRecord) -> dict[str, Any] | None:
    """The parent of a child instance (the sub-flow step that started it), else ``None``."""
    if record.parent_instance_id is None:
        return None
    return {
        "instance_id": record.parent_instance_id,
        "scope": record.parent_scope,
        "step_id": record.parent_step_id,
    }


def receipt_dict(r: SignalReceipt) -> dict[str, Any]:
    """What became of a delivered signal."""
    return {
        "instance_id": r.instance_id,
        "name": r.name,
        "seq": r.seq,
        "status": r.status,
        "state": r.state.value,
    }


def taken_signals(steps: Sequence[StepRecord]) -> set[int]:
    """The inbox seqs a wait has taken: each is that wait's own step row (R2.10)."""
    taken: set[int] = set()
    for step in steps:
        if step.outcome is not Outcome.SUCCESS or '"seq"' not in step.result:
            continue
        value = codec.loads(step.result)
        if isinstance(value, dict) and isinstance(value.get("seq"), int):
            taken.add(value["seq"])
    return taken


def signal_dict(s: SignalRecord, *, taken: bool) -> dict[str, Any]:
    """A signal of the instance's inbox, and whether a wait has taken it."""
    return {
        "seq": s.seq,
        "name": s.name,
        "key": s.key,
        "received_at": s.received_at.isoformat(),
        "taken": taken,
        "payload": payload(s.payload),
    }


def outbox_dict(e: EventRecord) -> dict[str, Any]:
    """An event the instance staged, and where it is on its way out."""
    return {
        "event_id": e.event_id,
        "type": e.type,
        "partition_key": e.partition_key,
        "staged_at": e.staged_at.isoformat() if e.staged_at else None,
        "published_at": e.published_at.isoformat() if e.published_at else None,
        "dead_at": e.dead_at.isoformat() if e.dead_at else None,
        "attempts": e.attempts,
    }


def stop_dict(o: StopOutcome) -> dict[str, Any]:
    """What a cancel or terminate did."""
    return {
        "instance_id": o.instance_id,
        "mode": o.mode,
        "status": o.status,
        "state": o.state.value,
        "reached": list(o.reached),
        "waiting": list(o.waiting),
    }


def event_dict(e: EventRecord) -> dict[str, Any]:
    """An outbox event (a dead letter) as JSON, with its payload decoded."""
    return {
        "event_id": e.event_id,
        "instance_id": e.instance_id,
        "type": e.type,
        "schema_version": e.schema_version,
        "partition_key": e.partition_key,
        "staged_seq": e.staged_seq,
        "staged_at": e.staged_at.isoformat() if e.staged_at else None,
        "attempts": e.attempts,
        "dead_at": e.dead_at.isoformat() if e.dead_at else None,
        "reason": e.dead_reason,
        "payload": payload(e.payload),
    }


def replay_dict(p: ReplayPlan) -> dict[str, Any]:
    """Where a replay starts and what it re-runs."""
    return {
        "instance_id": p.instance_id,
        "state": p.state.value,
        "mode": p.mode,
        "step": p.step,
        "step_id": p.step_id,
        "scope": p.scope,
        "reruns": list(p.reruns),
        "undo": list(p.undo),
        "kept": list(p.kept),
        "deadline_at": p.deadline_at.isoformat() if p.deadline_at else None,
    }


def result_dict(record: InstanceRecord) -> dict[str, Any]:
    """What an ended instance ended with: its final state bag if it completed, its error if
    not."""
    completed = record.state is InstanceState.COMPLETED
    return {
        "instance_id": record.instance_id,
        "state": record.state.value,
        "result": payload(record.state_bag) if completed else None,
        "error": payload(record.error),
    }


def instance_view(everything: ArchivedInstance, plans: Sequence[Plan]) -> dict[str, Any]:
    """An instance with what it waits for, its parent, its inbox and its events: what
    ``flowx show``, ``GET /v1/instances/{id}`` and the UI's instance page show."""
    record, steps = everything.instance, list(everything.steps)
    taken = taken_signals(steps)
    return {
        "instance": instance_dict(record),
        "waiting": waiting_dict(waiting_for(record, steps, plans)),
        "parent": parent_dict(record),
        "signals": [signal_dict(s, taken=s.seq in taken) for s in everything.signals],
        "events": [outbox_dict(e) for e in everything.events],
    }


def next_cursor(rows: Sequence[InstanceRecord], limit: int) -> str | None:
    """The keyset cursor after a full page (``CREATED_AT,ID``, exact to the microsecond), or
    ``None`` after a short one: a full page may or may not be the last."""
    if len(rows) < limit or not rows:
        return None
    return f"{rows[-1].created_at.isoformat()},{rows[-1].instance_id}"
