"""Starts group-created the way step commits are (R6.2): lease and row, many in one statement.

``CREATE_LEASED`` (store.py) takes one start's lease and writes its row in one statement: one
transaction, one WAL flush, per start. Under load starts arrive together, as commits do, and
``CREATE_LEASED_BATCH`` writes them all in one: the leases in one upsert, the rows in one
insert, each row fenced by its own lease's token. A start whose lease is live elsewhere gets no
lease and no row (its caller waits for the row, as for a single start); one whose id or key
already has a row gets its lease and the existing row.

Batched as commits are (``batching.Batcher``): a start goes out at once when nothing is in
flight, one id never appears twice in a batch, and a batch that fails on one start's data is
retried start by start so that only that start fails.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, LiteralString, Protocol

from psycopg.rows import dict_row

from flowx.stores.columns import CREATE_COLUMNS, INSTANCE_COLUMNS, instance_of
from flowx.stores.postgres.arrays import Ints, Texts, Times
from flowx.stores.postgres.batching import Batcher
from flowx.stores.postgres.database import PostgresDatabase
from flowx.stores.postgres.leases import GRANT_OVER_EXPIRED
from flowx.stores.records import CreateResult, InstanceRecord, Lease, NewInstance

# Leases locked and rows inserted in id order, so two nodes' batches cannot deadlock.
CREATE_LEASED_BATCH: Final[LiteralString] = (
    """
WITH input AS (
    SELECT * FROM unnest(
        %(instance_ids)b::uuid[], %(flow_ids)b::text[], %(flow_versions)b::text[],
        %(tenant_ids)b::text[], %(states)b::text[], %(inputs)b::text[], %(state_bags)b::text[],
        %(keys)b::text[], %(correlations)b::text[], %(deadlines)b::timestamptz[],
        %(parents)b::uuid[], %(parent_scopes)b::text[], %(parent_steps)b::int[],
        %(codecs)b::int[], %(traces)b::text[]
    ) WITH ORDINALITY AS i(instance_id, flow_id, flow_version, tenant_id, state, input,
                           state_bag, idempotency_key, correlation_id, deadline_at,
                           parent_instance_id, parent_scope, parent_step_id, codec_version,
                           trace_context, ord)
), t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), granted AS (
    INSERT INTO flow_lease AS l (instance_id, owner_node, fencing_token, expires_at, acquired_at)
    SELECT i.instance_id, %(owner)s, 1, t.now + %(ttl)s::interval, t.now
      FROM input i, t
     ORDER BY i.instance_id
"""
    + GRANT_OVER_EXPIRED
    + """    RETURNING instance_id, fencing_token, expires_at, acquired_at
), created AS (
    INSERT INTO flow_instance ("""
    + CREATE_COLUMNS
    + """)
    SELECT i.instance_id, i.flow_id, i.flow_version, i.tenant_id, i.state, g.fencing_token,
           i.input::json, i.state_bag::json, i.idempotency_key, i.correlation_id, i.deadline_at,
           i.parent_instance_id, i.parent_scope, i.parent_step_id, i.codec_version,
           g.acquired_at, g.acquired_at, i.trace_context
      FROM input i JOIN granted g ON g.instance_id = i.instance_id
     ORDER BY i.instance_id
    ON CONFLICT DO NOTHING
    RETURNING """
    + INSTANCE_COLUMNS
    + """
)
SELECT i.ord, g.fencing_token AS lease_token, g.expires_at AS lease_expires, c.*
  FROM input i
  LEFT JOIN granted g ON g.instance_id = i.instance_id
  LEFT JOIN created c ON c.instance_id = i.instance_id
 ORDER BY i.ord
"""
)

Created = tuple[Lease | None, CreateResult | None]


class Single(Protocol):
    """One start in a statement of its own (``PostgresJournal.create_one``)."""

    async def __call__(
        self, instance: NewInstance, *, owner: str, ttl: timedelta, now: datetime | None
    ) -> Created: ...


#: The row a start's id or key already has, read on the batch's cursor.
Existing = Callable[[Any, NewInstance], Awaitable[InstanceRecord]]


def batch_params(
    instances: list[NewInstance], *, owner: str, ttl: timedelta, now: datetime | None
) -> dict[str, Any]:
    return {
        "instance_ids": Texts([i.instance_id for i in instances]),
        "flow_ids": Texts([i.flow_id for i in instances]),
        "flow_versions": Texts([i.flow_version for i in instances]),
        "tenant_ids": Texts([i.tenant_id for i in instances]),
        "states": Texts([i.state.value for i in instances]),
        "inputs": Texts([i.input for i in instances]),
        "state_bags": Texts([i.state_bag for i in instances]),
        "keys": Texts([i.idempotency_key for i in instances]),
        "correlations": Texts([i.correlation_id for i in instances]),
        "deadlines": Times([i.deadline_at for i in instances]),
        "parents": Texts([i.parent_instance_id for i in instances]),
        "parent_scopes": Texts([i.parent_scope for i in instances]),
        "parent_steps": Ints([i.parent_step_id for i in instances]),
        "codecs": Ints([i.codec_version for i in instances]),
        "traces": Texts([i.trace_context for i in instances]),
        "owner": owner,
        "ttl": ttl,
        "now": now,
    }


@dataclass(frozen=True, slots=True)
class Start:
    instance: NewInstance
    owner: str
    ttl: timedelta
    now: datetime | None


class GroupCreator:
    """Starts batched (``batching.Batcher``) by owner, TTL and time, each id once a batch.
    ``single`` writes one start alone (the one-start statement, and the fallback when a batch
    fails on one start's data); ``existing`` reads the row a start's id or key already has."""

    def __init__(self, db: PostgresDatabase, single: Single, existing: Existing) -> None:
        self._db = db
        self._single = single
        self._existing = existing
        self._batcher: Batcher[Start, Created] = Batcher(
            self._one,
            self._many,
            key=lambda s: s.instance.instance_id,
            group=lambda s: (s.owner, s.ttl, s.now),
        )

    async def create(
        self, instance: NewInstance, *, owner: str, ttl: timedelta, now: datetime | None
    ) -> Created:
        return await self._batcher.submit(Start(instance, owner, ttl, now))

    async def _one(self, start: Start) -> Created:
        return await self._single(start.instance, owner=start.owner, ttl=start.ttl, now=start.now)

    async def _many(self, starts: list[Start]) -> list[Created | Exception]:
        first = starts[0]
        params = batch_params(
            [s.instance for s in starts], owner=first.owner, ttl=first.ttl, now=first.now
        )
        async with self._db.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            rows = await (await cur.execute(CREATE_LEASED_BATCH, params)).fetchall()
            return [
                await self._outcome(cur, s.instance, s.owner, row)
                for s, row in zip(starts, rows, strict=True)
            ]

    async def _outcome(
        self, cur: Any, instance: NewInstance, owner: str, row: dict[str, Any]
    ) -> Created:
        row.pop("ord")
        token, expires = row.pop("lease_token"), row.pop("lease_expires")
        if token is None:
            return None, None  # its lease is live elsewhere: another start of this id
        lease = Lease(
            instance_id=instance.instance_id, owner=owner, token=int(token), expires_at=expires
        )
        if row["instance_id"] is not None:
            return lease, CreateResult(instance=instance_of(row), created=True)
        return lease, CreateResult(instance=await self._existing(cur, instance), created=False)
