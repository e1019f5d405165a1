"""One shard crashes; the others do not wait for it, and its instances finish once it is back
(R6.2, R9.9, with R3.4 recovery and SPEC §8 "journal unavailable" per shard).

A real fault: shard 2's server is stopped in ``immediate`` mode (every backend gone at once, as
a crash looks to its clients) while its instances are mid-step, and started again later. The
clusters are the session's (``pg_shards``); the victim is restarted however the test ends.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pytest
from pydantic import BaseModel

import flowx
from flowx.stores.placement import shard_of, tenant_shard
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceState
from flowx.stores.sharded import ShardedStores
from flowx.testing import FakeClock
from tests.support.hosts import fold_settings
from tests.support.polling import until
from tests.support.servers import ThrowawayPostgres, port_open

T = TypeVar("T")
VICTIM = 2
CONNECT_TIMEOUT = 1

calls: list[str] = []
gates: dict[str, asyncio.Event] = {}
entered: dict[str, asyncio.Event] = {}


class Job(BaseModel):
    tenant: str
    name: str


class JobState(BaseModel):
    first: str | None = None
    held: str | None = None
    last: str | None = None


@flowx.capability("kill.first", version="1.0.0")
async def first(ctx: flowx.StepContext, job: Job) -> str:
    calls.append(f"first:{job.name}")
    return f"F-{job.name}"


@flowx.capability("kill.hold", version="1.0.0")
async def hold(ctx: flowx.StepContext, job: Job) -> str:
    calls.append(f"hold:{job.name}")
    started = entered.get(job.name)
    if started is not None:
        started.set()
    gate = gates.get(job.name)
    if gate is not None:
        await gate.wait()
    return f"H-{job.name}"


@flowx.capability("kill.last", version="1.0.0")
async def last(ctx: flowx.StepContext, job: Job) -> str:
    calls.append(f"last:{job.name}")
    return f"L-{job.name}"


JOB = (
    flowx.flow("kill.job", version="1", input=Job, state=JobState, partition_key=lambda j: j.tenant)
    .step(first, into="first")
    .step(hold, into="held")
    .step(last, into="last")
    .build()
)


def tenants_on(shard: int, count: int) -> list[str]:
    found = (f"kt-{n}" for n in range(10_000))
    return [t for t in found if tenant_shard(t, 3) == shard][:count]


async def when_back(call: Callable[[], Awaitable[T]], *, within: float = 30) -> T:
    """What a client does with a 503: retry until the shard answers."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await call()
        except flowx.JournalUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


@pytest.fixture
async def victim(pg_shards: list[ThrowawayPostgres]) -> AsyncIterator[ThrowawayPostgres]:
    """Shard 2's cluster, running again after the test whatever happened in it."""
    calls.clear()
    gates.clear()
    entered.clear()
    cluster = pg_shards[VICTIM]
    yield cluster
    if not port_open(cluster.port):
        cluster.start()


async def test_a_crashed_shard_holds_up_only_its_own_instances_and_they_finish_after_it(
    pg_shards: list[ThrowawayPostgres], victim: ThrowawayPostgres
) -> None:
    clock = FakeClock()
    schema = f"flowx_k_{uuid.uuid4().hex[:12]}"
    store = flowx.sharded(
        [c.dsn for c in pg_shards],
        schema=schema,
        connect_timeout=CONNECT_TIMEOUT,
        min_size=1,
        max_size=4,
    )
    assert isinstance(store, ShardedStores)
    settings = flowx.HostSettings(lease_ttl="30s")
    host = flowx.FlowHost(
        store=store,
        flows=[JOB],
        **fold_settings({"clock": clock, "recovery": False, "settings": settings}),
    )
    await host.open()
    try:
        await _crash_and_recover(host, store, clock, victim)
    finally:
        if not port_open(victim.port):
            victim.start()
        await host.drain(timeout=5)


async def _crash_and_recover(
    host: flowx.FlowHost, store: ShardedStores, clock: FakeClock, victim: ThrowawayPostgres
) -> None:
    # Two instances on the victim, each held inside its second step.
    doomed = tenants_on(VICTIM, 2)
    for tenant in doomed:
        entered[tenant], gates[tenant] = asyncio.Event(), asyncio.Event()
    held = [await host.start(JOB, Job(tenant=t, name=t)) for t in doomed]
    assert {shard_of(h.instance_id) for h in held} == {VICTIM}
    await asyncio.wait_for(asyncio.gather(*(entered[t].wait() for t in doomed)), 10)

    victim.stop()  # immediate: a crash, as its clients see it
    for tenant in doomed:
        gates[tenant].set()  # the step ends; its commit meets a dead server
    await host.wait_idle(timeout=CONNECT_TIMEOUT * 4)
    assert host.in_flight == 0

    # The other shards do not wait for it: new instances there start and complete now.
    others = tenants_on(0, 2) + tenants_on(1, 2)
    done = [await host.start(JOB, Job(tenant=t, name=t)) for t in others]
    states = await asyncio.gather(*(h.result(timeout=15) for h in done))
    assert [s.last for s in states] == [f"L-{t}" for t in others]
    # An idempotent start asks only its own shard whether the key was used (R4.1).
    job = Job(tenant=others[0], name="keyed")
    keyed = await host.start(JOB, job, idempotency_key="during-the-outage")
    assert (await keyed.result(timeout=15)).last == "L-keyed"
    again = await host.start(JOB, job, idempotency_key="during-the-outage")
    assert again.instance_id == keyed.instance_id and not again.created
    done.append(keyed)
    scan = await host.recover_once()  # a sweep goes on with the shards that answer
    assert scan.resumed == 0
    with pytest.raises(flowx.JournalUnavailable):
        await host.get(held[0].instance_id)  # the victim's own instances wait for it

    # Back: past the lease TTL its instances are abandoned, resumed and finished.
    victim.start()
    clock.advance(seconds=31)
    resumed = 0

    async def recovered() -> bool:
        nonlocal resumed
        resumed += (await when_back(host.recover_once)).resumed
        return resumed >= len(doomed)

    await until(recovered, within=30, what="the crashed shard's instances resumed")

    async def finished() -> bool:
        records = [await when_back(lambda h=h: host.get(h.instance_id)) for h in held]
        return all(r.state is InstanceState.COMPLETED for r in records)

    await until(finished, within=30, what="the crashed shard's instances completed")

    # Nothing lost, nothing run twice past its commit: each instance completed once.
    started = {h.instance_id for h in held + done}
    listed = await store.catalog.list_instances(InstanceQuery(limit=100))
    assert {r.instance_id for r in listed} == started
    assert await store.catalog.count_instances(InstanceQuery(), by="state") == {
        "Completed": len(started)
    }
    for tenant in others:
        assert calls.count(f"first:{tenant}") == calls.count(f"last:{tenant}") == 1
    for tenant in doomed:
        assert calls.count(f"first:{tenant}") == 1  # committed before the crash: not re-run
        assert calls.count(f"last:{tenant}") == 1
