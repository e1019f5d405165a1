"""Group commit on PostgreSQL: many instances per statement, each commit still its own
(R2.3, R2.4, R6.2)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import flowx
from flowx.stores.postgres import PostgresStores
from flowx.stores.records import StepCommit
from flowx.testing.conformance._support import at, event, instance, step
from tests.postgres_support import PG_DSN


async def test_a_batch_commits_each_instance_and_refuses_only_the_fenced(
    pg_schema: Callable[[], str],
) -> None:
    stores = PostgresStores(PG_DSN, schema=pg_schema())
    await stores.open()
    try:
        j = stores.journal
        ids = [
            (await j.create(instance(), token=1, now=at(0))).instance.instance_id
            for _ in range(120)
        ]
        zombies = set(ids[::10])
        for iid in zombies:  # another node took these over: token 1 is now stale
            await j.open(iid, token=2, now=at(1))
        results = await asyncio.gather(
            *(
                j.commit(
                    StepCommit(
                        instance_id=iid,
                        token=1,
                        now=at(2),
                        step=step(1),
                        state_bag=f'{{"n":{n}}}',
                        events=(event(key=iid),),
                    )
                )
                for n, iid in enumerate(ids)
            ),
            return_exceptions=True,
        )
        group = j._group  # type: ignore[attr-defined]
        assert group.batches >= 1 and group.batched_commits > 1  # batching really happened
        for n, (iid, outcome) in enumerate(zip(ids, results, strict=True)):
            record = await j.get(iid)
            if iid in zombies:
                assert isinstance(outcome, flowx.FencedOut)
                assert record.state_bag == "{}" and record.next_sequence == 1
                assert list(await j.events(iid)) == []
            else:
                assert outcome == 1
                assert record.state_bag == f'{{"n":{n}}}'
                assert record.state_bag_sequence == 1 and record.next_sequence == 2
                events = await j.events(iid)
                assert [(e.sequence, e.ordinal, e.partition_key) for e in events] == [(1, 0, iid)]
    finally:
        await stores.close()


async def test_a_duplicate_in_a_batch_fails_alone(pg_schema: Callable[[], str]) -> None:
    stores = PostgresStores(PG_DSN, schema=pg_schema())
    await stores.open()
    try:
        j = stores.journal
        ids = [
            (await j.create(instance(), token=1, now=at(0))).instance.instance_id for _ in range(40)
        ]
        await j.commit(StepCommit(instance_id=ids[7], token=1, now=at(1), step=step(1)))
        results = await asyncio.gather(
            *(
                j.commit(StepCommit(instance_id=iid, token=1, now=at(2), step=step(1)))
                for iid in ids
            ),
            return_exceptions=True,
        )
        assert isinstance(results[7], flowx.DuplicateStep)
        assert all(r == 1 for i, r in enumerate(results) if i != 7)
        assert len(await j.steps(ids[7])) == 1
    finally:
        await stores.close()
