"""``DurableLease``: it renews every TTL/3 and fails closed (R3.2, STYLE 5).

On test time, not real time: a ``FakeClock`` stands in for the lease module's
``time.monotonic()`` and for the event loop's clock (which the ``LeaseKeeper``'s renewal
rounds wait on), so a realistic 30 s TTL passes in a few milliseconds and no test sleeps
against a sub-second TTL hoping the machine is not loaded.
"""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

import flowx
import flowx.hosting.lease
from flowx.hosting.lease import DurableLease, LeaseKeeper
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


class _ReleasesFail:
    """The memory lease store, but its first ``failures`` releases go unanswered (a restart
    of the store while a run hands its lease back); ``errors`` instead scripts what each
    release in turn raises (``None``: it lands)."""

    def __init__(
        self,
        inner: MemoryStores,
        failures: int = 0,
        errors: list[BaseException | None] | None = None,
    ) -> None:
        self.inner = inner.leases
        self.script = errors or [flowx.JournalUnavailable("lease store restarting")] * failures
        self.calls = 0
        self.gate: asyncio.Event | None = None

    async def renew_many(self, *args: Any, **kw: Any) -> Any:
        return await self.inner.renew_many(*args, **kw)

    async def release(self, *args: Any, **kw: Any) -> None:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.calls <= len(self.script) and (error := self.script[self.calls - 1]) is not None:
            raise error
        await self.inner.release(*args, **kw)


def _keeper(store: _ReleasesFail, clock: FakeClock) -> LeaseKeeper:
    return LeaseKeeper(store, ttl=TTL, renew_every=TTL / 3, clock=clock).start()  # type: ignore[arg-type]


async def _kept(
    store: _ReleasesFail, iid: str, clock: FakeClock, keeper: LeaseKeeper
) -> DurableLease:
    """A lease held under a node's shared keeper, as a host holds every lease."""
    lease = await store.inner.acquire(iid, owner="n1", ttl=TTL, now=clock.now())
    assert lease is not None
    return DurableLease(
        store,  # type: ignore[arg-type]
        lease,
        ttl=TTL,
        renew_every=TTL / 3,
        clock=clock,
        keeper=keeper,
    ).start()


@pytest.fixture
async def stopped() -> AsyncIterator[list[LeaseKeeper]]:
    """Keepers stopped after the test, whether it passed or not (no task outlives it)."""
    keepers: list[LeaseKeeper] = []
    yield keepers
    for keeper in keepers:
        await keeper.stop()


async def test_an_unanswered_release_is_sent_again_once_the_store_answers(
    clock: FakeClock, stopped: list[LeaseKeeper]
) -> None:
    """A release lost to a store restart must not keep the instance from every other node for
    the rest of the TTL (a ``Pending`` start would wait 30 s): it is sent again and lands."""
    stores = MemoryStores()
    store = _ReleasesFail(stores, failures=3)
    keeper = _keeper(store, clock)
    stopped.append(keeper)
    held = await _kept(store, "d", clock, keeper)
    await held.release()  # unanswered: the lease is still live in the store
    assert await stores.leases.acquire("d", owner="n2", ttl=TTL, now=clock.now()) is None
    assert keeper.owed == 1
    await pass_time(clock, 3.0)  # well inside the TTL
    assert store.calls == 4  # three unanswered, then the one that landed
    assert keeper.owed == 0
    taken = await stores.leases.acquire("d", owner="n2", ttl=TTL, now=clock.now())
    assert taken is not None and taken.token == 2


async def test_a_lease_held_for_several_ttls_is_still_released_again(
    clock: FakeClock, stopped: list[LeaseKeeper]
) -> None:
    """Its renewals move the moment it would run out by itself: a run that held its lease for
    longer than a TTL gets its unanswered release sent again too."""
    stores = MemoryStores()
    store = _ReleasesFail(stores, failures=1)
    keeper = _keeper(store, clock)
    stopped.append(keeper)
    held = await _kept(store, "long", clock, keeper)
    await pass_time(clock, 3 * TTL.total_seconds())  # renewed all along
    assert keeper.rounds >= 6
    await held.release()
    await pass_time(clock, 1.0)
    assert store.calls == 2
    assert await stores.leases.acquire("long", owner="n2", ttl=TTL, now=clock.now()) is not None


