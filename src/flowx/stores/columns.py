"""The journal's column lists, and the one reading of a row of them, for every SQL backend.

PostgreSQL and SQLite share one schema (the migrations of both create the same tables and
columns), so what a query selects, and how a selected row becomes a record, is written once
here. Only what differs stays with a backend: placeholders (``%s`` against ``?``) and the
representation of a value (a ``timestamptz`` arrives as a ``datetime``; SQLite keeps text and
its ``rows`` module converts it before calling the readers below).

The lists are plain string literals so that they stay ``LiteralString`` when a PostgreSQL
module concatenates them into its statements.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from flowx.stores.records import (
    EventRecord,
    InstanceRecord,
    InstanceState,
    Outcome,
    RecoveryCandidate,
    SignalRecord,
    StepRecord,
)

#: Every ``flow_instance`` column an ``InstanceRecord`` carries, in its field order.
INSTANCE_COLUMNS: Final = (
    "instance_id, flow_id, flow_version, state, fence, next_sequence, input, state_bag, "
    "state_bag_sequence, error, tenant_id, idempotency_key, correlation_id, deadline_at, "
    "parent_instance_id, parent_scope, parent_step_id, resume_count, codec_version, "
    "created_at, updated_at, wake_at, wake_step_id, wake_scope, wake_signal, replay_sequence, "
    "resume_from_step, stop_request, replay_from, trace_context"
)
#: The columns a create writes (``FlowJournal.create``); the rest keep their defaults.
CREATE_COLUMNS: Final = (
    "instance_id, flow_id, flow_version, tenant_id, state, fence, input, state_bag, "
    "idempotency_key, correlation_id, deadline_at, parent_instance_id, parent_scope, "
    "parent_step_id, codec_version, created_at, updated_at, trace_context"
)
#: Every ``flow_step`` column, in ``StepRecord`` field order; a commit writes all of them.
STEP_COLUMNS: Final = (
    "instance_id, scope, step_id, attempt, sequence, step_name, outcome, result, "
    "capability_id, capability_version, nondeterministic, duration_ms, committed_at, node_id"
)
#: What the recovery scan and the timer read of an instance (``RecoveryCandidate``).
CANDIDATE_COLUMNS: Final = "instance_id, flow_id, flow_version, state, updated_at"
#: Every ``flow_signal`` column a ``SignalRecord`` carries.
SIGNAL_COLUMNS: Final = "instance_id, name, seq, key, payload, received_at"
#: The ``outbox_event`` columns of an ``EventRecord``, from the table aliased ``o``.
EVENT_COLUMNS: Final = (
    "o.event_id, o.instance_id, o.sequence, o.ordinal, o.staged_seq, o.type, "
    "o.schema_version, o.partition_key, o.payload, o.published_at, o.staged_at, "
    "coalesce(o.attempts, 0) AS attempts, o.last_error, o.dead_at, o.dead_reason, "
    "o.trace_context"
)

#: The SQL spelling of ``TERMINAL_STATES`` and ``ACTIVE_STATES``, for ``state IN ...``.
TERMINAL_STATES_SQL: Final = (
    "('Completed', 'Failed', 'TimedOut', 'CompensationFailed', 'Cancelled', 'Terminated')"
)
ACTIVE_STATES_SQL: Final = "('Pending', 'Running', 'Compensating')"


def names(columns: str) -> tuple[str, ...]:
    """The field each column of a list fills: ``o.x`` and ``f(o.x, 0) AS x`` both fill ``x``."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(columns):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(columns[start:i])
            start = i + 1
    parts.append(columns[start:])
    return tuple(p.strip().rsplit(" AS ", 1)[-1].rsplit(".", 1)[-1] for p in parts)


def instance_of(row: Mapping[str, Any]) -> InstanceRecord:
    """An ``INSTANCE_COLUMNS`` row, by column name."""
    return InstanceRecord(**{**row, "state": InstanceState(row["state"])})


def step_of(row: Mapping[str, Any]) -> StepRecord:
    """A ``STEP_COLUMNS`` row, by column name."""
    return StepRecord(**{**row, "outcome": Outcome(row["outcome"])})


def candidate_of(row: Mapping[str, Any]) -> RecoveryCandidate:
    """A ``CANDIDATE_COLUMNS`` row (or a whole instance row), by column name."""
    return RecoveryCandidate(
        instance_id=row["instance_id"],
        flow_id=row["flow_id"],
        flow_version=row["flow_version"],
        state=InstanceState(row["state"]),
        updated_at=row["updated_at"],
    )


def signal_of(row: Mapping[str, Any]) -> SignalRecord:
    """A ``SIGNAL_COLUMNS`` row, by column name."""
    return SignalRecord(**row)


def event_of(row: Mapping[str, Any]) -> EventRecord:
    """An ``EVENT_COLUMNS`` row, by column name."""
    return EventRecord(**row)
