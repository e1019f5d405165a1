"""The Redis lease store across a real Redis restart (issue 4, R2.4, R3.1).

Redis here keeps nothing on disk: a restart forgets every fencing counter. These tests restart
a real ``redis-server`` of their own (``tests/support/servers.py``; the shared one is never
touched) and show that no token at or below a fence the journal has seen is ever used.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel

import flowx
from flowx.stores.errors import FencedOut
from flowx.stores.paired import PairedStores, with_leases
from flowx.stores.postgres import PostgresStores
from flowx.stores.records import InstanceState, NewInstance
from flowx.stores.redis import RedisLeaseStore
from tests.postgres_support import PG_DSN
from tests.support.servers import ThrowawayRedis

pytestmark = pytest.mark.crash  # restarts a real server

TTL = timedelta(seconds=3)
gate: dict[str, asyncio.Event] = {}


class Order(BaseModel):
    name: str


class OrderState(BaseModel):
    a: str | None = None
    b: str | None = None


@flowx.capability("redis_restart.a", version="1.0.0")
async def step_a(ctx: flowx.StepContext, order: Order) -> str:
    return "a"


@flowx.capability("redis_restart.b", version="1.0.0")
async def step_b(ctx: flowx.StepContext, order: Order) -> str:
    event = gate.get(order.name)
    if event is not None:
        await event.wait()
    return "b"


PLAN = (
    flowx.flow("redis_restart.order", version="1.0.0", input=Order, state=OrderState)
    .step(step_a, into="a")
    .step(step_b, into="b")
    .build()
)


@pytest.fixture
async def stores(
    pg_schema: Callable[[], str], redis: ThrowawayRedis
) -> AsyncIterator[PairedStores]:
    prefix = f"flowx-test-{uuid.uuid4().hex[:12]}"
    paired = with_leases(
        PostgresStores(PG_DSN, schema=pg_schema()), RedisLeaseStore(redis.url, prefix=prefix)
    )
    await paired.open()
    try:
        yield paired
    finally:
        await paired.close()


@pytest.fixture
def restart_redis(redis: ThrowawayRedis) -> Callable[[], Awaitable[None]]:
    async def restart() -> None:
        await asyncio.to_thread(redis.stop)
        await asyncio.to_thread(redis.start)

    return restart


async def test_after_a_restart_no_token_at_or_below_the_journal_fence_is_used(
    stores: PairedStores, restart_redis: Callable[[], Awaitable[None]]
) -> None:
    now = datetime.now(UTC)
    iid = str(uuid.uuid4())
    lease = await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=now)
    assert lease is not None
    await stores.journal.create(
        NewInstance(
            instance_id=iid,
            flow_id=PLAN.flow_id,
            flow_version=PLAN.version,
            input=flowx.codec.dumps(Order(name="fenced")),
            state_bag="{}",
            state=InstanceState.RUNNING,
        ),
        token=lease.token,
        now=now,
    )
    for _ in range(4):  # four takeovers: the journal's fence climbs to 5
        await stores.leases.release(lease, now=now)
        fence = (await stores.journal.get(iid)).fence  # type: ignore[union-attr]
        lease = await stores.leases.acquire(iid, owner="n1", ttl=TTL, now=now, floor=fence)
        assert lease is not None
        await stores.journal.open(iid, token=lease.token, now=now)
    await stores.leases.release(lease, now=now)
    assert (await stores.journal.get(iid)).fence == 5  # type: ignore[union-attr]

    await restart_redis()
    assert await stores.leases.current(iid) is None  # the counter is gone with the restart

    # Without the floor a fresh Redis starts again at 1 — and the journal refuses that token.
    blind = await stores.leases.acquire(iid, owner="blind", ttl=TTL, now=datetime.now(UTC))
    assert blind is not None and blind.token == 1
    with pytest.raises(FencedOut):
        await stores.journal.open(iid, token=blind.token, now=datetime.now(UTC))
    await stores.leases.release(blind, now=datetime.now(UTC))

    # The host always passes the journal's fence as the floor: the token lands above it.
    async with flowx.FlowHost(
        store=stores,
        flows=[PLAN],
        settings=flowx.HostSettings.load(recovery=False),
    ) as host:
        assert await host.resume(iid) == "resumed"
        await host.wait_idle(timeout=30)
        record = await host.get(iid)
        lease_after = await stores.leases.current(iid)
    assert record.state is InstanceState.COMPLETED
    assert record.fence == 6
    assert lease_after is not None and lease_after.token == 6


async def test_a_live_lease_survives_a_restart_and_nobody_else_takes_it(
    stores: PairedStores, restart_redis: Callable[[], Awaitable[None]]
) -> None:
    gate["held"] = asyncio.Event()
    settings = flowx.HostSettings(lease_ttl=TTL)
    async with flowx.FlowHost(
        store=stores,
        flows=[PLAN],
        settings=settings.replace(recovery=False, node_id="owner"),
    ) as owner:
        handle = await owner.start(PLAN, Order(name="held"))
        token = (await stores.leases.current(handle.instance_id)).token  # type: ignore[union-attr]
        await restart_redis()
        # The next renewal (every TTL/3) writes the forgotten lease back under its own token.
        for _ in range(100):
            current = await stores.leases.current(handle.instance_id)
            if current is not None:
                break
            await asyncio.sleep(0.05)
        assert current is not None and (current.owner, current.token) == ("owner", token)
        peer = await stores.leases.acquire(
            handle.instance_id, owner="peer", ttl=TTL, now=datetime.now(UTC), floor=token
        )
        assert peer is None  # still held
        gate["held"].set()
        state = await handle.result(timeout=30)
        record = await stores.journal.get(handle.instance_id)
    assert state.b == "b"
    assert record is not None and record.fence == token  # never taken over
