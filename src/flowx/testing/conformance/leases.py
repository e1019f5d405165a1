"""``LeaseStore`` conformance: exclusive, expiring, and tokens that never go back (R3.1)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flowx.stores.errors import FencedOut, LeaseLost
from flowx.stores.paired import PairedStores
from flowx.stores.protocols import CommitReleases, LeasedCreate, StoreClock
from flowx.stores.records import InstanceState
from flowx.testing.conformance._support import (
    at,
    commit,
    event,
    instance,
    make_instance,
    new_id,
    step,
)

TTL = timedelta(seconds=30)


class LeaseStoreConformance:
    """Subclass it where a ``stores`` fixture (class or module level) yields an opened,
    empty ``Stores``."""

    async def test_a_lease_can_be_taken_before_its_instance_exists(self, stores: Any) -> None:
        iid = new_id()
        lease = await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=at(0))
        assert lease is not None
        assert lease.token >= 1
        assert lease.owner == "n1"
        assert lease.expires_at == at(30)
        assert await stores.journal.get(iid) is None

    async def test_a_live_lease_excludes_every_other_acquirer(self, stores: Any) -> None:
        iid = new_id()
        assert await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=at(0)) is not None
        assert await stores.leases.acquire(iid, owner="n2", ttl=TTL, now=at(29)) is None
        assert await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=at(29)) is None

    async def test_tokens_rise_across_expiry_and_release(self, stores: Any) -> None:
        iid = new_id()
        first = await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=at(0))
        second = await stores.leases.acquire(iid, owner="n2", ttl=TTL, now=at(31))  # expired
        assert second is not None and second.token > first.token
        await stores.leases.release(second, now=at(32))
        third = await stores.leases.acquire(iid, owner="n3", ttl=TTL, now=at(33))
        assert third is not None and third.token > second.token
        current = await stores.leases.current(iid)
        assert current.token == third.token
        assert current.owner == "n3"

    async def test_the_lease_row_survives_release(self, stores: Any) -> None:
        iid = new_id()
        lease = await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=at(0))
        await stores.leases.release(lease, now=at(1))
        after = await stores.leases.current(iid)
        assert after is not None
        assert after.token == lease.token
        assert after.expires_at <= at(1)

    async def test_renew_extends_a_live_lease(self, stores: Any) -> None:
        iid = new_id()
        lease = await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=at(0))
        renewed = await stores.leases.renew(lease, ttl=TTL, now=at(20))
        assert renewed.token == lease.token
        assert renewed.expires_at == at(50)
        assert await stores.leases.acquire(iid, owner="n2", ttl=TTL, now=at(40)) is None

    async def test_a_stale_token_cannot_renew(self, stores: Any) -> None:
        iid = new_id()
        old = await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=at(0))
        new = await stores.leases.acquire(iid, owner="n2", ttl=TTL, now=at(31))
        with pytest.raises(LeaseLost):
            await stores.leases.renew(old, ttl=TTL, now=at(32))
        assert (await stores.leases.current(iid)).token == new.token

    async def test_an_expired_lease_cannot_renew(self, stores: Any) -> None:
        iid = new_id()
        lease = await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=at(0))
        with pytest.raises(LeaseLost):
            await stores.leases.renew(lease, ttl=TTL, now=at(30))

    async def test_a_released_lease_cannot_renew(self, stores: Any) -> None:
        iid = new_id()
        lease = await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=at(0))
        await stores.leases.release(lease, now=at(1))
        with pytest.raises(LeaseLost):
            await stores.leases.renew(lease, ttl=TTL, now=at(2))

    async def test_release_is_idempotent_and_a_stale_release_is_inert(self, stores: Any) -> None:
        iid = new_id()
        old = await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=at(0))
        new = await stores.leases.acquire(iid, owner="n2", ttl=TTL, now=at(31))
        await stores.leases.release(old, now=at(32))  # the zombie's release
        await stores.leases.release(old, now=at(33))
        assert await stores.leases.acquire(iid, owner="n3", ttl=TTL, now=at(34)) is None
        assert (await stores.leases.current(iid)).token == new.token

    async def test_release_lets_a_peer_in_at_once(self, stores: Any) -> None:
        iid = new_id()
        lease = await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=at(0))
        await stores.leases.release(lease, now=at(1))
        peer = await stores.leases.acquire(iid, owner="n2", ttl=TTL, now=at(1))
        assert peer is not None

    async def test_a_token_is_issued_above_the_floor(self, stores: Any) -> None:
        iid = new_id()
        first = await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=at(0), floor=41)
        assert first.token > 41
        await stores.leases.release(first, now=at(1))
        second = await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=at(2), floor=3)
        assert second.token > first.token

    async def test_tokens_are_per_instance(self, stores: Any) -> None:
        a, b = new_id(), new_id()
        la = await stores.leases.acquire(a, owner="n1", ttl=TTL, now=at(0))
        lb = await stores.leases.acquire(b, owner="n1", ttl=TTL, now=at(0))
        assert la is not None and lb is not None
        assert await stores.leases.current(new_id()) is None

    async def test_acquisition_raises_the_fence_and_the_old_token_is_fenced_out(
        self, stores: Any
    ) -> None:
        """R2.4: the fence rises on lease acquisition, before any write; a commit under the
        old token is refused with ``FencedOut`` and writes nothing.

        A lease store paired with another backend's journal (Redis leases) cannot raise the
        journal's fence itself: there the host passes the fence as the floor and the fence
        rises when the new owner opens the instance, before it reads anything (paired.py).
        """
        iid = await make_instance(stores, token=1)
        assert (await stores.journal.get(iid)).fence == 1
        paired: object = stores
        if isinstance(paired, PairedStores):
            lease = await stores.leases.acquire(iid, owner="node-b", ttl=TTL, now=at(1), floor=1)
            assert lease is not None and lease.token > 1
            await stores.journal.open(iid, token=lease.token, now=at(1))
        else:
            lease = await stores.leases.acquire(iid, owner="node-b", ttl=TTL, now=at(1))
            assert lease is not None and lease.token > 1
        assert (await stores.journal.get(iid)).fence == lease.token

        zombie = commit(
            iid,
            token=1,
            now=2,
            step=step(1),
            state_bag='{"zombie":true}',
            events=(event(),),
        )
        with pytest.raises(FencedOut) as refused:
            await stores.journal.commit(zombie)
        assert refused.value.fence == lease.token and refused.value.token == 1
        assert list(await stores.journal.steps(iid)) == []
        assert list(await stores.journal.events(iid)) == []
        assert (await stores.journal.get(iid)).state_bag == "{}"
        assert await stores.outbox.pending_count() == 0
        fresh = commit(iid, token=lease.token, now=3)
        assert await stores.journal.commit(fresh) is None

    async def test_a_leased_create_takes_lease_and_instance_in_one_write(self, stores: Any) -> None:
        """Only for stores that declare ``LeasedCreate``; the rest start in two writes."""
        declared: object = stores  # narrow a copy: `stores` keeps its other roles
        if not isinstance(declared, LeasedCreate):
            pytest.skip("this store does not declare LeasedCreate")
        iid = new_id()
        lease, created = await stores.create_leased(
            instance(iid, idempotency_key="lc-1"), owner="n1", ttl=TTL, now=at(0)
        )
        assert lease is not None and created is not None and created.created
        assert created.instance.fence == lease.token
        assert (await stores.leases.current(iid)).token == lease.token
        # Held by n1: a second start for the same id writes nothing.
        assert await stores.create_leased(
            instance(iid, input='{"x":2}'), owner="n2", ttl=TTL, now=at(1)
        ) == (None, None)
        assert (await stores.journal.get(iid)).input == created.instance.input
        # Released: the lease is granted again, higher, and the existing row is returned.
        await stores.leases.release(lease, now=at(2))
        again, existing = await stores.create_leased(
            instance(iid, input='{"x":3}'), owner="n2", ttl=TTL, now=at(3)
        )
        assert again is not None and again.token > lease.token
        assert existing is not None and not existing.created
        assert existing.instance.input == created.instance.input
        # Same idempotency key, another id: the first instance is returned.
        other, by_key = await stores.create_leased(
            instance(new_id(), idempotency_key="lc-1"), owner="n3", ttl=TTL, now=at(4)
        )
        assert other is not None and by_key is not None and not by_key.created
        assert by_key.instance.instance_id == iid

    async def test_renew_many_extends_live_leases_and_names_the_lost_ones(
        self, stores: Any
    ) -> None:
        """R9.1: a node renews all its leases in one call; a stale token or an expired lease
        comes back ``None`` in its place, and the rest are renewed."""
        live, stale, expired = new_id(), new_id(), new_id()
        a = await stores.leases.acquire(live, owner="n1", ttl=TTL, now=at(0))
        old = await stores.leases.acquire(stale, owner="n1", ttl=TTL, now=at(0))
        await stores.leases.release(old, now=at(1))
        newer = await stores.leases.acquire(stale, owner="n2", ttl=TTL, now=at(2))
        c = await stores.leases.acquire(expired, owner="n1", ttl=timedelta(seconds=5), now=at(0))
        renewed = await stores.leases.renew_many([a, old, c], ttl=TTL, now=at(20))
        assert len(renewed) == 3
        assert renewed[0] is not None and renewed[0].expires_at == at(50)
        assert renewed[0].token == a.token
        assert renewed[1] is None and renewed[2] is None
        assert (await stores.leases.current(stale)).token == newer.token  # untouched
        assert await stores.leases.renew_many([], ttl=TTL, now=at(21)) == []

    async def test_without_a_pinned_time_the_store_decides_by_its_own_clock(
        self, stores: Any
    ) -> None:
        """R9.2: ``now=None`` is the store's clock: a lease taken that way is live for the
        store whatever the caller's clock says, and expires a TTL after the store's now."""
        iid = new_id()
        lease = await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=None)
        assert lease is not None
        assert await stores.leases.acquire(iid, owner="n2", ttl=TTL, now=None) is None
        renewed = (await stores.leases.renew_many([lease], ttl=TTL, now=None))[0]
        assert renewed is not None and renewed.expires_at >= lease.expires_at
        await stores.leases.release(renewed, now=None)
        again = await stores.leases.acquire(iid, owner="n2", ttl=TTL, now=None)
        assert again is not None and again.token > lease.token
        clock: object = stores
        if isinstance(clock, StoreClock):
            reference = (await clock.store_clock())[-1][1]  # the lease store's clock is last
        else:
            reference = datetime.now(UTC)  # stores in this process share its clock
        assert abs(again.expires_at - (reference + TTL)) < timedelta(seconds=5)

    async def test_a_terminal_commit_can_end_its_lease_in_the_same_write(self, stores: Any) -> None:
        """``CommitReleases``: a commit with ``release_lease`` ends the lease its token names
        (the next acquirer needs no wait); one the fence refuses ends nothing. Many at once
        (a group commit on PostgreSQL) each end their own."""
        declared: object = stores
        if not (isinstance(declared, CommitReleases) and declared.commit_releases_lease()):
            pytest.skip("this store does not declare CommitReleases")
        iid = new_id()
        lease = await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=at(0))
        await stores.journal.create(instance(iid), token=lease.token, now=at(0))
        done = commit(
            iid, token=lease.token, now=1, state=InstanceState.COMPLETED, release_lease=True
        )
        await stores.journal.commit(done)
        assert (await stores.leases.current(iid)).expires_at == at(1)
        again = await stores.leases.acquire(iid, owner="n2", ttl=TTL, now=at(2))
        assert again is not None and again.token > lease.token
        # A stale holder's releasing commit is refused, and the live lease stays live.
        stale = commit(
            iid, token=lease.token, now=3, state=InstanceState.FAILED, release_lease=True
        )
        with pytest.raises(FencedOut):
            await stores.journal.commit(stale)
        assert (await stores.leases.current(iid)).expires_at == again.expires_at
        # Without the flag a commit leaves the lease alone.
        await stores.journal.commit(commit(iid, token=again.token, now=4, step=step(1)))
        assert (await stores.leases.current(iid)).expires_at == again.expires_at
        # Many at once: each ends its own lease, and only its own.
        many = [new_id() for _ in range(24)]
        leases = [await stores.leases.acquire(i, owner="n1", ttl=TTL, now=at(0)) for i in many]
        for i, held in zip(many, leases, strict=True):
            await stores.journal.create(instance(i), token=held.token, now=at(0))
        ending = [
            commit(
                i, token=held.token, now=5, state=InstanceState.COMPLETED, release_lease=n % 2 == 0
            )
            for n, (i, held) in enumerate(zip(many, leases, strict=True))
        ]
        await asyncio.gather(*(stores.journal.commit(c) for c in ending))
        for n, i in enumerate(many):
            expected = at(5) if n % 2 == 0 else at(30)
            assert (await stores.leases.current(i)).expires_at == expected, n

    async def test_leased_creates_at_once_each_get_their_own_outcome(self, stores: Any) -> None:
        """Starts that arrive together (group-created on PostgreSQL) each get their lease and
        row; one whose lease is live elsewhere gets neither; one whose key already has a row
        gets its lease and that row."""
        declared: object = stores
        if not isinstance(declared, LeasedCreate):
            pytest.skip("this store does not declare LeasedCreate")
        held = new_id()
        assert await stores.leases.acquire(held, owner="other", ttl=TTL, now=at(0)) is not None
        known = instance(new_id(), idempotency_key="together-1")
        first, made = await declared.create_leased(known, owner="n0", ttl=TTL, now=at(0))
        assert first is not None and made is not None and made.created
        await stores.leases.release(first, now=at(0))
        fresh = [
            instance(new_id(), input=f'{{"n":{n}}}', trace_context=f"00-{n:032x}-{n:016x}-01")
            for n in range(20)
        ]
        again = instance(new_id(), idempotency_key="together-1")
        starts = [*fresh, instance(held), again]
        outcomes = await asyncio.gather(
            *(declared.create_leased(s, owner="n1", ttl=TTL, now=at(1)) for s in starts)
        )
        for start, (lease, result) in zip(fresh, outcomes, strict=False):
            assert lease is not None and result is not None and result.created
            assert result.instance.instance_id == start.instance_id
            assert result.instance.input == start.input
            assert result.instance.trace_context == start.trace_context  # batched or alone
            assert result.instance.fence == lease.token
            assert (await stores.leases.current(start.instance_id)).owner == "n1"
        assert outcomes[-2] == (None, None)
        assert await stores.journal.get(held) is None
        lease, existing = outcomes[-1]
        assert lease is not None and existing is not None and not existing.created
        assert existing.instance.instance_id == known.instance_id
