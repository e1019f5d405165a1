"""Lease grants on PostgreSQL never wait on an instance row while holding its lease row (R2.4).

The queue claim (claims.py) locks ``Pending`` instance rows first and takes their leases
after; a signal's sender then wakes the instance it made ``Pending`` here with an
``acquire``. If the acquire locked the lease row and then waited for the instance row, the
two would wait for each other and PostgreSQL would break the deadlock after a second by
failing one of them (seen under load in ``benchmarks/waits.py``). Here a separate connection
plays the claim's part in its exact order, so the overlap is certain, not up to timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

from flowx.stores.postgres import PostgresStores
from flowx.stores.records import InstanceState
from flowx.testing.conformance._support import at, make_instance
from tests.postgres.support import aconnect
from tests.postgres_support import PG_DSN

TTL = timedelta(seconds=30)
#: A guard against a hang, not a measurement: the acquire answers without waiting at all.
GUARD_S = 30.0


async def test_an_acquire_passes_over_an_instance_a_claim_holds(
    pg_schema: Callable[[], str],
) -> None:
    schema = pg_schema()
    stores = PostgresStores(PG_DSN, schema=schema)
    await stores.open()
    claim = await aconnect(schema)
    try:
        iid = await make_instance(stores)  # no lease row yet: the claim inserts one
        first = await stores.leases.acquire(iid, owner="a", ttl=TTL, now=at(1))
        assert first is not None
        await stores.leases.release(first, now=at(1.5))  # expired: free for anyone
        async with claim.transaction():
            # The claim's order: the instance row, then its lease.
            await claim.execute(
                "SELECT 1 FROM flow_instance WHERE instance_id = %s FOR UPDATE", (iid,)
            )
            acquired = await asyncio.wait_for(
                stores.leases.acquire(iid, owner="b", ttl=TTL, now=at(2)), GUARD_S
            )
            assert acquired is None  # a lost race, answered at once
            await claim.execute(
                "UPDATE flow_lease SET owner_node = 'claim', fencing_token = fencing_token + 1,"
                " expires_at = %s WHERE instance_id = %s",
                (at(2) + TTL, iid),
            )
        lease = await stores.leases.current(iid)
        assert lease is not None and lease.owner == "claim"
    finally:
        await claim.close()
        await stores.close()


async def test_an_acquire_takes_a_free_instance_that_no_one_holds(
    pg_schema: Callable[[], str],
) -> None:
    """The other half: passing over a held row must not turn into refusing a free one."""
    schema = pg_schema()
    stores = PostgresStores(PG_DSN, schema=schema)
    await stores.open()
    try:
        iid = await make_instance(stores)
        first = await stores.leases.acquire(iid, owner="a", ttl=TTL, now=at(1))
        assert first is not None
        await stores.leases.release(first, now=at(1.5))
        second = await stores.leases.acquire(iid, owner="b", ttl=TTL, now=at(2))
        assert second is not None and second.token > first.token
        record = await stores.journal.get(iid)
        assert record is not None and record.fence == second.token
        # A lease for an id with no instance row (the lease store on its own) still works.
        lone = await stores.leases.acquire(
            "00000000-0000-4000-8000-000000000001", owner="c", ttl=TTL, now=at(2)
        )
        assert lone is not None
    finally:
        await stores.close()


async def test_a_claim_passes_over_an_instance_whose_lease_row_is_held(
    pg_schema: Callable[[], str],
) -> None:
    """R9.1: a queued instance whose lease row another transaction holds (an acquire waiting
    for its commit's flush on a slow disk) is passed over, not waited for; once free, the next
    claim takes it."""
    schema = pg_schema()
    stores = PostgresStores(PG_DSN, schema=schema)
    await stores.open()
    holder = await aconnect(schema)
    try:
        iid = await make_instance(stores, state=InstanceState.PENDING)
        first = await stores.leases.acquire(iid, owner="a", ttl=TTL, now=at(1))
        assert first is not None
        await stores.leases.release(first, now=at(1.5))
        async with holder.transaction():
            await holder.execute(
                "SELECT 1 FROM flow_lease WHERE instance_id = %s FOR UPDATE", (iid,)
            )
            claimed = await asyncio.wait_for(
                stores.claim_queued(owner="b", ttl=TTL, limit=10, flows=None, now=at(2)), GUARD_S
            )
            assert claimed == []
        claimed = await stores.claim_queued(owner="b", ttl=TTL, limit=10, flows=None, now=at(3))
        assert [lease.instance_id for lease, _ in claimed] == [iid]
    finally:
        await holder.close()
        await stores.close()
