"""RabbitMQ ingress on the real broker (R6.1, R9.9; SPEC §8 "poison message at ingress"): a
message starts an instance that completes, a redelivery starts nothing twice, poison lands in
the dead-letter queue with its code and reason while the queue keeps flowing, two consumers
share a queue, and a signal by message wakes a waiting instance. Each test has its own queues,
deleted after; the hosts run on the in-memory store (several hosts share it: several nodes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import pytest

from flowx import metrics
from flowx.errors import FlowXError
from flowx.ingress import Delivery, IngressDispatcher, IngressRetry, Started, Verdict
from flowx.ingress.rabbitmq import RabbitMQIngress
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceRecord, InstanceState
from flowx.urls import BadURL
from tests.ingress.flows import FLOWS
from tests.ingress.rabbit import RABBITMQ_URL, TestQueue, own_queue
from tests.support.fault_proxy import FaultProxy
from tests.support.polling import until

MakeHost = Callable[..., Any]


@pytest.fixture
async def queue() -> AsyncIterator[TestQueue]:
    async with own_queue() as made:
        await made.declare()
        yield made


@pytest.fixture
async def consume(host_factory: MakeHost) -> AsyncIterator[Callable[..., Any]]:
    """Start a consumer of a queue on a fresh host (another node of the one memory store)."""
    started: list[RabbitMQIngress] = []

    async def make(url: str, dispatcher: IngressDispatcher | None = None) -> RabbitMQIngress:
        if dispatcher is None:
            dispatcher = IngressDispatcher(await host_factory(*FLOWS))
        consumer = RabbitMQIngress(url)
        await consumer.start(dispatcher)
        started.append(consumer)
        return consumer

    yield make
    for consumer in started:
        await consumer.stop(timeout=5)


async def all_instances(host: Any) -> list[InstanceRecord]:
    return list(await host.store.catalog.list_instances(InstanceQuery(limit=500)))


async def completed(host: Any, n: int, *, within: float = 30) -> list[InstanceRecord]:
    found: list[InstanceRecord] = []

    async def done() -> bool:
        found[:] = await all_instances(host)
        return len(found) >= n and all(r.state is InstanceState.COMPLETED for r in found)

    await until(done, within=within, what=f"{n} instances completed")
    return found


async def test_a_message_starts_an_instance_that_completes_and_its_redelivery_starts_nothing(
    queue: TestQueue, consume: Callable[..., Any]
) -> None:
    consumer = await consume(queue.url())
    host = consumer._dispatcher.host
    await queue.publish({"order_id": "o-1"}, message_id="m-1")
    await queue.publish({"order_id": "o-1"}, message_id="m-1")  # a publisher's retry
    await queue.publish({"order_id": "o-2"}, message_id="m-2")
    records = await completed(host, 2)
    await until(lambda: _drained(queue), within=10, what="the queue is empty")
    assert sorted(r.idempotency_key or "" for r in await all_instances(host)) == ["m-1", "m-2"]
    assert len(records) == 2


async def _drained(queue: TestQueue) -> bool:
    return await queue.depth() == 0


class KillBeforeAck(IngressDispatcher):
    """Handles a message (the start commits), then cuts the consumer's connection before the
    ack can leave: what a worker killed between its commit and its ack looks like to the
    broker."""

    consumer: RabbitMQIngress
    handled: asyncio.Event

    async def handle(self, d: Delivery) -> Verdict:
        verdict = await super().handle(d)
        self.handled.set()
        await self.consumer._connection.close()  # cancels this very handler: no ack leaves
        return verdict


async def test_a_message_handled_but_not_acked_is_redelivered_and_starts_nothing_twice(
    queue: TestQueue, consume: Callable[..., Any], host_factory: MakeHost
) -> None:
    host = await host_factory(*FLOWS)
    killer = KillBeforeAck(host)
    killer.handled = asyncio.Event()
    killer.consumer = RabbitMQIngress(queue.url())
    await killer.consumer.start(killer)
    try:
        await queue.publish({"order_id": "o-k"}, message_id="m-k")
        await asyncio.wait_for(killer.handled.wait(), 20)
    finally:
        await killer.consumer.stop(timeout=1)
    assert len(await all_instances(host)) == 1
    duplicates = metrics.INGRESS_MESSAGES.get("duplicate")
    await consume(queue.url(), IngressDispatcher(host))  # a second worker takes the redelivery
    await until(
        lambda: metrics.INGRESS_MESSAGES.get("duplicate") == duplicates + 1,
        within=20,
        what="the redelivered message is handled as a duplicate",
    )
    await until(lambda: _drained(queue), within=10, what="the redelivery is acked")
    [record] = await completed(host, 1)
    assert record.idempotency_key == "m-k"


POISON: list[tuple[Any, dict[str, str], str, str]] = [
    (b"\xff not utf-8", {}, "shop.ing.order", "ingress.not_json"),
    (b"{oops", {}, "shop.ing.order", "ingress.not_json"),
    ({"order_id": "x"}, {}, "shop.ing.unknown", "ingress.unknown_flow"),
    ({"quantity": "many"}, {}, "shop.ing.order", "ingress.input_invalid"),
    ({"order_id": "y" * 300}, {}, "shop.ing.order", "ingress.too_large"),
    (
        {"amount": 1},
        {"flowx-signal": "paid", "flowx-instance": "nope"},
        "shop.x",
        "ingress.unknown_instance",
    ),
]


async def test_each_poison_message_is_dead_lettered_with_its_code_and_the_queue_keeps_flowing(
    queue: TestQueue, consume: Callable[..., Any], host_factory: MakeHost
) -> None:
    host = await host_factory(*FLOWS)
    await consume(queue.url(), IngressDispatcher(host, max_bytes=200))
    for i, (body, headers, key, _) in enumerate(POISON):
        await queue.publish(body, message_id=f"p-{i}", routing_key=key, headers=headers)
    # (A message with no id and no key header is dead too, ingress.no_key: test_core.py. No
    # client here can send one: aiormq gives every message it publishes a random id.)
    await queue.publish({"order_id": "after"}, message_id="good")
    dead = await queue.take_dead(len(POISON))
    by_id = {m.message_id: m for m in dead}
    for i, (body, _, key, code) in enumerate(POISON):
        letter = by_id[f"p-{i}"]
        assert letter.headers["flowx-dead-code"] == code
        assert letter.headers["flowx-dead-reason"]
        assert letter.headers["flowx-dead-routing-key"] == key
        assert letter.headers["flowx-dead-queue"] == queue.name
        if isinstance(body, bytes):
            assert letter.body == body  # the original body, byte for byte
    signal = by_id[f"p-{len(POISON) - 1}"]
    assert signal.headers["flowx-signal"] == "paid"  # the original headers are kept
    [record] = await completed(host, 1)
    assert record.idempotency_key == "good"
    await until(lambda: _drained(queue), within=10, what="every message is acked")


class Counting(IngressDispatcher):
    """Counts the instances this node's dispatcher created."""

    started = 0

    async def handle(self, d: Delivery) -> Verdict:
        verdict = await super().handle(d)
        if isinstance(verdict, Started) and verdict.created:
            self.started += 1
        return verdict


