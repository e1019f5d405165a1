"""``RetentionStore`` on the SQLite file (R2.13): expired pages, contents, deletes.

A delete is one ``SqliteDatabase.write``, so the file's write lock is held from its first
statement: two processes deleting one page take turns, and the second finds nothing left.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Final

from flowx.stores.columns import (
    EVENT_COLUMNS,
    INSTANCE_COLUMNS,
    SIGNAL_COLUMNS,
    STEP_COLUMNS,
    TERMINAL_STATES_SQL,
)
from flowx.stores.records import (
    ArchivedInstance,
    ExpiredInstance,
    InstanceState,
    RetentionPolicy,
)
from flowx.stores.retention import HELD_BY_SQL, assemble
from flowx.stores.sqlite.database import SqliteDatabase, from_text, to_text
from flowx.stores.sqlite.rows import event_row, instance_row, signal_row, step_row

POLICIES: Final = "SELECT flow_id, state_class, retain_for_seconds FROM retention_policy"
SET_POLICY: Final = (
    "INSERT INTO retention_policy (flow_id, state_class, retain_for_seconds) VALUES (?, ?, ?) "
    "ON CONFLICT (flow_id, state_class) "
    "DO UPDATE SET retain_for_seconds = excluded.retain_for_seconds"
)
# flow_instance_ended_idx: the literal state list lets SQLite use the partial index.
EXPIRED: Final = (
    f"SELECT f.instance_id, f.flow_id, f.state, f.updated_at, {HELD_BY_SQL} "
    f"FROM flow_instance f WHERE f.state IN {TERMINAL_STATES_SQL} "
    "AND f.state IN (SELECT value FROM json_each(:states)) AND f.updated_at < :before "
    "AND ((:flow IS NULL AND f.flow_id NOT IN (SELECT value FROM json_each(:skip))) "
    "OR f.flow_id = :flow) "
    "AND (:after_at IS NULL OR (f.updated_at, f.instance_id) > (:after_at, :after_id)) "
    "ORDER BY f.updated_at, f.instance_id LIMIT :limit"
)
DELETE: Final = (
    "DELETE FROM flow_instance AS f WHERE f.instance_id = ? AND f.updated_at = ? "
    f"AND f.state IN {TERMINAL_STATES_SQL} AND ({HELD_BY_SQL}) IS NULL"
)
DELETE_LEASE: Final = "DELETE FROM flow_lease WHERE instance_id = ?"
_IN_IDS: Final = "IN (SELECT value FROM json_each(?))"


class SqliteRetention:
    """``RetentionStore``: reads on the database thread, each delete page one write."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def policies(self) -> Sequence[RetentionPolicy]:
        def q(conn: sqlite3.Connection) -> Sequence[RetentionPolicy]:
            return tuple(
                RetentionPolicy(
                    flow_id=r[0],
                    state_class=r[1],
                    retain_for=timedelta(seconds=r[2]) if r[2] is not None else None,
                )
                for r in conn.execute(POLICIES + " ORDER BY flow_id, state_class")
            )

        return await self._db.run(q)

    async def set_policy(self, policy: RetentionPolicy) -> None:
        seconds = int(policy.retain_for.total_seconds()) if policy.retain_for is not None else None

        def tx(conn: sqlite3.Connection) -> None:
            conn.execute(SET_POLICY, (policy.flow_id, policy.state_class, seconds))

        await self._db.write(tx)

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
            "states": json.dumps([s.value for s in states]),
            "before": to_text(ended_before),
            "flow": flow_id,
            "skip": json.dumps(list(skip_flows)),
            "after_at": to_text(after[0]) if after else None,
            "after_id": after[1] if after else None,
            "limit": limit,
        }

        def q(conn: sqlite3.Connection) -> Sequence[ExpiredInstance]:
            return tuple(
                ExpiredInstance(
                    instance_id=r[0],
                    flow_id=r[1],
                    state=InstanceState(r[2]),
                    updated_at=from_text(r[3]),
                    held_by=r[4],
                )
                for r in conn.execute(EXPIRED, params)
            )

        return await self._db.run(q)

    async def contents(self, instance_ids: Sequence[str]) -> Sequence[ArchivedInstance]:
        ids = json.dumps(list(instance_ids))

        def q(conn: sqlite3.Connection) -> Sequence[ArchivedInstance]:
            def read(columns: str, table: str, order: str) -> list[Any]:
                sql = f"SELECT {columns} FROM {table} WHERE instance_id {_IN_IDS} ORDER BY {order}"
                return list(conn.execute(sql, (ids,)))

            return assemble(
                instance_ids,
                {
                    r.instance_id: r
                    for r in map(instance_row, read(INSTANCE_COLUMNS, "flow_instance", "rowid"))
                },
                map(step_row, read(STEP_COLUMNS, "flow_step", "instance_id, sequence")),
                map(signal_row, read(SIGNAL_COLUMNS, "flow_signal", "seq")),
                map(event_row, read(EVENT_COLUMNS, "outbox_event o", "o.staged_seq")),
            )

        return await self._db.run(q)

    async def delete(self, expired: Sequence[ExpiredInstance]) -> int:
        pairs = [(e.instance_id, to_text(e.updated_at)) for e in expired]

        def tx(conn: sqlite3.Connection) -> int:
            deleted = 0
            for iid, updated_at in pairs:
                if conn.execute(DELETE, (iid, updated_at)).rowcount == 1:
                    conn.execute(DELETE_LEASE, (iid,))
                    deleted += 1
            return deleted

        return await self._db.write(tx)
