"""The outbox on PostgreSQL: claim, publish and mark in one transaction (R5.2, R5.3, R5.5).

A claim takes the oldest pending rows ``FOR UPDATE SKIP LOCKED``, so several publishers
share the queue without waiting on each other. ``SKIP LOCKED`` alone would break per-key
order: the newer of two events of one key could go to a second publisher while the first
still holds the older one. So a claimed row is dropped from the batch when its key has an
older pending event this claim did not take (the sibling hold). The row lock is kept until
the claim ends, which is harmless: the key is held anyway.

The transaction stays open while the broker is called. The session's
``idle_in_transaction_session_timeout`` (10 s by default) bounds how long a publisher that died
mid-batch can hold its rows; a publisher must time its broker calls out well below it.

Order is per key, in ``staged_seq`` order, for events whose staging was ordered (one
committed before the next was staged, which always holds within one instance). Two
transactions that stage events of one key at the same moment take their ``staged_seq`` values
in one order and may commit in the other; such events were concurrent, and either may go out
first. Consumers deduplicate by ``event_id``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Final, LiteralString

from psycopg.rows import dict_row

from flowx.stores.columns import EVENT_COLUMNS, event_of
from flowx.stores.outbox_claims import ClaimOutcome
from flowx.stores.postgres.database import PostgresDatabase
from flowx.stores.postgres.notify import Listener
from flowx.stores.records import EventRecord, OutboxBacklog

# outbox_event_pending_idx serves the claim (staged_seq order, pending only);
# outbox_event_pending_key_idx serves the sibling hold, one probe per claimed row.
CLAIM: Final[LiteralString] = (
    """
WITH claimed AS (
    SELECT event_id, staged_seq, partition_key
      FROM outbox_event
     WHERE published_at IS NULL AND dead_at IS NULL
     ORDER BY staged_seq
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
SELECT """
    + EVENT_COLUMNS
    + """
  FROM claimed c JOIN outbox_event o ON o.event_id = c.event_id
 WHERE c.partition_key IS NULL
    OR NOT EXISTS (
        SELECT 1 FROM outbox_event p
         WHERE p.partition_key = c.partition_key
           AND p.published_at IS NULL AND (p.dead_at IS NULL OR %(hold)s)
           AND p.staged_seq < c.staged_seq
           AND p.event_id NOT IN (SELECT event_id FROM claimed))
 ORDER BY c.staged_seq
"""
)

MARK_PUBLISHED: Final[LiteralString] = (
    "UPDATE outbox_event SET published_at = %(now)s WHERE event_id = ANY(%(ids)b::uuid[])"
)

REFUSE: Final[LiteralString] = """
UPDATE outbox_event
   SET attempts = coalesce(attempts, 0) + 1,
       last_error = %(reason)s,
       dead_at = CASE WHEN %(dead)s THEN %(now)s ELSE dead_at END,
       dead_reason = CASE WHEN %(dead)s THEN %(reason)s ELSE dead_reason END
 WHERE event_id = %(event_id)s
"""

PENDING: Final[LiteralString] = (
    "SELECT count(*) FROM outbox_event WHERE published_at IS NULL AND dead_at IS NULL"
)

# outbox_event_pending_idx: the unpublished rows only.
BACKLOG: Final[LiteralString] = (
    "SELECT count(*) FILTER (WHERE dead_at IS NULL), min(staged_at) FILTER (WHERE dead_at IS "
    "NULL), count(*) FILTER (WHERE dead_at IS NOT NULL) FROM outbox_event "
    "WHERE published_at IS NULL"
)

DEAD_LETTERS: Final[LiteralString] = (
    "SELECT "
    + EVENT_COLUMNS
    + " FROM outbox_event o WHERE o.dead_at IS NOT NULL AND o.published_at IS NULL "
    "ORDER BY o.dead_at, o.staged_seq LIMIT %(limit)s"
)

RETRY: Final[LiteralString] = (
    "UPDATE outbox_event SET dead_at = NULL, dead_reason = NULL, attempts = 0 "
    "WHERE event_id = %(event_id)s AND dead_at IS NOT NULL AND published_at IS NULL"
)


class PostgresOutbox:
    """**OutboxStore** on PostgreSQL."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db
        self._listener = Listener(db)

    async def wait_staged(self, timeout: float) -> bool:
        """Wait for another process's NOTIFY that it staged events (``StagedWakeups``)."""
        return await self._listener.wait(timeout)

    async def close(self) -> None:
        await self._listener.close()

    @contextlib.asynccontextmanager
    async def claim(
        self, *, limit: int, now: datetime, owner: str, dead_letters_hold_keys: bool = False
    ) -> AsyncIterator[ClaimOutcome]:
        params = {"limit": limit, "hold": dead_letters_hold_keys}
        # Unbounded here: the claim is held while the broker publishes; the server's
        # idle-in-transaction timeout ends a claim whose publisher vanished.
        async with self._db.connection(bounded=False) as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            rows = await (await cur.execute(CLAIM, params, prepare=True)).fetchall()
            outcome = ClaimOutcome(events=tuple(event_of(r) for r in rows))
            yield outcome
            if outcome.acknowledged:
                await conn.execute(
                    MARK_PUBLISHED, {"now": now, "ids": outcome.published_ids}, prepare=True
                )
            for r in outcome.refusals:
                await conn.execute(
                    REFUSE,
                    {"event_id": r.event_id, "reason": r.reason, "dead": r.dead, "now": now},
                )

    async def pending_count(self) -> int:
        async with self._db.connection() as conn:
            row = await (await conn.execute(PENDING)).fetchone()
            return int(row[0]) if row else 0

    async def backlog(self) -> OutboxBacklog:
        async with self._db.connection() as conn:
            row = await (await conn.execute(BACKLOG)).fetchone()
        assert row is not None  # nosec B101  # invariant: an aggregate always answers one row
        return OutboxBacklog(pending=int(row[0]), oldest_staged_at=row[1], dead=int(row[2]))

    async def dead_letters(self, *, limit: int = 100) -> Sequence[EventRecord]:
        async with self._db.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            rows = await (await cur.execute(DEAD_LETTERS, {"limit": limit})).fetchall()
            return tuple(event_of(r) for r in rows)

    async def retry_dead_letter(self, event_id: str) -> bool:
        async with self._db.connection() as conn:
            cur = await conn.execute(RETRY, {"event_id": event_id})
            return cur.rowcount == 1
