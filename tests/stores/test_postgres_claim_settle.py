"""A queue claim whose commit gets no answer is settled, not abandoned (R9.1, R6.4).

Under a disk that takes seconds to flush, a claim's ``COMMIT`` can outlast the client's
round-trip deadline. Before, the claim raised and whatever it had taken stayed leased to this
node, unrun, until the leases expired a TTL later and recovery handed the instances to a new
token (``tests/faults/test_slow_fsync.py`` saw 12 instances change hands). Now the claim's
rows are known before its commit is sent, and a silent commit is settled by re-reading them.

The commit is held, for certain, by a deferred constraint trigger that runs at ``COMMIT`` and
waits for an advisory lock this test holds; the test lets it go (or makes it fail) only once
the settling read is seen waiting for the claim's transaction. Nothing depends on timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

import psycopg
import pytest

from flowx.stores.errors import JournalNoAnswer
from flowx.stores.postgres import PostgresStores
from flowx.stores.records import History, InstanceState, Lease
from flowx.testing.conformance._support import instance
from tests.postgres.support import aconnect
from tests.postgres_support import PG_DSN

TTL = timedelta(seconds=60)
GATE = 7_311_001  # the advisory lock key the trigger waits on
#: A guard against a hang, not a measurement.
GUARD_S = 30.0

_HOLD_COMMIT = """
CREATE TABLE gate (fail boolean NOT NULL);
INSERT INTO gate VALUES (false);
CREATE FUNCTION hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_lock_shared({gate});
    PERFORM pg_advisory_unlock_shared({gate});
    IF (SELECT fail FROM gate) THEN
        RAISE EXCEPTION 'the test failed this commit';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER hold_commit AFTER UPDATE ON flow_instance
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION hold_commit();
"""


async def _settling(watch: psycopg.AsyncConnection[object]) -> None:
    """Until the settling read waits on the claim's transaction (a lock wait on the row)."""
    while True:
        cur = await watch.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND query LIKE %s",
            ("%FOR SHARE%",),
        )
        row = await cur.fetchone()
        if row is not None and row[0]:
            return
        await asyncio.sleep(0.02)


async def _claim_with_a_silent_commit(
    pg_schema: Callable[[], str], *, fail: bool
) -> tuple[PostgresStores, list[str], list[tuple[Lease, History]] | BaseException]:
    schema = pg_schema()
    stores = PostgresStores(PG_DSN, schema=schema)
    await stores.open()
    stores.db.round_trip_timeout = 1.0
    ids = []
    for _ in range(3):
        created = await stores.journal.create(
            instance(state=InstanceState.PENDING), token=1, now=None
        )
        ids.append(created.instance.instance_id)
    gate = await aconnect(schema)
    try:
        await gate.execute(_HOLD_COMMIT.format(gate=GATE))
        await gate.execute("UPDATE gate SET fail = %s", (fail,))
        await gate.execute("SELECT pg_advisory_lock(%s)", (GATE,))
        claim = asyncio.create_task(
            stores.claim_queued(owner="n1", ttl=TTL, limit=10, flows=None, now=None)
        )
        await asyncio.wait_for(_settling(gate), GUARD_S)
        await gate.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
        try:
            result: list[tuple[Lease, History]] | BaseException = list(
                await asyncio.wait_for(claim, GUARD_S)
            )
        except JournalNoAnswer as exc:
            result = exc
        await gate.execute("DROP TRIGGER hold_commit ON flow_instance")
    finally:
        await gate.close()
    return stores, ids, result


async def test_a_claim_whose_commit_landed_runs_what_it_took(
    pg_schema: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    stores, ids, result = await _claim_with_a_silent_commit(pg_schema, fail=False)
    try:
        assert not isinstance(result, BaseException), result
        assert "re-read: 3 of its 3 instance(s) are this node's" in caplog.text
        taken = {h.instance.instance_id: (lease, h) for lease, h in result}
        assert sorted(taken) == sorted(ids)
        for iid, (lease, history) in taken.items():
            current = await stores.leases.current(iid)
            assert current is not None and (current.owner, current.token) == ("n1", lease.token)
            assert history.instance.state is InstanceState.RUNNING
            assert history.instance.fence == lease.token
        # Nothing is left for another claim.
        assert await stores.claim_queued(owner="n2", ttl=TTL, limit=10, flows=None, now=None) == []
    finally:
        await stores.close()


async def test_a_claim_whose_commit_failed_leaves_its_rows_queued(
    pg_schema: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    stores, ids, result = await _claim_with_a_silent_commit(pg_schema, fail=True)
    try:
        assert result == []  # settled: it took nothing
        assert "re-read: 0 of its 3 instance(s) are this node's" in caplog.text
        for iid in ids:
            record = await stores.journal.get(iid)
            assert record is not None and record.state is InstanceState.PENDING
        again = await stores.claim_queued(owner="n2", ttl=TTL, limit=10, flows=None, now=None)
        assert sorted(h.instance.instance_id for _, h in again) == sorted(ids)
        assert all(lease.owner == "n2" for lease, _ in again)
    finally:
        await stores.close()