async def test_an_owed_release_stops_once_the_lease_has_run_out(
    clock: FakeClock, stopped: list[LeaseKeeper]
) -> None:
    """Never answered: it is given up once the lease has run out by itself, and the newer
    lease another node then takes is left alone."""
    stores = MemoryStores()
    store = _ReleasesFail(stores, failures=10**6)
    keeper = _keeper(store, clock)
    stopped.append(keeper)
    held = await _kept(store, "e", clock, keeper)
    await held.release()
    await pass_time(clock, TTL.total_seconds() + 2)
    assert keeper.owed == 0
    tried = store.calls
    assert 1 < tried < 60  # sent again, about once a second at most, then given up
    taken = await stores.leases.acquire("e", owner="n2", ttl=TTL, now=clock.now())
    assert taken is not None
    await pass_time(clock, 5.0)
    assert store.calls == tried
    assert (await stores.leases.current("e")).owner == "n2"


async def test_a_release_failing_on_something_else_is_given_up_and_the_keeper_stops_cleanly(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """An error the store does not name as an outage (a driver error it did not translate,
    a bug) is logged and not sent again; the other owed releases and the keeper's own stop
    are not disturbed by it."""
    stores = MemoryStores()
    store = _ReleasesFail(
        stores,
        errors=[
            flowx.JournalUnavailable("restarting"),
            flowx.JournalUnavailable("restarting"),
            RuntimeError("read-only after a failover"),
            None,
        ],
    )
    keeper = _keeper(store, clock)
    other = await _kept(store, "held", clock, keeper)  # keeps the renewal loop running
    first = await _kept(store, "g", clock, keeper)
    second = await _kept(store, "h", clock, keeper)
    with caplog.at_level(logging.ERROR, logger="flowx.lease"):
        await first.release()
        await second.release()
        await pass_time(clock, 3.0)
    assert store.calls == 4  # two unanswered; then one given up, one landed
    assert keeper.owed == 0
    assert "not released; it will expire" in caplog.text
    assert "read-only after a failover" in caplog.text
    await keeper.stop()  # does not raise
    assert keeper.held == 1 and keeper._task is None
    await other.release()


@pytest.mark.parametrize("budget", [1.0, 0.0], ids=["drain-budget", "no-budget"])
async def test_a_stopping_node_gives_owed_releases_one_last_try_within_its_budget(
    clock: FakeClock, stopped: list[LeaseKeeper], budget: float
) -> None:
    """With time left in the drain an owed release is sent once more, at once; with none,
    it is not sent again: the lease runs out by itself."""
    stores = MemoryStores()
    store = _ReleasesFail(stores, failures=1)
    keeper = _keeper(store, clock)
    stopped.append(keeper)
    held = await _kept(store, "f", clock, keeper)
    await held.release()
    await keeper.stop(owed_within=budget)
    await pass_time(clock, 3.0)
    assert store.calls == (2 if budget else 1)
    assert keeper.owed == 0
    taken = await stores.leases.acquire("f", owner="n2", ttl=TTL, now=clock.now())
    assert (taken is not None) == bool(budget)


async def test_a_release_unanswered_while_the_keeper_stops_is_not_kept_owed(
    clock: FakeClock, stopped: list[LeaseKeeper]
) -> None:
    store = _ReleasesFail(MemoryStores(), failures=1)
    store.gate = asyncio.Event()
    keeper = _keeper(store, clock)
    stopped.append(keeper)
    held = await _kept(store, "y", clock, keeper)
    releasing = asyncio.create_task(held.release())
    await asyncio.sleep(0)
    await keeper.stop()
    store.gate.set()
    await releasing
    assert keeper.owed == 0
    await pass_time(clock, 3.0)
    assert store.calls == 1
