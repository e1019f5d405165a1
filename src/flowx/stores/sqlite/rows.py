"""Reading SQLite rows into records, for the journal, the waits and the outbox alike.

SQLite hands back tuples and keeps timestamps as fixed-width UTC text (``to_text``). Each
reader here names a tuple's values by the column list it was selected with and turns the
timestamp columns back into ``datetime`` values; the record itself is then built by the
backend-neutral reader in ``flowx.stores.columns``, as PostgreSQL's are. The statements that
more than one module runs (read an instance, a page of candidates) live here too, so no
module imports another for them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, Final

from flowx.stores.columns import (
    CANDIDATE_COLUMNS,
    EVENT_COLUMNS,
    INSTANCE_COLUMNS,
    SIGNAL_COLUMNS,
    STEP_COLUMNS,
    candidate_of,
    event_of,
    instance_of,
    names,
    signal_of,
    step_of,
)
from flowx.stores.records import (
    EventRecord,
    InstanceRecord,
    RecoveryCandidate,
    SignalRecord,
    StepRecord,
)
from flowx.stores.sqlite.database import from_text

#: Columns kept as ``to_text`` timestamps, in any of the lists.
_TIMESTAMPS: Final = frozenset(
    {
        "deadline_at",
        "created_at",
        "updated_at",
        "wake_at",
        "committed_at",
        "received_at",
        "published_at",
        "staged_at",
        "dead_at",
    }
)

# Primary key.
SELECT_INSTANCE: Final = f"SELECT {INSTANCE_COLUMNS} FROM flow_instance WHERE instance_id = ?"


def _named(fields: tuple[str, ...], row: Sequence[Any]) -> dict[str, Any]:
    """The row's values by field, each timestamp read back from its text (``NULL`` stays)."""
    return {
        name: from_text(value) if name in _TIMESTAMPS and value else value
        for name, value in zip(fields, row, strict=True)
    }


_INSTANCE_FIELDS: Final = names(INSTANCE_COLUMNS)
_STEP_FIELDS: Final = names(STEP_COLUMNS)
_CANDIDATE_FIELDS: Final = names(CANDIDATE_COLUMNS)
_SIGNAL_FIELDS: Final = names(SIGNAL_COLUMNS)
_EVENT_FIELDS: Final = names(EVENT_COLUMNS)


def instance_row(row: Sequence[Any]) -> InstanceRecord:
    """An ``INSTANCE_COLUMNS`` row."""
    return instance_of(_named(_INSTANCE_FIELDS, row))


def step_row(row: Sequence[Any]) -> StepRecord:
    """A ``STEP_COLUMNS`` row."""
    return step_of(_named(_STEP_FIELDS, row))


def signal_row(row: Sequence[Any]) -> SignalRecord:
    """A ``SIGNAL_COLUMNS`` row."""
    return signal_of(_named(_SIGNAL_FIELDS, row))


def event_row(row: Sequence[Any]) -> EventRecord:
    """An ``EVENT_COLUMNS`` row."""
    return event_of(_named(_EVENT_FIELDS, row))


def read_instance(conn: sqlite3.Connection, instance_id: str) -> InstanceRecord | None:
    """The instance's row, or ``None``."""
    row = conn.execute(SELECT_INSTANCE, (instance_id,)).fetchone()
    return instance_row(row) if row is not None else None


def candidates(
    conn: sqlite3.Connection, sql: str, args: tuple[Any, ...]
) -> Sequence[RecoveryCandidate]:
    """Run a candidate query (the recovery scan's, the timer's: ``CANDIDATE_COLUMNS``) and
    read its rows."""
    return tuple(candidate_of(_named(_CANDIDATE_FIELDS, r)) for r in conn.execute(sql, args))
