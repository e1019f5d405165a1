"""Queued work claimed, not raced for: a page of ``Pending`` instances in one statement.

``CLAIM_QUEUED`` picks the oldest ``Pending`` rows of the flows a node carries with
``FOR UPDATE SKIP LOCKED`` (rows another node's claim holds right now are passed over, not
waited for), grants a lease on each whose lease is free, raises its fence to the new token and
makes it ``Running`` — all in one round trip, so a second worker's claim never sees the same
rows as ``Pending`` again. Neither row is waited for: an instance whose lease row another
transaction holds is passed over like one whose instance row is held. A row whose lease is
still live (a start that has not released it yet) is passed over and left ``Pending`` for a
later claim. The histories of what was claimed
are read in a second round trip, one statement for the page, pipelined with the inboxes of
those that were waiting for a signal.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Final, LiteralString

from psycopg.rows import dict_row

from flowx.stores.columns import (
    INSTANCE_COLUMNS,
    STEP_COLUMNS,
    instance_of,
    signal_of,
    step_of,
)
from flowx.stores.postgres.database import PostgresDatabase
from flowx.stores.postgres.leases import GRANT_OVER_EXPIRED
from flowx.stores.postgres.reads import SELECT_INBOXES
from flowx.stores.records import History, Lease, SignalRecord, StepRecord

_F_COLUMNS: Final = ", ".join(f"f.{c.strip()}" for c in INSTANCE_COLUMNS.split(","))

# flow_instance_queued_idx walked in order; the lease upsert and the open as in ACQUIRE and
# OPEN_INSTANCE (store.py). ``opened`` only touches rows whose lease was granted.
CLAIM_QUEUED: Final[LiteralString] = (
    """
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), picked AS (
    SELECT f.instance_id, f.fence FROM flow_instance f, t
     WHERE f.state = 'Pending'
       AND (%(flows)s::text[] IS NULL OR (f.flow_id || '@' || f.flow_version) = ANY (%(flows)s))
       -- a start that has not released its lease yet is not at the head of every page
       AND NOT EXISTS (SELECT 1 FROM flow_lease l
                        WHERE l.instance_id = f.instance_id AND l.expires_at > t.now)
     ORDER BY f.updated_at, f.instance_id
     LIMIT %(limit)s
       FOR UPDATE OF f SKIP LOCKED
), held AS (
    -- their lease rows, without waiting either: a row another transaction holds (an acquire
    -- committing under a slow disk) would hold this claim past its deadline (R9.1)
    SELECT l.instance_id FROM flow_lease l
     WHERE l.instance_id IN (SELECT instance_id FROM picked)
       FOR UPDATE OF l SKIP LOCKED
), grantable AS (
    SELECT p.instance_id, p.fence FROM picked p
     WHERE p.instance_id IN (SELECT instance_id FROM held)
        OR NOT EXISTS (SELECT 1 FROM flow_lease l WHERE l.instance_id = p.instance_id)
), granted AS (
    INSERT INTO flow_lease AS l (instance_id, owner_node, fencing_token, expires_at, acquired_at)
    SELECT p.instance_id, %(owner)s, p.fence + 1, t.now + %(ttl)s::interval, t.now
      FROM grantable p, t
"""
    + GRANT_OVER_EXPIRED
    + """    RETURNING instance_id, fencing_token, expires_at
), opened AS (
    UPDATE flow_instance f
       SET fence = g.fencing_token, resume_count = f.resume_count + 1, state = 'Running',
           updated_at = t.now, version = f.version + 1
      FROM granted g, t
     WHERE f.instance_id = g.instance_id AND f.fence <= g.fencing_token
    RETURNING """
    + _F_COLUMNS
    + """, g.fencing_token AS lease_token, g.expires_at AS lease_expires
)
SELECT * FROM opened
"""
)
# Run first in the claim's transaction: with a ``flows`` filter the planner misjudges how many
# queued rows match and would read them all and sort them; walking the queued index in order
# stops at the page's end (tests/postgres/test_query_plans.py).
CLAIM_PLAN: Final[LiteralString] = "SET LOCAL enable_sort = off"
# flow_step's primary key; each instance's rows in commit order (R2.8).
STEPS_OF_MANY: Final[LiteralString] = (
    "SELECT " + STEP_COLUMNS + " FROM flow_step WHERE instance_id = ANY (%s::uuid[]) "
    "ORDER BY instance_id, sequence"
)


async def claim_queued(
    db: PostgresDatabase,
    *,
    owner: str,
    ttl: timedelta,
    limit: int,
    flows: Sequence[str] | None,
    now: datetime | None,
) -> list[tuple[Lease, History]]:
    """``QueueClaims.claim_queued`` on PostgreSQL: two round trips for a whole page."""
    params = {
        "now": now,
        "flows": None if flows is None else list(flows),
        "limit": limit,
        "owner": owner,
        "ttl": ttl,
    }
    async with db.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        async with conn.pipeline(), conn.transaction():
            await conn.execute(CLAIM_PLAN)
            await cur.execute(CLAIM_QUEUED, params, prepare=True)
        rows = await cur.fetchall()
    if not rows:
        return []
    ids = [str(r["instance_id"]) for r in rows]
    steps: dict[str, list[StepRecord]] = {i: [] for i in ids}
    # Those woken at a signal wait run by reading its inbox first: read here too, in the
    # same round trip as the steps.
    waiting = [(str(r["instance_id"]), r["wake_signal"]) for r in rows if r["wake_signal"]]
    inboxes: dict[str, list[SignalRecord]] = {iid: [] for iid, _ in waiting}
    # A block of its own: the claim's commit waits for its WAL flush, and each block of round
    # trips has one deadline (R9.1).
    async with db.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        signals = conn.cursor(row_factory=dict_row)
        async with conn.pipeline():
            await cur.execute(STEPS_OF_MANY, (ids,), prepare=True)
            if waiting:
                names = ([iid for iid, _ in waiting], [name for _, name in waiting])
                await signals.execute(SELECT_INBOXES, names, prepare=True)
        for s in await cur.fetchall():
            record = step_of(s)
            steps[str(record.instance_id)].append(record)
        if waiting:
            for s in await signals.fetchall():
                signal = signal_of(s)
                inboxes[str(signal.instance_id)].append(signal)
    claimed: list[tuple[Lease, History]] = []
    for row in rows:
        lease = Lease(
            instance_id=str(row["instance_id"]),
            owner=owner,
            token=int(row.pop("lease_token")),
            expires_at=row.pop("lease_expires"),
        )
        instance = instance_of(row)
        inbox = inboxes.get(lease.instance_id)
        history = History(
            instance=instance,
            steps=tuple(steps[lease.instance_id]),
            inbox=tuple(inbox) if inbox is not None else None,
        )
        claimed.append((lease, history))
    return claimed
