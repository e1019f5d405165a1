"""``RecoveryIndex`` conformance: only abandoned instances, each once, bounded (R3.4)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from flowx.stores.protocols import QueueClaims
from flowx.stores.records import InstanceState
from flowx.testing.conformance._support import at, commit, instance, one_shard, step

IDLE = timedelta(seconds=30)


class RecoveryIndexConformance:
    """Subclass it where a ``stores`` fixture (class or module level) yields an opened,
    empty ``Stores``."""

    async def _make(self, stores: Any, state: InstanceState, updated: float, **fields: Any) -> str:
        created = await stores.journal.create(
            instance(
                state=InstanceState.PENDING
                if state is InstanceState.PENDING
                else InstanceState.RUNNING,
                **fields,
            ),
            token=1,
            now=at(updated),
        )
        iid: str = created.instance.instance_id
        if state not in (InstanceState.PENDING, InstanceState.RUNNING):
            await stores.journal.commit(commit(iid, token=1, now=updated, state=state))
        return iid

    async def test_a_scan_returns_only_abandoned_instances(self, stores: Any) -> None:
        idle_running = await self._make(stores, InstanceState.RUNNING, 0)
        idle_compensating = await self._make(stores, InstanceState.COMPENSATING, 1)
        queued = await self._make(stores, InstanceState.PENDING, 95)
        await self._make(stores, InstanceState.RUNNING, 80)  # written 20 s ago: alive
        for done in (
            InstanceState.COMPLETED,
            InstanceState.FAILED,
            InstanceState.SUSPENDED,
            InstanceState.COMPENSATION_FAILED,
            InstanceState.TIMED_OUT,
        ):
            await self._make(stores, done, 0)
        stale_queued = await self._make(stores, InstanceState.PENDING, 2)
        page = await stores.recovery.find_abandoned(now=at(100), idle_for=IDLE, limit=50)
        assert [c.instance_id for c in page] == [idle_running, idle_compensating, stale_queued]
        queue = await stores.recovery.find_queued(limit=50)
        assert [c.instance_id for c in queue] == [stale_queued, queued]
        first = page[0]
        assert (first.flow_id, first.flow_version, first.state) == (
            "conformance.flow",
            "1.0.0",
            InstanceState.RUNNING,
        )

    async def test_a_commit_takes_an_instance_out_of_the_scan(self, stores: Any) -> None:
        iid = await self._make(stores, InstanceState.RUNNING, 0)
        await stores.journal.commit(commit(iid, token=1, now=90, step=step(1)))
        assert (
            list(await stores.recovery.find_abandoned(now=at(100), idle_for=IDLE, limit=10)) == []
        )

    async def test_a_page_is_bounded_and_holds_no_instance_twice(self, stores: Any) -> None:
        made = [await self._make(stores, InstanceState.RUNNING, i) for i in range(12)]
        pages = [
            await stores.recovery.find_abandoned(now=at(500), idle_for=IDLE, limit=5, offset=off)
            for off in (0, 5, 10)
        ]
        assert [len(p) for p in pages] == [5, 5, 2]
        ids = [c.instance_id for p in pages for c in p]
        assert len(ids) == len(set(ids))
        assert ids == made  # oldest first, offsets walk the same order

    async def test_an_offset_past_the_end_is_an_empty_page(self, stores: Any) -> None:
        await self._make(stores, InstanceState.RUNNING, 0)
        assert (
            list(
                await stores.recovery.find_abandoned(now=at(500), idle_for=IDLE, limit=5, offset=3)
            )
            == []
        )

    async def test_the_queue_holds_only_pending_instances_oldest_first(self, stores: Any) -> None:
        later = await self._make(stores, InstanceState.PENDING, 50)
        earlier = await self._make(stores, InstanceState.PENDING, 10)
        await self._make(stores, InstanceState.RUNNING, 0)
        await self._make(stores, InstanceState.COMPLETED, 0)
        assert [c.instance_id for c in await stores.recovery.find_queued(limit=10)] == [
            earlier,
            later,
        ]
        assert [c.instance_id for c in await stores.recovery.find_queued(limit=1, offset=1)] == [
            later
        ]
        history = await stores.journal.open(earlier, token=2, now=at(60))
        assert history.instance.state is InstanceState.RUNNING  # taken: off the queue
        assert [c.instance_id for c in await stores.recovery.find_queued(limit=10)] == [later]

    async def test_queued_work_is_claimed_once_leased_and_opened(self, stores: Any) -> None:
        """``QueueClaims``: the oldest Pending instances of the carried flows, each leased
        (fence raised to the new token), Running and read, in one write; one whose lease is
        live elsewhere stays Pending; two claims at once never take the same instance."""
        declared: object = stores
        if not isinstance(declared, QueueClaims):
            pytest.skip("this store does not declare QueueClaims")
        # A sharded journal claims each shard's oldest, the page split over the shards
        # (README "Sharding the journal": queued claims), so there, for "the oldest" to be
        # one answer, these share a shard; the backlog below is spread over every shard.
        one = one_shard(stores)
        older = await self._make(stores, InstanceState.PENDING, 1, **one)
        await stores.journal.commit(commit(older, token=1, now=2, step=step(1)))
        held = await self._make(stores, InstanceState.PENDING, 0, **one)
        assert await stores.leases.acquire(held, owner="starter", ttl=IDLE, now=at(3)) is not None
        await self._make(stores, InstanceState.RUNNING, 0, **one)  # not queued
        other_flow = await stores.journal.create(
            instance(flow_id="conformance.other", state=InstanceState.PENDING, **one),
            token=1,
            now=at(0),
        )
        newer = await self._make(stores, InstanceState.PENDING, 5, **one)
        refs = ["conformance.flow@1.0.0"]
        first = await declared.claim_queued(owner="n1", ttl=IDLE, limit=1, flows=refs, now=at(10))
        assert [h.instance.instance_id for _, h in first] == [older]
        lease, history = first[0]
        assert lease.owner == "n1" and lease.token > 1 and lease.expires_at == at(40)
        assert history.instance.state is InstanceState.RUNNING
        assert history.instance.fence == lease.token
        assert [s.step_id for s in history.steps] == [1]
        assert (await stores.leases.current(older)).token == lease.token
        rest = await declared.claim_queued(owner="n2", ttl=IDLE, limit=10, flows=refs, now=at(11))
        assert [h.instance.instance_id for _, h in rest] == [newer]  # not `held`, not the other
        assert (await stores.journal.get(held)).state is InstanceState.PENDING
        assert (await stores.journal.get(other_flow.instance.instance_id)).state is (
            InstanceState.PENDING
        )
        anyone = await declared.claim_queued(owner="n3", ttl=IDLE, limit=10, flows=None, now=at(12))
        assert [h.instance.instance_id for _, h in anyone] == [other_flow.instance.instance_id]
        # Two claims at once share a backlog between them, each instance exactly once (`held`
        # too: its lease has run out by now).
        backlog = {await self._make(stores, InstanceState.PENDING, 20 + i) for i in range(30)}
        backlog.add(held)
        a, b = await asyncio.gather(
            declared.claim_queued(owner="a", ttl=IDLE, limit=20, flows=None, now=at(60)),
            declared.claim_queued(owner="b", ttl=IDLE, limit=20, flows=None, now=at(60)),
        )
        taken = [h.instance.instance_id for _, h in (*a, *b)]
        assert len(taken) == len(set(taken)) == 31 and set(taken) == backlog
