"""``StopStore`` on the SQLite file: cancel and terminate requests (R9.4).

The request is one ``SqliteDatabase.write``: the file's write lock is held from its first
statement, so the tree it reads is the tree it writes.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Final

from flowx.stores.records import STOP_SIGNAL, InstanceState, StopReceipt, StopRequest
from flowx.stores.sqlite.database import SqliteDatabase, to_text
from flowx.stores.stops import TreeRow, receipt, targets

# The instance and its descendants (flow_instance_parent_idx), by primary key.
TREE: Final = (
    "WITH RECURSIVE tree(instance_id) AS (SELECT instance_id FROM flow_instance "
    "WHERE instance_id = ? UNION SELECT f.instance_id FROM flow_instance f "
    "JOIN tree t ON f.parent_instance_id = t.instance_id) "
    "SELECT f.instance_id, f.state, f.stop_request FROM flow_instance f "
    "JOIN tree USING (instance_id)"
)
# A Suspended or Quarantined instance becomes Pending (a node stops it at once); the
# others keep their state and their updated_at, so the recovery scan's idle clock is not reset.
KEEP: Final = (
    "UPDATE flow_instance SET stop_request = :request, "
    "updated_at = CASE WHEN state IN ('Suspended', 'Quarantined') THEN :now ELSE updated_at END, "
    "state = CASE WHEN state IN ('Suspended', 'Quarantined') THEN 'Pending' ELSE state END, "
    "version = version + 1 WHERE instance_id = :instance_id"
)
# The journaled record of the request; its key (the mode) makes a repeat write nothing.
JOURNAL: Final = (
    "INSERT INTO flow_signal (instance_id, name, key, payload, received_at) "
    "VALUES (:instance_id, '" + STOP_SIGNAL + "', :mode, :request, :now) "
    "ON CONFLICT (instance_id, name, key) WHERE key IS NOT NULL DO NOTHING"
)
# Wake one holding a request not yet carried out (a repeat reaches it again).
WAKE: Final = (
    "UPDATE flow_instance SET state = 'Pending', updated_at = :now, version = version + 1 "
    "WHERE instance_id = :instance_id AND state IN ('Suspended', 'Quarantined')"
)
REQUESTS: Final = (
    "SELECT instance_id, stop_request FROM flow_instance "
    "WHERE stop_request IS NOT NULL AND instance_id IN (SELECT value FROM json_each(?))"
)


class SqliteStops:
    """``StopStore``: each request one write transaction."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def request_stop(self, instance_id: str, request: StopRequest) -> StopReceipt:
        text = request.dumps()

        def tx(conn: sqlite3.Connection) -> StopReceipt:
            tree = {
                str(r[0]): TreeRow(InstanceState(r[1]), r[2])
                for r in conn.execute(TREE, (instance_id,))
            }
            status, chosen, rewake = targets(instance_id, tree, request)
            for iid in rewake:
                conn.execute(WAKE, {"instance_id": iid, "now": to_text(request.at)})
            for iid in chosen:
                params = {
                    "instance_id": iid,
                    "request": text,
                    "mode": request.mode,
                    "now": to_text(request.at),
                }
                conn.execute(KEEP, params)
                conn.execute(JOURNAL, params)
            return receipt(instance_id, tree, request, status, chosen + rewake)

        return await self._db.write(tx)

    async def stop_requests(self, instance_ids: Sequence[str]) -> dict[str, str]:
        ids = json.dumps(list(instance_ids))

        def q(conn: sqlite3.Connection) -> dict[str, str]:
            return {str(r[0]): str(r[1]) for r in conn.execute(REQUESTS, (ids,))}

        return await self._db.run(q)
