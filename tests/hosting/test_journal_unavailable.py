"""SPEC §8 "journal unavailable", on a real PostgreSQL cut off by a fault proxy.

    new durable flows refused with a clear, retryable error (HTTP 503); ephemeral flows
    unaffected

Every host here reaches PostgreSQL through ``tests.support.fault_proxy.FaultProxy``, so a test
can take the journal away (``refuse``: connections refused and open ones reset; ``blackhole``:
nothing answers) and give it back, while the host and its pool stay the same objects. With
``connect_timeout=2`` a refusal costs the caller at most about two seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
from pydantic import BaseModel

import flowx
from flowx.hosting.stores import postgres
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceState, Outcome
from flowx.testing import FakeClock
from tests.postgres_support import PG_DSN
from tests.support.fault_proxy import FaultProxy
from tests.support.hosts import fold_settings

T = TypeVar("T")

CONNECT_TIMEOUT = 2
#: The password is a decoy: the test server trusts loopback, so it is never asked for, but it
#: is in the DSN the store holds, and it must never reach an error message.
PASSWORD = "s3cret-Pa55"

calls: list[str] = []
gates: dict[str, asyncio.Event] = {}
entered: dict[str, asyncio.Event] = {}


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()
    gates.clear()
    entered.clear()


class Order(BaseModel):
    name: str


class OrderState(BaseModel):
    reservation: str | None = None
    held: str | None = None


class Quote(BaseModel):
    amount: int


class QuoteState(BaseModel):
    total: int | None = None


@flowx.capability("unavail.reserve", version="1.0.0")
async def reserve(ctx: flowx.StepContext, order: Order) -> str:
    calls.append(f"reserve:{order.name}")
    return f"RSV-{order.name}"


@flowx.capability("unavail.unreserve", version="1.0.0")
async def unreserve(ctx: flowx.StepContext, order: Order) -> None:
    calls.append(f"unreserve:{order.name}")  # compensation: must never run here (R3.5)


@flowx.capability("unavail.hold", version="1.0.0")
async def hold(ctx: flowx.StepContext, order: Order) -> str:
    calls.append(f"hold:{order.name}")
    started = entered.get(order.name)
    if started is not None:
        started.set()
    gate = gates.get(order.name)
    if gate is not None:
        await gate.wait()
    return f"HELD-{order.name}"


@flowx.capability("unavail.price", version="1.0.0")
async def price(ctx: flowx.StepContext, quote: Quote) -> int:
    calls.append(f"price:{quote.amount}")
    return quote.amount * 2


DURABLE = (
    flowx.flow("unavail.order", version="1.0.0", input=Order, state=OrderState)
    .step(reserve, into="reservation", compensate=unreserve)
    .step(hold, into="held")
    .build()
)
EPHEMERAL = (
    flowx.flow(
        "unavail.quote",
        version="1.0.0",
        input=Quote,
        state=QuoteState,
        profile=flowx.Ephemeral,
    )
    .step(price, into="total")
    .build()
)


def _via(proxy: FaultProxy, *, password: str | None = None) -> str:
    target = urlsplit(PG_DSN)
    user = target.username or "postgres"
    credentials = f"{user}:{password}" if password else user
    return f"postgresql://{credentials}@127.0.0.1:{proxy.port}{target.path}"


@pytest.fixture
async def proxy() -> AsyncIterator[FaultProxy]:
    target = urlsplit(PG_DSN)
    fault = FaultProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await fault.start()
    yield fault
    await fault.stop()


@pytest.fixture
async def make_host(
    proxy: FaultProxy, pg_schema: Callable[[], str]
) -> AsyncIterator[Callable[..., flowx.FlowHost]]:
    """Hosts whose journal is PostgreSQL through the proxy; not opened, drained afterwards."""
    hosts: list[flowx.FlowHost] = []

    def make(*, password: str | None = None, **kw: Any) -> flowx.FlowHost:
        store = postgres(
            _via(proxy, password=password),
            schema=pg_schema(),
            connect_timeout=CONNECT_TIMEOUT,
            min_size=1,
            max_size=4,
        )
        kw.setdefault("recovery", False)
        kw.setdefault("settings", flowx.HostSettings(lease_ttl="30s"))
        host = flowx.FlowHost(store=store, flows=[DURABLE, EPHEMERAL], **fold_settings(kw))
        hosts.append(host)
        return host

    yield make
    await proxy.forward()
    for host in hosts:
        await host.drain(timeout=2)


async def _when_back(call: Callable[[], Awaitable[T]], *, within: float = 15) -> T:
    """What a client does with a 503: retry until the journal answers."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await call()
        except flowx.JournalUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_a_durable_start_is_refused_with_a_retryable_503_while_ephemeral_flows_run(
    proxy: FaultProxy, make_host: Callable[..., flowx.FlowHost]
) -> None:
    """SPEC §8 journal unavailable: durable refused (503, retryable); ephemeral unaffected."""
    host = make_host(password=PASSWORD)
    await host.open()
    await proxy.refuse()

    # Twice: the first start meets the pooled connection the outage cut, the second an
    # empty pool that cannot reconnect. Both must be the same clear, bounded refusal.
    for n in range(2):
        began = time.monotonic()
        with pytest.raises(flowx.JournalUnavailable) as refused:
            await host.start(DURABLE, Order(name=f"refused-{n}"))
        assert time.monotonic() - began < CONNECT_TIMEOUT + 1.5  # bounded, not hanging
        error = refused.value
        assert error.retryable is True
        assert error.http_status == 503
        assert error.code == "store.journal_unavailable"
        assert PASSWORD not in str(error)
        assert "***" in str(error) and "unavailable" in str(error)
        assert not isinstance(error, flowx.DurabilityNotConfigured)
    assert calls == []  # nothing of the refused flows ran

    quote = await host.start(EPHEMERAL, Quote(amount=21))
    assert (await quote.result(timeout=5)).total == 42
    assert calls == ["price:21"]


