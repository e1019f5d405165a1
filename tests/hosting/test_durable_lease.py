"""``DurableLease`` in real time: it renews every TTL/3 and fails closed (R3.2, STYLE 5)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

import flowx
from flowx.clock import SystemClock
from flowx.stores.memory import MemoryStores

TTL = timedelta(seconds=0.9)


async def _held(stores: MemoryStores, iid: str) -> flowx.DurableLease:
    clock = SystemClock()
    lease = await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=clock.now())
    assert lease is not None
    return flowx.DurableLease(
        stores.leases, lease, ttl=TTL, renew_every=TTL / 3, clock=clock
    ).start()


async def test_a_live_lease_renews_itself_past_its_ttl() -> None:
    stores = MemoryStores()
    held = await _held(stores, "a")
    first_expiry = (await stores.leases.current("a")).expires_at
    await asyncio.sleep(TTL.total_seconds() * 2)
    assert held.live
    assert held.token == 1
    assert (await stores.leases.current("a")).expires_at > first_expiry
    clock = SystemClock()
    assert await stores.leases.acquire("a", owner="n2", ttl=TTL, now=clock.now()) is None
    await held.release()


async def test_a_refused_renewal_makes_the_token_unreachable() -> None:
    stores = MemoryStores()
    held = await _held(stores, "b")
    # Another node takes the instance (as after a partition): the next renewal is refused.
    current = await stores.leases.current("b")
    await stores.leases.release(current, now=SystemClock().now())
    taken = await stores.leases.acquire("b", owner="n2", ttl=TTL, now=SystemClock().now())
    assert taken is not None
    await asyncio.sleep(TTL.total_seconds() / 3 + 0.2)
    assert not held.live
    with pytest.raises(flowx.LeaseLost):
        _ = held.token
    await held.release()  # releasing a lost lease is inert and never ends the new owner's
    assert (await stores.leases.current("b")).token == taken.token


class _Unreachable:
    """A lease store that stops answering after the first acquisition."""

    def __init__(self, inner: MemoryStores) -> None:
        self.inner = inner

    async def renew(self, *args: object, **kw: object) -> None:
        raise flowx.LeaseUnavailable("lease store unreachable")

    async def renew_many(self, *args: object, **kw: object) -> None:
        raise flowx.LeaseUnavailable("lease store unreachable")

    async def release(self, *args: object, **kw: object) -> None:
        raise flowx.LeaseUnavailable("lease store unreachable")


async def test_a_lease_that_cannot_be_renewed_is_lost_before_it_could_expire() -> None:
    stores = MemoryStores()
    clock = SystemClock()
    lease = await stores.leases.acquire("c", owner="n1", ttl=TTL, now=clock.now())
    assert lease is not None
    held = flowx.DurableLease(
        _Unreachable(stores),
        lease,
        ttl=TTL,  # type: ignore[arg-type]
        renew_every=TTL / 3,
        clock=clock,
    ).start()
    assert held.token == lease.token
    await asyncio.sleep(TTL.total_seconds())
    # Fail closed: with no renewal confirmed, the token is gone before the store's expiry
    # could hand the instance to anyone else (a third of the TTL is left for clock skew).
    with pytest.raises(flowx.LeaseLost):
        _ = held.token
    await held.release()
