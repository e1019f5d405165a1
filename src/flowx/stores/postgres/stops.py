"""``StopStore`` on PostgreSQL: cancel and terminate requests (R9.4).

One transaction: the tree is read and its rows locked in id order (two requests cannot
deadlock), the decision is made on what the lock holds, and the writes follow. A request
that woke an instance tells idle workers (``NOTIFY``, after the commit).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Final, LiteralString

from flowx.stores.errors import UnknownInstance
from flowx.stores.postgres.database import PostgresDatabase
from flowx.stores.postgres.notify import Notifier
from flowx.stores.records import InstanceState, StopReceipt, StopRequest
from flowx.stores.stops import TreeRow, receipt, targets

# The instance and its descendants (flow_instance_parent_idx), locked in id order.
LOCK_TREE: Final[LiteralString] = """
WITH RECURSIVE tree(instance_id) AS (
    SELECT instance_id FROM flow_instance WHERE instance_id = %(instance_id)s
    UNION
    SELECT f.instance_id FROM flow_instance f JOIN tree t ON f.parent_instance_id = t.instance_id
)
SELECT f.instance_id::text, f.state, f.stop_request FROM flow_instance f
 WHERE f.instance_id IN (SELECT instance_id FROM tree)
 ORDER BY f.instance_id FOR UPDATE OF f
"""
# A Suspended or Quarantined instance becomes Pending (a node stops it at once); the
# others keep their state and their updated_at, so the recovery scan's idle clock is not
# reset. The inbox row is the journaled record of the request; its key (the mode) makes a
# repeat write nothing.
KEEP: Final[LiteralString] = """
WITH kept AS (
    UPDATE flow_instance SET stop_request = %(request)s::json,
           updated_at = CASE WHEN state IN ('Suspended', 'Quarantined') THEN %(now)s
                        ELSE updated_at END,
           state = CASE WHEN state IN ('Suspended', 'Quarantined') THEN 'Pending' ELSE state END,
           version = version + 1
     WHERE instance_id = ANY (%(ids)b::uuid[])
    RETURNING instance_id
)
INSERT INTO flow_signal (instance_id, name, key, payload, received_at)
SELECT instance_id, 'flowx.stop', %(mode)s, %(request)s::json, %(now)s FROM kept
ON CONFLICT (instance_id, name, key) WHERE key IS NOT NULL DO NOTHING
"""
# Wake those holding a request not yet carried out (a repeat reaches them again).
WAKE: Final[LiteralString] = (
    "UPDATE flow_instance SET state = 'Pending', updated_at = %(now)s, version = version + 1 "
    "WHERE instance_id = ANY (%(ids)b::uuid[]) AND state IN ('Suspended', 'Quarantined')"
)
REQUESTS: Final[LiteralString] = (
    "SELECT instance_id::text, stop_request FROM flow_instance "
    "WHERE instance_id = ANY (%b::uuid[]) AND stop_request IS NOT NULL"
)


class PostgresStops:
    """``StopStore``: each request one transaction."""

    def __init__(self, db: PostgresDatabase, work: Notifier | None = None) -> None:
        self._db = db
        self._work = work

    async def request_stop(self, instance_id: str, request: StopRequest) -> StopReceipt:
        try:  # as the server prints a uuid, so the tree's rows match the id asked for
            instance_id = str(uuid.UUID(instance_id))
        except ValueError:
            raise UnknownInstance(instance_id) from None
        text = request.dumps()
        async with self._db.connection() as conn, conn.transaction():
            rows = await (await conn.execute(LOCK_TREE, {"instance_id": instance_id})).fetchall()
            tree = {str(r[0]): TreeRow(InstanceState(r[1]), r[2]) for r in rows}
            status, chosen, rewake = targets(instance_id, tree, request)
            if chosen:
                params = {"ids": chosen, "request": text, "mode": request.mode, "now": request.at}
                await conn.execute(KEEP, params)
            if rewake:
                await conn.execute(WAKE, {"ids": rewake, "now": request.at})
        done = receipt(instance_id, tree, request, status, chosen + rewake)
        sleeping = (InstanceState.SUSPENDED, InstanceState.QUARANTINED)
        if self._work is not None and any(tree[i].state in sleeping for i in chosen + rewake):
            self._work.mark()  # Pending now: a worker elsewhere may take it at once
        return done

    async def stop_requests(self, instance_ids: Sequence[str]) -> dict[str, str]:
        if not instance_ids:
            return {}
        async with self._db.connection() as conn:
            rows = await (await conn.execute(REQUESTS, (list(instance_ids),))).fetchall()
        return {str(r[0]): str(r[1]) for r in rows}
