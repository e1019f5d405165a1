"""The outbox on SQLite, in SQLite's own terms (R5.2, R5.3, R5.5).

There are no row locks, and holding the file's write lock while a broker answers would stop
every step commit in every process. So a claim is a short write that stamps the rows it takes
(``claimed_by``, ``claim_until``); the broker is called outside any transaction; a second short
write marks what it acknowledged and lifts the stamp. A publisher that dies mid-batch leaves a
stamp that runs out at ``claim_until``, and its events go out again (at-least-once).

The sibling hold is PostgreSQL's: a candidate is dropped when its key has an older pending
event outside this claim, stamped by another publisher or not. SQLite runs one writer at a
time, so ``staged_seq`` is also commit order: there is no concurrent-staging caveat here.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from typing import Final

from flowx.stores.columns import EVENT_COLUMNS
from flowx.stores.errors import UnknownConsumer
from flowx.stores.outbox_claims import ClaimOutcome
from flowx.stores.records import ChangeBatch, EventRecord, OutboxBacklog, OutboxPurge
from flowx.stores.sqlite.database import SqliteDatabase, from_text, to_text
from flowx.stores.sqlite.rows import event_row

log = logging.getLogger("flowx.sqlite")

_CANDIDATES: Final = (
    """
WITH c AS (
    SELECT staged_seq, partition_key FROM outbox_event
     WHERE published_at IS NULL AND dead_at IS NULL
       AND (claim_until IS NULL OR claim_until < :now)
     ORDER BY staged_seq
     LIMIT :limit
)
SELECT """
    + EVENT_COLUMNS
    + """
  FROM c JOIN outbox_event o ON o.staged_seq = c.staged_seq
 WHERE c.partition_key IS NULL
    OR NOT EXISTS (
        SELECT 1 FROM outbox_event p
         WHERE p.partition_key = c.partition_key
           AND p.published_at IS NULL AND (p.dead_at IS NULL OR :hold)
           AND p.staged_seq < c.staged_seq
           AND p.staged_seq NOT IN (SELECT staged_seq FROM c))
 ORDER BY o.staged_seq
"""
)


class SqliteOutbox:
    """**OutboxStore** on SQLite. ``claim_ttl`` must exceed a publisher's broker timeout."""

    def __init__(self, db: SqliteDatabase, *, claim_ttl: timedelta = timedelta(seconds=60)):
        self._db = db
        self._claim_ttl = claim_ttl

    @contextlib.asynccontextmanager
    async def claim(
        self, *, limit: int, now: datetime, owner: str, dead_letters_hold_keys: bool = False
    ) -> AsyncIterator[ClaimOutcome]:
        stamp = f"{owner}/{uuid.uuid4().hex}"
        until = to_text(now + self._claim_ttl)

        def take(conn: sqlite3.Connection) -> tuple[EventRecord, ...]:
            rows = conn.execute(
                _CANDIDATES, {"now": to_text(now), "limit": limit, "hold": dead_letters_hold_keys}
            ).fetchall()
            events = tuple(event_row(r) for r in rows)
            conn.executemany(
                "UPDATE outbox_event SET claimed_by = ?, claim_until = ? WHERE staged_seq = ?",
                [(stamp, until, e.staged_seq) for e in events],
            )
            return events

        events = await self._db.write(take)
        outcome = ClaimOutcome(events=events)
        if not events:
            yield outcome
            return
        try:
            yield outcome
        except BaseException:
            with contextlib.suppress(Exception):
                await self._db.write(lambda conn: self._release(conn, stamp))
            raise

        def finish(conn: sqlite3.Connection) -> None:
            marked = to_text(now)
            conn.executemany(
                "UPDATE outbox_event SET published_at = ? WHERE event_id = ? AND claimed_by = ?",
                [(marked, event_id, stamp) for event_id in outcome.published_ids],
            )
            for r in outcome.refusals:
                conn.execute(
                    "UPDATE outbox_event SET attempts = coalesce(attempts, 0) + 1, "
                    "last_error = ?, dead_at = CASE WHEN ? THEN ? ELSE dead_at END, "
                    "dead_reason = CASE WHEN ? THEN ? ELSE dead_reason END "
                    "WHERE event_id = ? AND claimed_by = ?",
                    (r.reason, r.dead, marked, r.dead, r.reason, r.event_id, stamp),
                )
            self._release(conn, stamp)

        await self._db.write(finish)

    @staticmethod
    def _release(conn: sqlite3.Connection, stamp: str) -> None:
        conn.execute(
            "UPDATE outbox_event SET claimed_by = NULL, claim_until = NULL WHERE claimed_by = ?",
            (stamp,),
        )

    async def pending_count(self) -> int:
        def q(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT count(*) FROM outbox_event WHERE published_at IS NULL AND dead_at IS NULL"
            ).fetchone()
            return int(row[0])

        return await self._db.run(q)

    async def backlog(self) -> OutboxBacklog:
        def q(conn: sqlite3.Connection) -> OutboxBacklog:
            row = conn.execute(
                "SELECT coalesce(sum(dead_at IS NULL), 0), min(CASE WHEN dead_at IS NULL "
                "THEN staged_at END), coalesce(sum(dead_at IS NOT NULL), 0) FROM outbox_event "
                "WHERE published_at IS NULL"
            ).fetchone()
            return OutboxBacklog(
                pending=int(row[0]),
                oldest_staged_at=from_text(row[1]) if row[1] is not None else None,
                dead=int(row[2]),
            )

        return await self._db.run(q)

    async def dead_letters(self, *, limit: int = 100) -> Sequence[EventRecord]:
        def q(conn: sqlite3.Connection) -> Sequence[EventRecord]:
            rows = conn.execute(
                f"SELECT {EVENT_COLUMNS} FROM outbox_event o WHERE o.dead_at IS NOT NULL "
                "AND o.published_at IS NULL ORDER BY o.dead_at, o.staged_seq LIMIT ?",
                (limit,),
            )
            return tuple(event_row(r) for r in rows)

        return await self._db.run(q)

    async def retry_dead_letter(self, event_id: str) -> bool:
        def tx(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE outbox_event SET dead_at = NULL, dead_reason = NULL, attempts = 0 "
                "WHERE event_id = ? AND dead_at IS NOT NULL AND published_at IS NULL",
                (event_id,),
            )
            return cur.rowcount == 1

        return await self._db.write(tx)


