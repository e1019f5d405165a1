"""Queued work claimed, not raced for: a page of ``Pending`` instances in one statement.

``CLAIM_QUEUED`` picks the oldest ``Pending`` rows of the flows a node carries with
``FOR UPDATE SKIP LOCKED`` (rows another node's claim holds right now are passed over, not
waited for), grants a lease on each whose lease is free, raises its fence to the new token and
makes it ``Running`` — all in one statement, so a second worker's claim never sees the same
rows as ``Pending`` again. Neither row is waited for: an instance whose lease row another
transaction holds is passed over like one whose instance row is held. A row whose lease is
still live (a start that has not released it yet) is passed over and left ``Pending`` for a
later claim.

The statement's rows come back before its ``COMMIT`` is sent (a round trip more than
pipelining the two), so a commit that gets no answer within its deadline — a disk that takes
seconds to flush — is settled, not abandoned: the claimed rows are re-read, and those the
claim really took run here under the lease it granted instead of expiring and changing hands
a TTL later (R9.1). The histories of what was claimed are read in one more round trip, one
statement for the page, pipelined with the inboxes of those that were waiting for a signal.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Final, LiteralString, TypeVar

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from flowx.stores.columns import (
    INSTANCE_COLUMNS,
    STEP_COLUMNS,
    instance_of,
    signal_of,
    step_of,
)
from flowx.stores.errors import JournalNoAnswer, JournalUnavailable
from flowx.stores.postgres.database import PostgresDatabase, deadline
from flowx.stores.postgres.leases import GRANT_OVER_EXPIRED
from flowx.stores.postgres.reads import SELECT_INBOXES
from flowx.stores.records import History, Lease, SignalRecord, StepRecord

log = logging.getLogger("flowx.postgres")
T = TypeVar("T")

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
       AND (%(flows)b::text[] IS NULL OR (f.flow_id || '@' || f.flow_version) = ANY (%(flows)b))
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
    "SELECT " + STEP_COLUMNS + " FROM flow_step WHERE instance_id = ANY (%b::uuid[]) "
    "ORDER BY instance_id, sequence"
)


# Which of a claim's rows it really took, when its commit had no answer (``_settle``): the
# claim returned each row with the token it raised the fence to, so a row is this node's
# exactly when its lease still carries that token and names this owner (a grant elsewhere
# after an aborted claim can repeat the token, never the owner) and the fence is that token.
# Those leases are renewed in the same statement: settling can take most of a TTL under the
# disk that made the commit late, and the lease may have run out meanwhile — still this
# node's while no one else was granted it (its token is the fence), and the row lock orders
# this renewal after any grant elsewhere.
# ``AWAIT_CLAIM`` runs first, in the same round trip: it waits for the claim's transaction
# while the server is still committing it. It must be a statement of its own: a locking
# statement re-checks only the rows it locks once a wait ends, and would judge the instance
# rows as its snapshot saw them before the claim committed.
AWAIT_CLAIM: Final[LiteralString] = (
    "SELECT 1 FROM flow_instance WHERE instance_id = ANY (%(ids)b::uuid[]) FOR SHARE"
)
SETTLE_CLAIM: Final[LiteralString] = """
UPDATE flow_lease l SET expires_at = coalesce(%(now)s::timestamptz, now()) + %(ttl)s::interval
  FROM unnest(%(ids)b::uuid[], %(tokens)b::bigint[]) AS r(instance_id, token), flow_instance f
 WHERE l.instance_id = r.instance_id AND l.fencing_token = r.token AND l.owner_node = %(owner)s
   AND f.instance_id = r.instance_id AND f.fence = r.token AND f.state = 'Running'