async def test_two_consumers_share_one_queue_and_both_take_some(
    queue: TestQueue, consume: Callable[..., Any], host_factory: MakeHost
) -> None:
    dispatchers = [Counting(await host_factory(*FLOWS)) for _ in range(2)]
    for dispatcher in dispatchers:
        await consume(queue.url(prefetch="1"), dispatcher)
    for i in range(20):
        await queue.publish({"order_id": f"o-{i}"}, message_id=f"m-{i}")
    # One memory store: every node sees every row.
    records = await completed(dispatchers[0].host, 20)
    assert len({r.idempotency_key for r in records}) == 20
    taken = [d.started for d in dispatchers]
    assert sum(taken) == 20 and all(n > 0 for n in taken), taken


async def test_a_signal_by_message_wakes_the_waiting_instance_and_its_redelivery_is_a_duplicate(
    queue: TestQueue, consume: Callable[..., Any]
) -> None:
    consumer = await consume(queue.url())
    host = consumer._dispatcher.host
    await queue.publish({"order_id": "w-1"}, message_id="start-w-1", routing_key="shop.ing.wait")

    async def waiting() -> list[InstanceRecord]:
        found = await all_instances(host)
        return [r for r in found if r.state is InstanceState.SUSPENDED]

    await until(waiting, within=20, what="the started instance waits for its signal")
    [record] = await waiting()
    signal = {"flowx-signal": "paid", "flowx-instance": record.instance_id}
    before = metrics.INGRESS_MESSAGES.get("signalled")
    await queue.publish({"amount": 3}, message_id="pay-1", routing_key="shop.pay", headers=signal)
    await queue.publish({"amount": 3}, message_id="pay-1", routing_key="shop.pay", headers=signal)
    await completed(host, 1)
    await until(
        lambda: metrics.INGRESS_MESSAGES.get("signalled") == before + 2,
        within=20,
        what="both signal messages are handled",
    )
    received = await host.store.waits.signals(record.instance_id, "paid")
    assert len(received) == 1  # the redelivery was a duplicate: nothing written


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("amqp://guest:s3cret@localhost:5672/", "names no queue"),
        ("amqp://guest:s3cret@localhost:5672/?queue=amq.x", "reserved by RabbitMQ"),
        ("amqp://guest:s3cret@localhost:5672/?queue=q&prefetch=0", "from 1 to 65535"),
        ("amqp://guest:s3cret@localhost:5672/?queue=q&prefetch=lots", "from 1 to 65535"),
        ("amqp://guest:s3cret@localhost:port/?queue=q", "cannot be parsed"),
    ],
)
def test_a_malformed_url_is_one_clear_line_without_its_password(url: str, says: str) -> None:
    with pytest.raises(BadURL, match=says) as caught:
        RabbitMQIngress(url)
    assert caught.value.code == "ingress.bad_url" or "parsed" in says
    assert "s3cret" not in str(caught.value)