async def test_the_same_host_starts_and_completes_durable_flows_once_the_journal_is_back(
    proxy: FaultProxy, make_host: Callable[..., flowx.FlowHost]
) -> None:
    """SPEC §8 journal unavailable: a refusal is retryable, on this host, with no restart."""
    host = make_host()
    await host.open()
    await proxy.refuse()
    with pytest.raises(flowx.JournalUnavailable):
        await host.start(DURABLE, Order(name="early"))

    await proxy.forward()
    handle = await _when_back(lambda: host.start(DURABLE, Order(name="later")))
    state = await handle.result(timeout=10)
    assert state == OrderState(reservation="RSV-later", held="HELD-later")
    assert (await host.get(handle.instance_id)).state is InstanceState.COMPLETED

    # The refused start left nothing behind: the journal holds only the one that ran.
    assert host.store is not None
    listed = await host.store.catalog.list_instances(InstanceQuery())
    assert [r.instance_id for r in listed] == [handle.instance_id]
    assert calls == ["reserve:later", "hold:later"]


async def _die_mid_step(
    proxy: FaultProxy, host: flowx.FlowHost, name: str
) -> flowx.FlowHandle[Any]:
    """Start an instance, cut the journal while its second step runs, let the step finish:
    its commit is the first write after the outage."""
    entered[name], gates[name] = asyncio.Event(), asyncio.Event()
    handle = await host.start(DURABLE, Order(name=name))
    await asyncio.wait_for(entered[name].wait(), 5)
    await proxy.refuse()
    gates[name].set()
    await host.wait_idle(timeout=CONNECT_TIMEOUT * 3)
    return handle


