"""``RetentionStore`` on PostgreSQL (R2.13): expired pages, contents, deletes.

A page of deletes is one statement: the rows it deletes are locked by it, so two sweeps
deleting one page delete each row once (the second finds it gone, or changed).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Final, LiteralString

from psycopg.rows import dict_row

from flowx.stores.columns import (
    EVENT_COLUMNS,
    INSTANCE_COLUMNS,
    SIGNAL_COLUMNS,
    STEP_COLUMNS,
    TERMINAL_STATES_SQL,
    event_of,
    instance_of,
    signal_of,
    step_of,
)
from flowx.stores.postgres.database import PostgresDatabase
from flowx.stores.records import (
    ArchivedInstance,
    ExpiredInstance,
    InstanceState,
    RetentionPolicy,
)
from flowx.stores.retention import assemble, held_by_sql

#: A change cursor on PostgreSQL is a ``(staged_xid, staged_seq)`` pair: an event is unread
#: while it is past the least of them.
HELD_BY_SQL: Final = held_by_sql(
    "(o.staged_xid, o.staged_seq) > (SELECT coalesce(c.last_staged_xid, '0'::xid8), "
    "c.last_staged_seq FROM change_cursor c ORDER BY 1, 2 LIMIT 1)"
)

POLICIES: Final[LiteralString] = (
    "SELECT flow_id, state_class, retain_for FROM retention_policy ORDER BY flow_id, state_class"
)
SET_POLICY: Final[LiteralString] = (
    "INSERT INTO retention_policy (flow_id, state_class, retain_for) VALUES (%s, %s, %s) "
    "ON CONFLICT (flow_id, state_class) DO UPDATE SET retain_for = excluded.retain_for"
)
# flow_instance_ended_idx, in (updated_at, instance_id) order.
EXPIRED: Final[LiteralString] = (
    "SELECT f.instance_id::text, f.flow_id, f.state, f.updated_at, "
    + HELD_BY_SQL
    + " AS held_by FROM flow_instance f WHERE f.state IN "
    + TERMINAL_STATES_SQL
    + " AND f.state = ANY (%(states)b::text[]) AND f.updated_at < %(before)s "
    "AND ((%(flow)s::text IS NULL AND f.flow_id <> ALL (%(skip)b::text[])) "
    "OR f.flow_id = %(flow)s::text) "
    "AND (%(after_at)s::timestamptz IS NULL "
    "OR (f.updated_at, f.instance_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)) "
    "ORDER BY f.updated_at, f.instance_id LIMIT %(limit)s"
)
# The instance row goes last: its delete cascades to steps, signals and events. Its lease
# row has no foreign key (a lease is taken before its instance exists) and goes with it.
DELETE: Final[LiteralString] = (
    "WITH gone AS (DELETE FROM flow_instance f "
    "USING unnest(%(ids)b::uuid[], %(ats)b::timestamptz[]) AS i(instance_id, updated_at) "
    "WHERE f.instance_id = i.instance_id AND f.updated_at = i.updated_at AND f.state IN "
    + TERMINAL_STATES_SQL
    + " AND ("
    + HELD_BY_SQL
    + ") IS NULL RETURNING f.instance_id), "
    "leases AS (DELETE FROM flow_lease l USING gone WHERE l.instance_id = gone.instance_id) "
    "SELECT count(*) FROM gone"
)
CONTENTS: Final[dict[str, LiteralString]] = {
    "instances": "SELECT "
    + INSTANCE_COLUMNS
    + " FROM flow_instance WHERE instance_id = ANY (%(ids)b::uuid[])",
    "steps": "SELECT "
    + STEP_COLUMNS
    + " FROM flow_step WHERE instance_id = ANY (%(ids)b::uuid[]) ORDER BY instance_id, sequence",
    "signals": "SELECT "
    + SIGNAL_COLUMNS
    + " FROM flow_signal WHERE instance_id = ANY (%(ids)b::uuid[]) ORDER BY seq",
    "events": "SELECT "
    + EVENT_COLUMNS
    + " FROM outbox_event o WHERE o.instance_id = ANY (%(ids)b::uuid[]) ORDER BY o.staged_seq",
}


def _uuids(ids: Sequence[str]) -> list[str]:
    """The ids that can be instances (a uuid each), as the server prints them."""
    out = []
    for iid in ids:
        try:
            out.append(str(uuid.UUID(iid)))
        except ValueError:
            continue
    return out


class PostgresRetention:
    """``RetentionStore``: reads on a pooled connection, each delete page one statement."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    async def policies(self) -> Sequence[RetentionPolicy]:
        async with self._db.connection() as conn:
            rows = await (await conn.execute(POLICIES)).fetchall()
        return tuple(RetentionPolicy(flow_id=r[0], state_class=r[1], retain_for=r[2]) for r in rows)

    async def set_policy(self, policy: RetentionPolicy) -> None:
        async with self._db.connection() as conn:
            await conn.execute(SET_POLICY, (policy.flow_id, policy.state_class, policy.retain_for))

    async def expired(
        self,
        *,
        flow_id: str | None,
        states: Sequence[InstanceState],
        ended_before: datetime,
        skip_flows: Sequence[str] = (),
        after: tuple[datetime, str] | None = None,
        limit: int,
    ) -> Sequence[ExpiredInstance]:
        params = {
            "states": [s.value for s in states],
            "before": ended_before,
            "flow": flow_id,
            "skip": list(skip_flows),
            "after_at": after[0] if after else None,
            "after_id": after[1] if after else None,
            "limit": limit,
        }
        async with self._db.connection() as conn:
            rows = await (await conn.execute(EXPIRED, params)).fetchall()
        return tuple(
            ExpiredInstance(
                instance_id=str(r[0]),
                flow_id=r[1],
                state=InstanceState(r[2]),
                updated_at=r[3],
                held_by=r[4],
            )
            for r in rows
        )

    async def contents(self, instance_ids: Sequence[str]) -> Sequence[ArchivedInstance]:
        ids = _uuids(instance_ids)
        async with self._db.connection() as conn, conn.transaction():
            # One snapshot for the four reads: an archive is of one moment.
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur = conn.cursor(row_factory=dict_row)
            read = {}
            for name, query in CONTENTS.items():
                read[name] = await (await cur.execute(query, {"ids": ids})).fetchall()
        return assemble(
            ids,
            {str(r["instance_id"]): instance_of(r) for r in read["instances"]},
            (step_of(r) for r in read["steps"]),
            (signal_of(r) for r in read["signals"]),
            (event_of(r) for r in read["events"]),
        )

    async def delete(self, expired: Sequence[ExpiredInstance]) -> int:
        if not expired:
            return 0
        params = {
            "ids": [e.instance_id for e in expired],
            "ats": [e.updated_at for e in expired],
        }
        async with self._db.connection() as conn, conn.transaction():
            row = await (await conn.execute(DELETE, params)).fetchone()
        return int(row[0]) if row is not None else 0