RETURNING l.instance_id::text, l.expires_at
"""


async def claim_queued(
    db: PostgresDatabase,
    *,
    owner: str,
    ttl: timedelta,
    limit: int,
    flows: Sequence[str] | None,
    now: datetime | None,
) -> list[tuple[Lease, History]]:
    """``QueueClaims.claim_queued`` on PostgreSQL: a page in three round trips — the claim,
    its commit, and the histories.

    The claim's rows come back before its commit is sent, so a commit with no answer (a slow
    disk: R9.1) is settled by re-reading those rows rather than left to expire: whatever the
    claim took runs here under the lease it was granted, and nothing changes hands. Settling
    and reading the histories are retried while the leases granted are young enough to be
    worth running (half a TTL from the claim)."""
    params = {
        "now": now,
        "flows": None if flows is None else list(flows),
        "limit": limit,
        "owner": owner,
        "ttl": ttl,
    }
    until = time.monotonic() + ttl.total_seconds() / 2
    try:
        async with db.connection(bounded=False) as conn:
            rows = await _claim(db, conn, params)
    except _Unsettled as unsettled:
        rows = await _settle(db, unsettled, params, until)
    if not rows:
        return []
    steps, inboxes = await _retrying(lambda: _histories(db, rows), until)
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


class _Unsettled(JournalNoAnswer):
    """A claim whose commit had no answer, with the rows it returned before the commit."""

    def __init__(self, rows: list[dict[str, Any]], cause: JournalNoAnswer) -> None:
        super().__init__(str(cause))
        self.rows = rows


async def _claim(
    db: PostgresDatabase, conn: AsyncConnection[Any], params: dict[str, Any]
) -> list[dict[str, Any]]:
    """The claim, then its commit: each round trip under a deadline of its own (R9.1)."""
    cur = conn.cursor(row_factory=dict_row)
    limit, where = db.round_trip_timeout, db.where()
    try:
        async with deadline(conn, limit, where):
            async with conn.pipeline():
                await conn.execute("BEGIN")
                await conn.execute(CLAIM_PLAN)
                await cur.execute(CLAIM_QUEUED, params, prepare=True)
            rows = await cur.fetchall()
    except BaseException:
        if not conn.closed and not conn.broken:
            async with deadline(conn, limit, where):
                await conn.execute("ROLLBACK")
        raise
    if not rows:
        async with deadline(conn, limit, where):
            await conn.execute("ROLLBACK")  # it wrote nothing: no flush to wait for
        return rows
    try:
        async with deadline(conn, limit, where):
            await conn.execute("COMMIT")
    except JournalNoAnswer as exc:
        raise _Unsettled(rows, exc) from exc
    return rows


async def _settle(
    db: PostgresDatabase, unsettled: _Unsettled, claim: dict[str, Any], until: float
) -> list[dict[str, Any]]:
    """The rows of ``unsettled`` that its claim really took, their leases renewed: all of
    them when the commit landed, none when it did not. Raises the claim's own error if the
    journal stays silent past ``until`` (what it took then expires and is recovered)."""
    rows = unsettled.rows
    params = {
        "ids": [str(r["instance_id"]) for r in rows],
        "tokens": [int(r["lease_token"]) for r in rows],
        **{k: claim[k] for k in ("owner", "ttl", "now")},
    }

    async def settle() -> dict[str, datetime]:
        async with db.connection() as conn:
            cur = conn.cursor()
            async with conn.pipeline():
                await conn.execute(AWAIT_CLAIM, params)
                await cur.execute(SETTLE_CLAIM, params)
            return {str(r[0]): r[1] for r in await cur.fetchall()}

    try:
        taken = await _retrying(settle, until)
    except JournalUnavailable:
        raise unsettled from None
    log.warning(
        "a queue claim's commit had no answer (%s); re-read: %d of its %d instance(s) are "
        "this node's and run here under the lease it was granted",
        unsettled,
        len(taken),
        len(rows),
    )
    settled = [r for r in rows if str(r["instance_id"]) in taken]
    for r in settled:
        r["lease_expires"] = taken[str(r["instance_id"])]
    return settled


async def _histories(
    db: PostgresDatabase, rows: list[dict[str, Any]]
) -> tuple[dict[str, list[StepRecord]], dict[str, list[SignalRecord]]]:
    """The steps of every claimed instance, and the inbox of those woken at a signal wait:
    one round trip, a block of its own (the claim's commit waited for its flush)."""
    ids = [str(r["instance_id"]) for r in rows]
    steps: dict[str, list[StepRecord]] = {i: [] for i in ids}
    waiting = [(str(r["instance_id"]), r["wake_signal"]) for r in rows if r["wake_signal"]]
    inboxes: dict[str, list[SignalRecord]] = {iid: [] for iid, _ in waiting}
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
    return steps, inboxes


async def _retrying(read: Callable[[], Awaitable[T]], until: float) -> T:
    """``read`` (which writes nothing), again after a journal error while there is time
    before ``until``: what a claim took is leased here and should run here, not wait a TTL."""
    pause = 0.05
    while True:
        try:
            return await read()
        except JournalUnavailable:
            if time.monotonic() + pause >= until:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, 1.0)
