"""``RetentionStore`` conformance (R2.13): which ended instances are past their window, which
of them are kept anyway and why, what an archive receives, and deletes that remove exactly
what was archived — once, however many sweeps race."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from flowx.stores.records import InstanceState, RetentionPolicy
from flowx.stores.retention import PARENT_KEPT, UNPUBLISHED, UNREAD
from flowx.testing.conformance._support import at, commit, event, step
from flowx.testing.conformance._support import make_instance as _make

ENDED = tuple(s for s in InstanceState if s.terminal)


async def _ended(
    stores: Any, when: float, state: InstanceState = InstanceState.COMPLETED, **kw: Any
) -> str:
    """An instance with one step row, ended ``state`` at ``when`` seconds after T0."""
    iid = await _make(stores, **kw)
    await stores.journal.commit(commit(iid, token=1, now=when - 1, step=step(1)))
    await stores.journal.commit(commit(iid, token=1, now=when, state=state, error=None))
    return iid


async def _expired(stores: Any, before: float, **kw: Any) -> list[Any]:
    return list(
        await stores.retention.expired(
            flow_id=kw.pop("flow_id", None),
            states=kw.pop("states", ENDED),
            ended_before=at(before),
            limit=kw.pop("limit", 100),
            **kw,
        )
    )


class RetentionStoreConformance:
    """Needs a ``stores`` fixture yielding opened ``Stores``."""

    async def test_the_policies_are_seeded_and_can_be_set(self, stores: Any) -> None:
        seeded = {
            (p.flow_id, p.state_class): p.retain_for for p in await stores.retention.policies()
        }
        assert seeded == {
            ("*", "Completed"): timedelta(days=30),
            ("*", "Failed"): timedelta(days=180),
            ("*", "Suspended"): None,
            ("*", "OutboxPublished"): timedelta(days=7),
        }
        await stores.retention.set_policy(
            RetentionPolicy(flow_id="billing", state_class="Completed", retain_for=None)
        )
        await stores.retention.set_policy(
            RetentionPolicy(flow_id="*", state_class="Completed", retain_for=timedelta(days=2))
        )
        now = {(p.flow_id, p.state_class): p.retain_for for p in await stores.retention.policies()}
        assert now[("billing", "Completed")] is None
        assert now[("*", "Completed")] == timedelta(days=2)

    async def test_ended_instances_are_found_oldest_first_and_paged(self, stores: Any) -> None:
        old = [await _ended(stores, t) for t in (10, 20, 30)]
        await _ended(stores, 50)  # not expired at 40
        await _make(stores)  # still running
        failed = await _ended(stores, 15, InstanceState.CANCELLED)
        page = await _expired(stores, 40, limit=2)
        assert [e.instance_id for e in page] == [old[0], failed]
        rest = await _expired(
            stores, 40, after=(page[-1].updated_at, page[-1].instance_id), limit=10
        )
        assert [e.instance_id for e in rest] == old[1:]
        completed = await _expired(stores, 40, states=(InstanceState.COMPLETED,))
        assert [e.instance_id for e in completed] == old
        assert all(e.held_by is None for e in page + rest)

    async def test_a_flow_is_found_alone_or_skipped(self, stores: Any) -> None:
        mine = await _ended(stores, 10, flow_id="billing")
        other = await _ended(stores, 10)
        assert [e.instance_id for e in await _expired(stores, 40, flow_id="billing")] == [mine]
        skipped = await _expired(stores, 40, skip_flows=["billing"])
        assert [e.instance_id for e in skipped] == [other]

    async def test_an_instance_is_held_back_while_it_owes_an_event_or_a_parent_lives(
        self, stores: Any
    ) -> None:
        unpublished = await _make(stores)
        await stores.journal.commit(
            commit(
                unpublished,
                token=1,
                now=5,
                step=step(1),
                state=InstanceState.COMPLETED,
                events=(event(),),
            )
        )
        parent = await _make(stores)
        child = await _ended(
            stores, 6, parent_instance_id=parent, parent_scope="", parent_step_id=1
        )
        held = {e.instance_id: e.held_by for e in await _expired(stores, 40)}
        assert held == {unpublished: UNPUBLISHED, child: PARENT_KEPT}, held
        assert await stores.retention.delete(await _expired(stores, 40)) == 0

        # Published, but a declared consumer has not read it yet.
        async with stores.outbox.claim(limit=10, now=at(7), owner="p") as claim:
            claim.published(len(claim.events))
        await stores.changes.subscribe("audit", now=at(0), from_start=False)
        read = await _make(stores)
        await stores.journal.commit(
            commit(
                read,
                token=1,
                now=8,
                step=step(1),
                state=InstanceState.COMPLETED,
                events=(event(),),
            )
        )
        async with stores.outbox.claim(limit=10, now=at(9), owner="p") as claim:
            claim.published(len(claim.events))
        held = {e.instance_id: e.held_by for e in await _expired(stores, 40)}
        assert held[read] == UNREAD
        assert held[unpublished] is None  # staged before the consumer subscribed

    async def test_contents_are_everything_the_journal_holds_of_an_instance(
        self, stores: Any
    ) -> None:
        iid = await _make(stores)
        await stores.waits.signal(iid, "go", '{"a":1}', key="k", now=at(2))
        await stores.journal.commit(
            commit(iid, token=1, now=3, step=step(1), events=(event(), event()))
        )
        await stores.journal.commit(commit(iid, token=1, now=4, state=InstanceState.FAILED))
        [got] = await stores.retention.contents([iid, "00000000-0000-4000-8000-000000000000"])
        assert got.instance == await stores.journal.get(iid)
        assert list(got.steps) == list(await stores.journal.steps(iid))
        assert [s.payload for s in got.signals] == ['{"a":1}']
        staged = await stores.journal.events(iid)
        assert [(e.event_id, e.payload, e.sequence) for e in got.events] == [
            (e.event_id, e.payload, e.sequence) for e in staged
        ]
        assert len(got.events) == 2

    async def test_a_delete_removes_what_was_found_with_its_rows_and_nothing_changed_since(
        self, stores: Any
    ) -> None:
        gone = await _make(stores)
        await stores.waits.signal(gone, "go", "{}", key="k", now=at(1))
        lease = await stores.leases.acquire(gone, owner="n", ttl=timedelta(seconds=5), now=at(2))
        assert lease is not None
        await stores.journal.commit(
            commit(gone, token=lease.token, now=10, step=step(1), state=InstanceState.COMPLETED)
        )
        moved = await _ended(stores, 12, InstanceState.FAILED)
        page = await _expired(stores, 40)
        # A replay re-opens ``moved`` after the page was read: it is not deleted.
        await stores.waits.rearm(moved, token=1, now=at(20), from_step=1)
        assert await stores.retention.delete(page) == 1
        assert await stores.journal.get(gone) is None
        assert list(await stores.journal.steps(gone)) == []
        assert list(await stores.waits.signals(gone, "go")) == []
        assert await stores.leases.current(gone) is None
        assert (await stores.journal.get(moved)).state is InstanceState.PENDING

    async def test_racing_deletes_delete_each_instance_once(self, stores: Any) -> None:
        for t in range(10, 30):
            await _ended(stores, t)
        page = await _expired(stores, 40)
        counts = await asyncio.gather(*(stores.retention.delete(page) for _ in range(4)))
        assert sum(counts) == 20
        assert await _expired(stores, 40) == []

    async def test_a_child_goes_after_its_parent(self, stores: Any) -> None:
        """A parent that ended may still be replayed and undo its completed child: the child
        is kept while the parent is in the journal, and goes at the next page after it."""
        parent = await _ended(stores, 5, InstanceState.COMPENSATION_FAILED)
        child = await _ended(
            stores, 4, parent_instance_id=parent, parent_scope="", parent_step_id=1
        )
        held = {e.instance_id: e.held_by for e in await _expired(stores, 40)}
        assert held == {child: PARENT_KEPT, parent: None}
        assert await stores.retention.delete(await _expired(stores, 40)) == 1
        assert await stores.journal.get(parent) is None
        [free] = await _expired(stores, 40)
        assert (free.instance_id, free.held_by) == (child, None)
        assert await stores.retention.delete([free]) == 1
