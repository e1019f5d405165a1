"""``LeaseStore`` on PostgreSQL: ``flow_lease``, INSERT or UPDATE, never DELETE (R3.1).

Acquisitions run on the pool, like any write that must be durable before work starts;
renewals and releases go over a connection of their own (R9.1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Final, LiteralString

from flowx.stores.postgres.arrays import BigInts, Texts, Times
from flowx.stores.postgres.database import DedicatedConnection, PostgresDatabase
from flowx.stores.postgres.notify import Notifier
from flowx.stores.postgres.releases import ReleaseBatcher
from flowx.stores.records import Lease
from flowx.stores.renewal import renew_one

# How every grant (ACQUIRE, CREATE_LEASED, the batched creates, the queue claim) takes over
# an existing lease row, inserted as ``flow_lease AS l``: only an expired lease is taken, and
# its token rises above every one issued for the instance and above the one inserted.
GRANT_OVER_EXPIRED: Final[LiteralString] = """
    ON CONFLICT (instance_id) DO UPDATE
       SET owner_node = excluded.owner_node,
           fencing_token = greatest(l.fencing_token + 1, excluded.fencing_token),
           expires_at = excluded.expires_at,
           acquired_at = excluded.acquired_at
     WHERE l.expires_at <= excluded.acquired_at
"""

# Acquire, and raise the instance's fence to the new token in the same statement (R2.4).
# The token is above every token issued for the instance, above the caller's floor, and above
# the journal's fence. ON CONFLICT ... WHERE leaves a live lease alone: no row, `None`.
# Time is the server's unless the caller pins it (`t`; R9.2): a node whose clock runs ahead
# must not see a live lease as expired. now() is the statement's start in autocommit.
# Only an expired lease row is locked, and only if no other acquirer holds it (`mine`): a
# live lease, or one another node is taking, is a lost race at once. A probe of a live lease
# thus locks nothing and writes nothing, so it never holds up its owner's renewal for a
# commit's flush, and two nodes sweeping the same instances never queue on each other — both
# a whole commit long under a slow disk (R9.1).
# With the lease row held, the instance row is locked without waiting either (`inst`): a
# queue claim (claims.py) locks instance rows first and lease rows after, so waiting here
# would be the other half of a deadlock. An instance row someone holds (a claim, a commit, a
# signal) is a lost race too; one with no row at all (a lease taken for its own sake) is not.
ACQUIRE: Final[LiteralString] = (
    """
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), mine AS (
    SELECT 1 FROM flow_lease, t
     WHERE instance_id = %(instance_id)s AND expires_at <= t.now
       FOR UPDATE OF flow_lease SKIP LOCKED
), free AS (
    SELECT 1 WHERE EXISTS (SELECT 1 FROM mine)
        OR NOT EXISTS (SELECT 1 FROM flow_lease WHERE instance_id = %(instance_id)s)
), inst AS (
    SELECT fence FROM flow_instance
     WHERE instance_id = %(instance_id)s AND EXISTS (SELECT 1 FROM free)
       FOR UPDATE SKIP LOCKED
), floor AS (
    SELECT greatest(%(floor)s::bigint, coalesce((SELECT fence FROM inst), 0)) AS f
), granted AS (
    INSERT INTO flow_lease AS l (instance_id, owner_node, fencing_token, expires_at, acquired_at)
    SELECT %(instance_id)s, %(owner)s, floor.f + 1, t.now + %(ttl)s::interval, t.now
      FROM floor, t
     WHERE EXISTS (SELECT 1 FROM free)
       AND (EXISTS (SELECT 1 FROM inst)
            OR NOT EXISTS (SELECT 1 FROM flow_instance WHERE instance_id = %(instance_id)s))
"""
    + GRANT_OVER_EXPIRED
    + """    RETURNING fencing_token, expires_at
), fenced AS (
    UPDATE flow_instance f SET fence = g.fencing_token
      FROM granted g
     WHERE f.instance_id = %(instance_id)s AND f.fence < g.fencing_token
    RETURNING 1
)
SELECT fencing_token, expires_at FROM granted
"""
)
# Every lease a node holds, renewed in one statement (R9.1); primary key per row. A lease
# whose token is stale or that has expired is not in the result.
RENEW_MANY: Final[LiteralString] = """
UPDATE flow_lease l SET expires_at = t.now + %(ttl)s::interval
  FROM (SELECT coalesce(%(now)s::timestamptz, now()) AS now) t,
       unnest(%(ids)b::uuid[], %(tokens)b::bigint[]) AS r(instance_id, token)
 WHERE l.instance_id = r.instance_id AND l.fencing_token = r.token AND l.expires_at > t.now
