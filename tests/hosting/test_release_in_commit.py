"""A run's terminal commit ends its lease in the same write where the journal keeps the
leases (``CommitReleases``): no release round trip follows. Where the leases live elsewhere
(a journal paired with another lease store), the run releases as before."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import flowx
from flowx.stores.records import InstanceState
from flowx.testing import FakeClock
from tests.engine.kit import Ledger, Order, until_state
from tests.engine.kit import fresh_ledgers as _reset  # noqa: F401 - autouse

ledger = Ledger("release")
work = ledger.capability("work", returns=lambda order: order.order_id)


def one_step() -> flowx.Plan:
    return flowx.flow("release.one", version="1", input=Order).step(work).build()


def count_releases(leases: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    released: list[str] = []
    real = leases.release

    async def counting(lease: Any, *, now: Any) -> None:
        released.append(lease.instance_id)
        await real(lease, now=now)

    monkeypatch.setattr(leases, "release", counting)
    return released


async def _nothing() -> None:
    return None


async def test_a_completed_run_sends_no_release_of_its_own(
    host_factory: Any, memory_store: Any, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    released = count_releases(memory_store.leases, monkeypatch)
    plan = one_step()
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="r1"))
    await until_state(host, handle.instance_id, InstanceState.COMPLETED)
    assert released == []
    lease = await memory_store.leases.current(handle.instance_id)
    assert lease.expires_at <= clock.now()  # ended by the commit: free for anyone at once


async def test_with_leases_kept_elsewhere_the_run_still_releases(
    host_factory: Any, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    leases = flowx.memory().leases
    released = count_releases(leases, monkeypatch)
    # What a lease store of its own has to open and close (this one is a test's own object).
    leases.open, leases.close, leases.describe = _nothing, _nothing, lambda: "memory leases"
    paired = flowx.with_leases(flowx.memory(), leases)
    plan = one_step()
    host = await host_factory(plan, store=paired)
    handle = await host.start(plan, Order(order_id="r2"))
    await until_state(host, handle.instance_id, InstanceState.COMPLETED)
    assert released == [handle.instance_id]
    assert (await leases.current(handle.instance_id)).expires_at <= clock.now()


async def test_a_result_waits_for_the_commit_not_for_the_release_after_it(
    host_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outcome is settled once the terminal commit lands: a caller waiting on the handle
    has it while the lease release is still on its way (one round trip less on its path),
    and the run still releases, and ends, once that release is through."""
    leases = flowx.memory().leases
    real = leases.release
    held = asyncio.Event()
    sent: list[str] = []

    async def held_release(lease: Any, *, now: Any) -> None:
        sent.append(lease.instance_id)
        await held.wait()
        await real(lease, now=now)

    monkeypatch.setattr(leases, "release", held_release)
    leases.open, leases.close, leases.describe = _nothing, _nothing, lambda: "memory leases"
    plan = one_step()
    host = await host_factory(plan, store=flowx.with_leases(flowx.memory(), leases))
    handle = await host.start(plan, Order(order_id="r3"))
    # Bounded only so that a regression fails instead of hanging: the release is held.
    await asyncio.wait_for(handle.result(), timeout=10)  # raises unless Completed
    assert (await host.get(handle.instance_id)).state is InstanceState.COMPLETED
    assert host.in_flight == 1  # the run is still releasing: it cannot end before that
    held.set()
    await host.wait_idle(timeout=30)
    assert sent == [handle.instance_id] and host.in_flight == 0
