"""The outbox on PostgreSQL with real brokers: the chain end to end (R5.6), a broker that
goes away (SPEC §8), and per-key order with four publishers at once (R5.3)."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import flowx
from flowx.outbox import (
    FanOutPublisher,
    OutboxPublisher,
    RabbitMQPublisher,
    RedisStreamsPublisher,
)
from flowx.stores.postgres import PostgresStores
from flowx.stores.records import EventWrite, NewInstance, StepCommit
from flowx.testing.conformance._support import at, step
from flowx.testing.conformance.outbox import read_at_least
from tests.outbox.flows import Order, order_flow
from tests.postgres_support import PG_DSN
from tests.redis_support import REDIS_URL, drop_redis_prefix
from tests.support.servers import ServerUnavailable, ThrowawayRedis

RABBITMQ_URL = os.environ.get("FLOWX_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/")


@pytest.fixture
async def pg(pg_schema: Callable[[], str]) -> AsyncIterator[PostgresStores]:
    stores = PostgresStores(PG_DSN, schema=pg_schema())
    await stores.open()
    try:
        yield stores
    finally:
        await stores.close()


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    name = f"flowx-test-{uuid.uuid4().hex[:12]}"
    yield name
    await drop_redis_prefix(name)


async def stream_entries(stream: str, url: str = REDIS_URL) -> list[dict[str, str]]:
    from redis import asyncio as aioredis

    client: Any = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        return [fields for _id, fields in await client.xrange(stream)]
    finally:
        await client.aclose()


async def wait_until_published(stores: PostgresStores, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while await stores.outbox.pending_count():
        assert asyncio.get_running_loop().time() < deadline, "the outbox did not drain"
        await asyncio.sleep(0.02)


async def rabbit_queue(exchange: str) -> tuple[Any, Any]:
    import aio_pika

    connection = await aio_pika.connect(RABBITMQ_URL)
    channel = await connection.channel()
    ex = await channel.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, durable=True)
    queue = await channel.declare_queue(f"{exchange}.q", durable=False, auto_delete=False)
    await queue.bind(ex, "#")
    return connection, queue


async def drain_queue(queue: Any) -> list[Any]:
    got = []
    while (message := await queue.get(no_ack=True, fail=False)) is not None:
        got.append(message)
    return got


async def test_flows_emit_through_the_outbox_to_a_real_redis_stream_and_rabbitmq_queue(
    pg: PostgresStores, prefix: str
) -> None:
    """R5.6: journal outbox → publisher → Redis and RabbitMQ → consumers reading them, in
    one process."""
    exchange = f"{prefix}.events"
    connection, queue = await rabbit_queue(exchange)
    broker = FanOutPublisher(
        RedisStreamsPublisher(REDIS_URL, prefix=f"{prefix}:"),
        RabbitMQPublisher(RABBITMQ_URL, exchange=exchange),
    )
    try:
        await _run_and_check(pg, prefix, broker, queue)
    finally:
        await queue.delete(if_unused=False, if_empty=False)
        channel = await connection.channel()
        await channel.exchange_delete(exchange)
        await connection.close()


async def _run_and_check(pg: PostgresStores, prefix: str, broker: Any, queue: Any) -> None:
    async with flowx.FlowHost(store=pg, flows=[order_flow], publisher=broker) as host:
        handles = [await host.start(order_flow, Order(order_id=f"o{i}")) for i in range(30)]
        await asyncio.gather(*(h.result() for h in handles))
        await wait_until_published(pg)
        for i, handle in enumerate(handles):
            staged = await pg.journal.events(handle.instance_id)
            got = await stream_entries(f"{prefix}:o{i}")
            # Every event exactly as staged, in its key's order, once.
            assert [g["event_id"] for g in got] == [e.event_id for e in staged]
            assert [g["payload"] for g in got] == [e.payload for e in staged]
            assert [json.loads(g["payload"])["n"] for g in got] == [1, 2, 3]
            assert all(json.loads(g["payload"])["card"] == "[redacted]" for g in got)
            assert {g["type"] for g in got} == {"shop.order_event"}
        # The RabbitMQ consumer: every event once, byte for byte, each key in order.
        messages = await drain_queue(queue)
        staged_all = {
            e.event_id: e for h in handles for e in await pg.journal.events(h.instance_id)
        }
        assert sorted(m.message_id for m in messages) == sorted(staged_all)
        per_key: dict[str, list[int]] = {}
        for m in messages:
            e = staged_all[m.message_id]
            assert m.body.decode() == e.payload
            assert m.headers["partition_key"] == e.partition_key
            per_key.setdefault(e.partition_key or "", []).append(json.loads(m.body)["n"])
        assert per_key == {f"o{i}": [1, 2, 3] for i in range(30)}


@pytest.mark.crash
async def test_with_redis_stopped_flows_complete_and_the_outbox_waits(
    pg: PostgresStores, prefix: str
) -> None:
    """SPEC §8 'broker unavailable': a real Redis is shut down mid-run and restarted (one of
    this test's own, ``tests/support/servers.py``: the shared one is never touched)."""
    try:
        redis = ThrowawayRedis()
    except ServerUnavailable as e:
        pytest.skip(str(e))
    redis.start()
    try:
        await _through_a_redis_outage(pg, prefix, redis)
    finally:
        redis.stop()


async def _through_a_redis_outage(pg: PostgresStores, prefix: str, redis: ThrowawayRedis) -> None:
    broker = RedisStreamsPublisher(redis.url, prefix=f"{prefix}:", timeout=1.0)
    async with flowx.FlowHost(store=pg, flows=[order_flow], publisher=broker) as host:
        assert host.outbox is not None
        host.outbox.retry_backoff = host.outbox.max_backoff = 0.2
        await asyncio.to_thread(redis.stop)
        try:
            handles = [await host.start(order_flow, Order(order_id=f"o{i}")) for i in range(20)]
            await asyncio.gather(*(h.result() for h in handles))
            states = [(await host.get(h.instance_id)).state for h in handles]
            assert set(states) == {flowx.InstanceState.COMPLETED}
            await asyncio.sleep(0.5)
            assert await pg.outbox.pending_count() == 60  # all of it waits, nothing lost
            assert host.outbox.failures > 0
        finally:
            await asyncio.to_thread(redis.start)
        await wait_until_published(pg)
        for i in range(20):
            got = await stream_entries(f"{prefix}:o{i}", redis.url)
            assert [json.loads(g["payload"])["n"] for g in got] == [1, 2, 3]


KEYS = 200
INSTANCES_PER_KEY = 2
COMMITS_PER_INSTANCE = 25
EVENTS_PER_COMMIT = 5
TOTAL = KEYS * INSTANCES_PER_KEY * COMMITS_PER_INSTANCE * EVENTS_PER_COMMIT  # 50,000


async def test_four_publishers_keep_every_key_in_order_over_50000_events(
    pg: PostgresStores, prefix: str
) -> None:
    """R5.3. Events are staged while four publishers drain (each with its own PostgreSQL
    transaction and Redis connection). A key's events come from two instances taking turns,
    each commit staged after the previous one of its key committed, so each key has one
    true order: ``n`` = 0, 1, 2, … The consumer reads every key's stream and checks it."""
    assert TOTAL >= 50_000
    locks = {k: asyncio.Lock() for k in range(KEYS)}
    counters = dict.fromkeys(range(KEYS), 0)

    async def stager(key: int, instance_id: str) -> None:
        await pg.journal.create(
            NewInstance(
                instance_id=instance_id,
                flow_id="ordering",
                flow_version="1",
                input="{}",
                state_bag="{}",
            ),
            token=1,
            now=at(0),
        )
        for c in range(1, COMMITS_PER_INSTANCE + 1):
            async with locks[key]:
                first = counters[key]
                counters[key] += EVENTS_PER_COMMIT
                await pg.journal.commit(
                    StepCommit(
                        instance_id=instance_id,
                        token=1,
                        now=at(c),
                        step=step(c),
                        events=tuple(
                            EventWrite(
                                event_id=str(uuid.uuid4()),
                                type="ordering.tick",
                                schema_version="1",
                                partition_key=f"k{key}",
                                payload=json.dumps({"n": first + i}),
                            )
                            for i in range(EVENTS_PER_COMMIT)
                        ),
                    )
                )

    relays = [
        OutboxPublisher(
            pg.outbox,
            RedisStreamsPublisher(REDIS_URL, prefix=f"{prefix}:"),
            batch_size=500,
            owner=f"p{n}",
        )
        for n in range(4)
    ]
    stop = asyncio.Event()
    loops = [asyncio.create_task(r.run(stop)) for r in relays]
    try:
        await asyncio.gather(
            *(stager(k, str(uuid.uuid4())) for k in range(KEYS) for _ in range(INSTANCES_PER_KEY))
        )
        await wait_until_published(pg, timeout=120)
    finally:
        stop.set()
        await asyncio.gather(*loops)
        for r in relays:
            await r.publisher.close()
    published = [r.published for r in relays]
    assert sum(published) >= TOTAL
    assert sum(1 for p in published if p) >= 2, f"only one publisher worked: {published}"
    out_of_order = []
    delivered = 0
    for k in range(KEYS):
        seen: set[str] = set()
        ns = []
        for g in await stream_entries(f"{prefix}:k{k}"):
            if g["event_id"] not in seen:
                seen.add(g["event_id"])
                ns.append(json.loads(g["payload"])["n"])
        delivered += len(ns)
        if ns != list(range(counters[k])):
            out_of_order.append(k)
    assert delivered == TOTAL
    assert out_of_order == []


async def test_a_commit_in_another_process_wakes_an_idle_publisher_by_notify(
    pg_schema: Callable[[], str],
) -> None:
    """LISTEN/NOTIFY: two store objects with their own pools stand for two processes."""
    schema = pg_schema()
    publisher_side = PostgresStores(PG_DSN, schema=schema)
    stager_side = PostgresStores(PG_DSN, schema=schema)
    await publisher_side.open()
    await stager_side.open()
    try:
        # Nothing staged yet: the wait times out (and the LISTEN connection is now up).
        assert await publisher_side.outbox.wait_staged(1.0) is False
        iid = str(uuid.uuid4())
        await stager_side.journal.create(
            NewInstance(
                instance_id=iid, flow_id="notify", flow_version="1", input="{}", state_bag="{}"
            ),
            token=1,
            now=at(0),
        )
        # A commit with no events sends no wake-up.
        await stager_side.journal.commit(
            StepCommit(
                instance_id=iid,
                token=1,
                now=at(1),
                step=step(1),
            )
        )
        assert await publisher_side.outbox.wait_staged(1.0) is False
        await stager_side.journal.commit(
            StepCommit(
                instance_id=iid,
                token=1,
                now=at(2),
                step=step(2),
                events=(
                    EventWrite(
                        event_id=str(uuid.uuid4()),
                        type="notify.tick",
                        schema_version="1",
                        partition_key="k",
                        payload="{}",
                    ),
                ),
            )
        )
        assert await publisher_side.outbox.wait_staged(10.0) is True
        assert await publisher_side.outbox.pending_count() == 1
    finally:
        await stager_side.close()
        await publisher_side.close()


async def test_a_subscription_never_skips_an_event_a_slower_transaction_stages(
    pg: PostgresStores,
) -> None:
    """R2.14 on PostgreSQL. Transaction A stages an event and stays open; B stages one after
    it and commits. A cursor by staged_seq that read B would pass A for ever. The feed reads
    nothing past A's transaction until A ends, then both, A first."""
    import psycopg

    ids = [str(uuid.uuid4()), str(uuid.uuid4())]
    for iid in ids:
        await pg.journal.create(
            NewInstance(
                instance_id=iid, flow_id="gap", flow_version="1", input="{}", state_bag="{}"
            ),
            token=1,
            now=at(0),
        )
    await pg.changes.subscribe("audit", now=at(0))
    slow_event = str(uuid.uuid4())
    async with await psycopg.AsyncConnection.connect(
        PG_DSN, options=f"-c search_path={pg.db.schema}"
    ) as slow:
        await slow.execute(
            "INSERT INTO outbox_event (event_id, instance_id, sequence, ordinal, type, "
            "schema_version, partition_key, payload, staged_at) "
            "VALUES (%s, %s, 1, 0, 'gap.slow', '1', 'k', '{}', now())",
            (slow_event, ids[0]),
        )
        fast = EventWrite(
            event_id=str(uuid.uuid4()),
            type="gap.fast",
            schema_version="1",
            partition_key="k",
            payload="{}",
        )
        await pg.journal.commit(
            StepCommit(
                instance_id=ids[1],
                token=1,
                now=at(1),
                step=step(1),
                events=(fast,),
            )
        )
        held = await pg.changes.read("audit")
        assert held.events == ()  # B is committed, but A's transaction is still open
        await pg.changes.commit("audit", held.position, now=at(2))
        await slow.commit()
    both = await read_at_least(pg, "audit", 2)
    assert [e.event_id for e in both.events] == [slow_event, fast.event_id]
    assert both.events[0].staged_seq < both.events[1].staged_seq
