"""Retention in the store (R2.13): what every backend says about an expired instance.

The sweep itself (which policies, which pages, the archiver) is the host's
(``flowx.hosting.retention``); a backend finds expired instances, reads their contents and
deletes what was archived. Why an expired instance is kept anyway is decided by the same
three rules everywhere, named here so every backend reports them in the same words.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from flowx.stores.records import (
    ArchivedInstance,
    EventRecord,
    InstanceRecord,
    SignalRecord,
    StepRecord,
)

#: An event of the instance has not been published (dead letters included: an operator may
#: still resend one).
UNPUBLISHED = "an event not yet published"
#: An event of the instance is past the cursor of a declared change consumer.
UNREAD = "an event a declared consumer has not read"
#: A sub-flow child whose parent is still in the journal: the parent's compensation — now, or
#: after a replay of a parent that failed — may still need to replay the child and run its
#: compensations. A child goes after its parent.
PARENT_KEPT = "its parent is still in the journal"


def held_by_sql(unread: str) -> str:
    """``HELD_BY_SQL`` with the backend's test of an event (``o``) a consumer has not read:
    a cursor is a ``staged_seq`` on SQLite, a ``(staged_xid, staged_seq)`` on PostgreSQL."""
    return (
        # Scalar subqueries, not EXISTS: each is one index probe per row of the page, where a
        # hashed EXISTS would read every pending event or live instance once per page.
        "CASE WHEN (SELECT 1 FROM outbox_event o WHERE o.instance_id = f.instance_id "
        f"AND o.published_at IS NULL LIMIT 1) IS NOT NULL THEN '{UNPUBLISHED}' "
        "WHEN (SELECT 1 FROM outbox_event o WHERE o.instance_id = f.instance_id "
        f"AND {unread} LIMIT 1) IS NOT NULL THEN '{UNREAD}' "
        "WHEN (SELECT 1 FROM flow_instance p WHERE p.instance_id = f.parent_instance_id) "
        f"IS NOT NULL THEN '{PARENT_KEPT}' END"
    )


#: Why an ended instance (aliased ``f``) is kept anyway, or ``NULL``: the rules above, in
#: SQL (outbox_event_instance_idx serves the first two, the primary key the third). SQLite's
#: spelling; PostgreSQL's cursors are pairs (``flowx.stores.postgres.retention``).
HELD_BY_SQL: Final = held_by_sql(
    "o.staged_seq > (SELECT min(c.last_staged_seq) FROM change_cursor c)"
)


def assemble(
    asked: Sequence[str],
    instances: Mapping[str, InstanceRecord],
    steps: Iterable[StepRecord],
    signals: Iterable[SignalRecord],
    events: Iterable[EventRecord],
) -> tuple[ArchivedInstance, ...]:
    """The archive of each asked instance that exists, from rows read for all of them at
    once (each list in the order it was read: sequence, arrival, staging)."""
    by: dict[str, tuple[list[StepRecord], list[SignalRecord], list[EventRecord]]] = {
        iid: ([], [], []) for iid in instances
    }
    for step in steps:
        by[step.instance_id][0].append(step)
    for signal in signals:
        by[signal.instance_id][1].append(signal)
    for event in events:
        by[event.instance_id][2].append(event)
    return tuple(
        ArchivedInstance(
            instance=instances[iid],
            steps=tuple(by[iid][0]),
            signals=tuple(by[iid][1]),
            events=tuple(by[iid][2]),
        )
        for iid in asked
        if iid in instances
    )