async def test_an_instance_whose_journal_dies_mid_run_is_not_failed_and_recovers_later(
    proxy: FaultProxy, make_host: Callable[..., flowx.FlowHost]
) -> None:
    """SPEC §8 journal unavailable mid-run: no Failed state, no compensation (R3.5); the
    instance is recovered from its last commit once the journal is back (R3.4, R2.8)."""
    clock = FakeClock()
    host = make_host(clock=clock)
    await host.open()
    handle = await _die_mid_step(proxy, host, "midrun")
    assert host.in_flight == 0  # the run stopped on this node
    assert calls == ["reserve:midrun", "hold:midrun"]

    await proxy.forward()
    record = await _when_back(lambda: host.get(handle.instance_id))
    assert record.state is InstanceState.RUNNING  # not Failed, not Compensating
    assert record.error is None
    assert host.store is not None
    steps = await host.store.journal.steps(handle.instance_id)
    # Only the first step's commit is in: the one attempted during the outage did not land.
    assert [(s.step_name, s.outcome) for s in steps] == [("unavail.reserve", Outcome.SUCCESS)]

    clock.advance(seconds=31)  # past the lease TTL: the scan sees it as abandoned
    scan = await _when_back(host.recover_once)
    assert scan.resumed == 1

    state = await handle.result(timeout=10)
    assert state == OrderState(reservation="RSV-midrun", held="HELD-midrun")
    final = await host.get(handle.instance_id)
    assert final.state is InstanceState.COMPLETED
    assert final.fence > record.fence  # taken over under a new token (R2.4)
    steps = await host.store.journal.steps(handle.instance_id)
    assert [(s.step_name, s.outcome) for s in steps] == [
        ("unavail.reserve", Outcome.SUCCESS),
        ("unavail.hold", Outcome.SUCCESS),
    ]
    # The committed step was replayed, the uncommitted one re-executed, nothing compensated.
    assert calls == ["reserve:midrun", "hold:midrun", "hold:midrun"]


async def test_a_commit_refused_mid_run_reaches_the_host_as_journal_unavailable(
    proxy: FaultProxy, make_host: Callable[..., flowx.FlowHost]
) -> None:
    """Drivers' exceptions never cross the store seam (stores/errors.py): a commit the outage
    stopped is ``JournalUnavailable`` — outcome unknown, re-read before re-executing."""
    host = make_host()
    await host.open()
    assert host.store is not None
    journal = host.store.journal
    raised: list[BaseException] = []
    commit = journal.commit

    async def recording(*args: Any, **kwargs: Any) -> Any:
        try:
            return await commit(*args, **kwargs)
        except BaseException as exc:
            raised.append(exc)
            raise

    journal.commit = recording  # type: ignore[method-assign]
    await _die_mid_step(proxy, host, "seam")
    assert len(raised) == 1
    assert isinstance(raised[0], flowx.JournalUnavailable), repr(raised[0])


@pytest.mark.parametrize("outage", ["refuse", "blackhole"])
async def test_a_host_opened_on_an_unreachable_journal_reconnects_by_itself(
    outage: str, proxy: FaultProxy, make_host: Callable[..., flowx.FlowHost]
) -> None:
    """SPEC §8 journal unavailable at start-up; R7.1 (stores reachable). ``open()`` returns
    within the connect timeout — refused or silent, it never hangs — the node is not ready and
    refuses durable work with a retryable 503, and it reconnects by itself."""
    await getattr(proxy, outage)()
    host = make_host()
    began = time.monotonic()
    await host.open()  # opens without the journal: it never hangs, and never dies of it
    assert time.monotonic() - began < CONNECT_TIMEOUT + 1.5
    assert not host.ready  # R7.1: up, but not ready for durable work
    with pytest.raises(flowx.JournalUnavailable) as refused:
        await host.start(DURABLE, Order(name=f"during-{outage}"))
    assert refused.value.retryable is True and refused.value.http_status == 503
    assert PASSWORD not in str(refused.value)

    await proxy.forward()
    await host.wait_ready(timeout=15)  # the same host reconnects: no rebuild, no restart
    assert host.ready
    handle = await host.start(DURABLE, Order(name=f"after-{outage}"))
    assert (await handle.result(timeout=10)).held == f"HELD-after-{outage}"


async def test_ephemeral_flows_run_on_a_host_booted_while_the_journal_is_down(
    proxy: FaultProxy, make_host: Callable[..., flowx.FlowHost]
) -> None:
    """SPEC §8 journal unavailable: "ephemeral flows unaffected" — also at boot."""
    await proxy.refuse()
    host = make_host()
    await host.open()
    assert not host.ready
    quote = await host.start(EPHEMERAL, Quote(amount=4))
    assert (await quote.result(timeout=5)).total == 8