def test_the_queue_and_dead_letter_names_come_from_the_url() -> None:
    consumer = RabbitMQIngress("amqp://guest:guest@localhost/?queue=orders&prefetch=5")
    assert (consumer.queue, consumer.dead, consumer.prefetch) == ("orders", "orders.dead", 5)
    named = RabbitMQIngress("amqp://guest:guest@localhost/?queue=orders&dead=orders.poison")
    assert named.dead == "orders.poison"
    assert "queue=" not in named._url  # taken off before aio-pika sees it


class DownOnce(IngressDispatcher):
    """Our side is down for the first delivery (``IngressRetry``), back for the next."""

    seen: list[Delivery]

    async def handle(self, d: Delivery) -> Verdict:
        self.seen.append(d)
        if len(self.seen) == 1:
            raise IngressRetry("the journal is down (simulated)")
        return await super().handle(d)


async def test_a_message_our_side_cannot_take_is_requeued_not_dead_lettered(
    queue: TestQueue, consume: Callable[..., Any], host_factory: MakeHost
) -> None:
    dispatcher = DownOnce(await host_factory(*FLOWS))
    dispatcher.seen = []
    await consume(queue.url(), dispatcher)
    await queue.publish({"order_id": "o-r"}, message_id="m-r")
    [record] = await completed(dispatcher.host, 1)
    assert record.idempotency_key == "m-r"
    assert [d.redelivered for d in dispatcher.seen] == [False, True]
    assert await queue.depth(queue.dead) == 0  # never dead-lettered


@pytest.fixture
async def broker_proxy() -> AsyncIterator[FaultProxy]:
    target = urlsplit(RABBITMQ_URL)
    fault = FaultProxy(target.hostname or "127.0.0.1", target.port or 5672)
    await fault.start()
    yield fault
    await fault.stop()


async def test_the_consumer_reconnects_after_the_broker_connection_is_cut(
    queue: TestQueue, consume: Callable[..., Any], broker_proxy: FaultProxy
) -> None:
    target = urlsplit(RABBITMQ_URL)
    via = f"amqp://guest:guest@127.0.0.1:{broker_proxy.port}{target.path or '/'}"
    consumer = await consume(f"{via}?queue={queue.name}&reconnect_interval=0.2")
    host = consumer._dispatcher.host
    await queue.publish({"order_id": "before"}, message_id="m-before")
    await completed(host, 1)
    reconnected = asyncio.Event()
    consumer._connection.reconnect_callbacks.add(lambda *_: reconnected.set())
    await broker_proxy.refuse()  # every connection reset, new ones refused: a broker restart
    await until(
        lambda: not consumer._connection.connected.is_set(),
        within=10,
        what="the consumer notices its connection is gone",
    )
    await queue.publish({"order_id": "during"}, message_id="m-during")
    await broker_proxy.forward()
    await asyncio.wait_for(reconnected.wait(), 20)
    await queue.publish({"order_id": "after"}, message_id="m-after")
    records = await completed(host, 3)
    assert sorted(r.idempotency_key or "" for r in records) == ["m-after", "m-before", "m-during"]


