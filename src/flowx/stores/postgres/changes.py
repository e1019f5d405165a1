"""Change subscriptions on PostgreSQL (R2.14), and the outbox purge they hold back (R2.13).

The cursor is ``(staged_xid, staged_seq)``, read only below a *horizon* (migration 0006 says
why ``staged_seq`` alone would skip events): every event staged below it has committed, or
never will be, so a cursor that passes it never skips a late commit.

The oldest running transaction (``pg_snapshot_xmin``) would be such a horizon, but
transaction ids are the whole server's: any writing transaction, in any schema or database,
would hold every feed back for as long as it ran. The horizon is the oldest running
transaction *that can still stage here*, found in the same statement as the read:

- the statement's own snapshot lists the transactions running when it began;
- ``pg_locks``, read afterwards in one call, tells which of them are still running (their
  ``transactionid`` lock) and whether each holds a lock on a relation of this schema;
- one that is still running and holds none is passed over: it will never stage here.

That last step rests on one invariant, which every statement FlowX sends keeps: **a
transaction that stages outbox rows in this schema holds a lock on a relation of this schema
from before its transaction id is assigned until it ends.** Each staging is one statement on
this schema's tables (``commit.py``), which locks every table it names before it writes its
first row, and a transaction's id is assigned by its first write; a relation's lock is held
to the end. (Code that first wrote elsewhere, or rolled back to a savepoint past its first
write here, and then staged, would break it: never stage that way.) Anything not proven to be
elsewhere counts — a transaction that ended between the snapshot and ``pg_locks`` holds one
read back; nothing is ever skipped.

What remains: a transaction that has an id and holds a lock on this schema (a FlowX commit, a
publisher's claim, a migration, or any session that wrote something and read or wrote these
tables in the same transaction) holds the feed back until it ends; one elsewhere on the
server does not.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final, LiteralString

from psycopg.rows import dict_row

from flowx.stores.columns import EVENT_COLUMNS, event_of
from flowx.stores.errors import UnknownConsumer
from flowx.stores.postgres.database import PostgresDatabase
from flowx.stores.records import ChangeBatch, OutboxPurge

# The horizon, one scalar subquery. ``locks`` is one call of pg_locks, read only when some
# transaction is running: one view, because a transaction seen running in one call and
# lockless in another may have ended in between. (pg_locks reads the fast-path locks before
# the main table, so a transactionid lock it shows belongs to a transaction that was running
# when its fast-path locks were read.) ``x`` is passed over only when it is still running and
# its virtual transaction holds no lock on a relation of this schema (current_schema(): the
# search_path names it) in this database.
HORIZON: Final[LiteralString] = """(
WITH snap AS (SELECT pg_current_snapshot() AS s),
locks AS MATERIALIZED (
    SELECT locktype, transactionid, virtualtransaction, database, relation FROM pg_locks
)
SELECT least(pg_snapshot_xmax(snap.s), (
    SELECT min(x) FROM pg_snapshot_xip(snap.s) AS x
     WHERE NOT EXISTS (
        SELECT 1 FROM locks t
         WHERE t.locktype = 'transactionid' AND t.transactionid = x::xid
           AND NOT EXISTS (
               SELECT 1 FROM locks r JOIN pg_class c ON c.oid = r.relation
                WHERE r.virtualtransaction = t.virtualtransaction AND r.locktype = 'relation'
                  AND r.database = (SELECT oid FROM pg_database
                                     WHERE datname = current_database())
                  AND c.relnamespace = current_schema()::regnamespace))))
  FROM snap)"""

SUBSCRIBE: Final[LiteralString] = (
    "INSERT INTO change_cursor (consumer, last_staged_seq, last_staged_xid, updated_at) "
    "VALUES (%(consumer)s, 0, CASE WHEN %(from_start)s THEN '0'::xid8 ELSE " + HORIZON + " END, "
    "%(now)s) ON CONFLICT (consumer) DO NOTHING"
)

CURSOR: Final[LiteralString] = (
    "SELECT coalesce(last_staged_xid, '0'::xid8)::text AS xid, last_staged_seq AS seq "
    "FROM change_cursor WHERE consumer = %(consumer)s"
)

READ: Final[LiteralString] = (
    "SELECT " + EVENT_COLUMNS + ", o.staged_xid::text AS staged_xid FROM outbox_event o "
    "WHERE (o.staged_xid, o.staged_seq) > (%(xid)s::text::xid8, %(seq)s::bigint) "
    "AND o.staged_xid < " + HORIZON + " ORDER BY o.staged_xid, o.staged_seq LIMIT %(limit)s"
)

COMMIT: Final[LiteralString] = (
    "UPDATE change_cursor SET last_staged_xid = %(xid)s::text::xid8, "
    "last_staged_seq = %(seq)s, updated_at = %(now)s WHERE consumer = %(consumer)s "
    "AND (coalesce(last_staged_xid, '0'::xid8), last_staged_seq) "
    "<= (%(xid)s::text::xid8, %(seq)s::bigint) RETURNING 1"
)

# Everything every subscription has read: (staged_xid, staged_seq) at or below the least
# cursor. With no subscription, everything published is eligible.
PURGE: Final[LiteralString] = """
WITH least AS (
    SELECT coalesce(last_staged_xid, '0'::xid8) AS xid, last_staged_seq AS seq
      FROM change_cursor ORDER BY 1, 2 LIMIT 1
), gone AS (
    DELETE FROM outbox_event o
     WHERE o.published_at < %(before)s
       AND (NOT EXISTS (SELECT 1 FROM least)
            OR (o.staged_xid, o.staged_seq) <= (SELECT xid, seq FROM least))
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS deleted,
       (SELECT count(*) FROM outbox_event o
         WHERE o.published_at < %(before)s
           AND EXISTS (SELECT 1 FROM least)
           AND (o.staged_xid, o.staged_seq) > (SELECT xid, seq FROM least)) AS held
"""


class PostgresChanges:
    """**ChangeFeed** on PostgreSQL."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db

    async def subscribe(self, consumer: str, *, now: datetime, from_start: bool = True) -> bool:
        async with self._db.connection() as conn:
            cur = await conn.execute(
                SUBSCRIBE, {"consumer": consumer, "from_start": from_start, "now": now}
            )
            return cur.rowcount == 1

    async def read(self, consumer: str, *, limit: int = 500) -> ChangeBatch:
        async with self._db.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            at = await (await cur.execute(CURSOR, {"consumer": consumer})).fetchone()
            if at is None:
                raise UnknownConsumer(consumer)
            rows = await (
                await cur.execute(
                    READ, {"xid": at["xid"], "seq": at["seq"], "limit": limit}, prepare=True
                )
            ).fetchall()
        position = (int(at["xid"]), int(at["seq"]))
        if rows:
            position = (int(rows[-1]["staged_xid"]), int(rows[-1]["staged_seq"]))
        events = tuple(event_of({k: v for k, v in r.items() if k != "staged_xid"}) for r in rows)
        return ChangeBatch(consumer=consumer, events=events, position=position)

    async def commit(self, consumer: str, position: tuple[int, int], *, now: datetime) -> None:
        async with self._db.connection() as conn:
            params = {"consumer": consumer, "xid": str(position[0]), "seq": position[1]}
            cur = await conn.execute(COMMIT, {**params, "now": now})
            if cur.rowcount == 1:
                return
            row = await (await conn.execute(CURSOR, {"consumer": consumer})).fetchone()
            if row is None:
                raise UnknownConsumer(consumer)
            # Already further along: never backwards.

    async def unsubscribe(self, consumer: str) -> bool:
        async with self._db.connection() as conn:
            cur = await conn.execute(
                "DELETE FROM change_cursor WHERE consumer = %(c)s", {"c": consumer}
            )
            return cur.rowcount == 1

    async def purge_published(self, *, before: datetime) -> OutboxPurge:
        async with self._db.connection() as conn, conn.transaction():
            row = await (await conn.execute(PURGE, {"before": before})).fetchone()
            assert row is not None  # nosec B101  # invariant: an aggregate answers one row
            return OutboxPurge(deleted=int(row[0]), held_back=int(row[1]))
