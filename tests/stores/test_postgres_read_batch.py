"""Batched reads on PostgreSQL answer each ask as a read alone would (R6.2).

Reads asked together go out as one statement; each ask must still get its own row (or none),
whatever the others in its batch are: an unknown id, an id spelled in upper case, an id that is
not a uuid at all (which fails alone, the rest of its batch answered).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from flowx.stores.postgres import PostgresStores
from flowx.stores.postgres.reads import BatchedReads
from flowx.testing.conformance._support import at, make_instance, new_id
from tests.postgres_support import PG_DSN


async def test_reads_asked_together_each_get_their_own_answer(
    pg_schema: Callable[[], str],
) -> None:
    stores = PostgresStores(PG_DSN, schema=pg_schema())
    await stores.open()
    try:
        ids = [await make_instance(stores) for _ in range(30)]
        for n, iid in enumerate(ids[:10]):
            for k in range(n % 3):
                await stores.waits.signal(iid, "go", f'{{"n":{k}}}', key=f"k{k}", now=at(1))
        reads = BatchedReads(stores.journal._db)  # type: ignore[attr-defined]
        missing = new_id()
        asks = [*ids, missing, ids[3].upper(), "not-a-uuid"]
        # Once with every ask a uuid (batches form), once with the bad one among them (its
        # batch falls back to one read each, and only it fails).
        clean = await asyncio.gather(*(reads.instance(i) for i in asks[:-1]))
        assert reads._instances.batches >= 1  # type: ignore[attr-defined]
        got = await asyncio.gather(*(reads.instance(i) for i in asks), return_exceptions=True)
        assert reads._instances.fallbacks >= 1  # type: ignore[attr-defined]
        assert got[:-1] == clean
        for iid, record in zip(ids, got[:30], strict=True):
            assert not isinstance(record, BaseException)
            assert record is not None and record.instance_id == iid
        assert got[30] is None
        upper = got[31]
        assert not isinstance(upper, BaseException) and upper is not None
        assert upper.instance_id == ids[3]
        assert isinstance(got[32], Exception)  # the server refuses it: that ask alone fails

        inboxes = await asyncio.gather(*(reads.signals(i, "go") for i in ids[:10]))
        inboxes += await asyncio.gather(*(reads.signals(i, "other") for i in ids[:3]))
        for n, (iid, inbox) in enumerate(zip(ids[:10], inboxes[:10], strict=True)):
            assert [s.key for s in inbox] == [f"k{k}" for k in range(n % 3)]
            assert all(s.instance_id == iid for s in inbox)
            assert [s.seq for s in inbox] == sorted(s.seq for s in inbox)
        assert all(inbox == () for inbox in inboxes[10:])
    finally:
        await stores.close()
