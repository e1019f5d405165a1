"""The publisher loop over the memory store and the recording broker (R5.2, R5.3, R5.5):
what a broker acknowledges is marked, what it does not goes out again in order, and a
permanently refused event ends as a dead letter that no longer holds its key."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict
from typing import Any

import pytest

import flowx
from flowx.outbox import OutboxPublisher, RecordingPublisher, RelayPolicy
from flowx.stores.memory import MemoryStores
from tests.outbox.flows import Order, order_flow


def per_key_n(events: Any) -> dict[str | None, list[int]]:
    """Each key's ``n`` values in first-delivery order."""
    seen: set[str] = set()
    out: dict[str | None, list[int]] = defaultdict(list)
    for e in events:
        if e.event_id in seen:
            continue
        seen.add(e.event_id)
        out[e.partition_key].append(json.loads(e.payload)["n"])
    return dict(out)


async def run_orders(host: flowx.FlowHost, count: int) -> None:
    handles = [await host.start(order_flow, Order(order_id=f"o{i}")) for i in range(count)]
    await asyncio.gather(*(h.result() for h in handles))


async def test_a_host_with_a_publisher_delivers_every_emitted_event_redacted() -> None:
    broker = RecordingPublisher()
    host = flowx.FlowHost(store=MemoryStores(), flows=[order_flow], publisher=broker)
    async with host:
        await run_orders(host, 20)
        assert host.outbox is not None
        for _ in range(200):
            if len(broker.received) == 60:
                break
            await asyncio.sleep(0.01)
    assert len(broker.received) == 60
    assert per_key_n(broker.received) == {f"o{i}": [1, 2, 3] for i in range(20)}
    assert all(json.loads(e.payload)["card"] == "[redacted]" for e in broker.received)
    assert await host.store.outbox.pending_count() == 0  # type: ignore[union-attr]


async def test_a_partial_accept_marks_the_prefix_and_resends_the_rest_in_order() -> None:
    store = MemoryStores()
    host = flowx.FlowHost(store=store, flows=[order_flow])
    async with host:
        await run_orders(host, 10)
        broker = RecordingPublisher()
        broker.accept_at_most = 7
        relay = OutboxPublisher(store.outbox, broker, batch_size=50)
        first = await relay.publish_once()
        assert (first.claimed, first.published) == (30, 7)
        assert first.failure is not None and not first.failure.permanent
        assert await store.outbox.pending_count() == 23
        broker.accept_at_most = None
        assert await relay.drain() == 23
    assert len(broker.received) == 30  # the 7 were not sent twice: they were marked
    assert per_key_n(broker.received) == {f"o{i}": [1, 2, 3] for i in range(10)}


async def test_while_the_broker_is_down_flows_complete_and_the_outbox_grows() -> None:
    """SPEC §8 'broker unavailable', against the recording broker (the real one is in
    tests/outbox/test_outbox_postgres.py)."""
    store = MemoryStores()
    broker = RecordingPublisher()
    broker.down = True
    relay = OutboxPublisher(
        store.outbox, broker, policy=RelayPolicy(retry_backoff=0.01, max_backoff=0.05)
    )
    stop = asyncio.Event()
    async with flowx.FlowHost(store=store, flows=[order_flow]) as host:
        loop = asyncio.create_task(relay.run(stop))
        await run_orders(host, 10)
        assert await store.outbox.pending_count() == 30
        await asyncio.sleep(0.1)
        assert relay.failures > 0 and broker.received == []
        broker.down = False
        for _ in range(200):
            if await store.outbox.pending_count() == 0:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await loop
    assert per_key_n(broker.received) == {f"o{i}": [1, 2, 3] for i in range(10)}


async def test_a_permanent_refusal_ends_as_a_dead_letter_and_frees_its_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStores()
    async with flowx.FlowHost(store=store, flows=[order_flow]) as host:
        await run_orders(host, 2)
        events = [e for e in store._data.events]
        bad = next(e for e in events if e.partition_key == "o0" and '"n":2' in e.payload)
        broker = RecordingPublisher()
        broker.refuse[bad.event_id] = "message too large"
        relay = OutboxPublisher(store.outbox, broker, policy=RelayPolicy(dead_after=3))
        with caplog.at_level(logging.ERROR, logger="flowx.outbox"):
            rounds = [await relay.publish_once() for _ in range(3)]
        assert [r.dead_lettered for r in rounds] == [0, 0, 1]
        assert all(r.failure is not None and r.failure.permanent for r in rounds)
        assert "dead letter after 3 attempts: message too large" in caplog.text
        await relay.drain()
        dead = await store.outbox.dead_letters()
        assert [d.event_id for d in dead] == [bad.event_id]
        assert dead[0].attempts == 3 and dead[0].dead_reason == "message too large"
        # R5.5: the key went on without it.
        assert per_key_n(broker.received) == {"o0": [1, 3], "o1": [1, 2, 3]}
        # The operator fixes the cause and resends it.
        del broker.refuse[bad.event_id]
        assert await store.outbox.retry_dead_letter(bad.event_id)
        await relay.drain()
        assert broker.received[-1].event_id == bad.event_id
        assert await store.outbox.pending_count() == 0


def test_bad_settings_are_refused_with_the_name_of_the_setting() -> None:
    store = MemoryStores()
    with pytest.raises(ValueError, match="batch_size"):
        OutboxPublisher(store.outbox, RecordingPublisher(), batch_size=0)
    with pytest.raises(ValueError, match="dead_after"):
        OutboxPublisher(store.outbox, RecordingPublisher(), policy=RelayPolicy(dead_after=0))
    with pytest.raises(flowx.FlowXError, match="publisher needs a store"):
        flowx.FlowHost(flows=[order_flow], publisher=RecordingPublisher())
