"""A commit the server refuses alone is a retryable ``JournalUnavailable``, never a driver error.

A partitioned or frozen node can leave a transaction open holding an instance's row lock
until the server's idle-in-transaction timeout. A commit that meets that lock waits
``lock_timeout`` and is refused by the server; the host must see the store's own error
(retryable: nothing was written), as it does for every other journal failure, not a psycopg
exception it can only log as "unexpected" (stores/errors.py: drivers' exceptions never cross
the store seam). Unlike a connection cut by the client deadline (R9.1), the connection is
fine afterwards: the group committer keeps it, and the next commit goes through.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

import flowx
from flowx.stores.postgres import PostgresStores
from flowx.stores.postgres.database import SessionLimits
from flowx.stores.records import StepCommit
from flowx.testing.conformance._support import at, instance, step
from tests.faults.support import sql


async def test_a_commit_refused_by_a_held_row_lock_is_journal_unavailable(
    pg_schema: Callable[[], str],
) -> None:
    from tests.postgres_support import PG_DSN

    schema = pg_schema()
    stores = PostgresStores(
        PG_DSN, schema=schema, limits=SessionLimits(lock_timeout_ms=200), min_size=1
    )
    await stores.open()
    try:
        journal = stores.journal
        iid = (await journal.create(instance(), token=1, now=at(0))).instance.instance_id
        async with sql(schema) as stuck, stuck.transaction():
            await stuck.execute(
                "SELECT 1 FROM flow_instance WHERE instance_id = %s FOR UPDATE", (iid,)
            )
            with pytest.raises(flowx.JournalUnavailable) as refused:
                await journal.commit(StepCommit(instance_id=iid, token=1, now=None, step=step(1)))
            assert refused.value.retryable
            assert isinstance(refused.value.__cause__, psycopg.errors.LockNotAvailable)
        assert await journal.steps(iid) == ()  # nothing was written
        # The lock is gone: the retry commits, on the same pool.
        assert (
            await journal.commit(StepCommit(instance_id=iid, token=1, now=None, step=step(1))) == 1
        )
    finally:
        await stores.close()