class SqliteChanges:
    """Change subscriptions on SQLite (R2.14). One writer at a time means ``staged_seq`` is
    commit order, so the cursor is that one number: the position is ``(0, staged_seq)``."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def subscribe(self, consumer: str, *, now: datetime, from_start: bool = True) -> bool:
        def tx(conn: sqlite3.Connection) -> bool:
            start = 0
            if not from_start:
                start = conn.execute(
                    "SELECT coalesce(max(staged_seq), 0) FROM outbox_event"
                ).fetchone()[0]
            cur = conn.execute(
                "INSERT INTO change_cursor (consumer, last_staged_seq, updated_at) "
                "VALUES (?, ?, ?) ON CONFLICT (consumer) DO NOTHING",
                (consumer, start, to_text(now)),
            )
            return cur.rowcount == 1

        return await self._db.write(tx)

    async def read(self, consumer: str, *, limit: int = 500) -> ChangeBatch:
        def q(conn: sqlite3.Connection) -> ChangeBatch:
            row = conn.execute(
                "SELECT last_staged_seq FROM change_cursor WHERE consumer = ?", (consumer,)
            ).fetchone()
            if row is None:
                raise UnknownConsumer(consumer)
            rows = conn.execute(
                f"SELECT {EVENT_COLUMNS} FROM outbox_event o WHERE o.staged_seq > ? "
                "ORDER BY o.staged_seq LIMIT ?",
                (row[0], limit),
            ).fetchall()
            events = tuple(event_row(r) for r in rows)
            return ChangeBatch(
                consumer=consumer,
                events=events,
                position=(0, events[-1].staged_seq if events else int(row[0])),
            )

        return await self._db.run(q)

    async def commit(self, consumer: str, position: tuple[int, int], *, now: datetime) -> None:
        def tx(conn: sqlite3.Connection) -> None:
            cur = conn.execute(
                "UPDATE change_cursor SET last_staged_seq = max(last_staged_seq, ?), "
                "updated_at = ? WHERE consumer = ?",
                (position[1], to_text(now), consumer),
            )
            if cur.rowcount != 1:
                raise UnknownConsumer(consumer)

        await self._db.write(tx)

    async def unsubscribe(self, consumer: str) -> bool:
        def tx(conn: sqlite3.Connection) -> bool:
            cur = conn.execute("DELETE FROM change_cursor WHERE consumer = ?", (consumer,))
            return cur.rowcount == 1

        return await self._db.write(tx)

    async def purge_published(self, *, before: datetime) -> OutboxPurge:
        def tx(conn: sqlite3.Connection) -> OutboxPurge:
            cutoff = to_text(before)
            read_to = conn.execute("SELECT min(last_staged_seq) FROM change_cursor").fetchone()[0]
            bound = (1 << 62) if read_to is None else int(read_to)
            held = conn.execute(
                "SELECT count(*) FROM outbox_event WHERE published_at IS NOT NULL "
                "AND published_at < ? AND staged_seq > ?",
                (cutoff, bound),
            ).fetchone()[0]
            deleted = conn.execute(
                "DELETE FROM outbox_event WHERE published_at IS NOT NULL AND published_at < ? "
                "AND staged_seq <= ?",
                (cutoff, bound),
            ).rowcount
            return OutboxPurge(deleted=int(deleted), held_back=int(held))

        return await self._db.write(tx)
