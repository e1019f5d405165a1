"""The values that cross the store seam: rows as the journal keeps them, and writes.

Keyword-only, slotted dataclasses: frozen, or for the engine's writes immutable to the type
checker (``record``). Payloads (input, state bag, results, events) are canonical JSON *text*,
not parsed values: the store keeps them byte-for-byte as written (R2.1), and nothing below the
engine needs to understand them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TypeVar

from typing_extensions import dataclass_transform

_R = TypeVar("_R")


@dataclass_transform(frozen_default=True, kw_only_default=True)
def record(cls: type[_R]) -> type[_R]:
    """A write the engine hands a store (a step's row, its commit, a new instance ...):
    immutable to the type checker (``mypy --strict`` refuses any assignment to a field, as for
    a frozen dataclass), and at run time a keyword-only, slotted dataclass hashed by its
    fields as a frozen one.

    Not ``frozen=True`` at run time: a frozen dataclass sets each field through
    ``object.__setattr__``, three times the cost of a plain one, and the hot path builds
    several of these per step: about 6 % of the engine's CPU per flow at 64 in flight, with
    the rows read back (issue 14). Rows a store hands out (``InstanceRecord``, ``StepRecord``,
    ``Lease`` ...) stay frozen dataclasses: the in-memory store hands out the very objects it
    keeps. Nothing in FlowX writes a field after construction; a changed copy is made with
    ``dataclasses.replace``."""
    return dataclass(kw_only=True, slots=True, unsafe_hash=True)(cls)


_new = object.__new__


def blank(cls: type[_R]) -> _R:
    """An instance of the dataclass ``cls`` (a record, or any slotted dataclass without a
    ``__new__`` or ``__post_init__`` of its own) with no field set yet, to be set at once by
    ``cls.__init__(it, field=..., ...)``: that builds what ``cls(field=...)`` builds. The
    step path builds its per-step records so (a ``StepWrite``, a ``StepCommit``, the
    history's ``Done`` and ``Attempts``). Called with keyword arguments, a class goes
    through ``type.__call__``, which on CPython 3.11 packs them into a dict and unpacks it
    again for ``__init__`` (0.88 against 0.46 µs for a ``StepWrite``); ``__init__`` called
    directly takes them as they are."""
    made: _R = _new(cls)
    return made


class InstanceState(StrEnum):
    """The states of ``flow_instance.state`` (the CHECK constraint lists the same values)."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    COMPENSATING = "Compensating"
    COMPLETED = "Completed"
    FAILED = "Failed"
    TIMED_OUT = "TimedOut"
    COMPENSATION_FAILED = "CompensationFailed"
    #: Stopped by an operator (R9.4): compensated what had finished, then ended.
    CANCELLED = "Cancelled"
    #: Stopped by an operator (R9.4) with no compensation.
    TERMINATED = "Terminated"
    #: Set aside: its journal no longer matches its plan (the plan changed under the same
    #: version). Not ended and not run by recovery; ``flowx replay`` puts it back.
    QUARANTINED = "Quarantined"

    @property
    def terminal(self) -> bool:
        """The instance has ended and will not run again (short of a ``flowx replay``)."""
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset(
    {
        InstanceState.COMPLETED,
        InstanceState.FAILED,
        InstanceState.TIMED_OUT,
        InstanceState.COMPENSATION_FAILED,
        InstanceState.CANCELLED,
        InstanceState.TERMINATED,
    }
)

#: States a node may be executing; an instance in one of them that nothing has written to for
#: a lease TTL is a recovery candidate (R3.4). Suspended is excluded: a waiting instance is
#: woken by its signal or timer, not by the scan.
ACTIVE_STATES = frozenset(
    {InstanceState.PENDING, InstanceState.RUNNING, InstanceState.COMPENSATING}
)


class Outcome(StrEnum):
    """What one ``flow_step`` row records."""

    SUCCESS = "Success"
    FAILURE = "Failure"
    COMPENSATED = "Compensated"
    COMPENSATION_FAILURE = "CompensationFailure"


@record
class NewInstance:
    """Everything ``FlowJournal.create`` writes for a new instance."""

    instance_id: str
    flow_id: str
    flow_version: str
    input: str
    state_bag: str
    state: InstanceState = InstanceState.RUNNING
    tenant_id: str | None = None
    idempotency_key: str | None = None
    correlation_id: str | None = None
    deadline_at: datetime | None = None
    parent_instance_id: str | None = None
    parent_scope: str | None = None
    parent_step_id: int | None = None
    codec_version: int = 1
    #: The W3C ``traceparent`` of the span that started it (``flowx.tracing``), or ``None``.
    trace_context: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class InstanceRecord:
    """A ``flow_instance`` row as read back."""

    instance_id: str
    flow_id: str
    flow_version: str
    state: InstanceState
    fence: int
    next_sequence: int
    input: str
    state_bag: str
    state_bag_sequence: int | None
    error: str | None
    tenant_id: str | None
    idempotency_key: str | None
    correlation_id: str | None
    deadline_at: datetime | None
    parent_instance_id: str | None
    parent_scope: str | None
    parent_step_id: int | None
    resume_count: int
    codec_version: int
    created_at: datetime
    updated_at: datetime
    #: The wait the instance was last sealed at (R2.10, R2.11): kept after it wakes, so the run
    #: that resumes it finds the same deadline instead of starting the wait again.
    wake_at: datetime | None = None
    wake_step_id: int | None = None
    wake_scope: str | None = None
    #: The signal name a Suspended instance waits for (``CHILD_WAIT`` for a sub-flow).
    wake_signal: str | None = None
    #: Set by a replay: failures journaled before this sequence do not count against a retry
    #: budget, so a replayed step or compensation gets its attempts afresh.
    replay_sequence: int | None = None
    #: The step an operator replayed from (an operator hint, never the frontier: R2.8).
    resume_from_step: int | None = None
    #: An operator's cancel or terminate, not yet carried out or carried out (R9.4): the
    #: ``StopRequest`` as JSON text, ``None`` when nobody asked the instance to stop.
    stop_request: str | None = None
    #: A replay re-running forward from a chosen step: that step and every later one re-run,
    #: and their rows journaled before ``replay_sequence`` no longer count (``None`` for any
    #: other replay).
    replay_from: int | None = None
    #: The trace its runs continue (``NewInstance.trace_context``).
    trace_context: str | None = None


@record
class StepWrite:
    """One ``flow_step`` row to insert; the store allocates its ``sequence``."""

    scope: str
    step_id: int
    attempt: int
    step_name: str
    outcome: Outcome
    result: str
    capability_id: str | None = None
    capability_version: str | None = None
    nondeterministic: str | None = None
    duration_ms: int = 0
    #: The node that ran this attempt (``None``: a run with no node, or an older row).
    node_id: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class StepRecord:
    """A ``flow_step`` row as read back. Rows are never updated (R2.2)."""

    instance_id: str
    scope: str
    step_id: int
    attempt: int
    sequence: int
    step_name: str
    outcome: Outcome
    result: str
    capability_id: str | None
    capability_version: str | None
    nondeterministic: str | None
    duration_ms: int
    committed_at: datetime
    node_id: str | None = None


@record
class EventWrite:
    """An ``outbox_event`` row staged in the same transaction as its step (R2.3, R5.1)."""

    event_id: str
    type: str
    schema_version: str
    partition_key: str | None
    payload: str
    #: The W3C ``traceparent`` it was emitted in (``flowx.tracing``), sent as a header.
    trace_context: str | None = None


@record
class StepCommit:
    """One step boundary: written atomically, under the fence, or not at all (R2.3, R2.4).

    ``step`` is the journal row (``None`` for a pure state transition such as the final
    ``Completed``). ``state_bag`` is the snapshot after this commit; with a ``step`` it becomes
    the snapshot of that row's sequence. ``state`` moves the instance; ``error`` records why a
    terminal failure happened.
    """

    instance_id: str
    token: int
    #: ``None``: the store stamps ``updated_at`` and ``committed_at`` with its own clock,
    #: which is what the recovery scan compares them with (R9.2).
    now: datetime | None
    step: StepWrite | None = None
    state_bag: str | None = None
    state: InstanceState | None = None
    error: str | None = None
    events: tuple[EventWrite, ...] = ()
    #: A child instance's terminal commit: wake its parent if the parent is Suspended waiting
    #: for this child (``parent_step_id``/``parent_scope``), in the same transaction, so a
    #: crash between the two cannot leave the parent waiting for ever.
    notify_parent: bool = False
    #: End the lease ``token`` names in the same write (a run's terminal commit, on stores
    #: whose journal keeps the leases: ``CommitReleases``), saving the release's own round
    #: trip. A commit the fence refuses releases nothing.
    release_lease: bool = False


#: ``wake_signal`` of a parent Suspended until its sub-flow child ends.
CHILD_WAIT = "flowx.sub_flow"


@dataclass(frozen=True, kw_only=True, slots=True)
class Wake:
    """Where a Suspended instance waits, and what wakes it.

    ``at`` is when the timer service wakes it (a sleep's end, a signal's timeout, the flow
    deadline), ``None`` for no timer. ``signal`` is the awaited signal name (or
    ``CHILD_WAIT``); a signal of that name makes the instance ``Pending`` again.
    """

    step_id: int
    scope: str
    at: datetime | None = None
    signal: str | None = None


@record
class SuspendCommit:
    """Seal an instance ``Suspended`` at a wait, fenced like a step commit (R2.4).

    Parking and scheduling the wake are this one write (R2.11). ``consumed`` lists the inbox
    ``seq`` of every signal of ``wake.signal`` the instance has already taken; ``child`` is the
    sub-flow instance a parent waits for. If a signal not in ``consumed`` is already in the
    inbox, or ``child`` has already ended, the instance is *not* suspended: the check and the
    seal happen under the instance's row lock, so no wake-up is lost between them.
    """

    instance_id: str
    token: int
    now: datetime
    wake: Wake
    state_bag: str | None = None
    consumed: tuple[int, ...] = ()
    child: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class SignalRecord:
    """A signal in an instance's inbox (``flow_signal``). ``seq`` is its order of arrival."""

    instance_id: str
    name: str
    seq: int
    key: str | None
    payload: str
    received_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class SignalReceipt:
    """What delivering a signal did.

    ``woken``: the instance was Suspended waiting for it and is now ``Pending``; ``kept``: it
    waits in the inbox for the flow to reach the wait; ``duplicate``: a signal with this
    ``key`` was already received (even if the instance has ended since), or every wait for it
    that happens once has already taken a signal or has one waiting, and nothing was written;
    ``late``: the one wait for it has already timed out (nothing written).
    """

    instance_id: str
    name: str
    seq: int
    status: str
    state: InstanceState


@dataclass(frozen=True, kw_only=True, slots=True)
class History:
    """What a node reads when it takes over an instance: its row and every committed step,
    ordered by ``sequence`` (R2.8). ``inbox``: where the store read it in the same round trip,
    the signals of the name the instance was waiting for, in ``seq`` order (``None``: not
    read; the run reads it when it needs it)."""

    instance: InstanceRecord
    steps: tuple[StepRecord, ...]
    inbox: tuple[SignalRecord, ...] | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class CreateResult:
    """``created`` is false when the idempotency key (or instance id) was already there; then
    ``instance`` is the existing row and nothing was written (R4.1)."""

    instance: InstanceRecord
    created: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class Lease:
    """A granted lease. ``token`` is the fencing token every write made under it carries."""

    instance_id: str
    owner: str
    token: int
    expires_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class RecoveryCandidate:
    """An instance the recovery scan found: active, and idle past the cutoff (or queued)."""

    instance_id: str
    flow_id: str
    flow_version: str
    state: InstanceState
    updated_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class EventRecord:
    """An ``outbox_event`` row as read back."""

    event_id: str
    instance_id: str
    sequence: int
    ordinal: int
    staged_seq: int
    type: str
    schema_version: str
    partition_key: str | None
    payload: str
    published_at: datetime | None
    staged_at: datetime | None = None
    #: Refusals counted under the publisher's retry policy (R5.5).
    attempts: int = 0
    last_error: str | None = None
    #: Set when the event was moved aside as a dead letter, with the broker's reason.
    dead_at: datetime | None = None
    dead_reason: str | None = None
    #: The ``traceparent`` it was emitted in (``EventWrite.trace_context``).
    trace_context: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ChangeBatch:
    """What a change subscription read (R2.14): events after its cursor, in order, and the
    position to commit once they are handled. ``position`` is opaque: pass it back as is."""

    consumer: str
    events: tuple[EventRecord, ...]
    position: tuple[int, int]


@dataclass(frozen=True, kw_only=True, slots=True)
class OutboxBacklog:
    """What waits in the outbox: events not yet published, when the oldest of them was
    staged (its lag), and dead letters. Read by the metrics sampler, not on any hot path."""

    pending: int
    oldest_staged_at: datetime | None
    dead: int


@dataclass(frozen=True, kw_only=True, slots=True)
class OutboxPurge:
    """What a purge of published outbox rows did (R2.13)."""

    deleted: int
    #: Past their window but kept: a change subscription has not read them yet.
    held_back: int


#: The inbox name a stop request is journaled under (one row per mode: its key is the mode).
STOP_SIGNAL = "flowx.stop"


@dataclass(frozen=True, kw_only=True, slots=True)
class StopRequest:
    """An operator asked an instance to stop (R9.4): who, why, when, and how.

    Kept on the instance (``stop_request``, so the node running it learns of it with a read
    it makes anyway) and as a row of its inbox (``STOP_SIGNAL``), the journaled record of
    the request. A terminate outranks a cancel: it may follow one, never the reverse."""

    mode: str
    reason: str
    by: str
    at: datetime

    def dumps(self) -> str:
        return json.dumps(
            {"mode": self.mode, "reason": self.reason, "by": self.by, "at": self.at.isoformat()},
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def loads(cls, text: str) -> StopRequest:
        data = json.loads(text)
        return cls(
            mode=data["mode"],
            reason=data["reason"],
            by=data["by"],
            at=datetime.fromisoformat(data["at"]),
        )

    def outranks(self, other: StopRequest | None) -> bool:
        """This request changes what ``other`` (the one already kept) asked for."""
        return other is None or (self.mode == "terminate" and other.mode == "cancel")


@dataclass(frozen=True, kw_only=True, slots=True)
class StopReceipt:
    """What ``StopStore.request_stop`` did. ``status``: ``requested`` (kept now),
    ``already`` (an equal or stronger request was kept before: nothing written), or
    ``ended`` (the instance had already ended by a stop: nothing written). ``affected``:
    every instance the request reached (the instance, then its unfinished descendants) with
    its state after the write; ``Pending`` ones are for a node to finish."""

    instance_id: str
    mode: str
    status: str
    state: InstanceState
    affected: tuple[tuple[str, InstanceState], ...] = ()


#: The retention classes of ``retention_policy.state_class`` (R2.13). ``Failed`` covers every
#: end but ``Completed``: Failed, TimedOut, CompensationFailed, Cancelled and Terminated.
RETENTION_CLASSES = ("Completed", "Failed", "Suspended", "OutboxPublished")


@dataclass(frozen=True, kw_only=True, slots=True)
class RetentionPolicy:
    """How long instances of ``flow_id`` (``'*'``: any flow without a policy of its own)
    ending in ``state_class`` are kept after they end; ``retain_for=None``: for ever."""

    flow_id: str
    state_class: str
    retain_for: timedelta | None


@dataclass(frozen=True, kw_only=True, slots=True)
class ExpiredInstance:
    """An ended instance past its retention window. ``updated_at`` is the version a delete
    checks, so what was archived is exactly what is deleted. ``held_by``: why it is kept
    anyway (``None``: it may go): an event not yet published or not yet read by a declared
    consumer, or a parent that has not ended (its compensation may still need the child)."""

    instance_id: str
    flow_id: str
    state: InstanceState
    updated_at: datetime
    held_by: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ArchivedInstance:
    """Everything the journal holds of one instance, as an archiver receives it."""

    instance: InstanceRecord
    steps: tuple[StepRecord, ...]
    signals: tuple[SignalRecord, ...]
    events: tuple[EventRecord, ...]
