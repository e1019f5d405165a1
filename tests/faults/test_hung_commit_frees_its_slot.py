"""A commit whose reply never arrives holds a group-commit slot only until its deadline (R9.1).

The group committer sends at most ``max_inflight`` batches at a time. A batch whose reply never
comes (request ACKed, then silence) must not keep its slot: commits of other instances go out
on other connections meanwhile, the hung one ends with ``JournalNoAnswer`` at the client
deadline — its outcome unknown, and here in fact landed — its connection is discarded, and a
commit queued behind it is sent instead of waiting for ever.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from flowx.stores.errors import JournalNoAnswer
from flowx.stores.postgres import PostgresStores
from flowx.stores.postgres.commit import GroupCommitter
from flowx.stores.postgres.database import SessionLimits
from flowx.stores.records import Outcome, StepCommit
from flowx.testing.conformance._support import at, instance, step
from tests.faults.support import executes, proxy_to_postgres, via
from tests.support.fault_proxy import FaultProxy
from tests.support.polling import until


@pytest.fixture
async def proxy() -> AsyncIterator[FaultProxy]:
    async with proxy_to_postgres() as fault:
        yield fault


async def _stores(proxy: FaultProxy, schema: str, deadline: float) -> PostgresStores:
    limits = SessionLimits(connect_timeout=2)
    stores = PostgresStores(via(proxy), schema=schema, min_size=1, max_size=6, limits=limits)
    stores.db.round_trip_timeout = deadline
    await stores.open()
    # The committers probe a connection idle for over a second before a commit; on a slow
    # machine that probe, not the commit, would be the reply withheld here.
    for slot in stores.journal._group._slots:
        slot._check_after = None
    return stores


async def _instances(stores: PostgresStores, n: int) -> list[str]:
    return [
        (await stores.journal.create(instance(), token=1, now=at(0))).instance.instance_id
        for _ in range(n)
    ]


def _commit(instance_id: str) -> StepCommit:
    return StepCommit(instance_id=instance_id, token=1, now=None, step=step(1))


async def test_other_commits_complete_while_one_reply_is_withheld(
    proxy: FaultProxy, pg_schema: Callable[[], str]
) -> None:
    """R9.1: a hung batch never stops the node's other commits; it ends at its deadline as
    ``JournalNoAnswer`` (outcome unknown) and gives its slot and its connection back."""
    deadline = 3.0  # long enough that the other commits surely finish inside it
    stores = await _stores(proxy, pg_schema(), deadline)
    try:
        journal = stores.journal
        group: GroupCommitter = journal._group
        hung_id, *other_ids = await _instances(stores, 4)

        caught = proxy.withhold_next_reply(executes)
        hung = asyncio.ensure_future(journal.commit(_commit(hung_id)))
        await asyncio.wait_for(caught.wait(), 5)

        sequences = await asyncio.wait_for(
            asyncio.gather(*(journal.commit(_commit(i)) for i in other_ids)), deadline * 3
        )
        assert sequences == [1, 1, 1]
        assert not hung.done(), "the withheld commit ended before the others were sent"

        with pytest.raises(JournalNoAnswer) as no_answer:
            await asyncio.wait_for(hung, deadline + 5)
        assert no_answer.value.retryable
        assert group._inflight == 0  # every slot is free again
        # The silent server did execute it: "unknown outcome", here landed.
        landed = await journal.steps(hung_id)
        assert [(s.step_id, s.outcome) for s in landed] == [(1, Outcome.SUCCESS)]
        # The client gave the connection up: the proxy sees it closed, no longer withheld.
        await until(lambda: proxy.withheld == 0, within=5, what="the hung connection closed")
        # And the journal keeps taking commits, the hung instance's included.
        later = StepCommit(instance_id=hung_id, token=1, now=None, step=step(2))
        assert await asyncio.wait_for(journal.commit(later), deadline * 3) == 2
    finally:
        await proxy.forward()
        await stores.close()


async def test_a_commit_queued_behind_every_hung_slot_goes_out_at_the_deadline(
    proxy: FaultProxy, pg_schema: Callable[[], str]
) -> None:
    """R9.1: with every slot held by a batch that gets no answer (one slot here), commits
    queued behind it are sent once the deadline frees it — not never."""
    deadline = 1.0
    stores = await _stores(proxy, pg_schema(), deadline)
    try:
        journal = stores.journal
        journal._group = GroupCommitter(stores.db, max_inflight=1)
        hung_id, queued_id = await _instances(stores, 2)

        caught = proxy.withhold_next_reply(executes)
        hung = asyncio.ensure_future(journal.commit(_commit(hung_id)))
        await asyncio.wait_for(caught.wait(), 5)
        queued = asyncio.ensure_future(journal.commit(_commit(queued_id)))

        with pytest.raises(JournalNoAnswer):
            await asyncio.wait_for(hung, deadline + 5)
        assert await asyncio.wait_for(queued, deadline + 5) == 1
        assert [s.step_id for s in await journal.steps(queued_id)] == [1]
    finally:
        await proxy.forward()
        await stores.close()
