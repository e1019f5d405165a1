"""``DurableLease``: it renews every TTL/3 and fails closed (R3.2, STYLE 5).

On test time, not real time: a ``FakeClock`` stands in for the lease module's
``time.monotonic()`` and for the event loop's clock (which the ``LeaseKeeper``'s renewal
rounds wait on), so a realistic 30 s TTL passes in a few milliseconds and no test sleeps
against a sub-second TTL hoping the machine is not loaded.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

import flowx
import flowx.hosting.lease
from flowx.hosting.lease import DurableLease
from flowx.stores.errors import LeaseLost
from flowx.stores.memory import MemoryStores
from flowx.testing import FakeClock

TTL = timedelta(seconds=30)


@pytest.fixture
async def clock(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeClock]:
    """Test time for the lease module and for this test's event loop."""
    loop = asyncio.get_running_loop()
    fake = FakeClock(monotonic_start=loop.time())
    monkeypatch.setattr(
        flowx.hosting.lease, "time", types.SimpleNamespace(monotonic=fake.monotonic)
    )
    monkeypatch.setattr(loop, "time", fake.monotonic)
    yield fake


async def pass_time(clock: FakeClock, seconds: float) -> None:
    """Move test time on in small steps, letting the keeper run its due rounds at each."""

    async def settle() -> None:
        for _ in range(10):  # a renewal round is a few awaits on the memory store
            await asyncio.sleep(0)

    await settle()  # what is ready now (a keeper just started) runs at the current time
    steps = 20
    for _ in range(steps):
        clock.advance(seconds=seconds / steps)
        await settle()


async def _held(stores: MemoryStores, iid: str, clock: FakeClock) -> DurableLease:
    lease = await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=clock.now())
    assert lease is not None
    return DurableLease(stores.leases, lease, ttl=TTL, renew_every=TTL / 3, clock=clock).start()


async def test_a_live_lease_renews_itself_past_its_ttl(clock: FakeClock) -> None:
    stores = MemoryStores()
    held = await _held(stores, "a", clock)
    first_expiry = (await stores.leases.current("a")).expires_at
    await pass_time(clock, TTL.total_seconds() * 2)
    assert held.live
    assert held.token == 1
    assert (await stores.leases.current("a")).expires_at > first_expiry
    assert await stores.leases.acquire("a", owner="n2", ttl=TTL, now=clock.now()) is None
    await held.release()


async def test_a_refused_renewal_makes_the_token_unreachable(clock: FakeClock) -> None:
    stores = MemoryStores()
    held = await _held(stores, "b", clock)
    # Another node takes the instance (as after a partition): the next renewal is refused.
    current = await stores.leases.current("b")
    await stores.leases.release(current, now=clock.now())
    taken = await stores.leases.acquire("b", owner="n2", ttl=TTL, now=clock.now())
    assert taken is not None
    await pass_time(clock, TTL.total_seconds() / 3 + 0.2)
    assert not held.live
    with pytest.raises(LeaseLost):
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


async def test_a_lease_that_cannot_be_renewed_is_lost_before_it_could_expire(
    clock: FakeClock,
) -> None:
    stores = MemoryStores()
    lease = await stores.leases.acquire("c", owner="n1", ttl=TTL, now=clock.now())
    assert lease is not None
    held = DurableLease(
        _Unreachable(stores),  # type: ignore[arg-type]
        lease,
        ttl=TTL,
        renew_every=TTL / 3,
        clock=clock,
    ).start()
    assert held.token == lease.token
    await pass_time(clock, TTL.total_seconds())
    # Fail closed: with no renewal confirmed, the token is gone before the store's expiry
    # could hand the instance to anyone else (a third of the TTL is left for clock skew).
    with pytest.raises(LeaseLost):
        _ = held.token
    await held.release()
