"""The hot reads batched: an instance by id, and a signal inbox (R6.2).

A busy node reads one instance row per signal it admits and one inbox per run that wakes at a
wait. Each alone is a pool checkout and a round trip whose cost, in this process, is mostly the
driver's, not the server's; reads that arrive while earlier ones are on the wire go out
together as one statement (``Batcher``, as writes do). A read is sent after it is asked for,
so it sees every write that committed before it was asked for, as one alone would.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Final, LiteralString

from psycopg.rows import dict_row

from flowx.stores.columns import INSTANCE_COLUMNS, SIGNAL_COLUMNS, instance_of, signal_of
from flowx.stores.postgres.batching import Batcher
from flowx.stores.postgres.database import PostgresDatabase
from flowx.stores.records import InstanceRecord, SignalRecord

# Primary key.
SELECT_INSTANCE: Final[LiteralString] = (
    "SELECT " + INSTANCE_COLUMNS + " FROM flow_instance WHERE instance_id = %s"
)
# Primary key, one probe per id.
SELECT_INSTANCES: Final[LiteralString] = (
    "SELECT " + INSTANCE_COLUMNS + " FROM flow_instance WHERE instance_id = ANY (%b::uuid[])"
)
# flow_signal_inbox_idx, in seq order.
SELECT_SIGNALS: Final[LiteralString] = (
    "SELECT " + SIGNAL_COLUMNS + " FROM flow_signal "
    "WHERE instance_id = %s AND name = %s ORDER BY seq"
)
# flow_signal_inbox_idx, one range per (instance, name).
SELECT_INBOXES: Final[LiteralString] = (
    "SELECT " + SIGNAL_COLUMNS + " FROM flow_signal "
    "WHERE (instance_id, name) IN (SELECT * FROM unnest(%b::uuid[], %b::text[])) "
    "ORDER BY instance_id, name, seq"
)

Inbox = tuple[str, str]


class BatchedReads:
    """``get`` and ``signals`` for the journal and the wait store, batched."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db
        self._instances: Batcher[str, InstanceRecord | None] = Batcher(
            self._instance, self._instances_of, key=lambda iid: iid
        )
        self._inboxes: Batcher[Inbox, tuple[SignalRecord, ...]] = Batcher(
            self._inbox, self._inboxes_of, key=lambda inbox: inbox
        )

    async def instance(self, instance_id: str) -> InstanceRecord | None:
        return await self._instances.submit(instance_id)

    async def signals(self, instance_id: str, name: str) -> tuple[SignalRecord, ...]:
        return await self._inboxes.submit((instance_id, name))

    async def _instance(self, instance_id: str) -> InstanceRecord | None:
        async with self._db.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            row = await (await cur.execute(SELECT_INSTANCE, (instance_id,))).fetchone()
        return instance_of(row) if row else None

    async def _instances_of(self, ids: list[str]) -> Sequence[InstanceRecord | None]:
        async with self._db.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            rows = await (await cur.execute(SELECT_INSTANCES, (ids,), prepare=True)).fetchall()
        found = {str(r["instance_id"]): instance_of(r) for r in rows}
        return [found.get(_canonical(iid)) for iid in ids]

    async def _inbox(self, inbox: Inbox) -> tuple[SignalRecord, ...]:
        async with self._db.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            rows = await (await cur.execute(SELECT_SIGNALS, inbox)).fetchall()
        return tuple(signal_of(r) for r in rows)

    async def _inboxes_of(self, inboxes: list[Inbox]) -> Sequence[tuple[SignalRecord, ...]]:
        params = ([iid for iid, _ in inboxes], [name for _, name in inboxes])
        async with self._db.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            rows = await (await cur.execute(SELECT_INBOXES, params, prepare=True)).fetchall()
        found: dict[Inbox, list[SignalRecord]] = {}
        for r in rows:
            record = signal_of(r)
            found.setdefault((str(record.instance_id), record.name), []).append(record)
        return [tuple(found.get((_canonical(iid), name), ())) for iid, name in inboxes]


def _canonical(instance_id: str) -> str:
    """An id as the server prints a uuid, to match rows to asks (the batch statement has
    already accepted each as a uuid)."""
    return str(uuid.UUID(instance_id))
