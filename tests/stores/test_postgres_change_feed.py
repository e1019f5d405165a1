"""The change feed's horizon on PostgreSQL (R2.14): what may hold it back, and what may not.

Transaction ids are the server's, so "below the oldest running transaction" let any writing
transaction anywhere on the server stop every feed. The feed now passes over a transaction
that holds no lock in its schema (it can never stage there), and still never passes one that
can: a staging transaction that commits late is read, in order, after it commits.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from flowx.stores.postgres import PostgresStores
from flowx.stores.records import EventWrite, StepCommit
from flowx.testing.conformance._support import at, event, instance, step
from flowx.testing.conformance.outbox import ids, read_at_least, stage
from tests.postgres.support import aconnect
from tests.postgres_support import PG_DSN

#: The horizon as it was: the oldest transaction running anywhere on the server.
SERVER_XMIN = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text"


@pytest.fixture
async def pg(pg_schema: Callable[[], str]) -> AsyncIterator[PostgresStores]:
    stores = PostgresStores(PG_DSN, schema=pg_schema())
    await stores.open()
    try:
        yield stores
    finally:
        await stores.close()


async def _xid(conn: psycopg.AsyncConnection[Any]) -> int:
    """The id of ``conn``'s open transaction."""
    row = await (await conn.execute("SELECT pg_current_xact_id()::text")).fetchone()
    assert row is not None
    return int(row[0])


async def _server_xmin(pg: PostgresStores) -> int:
    async with pg.db.connection() as conn:
        row = await (await conn.execute(SERVER_XMIN)).fetchone()
    assert row is not None
    return int(row[0])


async def test_open_transactions_in_another_schema_or_database_do_not_hold_the_feed_back(
    pg: PostgresStores, pg_schema: Callable[[], str]
) -> None:
    """R2.14: a transaction in another schema of this database that wrote a row, and one in
    another database that took a transaction id, stay open while events are staged and
    read. Both are older than the events (so the old horizon stopped below them); the feed
    reads every event regardless."""
    elsewhere = pg_schema()
    async with await aconnect("public") as setup:
        await setup.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(elsewhere)))
        await setup.execute(
            sql.SQL("CREATE TABLE {}.busy (n int)").format(sql.Identifier(elsewhere))
        )
    other_db = PG_DSN.rsplit("/", 1)[0] + "/postgres"
    async with (
        await aconnect(elsewhere) as same_db,
        await psycopg.AsyncConnection.connect(other_db) as other_database,
    ):
        await same_db.execute("BEGIN")
        await same_db.execute("INSERT INTO busy VALUES (1)")
        older = [await _xid(same_db), await _xid(other_database)]  # both stay open
        await pg.changes.subscribe("billing", now=at(0))
        staged = await stage(pg, ["a", "b", "a"])
        assert await _server_xmin(pg) <= min(older)  # the old horizon: nothing readable
        batch = await read_at_least(pg, "billing", 3)
        assert ids(batch.events) == ids(staged)
        assert batch.position[0] > max(older)  # the cursor passed both open transactions
        await pg.changes.commit("billing", batch.position, now=at(1))
        await same_db.rollback()
        await other_database.rollback()
    assert (await pg.changes.read("billing")).events == ()


async def test_a_staging_transaction_that_commits_late_is_never_skipped(
    pg: PostgresStores,
) -> None:
    """R2.14: transaction A writes to this schema first (so it has its id) and stages its
    event only after B, younger, has staged and committed one and the feed has read and
    committed its cursor. The feed shows nothing of B while A runs, then A's event and B's,
    in that order. A horizon that passed over A would have moved the cursor past A's id."""
    slow_iid, fast_iid = [
        (await pg.journal.create(instance(), token=1, now=at(0))).instance.instance_id
        for _ in range(2)
    ]
    await pg.changes.subscribe("audit", now=at(0))
    async with await aconnect(pg.db.schema) as slow:
        await slow.execute("BEGIN")
        await slow.execute(
            "UPDATE flow_instance SET updated_at = now() WHERE instance_id = %s", (slow_iid,)
        )
        slow_xid = await _xid(slow)
        fast = event("k", payload='{"n":"fast"}')
        await pg.journal.commit(
            StepCommit(instance_id=fast_iid, token=1, now=at(1), step=step(1), events=(fast,))
        )
        held = await pg.changes.read("audit")
        assert held.events == ()  # B has committed, but A could still stage below it
        assert held.position[0] <= slow_xid
        await pg.changes.commit("audit", held.position, now=at(2))
        late = str(uuid.uuid4())
        await slow.execute(
            "INSERT INTO outbox_event (event_id, instance_id, sequence, ordinal, type, "
            "schema_version, partition_key, payload, staged_at) "
            "VALUES (%s, %s, 1, 0, 'late.staged', '1', 'k', '{}', now())",
            (late, slow_iid),
        )
        assert (await pg.changes.read("audit")).events == ()  # A is still open
        await slow.commit()
    both = await read_at_least(pg, "audit", 2)
    assert [e.event_id for e in both.events] == [late, fast.event_id]


async def test_a_transaction_holding_a_lock_in_the_schema_holds_the_feed_back_until_it_ends(
    pg: PostgresStores,
) -> None:
    """The bound that remains: a transaction with an id that holds any lock on a relation of
    the feed's schema (here it only read the outbox) might still stage there, so nothing
    younger is read until it ends."""
    await pg.changes.subscribe("audit", now=at(0))
    async with await aconnect(pg.db.schema) as reader:
        await reader.execute("BEGIN")
        await _xid(reader)
        await reader.execute("SELECT count(*) FROM outbox_event")
        staged: list[EventWrite] = await stage(pg, ["a"])
        assert (await pg.changes.read("audit")).events == ()
        await reader.rollback()
    assert ids((await read_at_least(pg, "audit", 1)).events) == ids(staged)
