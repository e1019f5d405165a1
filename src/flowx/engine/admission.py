"""Signal admission: which of a flow's waits can take a signal, and whether one more may be kept.

This is engine knowledge — what a plan's waits are, which of them happen once, what a
journaled wait's result says — so it lives here, pure, and the host (and the CLI) ask it
instead of walking the plan themselves. The host does the reading (the instance row, its
steps) and the writing (the inbox); this module only decides, so it can be tested without
any store (R2.10).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from flowx import codec
from flowx.errors import SignalPayloadInvalid, SignalUnknown
from flowx.plan.model import AwaitSignalNode, ForEachNode, Plan, walk
from flowx.stores.records import InstanceRecord, InstanceState, Outcome, SignalReceipt, StepRecord
from flowx.validation import problems


@dataclass(frozen=True, slots=True)
class SignalTarget:
    """The waits of ``plan`` for signals named ``name`` (at least one)."""

    plan: Plan
    name: str
    waits: tuple[AwaitSignalNode, ...]
    #: No wait among ``waits`` is inside a ``for_each`` (which runs it once per element).
    once: bool

    @property
    def step_ids(self) -> set[int]:
        return {n.step_id for n in self.waits}

    def parse(self, payload: Any) -> Any:
        """``payload`` as the awaited type: a value or a dict of its fields, or JSON text when
        it is ``str``/``bytes`` (what ``flowx signal --payload`` sends). Raises
        ``SignalPayloadInvalid`` naming each bad field."""
        payload_type = self.waits[0].payload_type
        try:
            if isinstance(payload, str | bytes):
                return TypeAdapter(payload_type).validate_json(payload)
            return TypeAdapter(payload_type).validate_python(payload)
        except ValidationError as exc:
            raise SignalPayloadInvalid(
                f"signal {self.name!r} for {self.plan.ref} must be a {payload_type!r}: "
                f"{problems(exc)}"
            ) from exc


def target(plan: Plan, name: str) -> SignalTarget:
    """The waits of ``plan`` that take signals named ``name``; a name the flow never waits for
    is a mistake the sender should hear about (``signal.unknown``), not a signal to keep."""
    waits = [n for n in walk(plan.body) if isinstance(n, AwaitSignalNode)]
    matching = tuple(n for n in waits if n.signal == name)
    if not matching:
        known = ", ".join(sorted({n.signal for n in waits})) or "none"
        raise SignalUnknown(
            f"{plan.ref} never waits for a signal named {name!r} (it waits for: {known}); "
            "check the name"
        )
    looped = {
        n.step_id
        for loop in walk(plan.body)
        if isinstance(loop, ForEachNode)
        for n in walk(loop.body)
    }
    return SignalTarget(
        plan=plan,
        name=name,
        waits=matching,
        once=all(n.step_id not in looped for n in matching),
    )


def _waiting_now(target: SignalTarget, record: InstanceRecord) -> bool:
    return record.state is InstanceState.SUSPENDED and record.wake_signal == target.name


def counted(target: SignalTarget, record: InstanceRecord) -> bool:
    """Whether the inbox is counted for this signal: only while the instance runs and every
    wait for the name happens once (a looped wait can take any number)."""
    return not record.state.terminal and target.once


def needs_steps(target: SignalTarget, record: InstanceRecord) -> bool:
    """Whether ``admit`` needs the instance's journaled steps: not when the instance is
    suspended at the one wait for this name (then no wait for it is over yet)."""
    return counted(target, record) and (not _waiting_now(target, record) or len(target.waits) > 1)


@dataclass(frozen=True, slots=True)
class Admission:
    """What to do with a signal: keep it with the inbox bounded by ``limit`` (``None``: not
    bounded), or write nothing and answer ``settled``."""

    limit: int | None = None
    settled: SignalReceipt | None = None


def admit(
    target: SignalTarget, record: InstanceRecord, steps: Iterable[StepRecord] = ()
) -> Admission:
    """Decide for one signal to ``record`` (``steps``: its journal, when ``needs_steps``).

    Each wait for this name that happens once takes at most one signal: the store counts
    the inbox against that ``limit`` under the lock that inserts, so racing senders keep one.
    When every such wait is already over, the signal is a redelivery (or too late): nothing
    is kept, since keeping it would only hide that.
    """
    if not counted(target, record):
        return Admission()
    ids = target.step_ids
    ended = {r.step_id: r for r in steps if r.step_id in ids and r.outcome is Outcome.SUCCESS}
    timed_out = [r for r in ended.values() if codec.loads(r.result).get("timed_out")]
    limit = len(target.waits) - len(timed_out)
    if not _waiting_now(target, record) and len(ended) == len(target.waits):
        last = codec.loads(max(ended.values(), key=lambda r: r.sequence).result)
        return Admission(
            limit=limit,
            settled=SignalReceipt(
                instance_id=record.instance_id,
                name=target.name,
                seq=int(last.get("seq") or 0),
                status="late" if last.get("timed_out") else "duplicate",
                state=record.state,
            ),
        )
    return Admission(limit=limit)