RETURNING l.instance_id::text, l.expires_at
"""
# Releases that arrive together, in one statement (primary key per row), on the renewals'
# connection. Each row says whether its instance is left for any node to take (a queued
# start, a hand-back): then the release, not the commit before it, is the moment to wake a
# worker elsewhere.
RELEASE_MANY: Final[LiteralString] = """
UPDATE flow_lease l SET expires_at = coalesce(r.now, now())
  FROM unnest(%(ids)b::uuid[], %(tokens)b::bigint[], %(nows)b::timestamptz[])
       AS r(instance_id, token, now)
 WHERE l.instance_id = r.instance_id AND l.fencing_token = r.token
   AND l.expires_at > coalesce(r.now, now())
RETURNING (SELECT state = 'Pending' FROM flow_instance f WHERE f.instance_id = l.instance_id)
"""
CURRENT_LEASE: Final[LiteralString] = (
    "SELECT owner_node, fencing_token, expires_at FROM flow_lease WHERE instance_id = %s"
)


def release_params(batch: Sequence[tuple[Lease, datetime | None]]) -> dict[str, Any]:
    """``RELEASE_MANY``'s parameters for a batch of (lease, the clock's now or ``None``)."""
    return {
        "ids": Texts([lease.instance_id for lease, _ in batch]),
        "tokens": BigInts([lease.token for lease, _ in batch]),
        "nows": Times([now for _, now in batch]),
    }


class PostgresLeaseStore:
    """``LeaseStore`` on ``flow_lease``: INSERT or UPDATE, never DELETE (R3.1).

    Renewals go over a connection of their own, outside the pool: a node's one renewal
    statement per interval never waits behind step commits for a pooled connection, which is
    what lost live leases when every commit was slow (a slow disk; R9.1).
    """

    def __init__(self, db: PostgresDatabase, work: Notifier | None = None) -> None:
        self._db = db
        self._work = work
        # Renewals commit without waiting for their WAL flush: a slow disk (an fsync of a
        # fifth of the TTL) would otherwise make each renewal take two flushes and live
        # leases run out (R9.1). What a server crash can lose is the last renewals, so the
        # store may end a lease up to a renewal interval before its holder stops starting
        # capabilities: exactly a zombie's case, and the fence (raised by the next
        # acquisition, which always commits synchronously) refuses its writes (R2.4).
        self._renewals = DedicatedConnection(db, "lease renewals", asynchronous=True)
        # Releases go the same way, batched: one statement for all that arrive together,
        # never behind a step commit's row lock or its WAL flush. One that is lost (a server
        # crash) costs only its TTL: the lease then expires by itself.
        self._releases = ReleaseBatcher(self._release_many)

    async def acquire(
        self,
        instance_id: str,
        *,
        owner: str,
        ttl: timedelta,
        now: datetime | None,
        floor: int = 0,
    ) -> Lease | None:
        params = {
            "instance_id": instance_id,
            "owner": owner,
            "now": now,
            "ttl": ttl,
            "floor": floor,
        }
        async with self._db.connection() as conn:
            row = await (await conn.execute(ACQUIRE, params, prepare=True)).fetchone()
        if row is None:
            return None
        return Lease(instance_id=instance_id, owner=owner, token=int(row[0]), expires_at=row[1])

    async def renew(self, lease: Lease, *, ttl: timedelta, now: datetime | None) -> Lease:
        return await renew_one(self, lease, ttl=ttl, now=now)

    async def renew_many(
        self, leases: Sequence[Lease], *, ttl: timedelta, now: datetime | None
    ) -> Sequence[Lease | None]:
        if not leases:
            return []
        params = {
            "ids": [lease.instance_id for lease in leases],
            "tokens": [lease.token for lease in leases],
            "ttl": ttl,
            "now": now,
        }
        async with self._renewals.connection() as conn:
            rows = await (await conn.execute(RENEW_MANY, params, prepare=True)).fetchall()
        expiry = {str(r[0]): r[1] for r in rows}
        return [
            dataclasses.replace(lease, expires_at=expiry[lease.instance_id])
            if lease.instance_id in expiry
            else None
            for lease in leases
        ]

    async def release(self, lease: Lease, *, now: datetime | None) -> None:
        await self._releases.release(lease, now)

    async def _release_many(self, batch: Sequence[tuple[Lease, datetime | None]]) -> None:
        async with self._renewals.connection() as conn:
            query = await conn.execute(RELEASE_MANY, release_params(batch), prepare=True)
            rows = await query.fetchall()
        if self._work is not None and any(row[0] for row in rows):
            self._work.mark()

    async def current(self, instance_id: str) -> Lease | None:
        async with self._db.connection() as conn:
            row = await (await conn.execute(CURRENT_LEASE, (instance_id,))).fetchone()
        if row is None:
            return None
        return Lease(instance_id=instance_id, owner=row[0], token=int(row[1]), expires_at=row[2])

    async def close(self) -> None:
        await self._renewals.close()