async def test_a_dead_letter_the_broker_does_not_confirm_leaves_the_message_unacked(
    queue: TestQueue, consume: Callable[..., Any], host_factory: MakeHost
) -> None:
    """The dead-letter exchange is deleted under the consumer: the publish fails, so the poison
    message is not acked but requeued; the channel reopens, declaring the exchange again,
    and the next attempt lands it in the dead-letter queue — once."""
    await consume(queue.url(), IngressDispatcher(await host_factory(*FLOWS)))
    await queue.channel.exchange_delete(queue.dead)
    dead_before = metrics.INGRESS_MESSAGES.get("dead")
    await queue.publish(b"not json", message_id="poison")
    [letter] = await queue.take_dead(1, within=30)
    assert letter.message_id == "poison"
    assert letter.headers["flowx-dead-code"] == "ingress.not_json"
    assert metrics.INGRESS_MESSAGES.get("dead") - dead_before >= 2  # judged again after the failure
    await until(lambda: _drained(queue), within=10, what="the poison message is acked at last")
    assert await queue.depth(queue.dead) == 0


class Recording(IngressDispatcher):
    """Records the message ids it handled, in the order it handled them."""

    taken: list[str]

    async def handle(self, d: Delivery) -> Verdict:
        self.taken.append(d.message_id or "")
        return await super().handle(d)


async def test_an_ordered_queue_has_one_active_consumer_taking_messages_in_order(
    host_factory: MakeHost,
) -> None:
    async with own_queue() as queue:
        await queue.declare({"x-single-active-consumer": True})
        dispatchers = []
        consumers = []
        for _ in range(2):
            dispatcher = Recording(await host_factory(*FLOWS))
            dispatcher.taken = []
            consumer = RabbitMQIngress(queue.url(ordered="true"))
            await consumer.start(dispatcher)
            dispatchers.append(dispatcher)
            consumers.append(consumer)
        try:
            first = [f"m-{i}" for i in range(10)]
            for key in first:
                await queue.publish({"order_id": key}, message_id=key)
            await until(lambda: _drained(queue), within=20, what="the first batch is taken")
            await until(lambda: len(dispatchers[0].taken) == 10, within=20, what="all acked by one")
            assert dispatchers[0].taken == first  # the active consumer, in queue order
            assert dispatchers[1].taken == []  # the other waits as the standby
            await consumers[0].stop(timeout=5)  # the active one goes: the standby takes over
            then = [f"n-{i}" for i in range(5)]
            for key in then:
                await queue.publish({"order_id": key}, message_id=key)
            await until(
                lambda: len(dispatchers[1].taken) == 5, within=20, what="the standby takes over"
            )
            assert dispatchers[1].taken == then
        finally:
            for consumer in consumers:
                await consumer.stop(timeout=5)


def test_ordered_takes_one_message_at_a_time() -> None:
    ordered = RabbitMQIngress("amqp://guest:guest@localhost/?queue=q&ordered=true")
    assert (ordered.ordered, ordered.prefetch) == (True, 1)
    with pytest.raises(BadURL, match="ordered=true takes one message at a time"):
        RabbitMQIngress("amqp://guest:guest@localhost/?queue=q&ordered=true&prefetch=8")
    with pytest.raises(BadURL, match="must be true or false"):
        RabbitMQIngress("amqp://guest:guest@localhost/?queue=q&ordered=maybe")


async def test_a_broker_down_at_start_is_retried_until_it_answers(
    queue: TestQueue, consume: Callable[..., Any], broker_proxy: FaultProxy
) -> None:
    await broker_proxy.refuse()
    target = urlsplit(RABBITMQ_URL)
    via = f"amqp://guest:guest@127.0.0.1:{broker_proxy.port}{target.path or '/'}"
    consumer = await consume(f"{via}?queue={queue.name}")  # returns: retrying in the background
    assert consumer._connection is None
    await queue.publish({"order_id": "o-late"}, message_id="m-late")
    await broker_proxy.forward()
    [record] = await completed(consumer._dispatcher.host, 1)
    assert record.idempotency_key == "m-late"


async def test_a_refused_login_is_one_error_without_the_password(host_factory: MakeHost) -> None:
    target = urlsplit(RABBITMQ_URL)
    url = f"amqp://guest:Wr0ng-pw@{target.hostname}:{target.port or 5672}/?queue=never"
    consumer = RabbitMQIngress(url)
    with pytest.raises(FlowXError, match="RabbitMQ refused the login") as caught:
        await consumer.start(IngressDispatcher(await host_factory(*FLOWS)))
    assert caught.value.code == "ingress.refused"
    assert "Wr0ng" not in str(caught.value)
    await consumer.stop(timeout=1)
