"""A signal by correlation id (issue 18 item 2; R2.10, R6.1): the rule of
``flowx.hosting.correlation`` — one live instance gets it, none at all is unknown, only ended
ones give the newest (a keyed redelivery is a duplicate), several live ones are ambiguous —
through the broker-neutral dispatcher on the memory store, then end to end on the real
RabbitMQ: a start carrying ``flowx-correlation`` is found again by a signal naming only it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import pytest

from flowx import metrics
from flowx.errors import CorrelationAmbiguous, CorrelationNotFound
from flowx.hosting.correlation import resolve_correlation
from flowx.ingress import Dead, Delivery, IngressDispatcher, Signalled
from flowx.ingress.rabbitmq import RabbitMQIngress
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceState
from flowx.testing import FakeClock
from tests.ingress.flows import FLOWS
from tests.ingress.rabbit import TestQueue, own_queue
from tests.support.polling import until

MakeHost = Callable[..., Any]


def by_correlation(correlation: str, *, key: str = "s-1", amount: int = 1) -> Delivery:
    return Delivery(
        body=json.dumps({"amount": amount}).encode(),
        message_id=key,
        headers={"flowx-signal": "paid", "flowx-correlation": correlation},
        subject="shop.signals",
    )


async def _waiting(host: Any, order_id: str, correlation: str, clock: FakeClock) -> str:
    """A started ``ing.wait`` instance, Suspended on its signal; the clock moves on after it
    so the next start is strictly newer (``created_at`` orders "newest")."""
    handle = await host.start(
        "ing.wait", {"order_id": order_id}, idempotency_key=order_id, correlation_id=correlation
    )

    async def suspended() -> bool:
        return bool((await host.get(handle.instance_id)).state is InstanceState.SUSPENDED)

    await until(suspended, within=10, what=f"{order_id} waits for its signal")
    clock.advance(timedelta(seconds=1))
    return str(handle.instance_id)


async def _terminated(host: Any, instance_id: str) -> None:
    await host.terminate(instance_id, "ended before its signal came")

    async def ended() -> bool:
        return bool((await host.get(instance_id)).state.terminal)

    await until(ended, within=10, what="the terminated instance ends")


@pytest.fixture
async def dispatcher(host_factory: MakeHost) -> IngressDispatcher:
    return IngressDispatcher(await host_factory(*FLOWS))


async def test_the_one_live_instance_with_the_correlation_id_gets_the_signal(
    dispatcher: IngressDispatcher, clock: FakeClock
) -> None:
    host = dispatcher.host
    old = await _waiting(host, "c-old", "order-1", clock)
    await _terminated(host, old)
    live = await _waiting(host, "c-live", "order-1", clock)
    await _waiting(host, "c-other", "order-2", clock)
    assert await dispatcher.handle(by_correlation("order-1")) == Signalled(live, "woken")
    assert await dispatcher.handle(by_correlation("order-1")) == Signalled(live, "duplicate")
    assert len(await host.store.waits.signals(old, "paid")) == 0


async def test_only_ended_instances_give_the_newest_a_keyed_redelivery_is_a_duplicate(
    dispatcher: IngressDispatcher, clock: FakeClock
) -> None:
    host = dispatcher.host
    older = await _waiting(host, "e-1", "order-3", clock)
    newest = await _waiting(host, "e-2", "order-3", clock)
    await _terminated(host, older)
    assert await dispatcher.handle(by_correlation("order-3", key="k")) == Signalled(newest, "woken")

    async def completed() -> bool:
        return bool((await host.get(newest)).state is InstanceState.COMPLETED)

    await until(completed, within=10, what="the signalled instance completes")
    # Both ended now: the same key again is the sender's retry, a duplicate.
    assert await dispatcher.handle(by_correlation("order-3", key="k")) == Signalled(
        newest, "duplicate"
    )
    fresh = await dispatcher.handle(by_correlation("order-3", key="another"))
    assert isinstance(fresh, Dead) and fresh.code == "ingress.instance_finished", fresh
    assert newest in fresh.reason


async def test_no_instance_is_unknown_and_several_live_ones_are_ambiguous(
    dispatcher: IngressDispatcher, clock: FakeClock
) -> None:
    host = dispatcher.host
    unknown = await dispatcher.handle(by_correlation("order-none"))
    assert isinstance(unknown, Dead) and unknown.code == "ingress.unknown_instance", unknown
    assert "'order-none'" in unknown.reason
    first = await _waiting(host, "a-1", "order-4", clock)
    second = await _waiting(host, "a-2", "order-4", clock)
    await _waiting(host, "a-3", "order-4", clock)
    ambiguous = await dispatcher.handle(by_correlation("order-4"))
    assert isinstance(ambiguous, Dead) and ambiguous.code == "ingress.ambiguous_correlation"
    assert "names 3 flow instances" in ambiguous.reason, ambiguous
    for instance_id in (first, second):
        assert len(await host.store.waits.signals(instance_id, "paid")) == 0
    with pytest.raises(CorrelationAmbiguous) as refused:
        await resolve_correlation(host.store.catalog, "order-4")
    assert refused.value.live == 3
    with pytest.raises(CorrelationNotFound):
        await resolve_correlation(host.store.catalog, "order-none")


async def test_an_instance_header_wins_over_a_correlation_header(
    dispatcher: IngressDispatcher, clock: FakeClock
) -> None:
    host = dispatcher.host
    named = await _waiting(host, "h-1", "order-5", clock)
    await _waiting(host, "h-2", "order-5", clock)  # the correlation alone is ambiguous
    delivery = by_correlation("order-5")
    headers = {**delivery.headers, "flowx-instance": named}
    verdict = await dispatcher.handle(
        Delivery(body=delivery.body, message_id="s-h", headers=headers, subject="shop.signals")
    )
    assert verdict == Signalled(named, "woken")


# -- end to end on the real RabbitMQ ---------------------------------------------------------


@pytest.fixture
async def queue() -> AsyncIterator[TestQueue]:
    async with own_queue() as made:
        await made.declare()
        yield made


async def test_over_rabbitmq_a_signal_by_correlation_wakes_the_instance_a_start_named(
    queue: TestQueue, host_factory: MakeHost
) -> None:
    host = await host_factory(*FLOWS)
    consumer = RabbitMQIngress(queue.url())
    await consumer.start(IngressDispatcher(host))
    try:
        corr = {"flowx-correlation": "po-77"}
        await queue.publish(
            {"order_id": "r-1"}, message_id="start-r-1", routing_key="shop.ing.wait", headers=corr
        )

        async def waiting() -> list[Any]:
            found = await host.store.catalog.list_instances(_query("po-77"))
            return [r for r in found if r.state is InstanceState.SUSPENDED]

        await until(waiting, within=20, what="the started instance waits for its signal")
        [record] = await waiting()
        signal = {"flowx-signal": "paid", **corr}
        before = metrics.INGRESS_MESSAGES.get("signalled")
        for _ in range(2):  # the second is a redelivery: same message id, so same key
            await queue.publish(
                {"amount": 3}, message_id="pay-77", routing_key="shop.pay", headers=signal
            )

        async def both_handled() -> bool:
            return bool(metrics.INGRESS_MESSAGES.get("signalled") == before + 2)

        await until(both_handled, within=20, what="both signal messages are handled")

        async def completed() -> bool:
            return bool((await host.get(record.instance_id)).state is InstanceState.COMPLETED)

        await until(completed, within=20, what="the signalled instance completes")
        assert len(await host.store.waits.signals(record.instance_id, "paid")) == 1
        # Unknown, then ambiguous (two more live instances under one id): dead-lettered.
        for order_id in ("r-2", "r-3"):
            await queue.publish(
                {"order_id": order_id},
                message_id=f"start-{order_id}",
                routing_key="shop.ing.wait",
                headers={"flowx-correlation": "po-88"},
            )

        async def two_waiting() -> bool:
            found = await host.store.catalog.list_instances(_query("po-88"))
            return len([r for r in found if r.state is InstanceState.SUSPENDED]) == 2

        await until(two_waiting, within=20, what="two instances under po-88 wait")
        for correlation, key in (("po-none", "pay-none"), ("po-88", "pay-88")):
            headers = {"flowx-signal": "paid", "flowx-correlation": correlation}
            await queue.publish(
                {"amount": 1}, message_id=key, routing_key="shop.pay", headers=headers
            )
        dead = await queue.take_dead(2)
        codes = {m.message_id: (m.headers or {}).get("flowx-dead-code") for m in dead}
        assert codes == {
            "pay-none": "ingress.unknown_instance",
            "pay-88": "ingress.ambiguous_correlation",
        }
    finally:
        await consumer.stop(timeout=5)


def _query(correlation: str) -> InstanceQuery:
    return InstanceQuery(correlation_id=correlation, limit=50)
