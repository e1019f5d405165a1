"""Redis leases stopped for 3 × TTL under steps longer than the renewal margin (R2.4, R3.5,
SPEC §8 "lease store unavailable").

Two nodes share a PostgreSQL journal and take their leases from a throwaway ``redis-server``.
Every instance is inside its second step when Redis is killed; those steps finish only after
every lease has run out locally, so each finished step commits with no live lease — under the
token it ran with, and the journal's fence, which nobody raised, accepts it (R2.4). Each run
then stops before its next capability (R3.5). No start is accepted while Redis is down. Redis
comes back empty after 3 × TTL; the nodes recover every instance (the journal's fence is the
floor of the new tokens) and finish it. Every step's effect ran exactly once — nothing was cut
by a kill here, so there is nothing to re-run — nothing was compensated, and no write was
accepted past a fence.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from pydantic import BaseModel

import flowx
from flowx.hosting.lease import DurableLease
from flowx.hosting.stores import postgres, redis_leases
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import Outcome
from tests.faults.support import Ledger, WriteTap, on_node, writes_past_a_fence
from tests.postgres_support import PG_DSN
from tests.support.polling import until
from tests.support.servers import ThrowawayRedis

TTL = 3.0
RENEW = TTL / 3  # the default renewal interval
MARGIN = TTL * 2 / 3  # how long a lease stays live here after a renewal is sent
SCAN = 0.5
STEP = RENEW * 1.2  # each step outlasts a renewal interval
OUTAGE = 3 * TTL
INSTANCES = 4

ledger = Ledger()
in_two: set[str] = set()
release_two = asyncio.Event()


class Work(BaseModel):
    name: str
    quick: bool = False


class WorkState(BaseModel):
    one: str | None = None
    two: str | None = None
    three: str | None = None


@flowx.capability("faults.redis.one", version="1.0.0")
async def one(ctx: flowx.StepContext, work: Work) -> str:
    node = ledger.record(ctx, "one")
    if not work.quick:
        await asyncio.sleep(STEP)
    return node


@flowx.capability("faults.redis.two", version="1.0.0")
async def two(ctx: flowx.StepContext, work: Work) -> str:
    node = ledger.record(ctx, "two")
    if not work.quick:
        in_two.add(ctx.instance_id)
        await release_two.wait()  # outlasts the renewal margin: the test opens it
    return node


@flowx.capability("faults.redis.three", version="1.0.0")
async def three(ctx: flowx.StepContext, work: Work) -> str:
    node = ledger.record(ctx, "three")
    if not work.quick:
        await asyncio.sleep(STEP)
    return node


@flowx.capability("faults.redis.undo", version="1.0.0")
async def undo(ctx: flowx.StepContext, work: Work) -> None:
    ledger.record(ctx, "undo")


FLOW = (
    flowx.flow("faults.redis", version="1.0.0", input=Work, state=WorkState)
    .step(one, into="one", compensate=undo)
    .step(two, into="two", compensate=undo)
    .step(three, into="three")
    .build()
)
STEPS = ["faults.redis.one", "faults.redis.two", "faults.redis.three"]


def _leases(hosts: list[flowx.FlowHost]) -> list[DurableLease]:
    """Every lease the nodes' keepers hold (a run keeps its lease until it stops)."""
    return [lease for h in hosts if h._keeper for lease in h._keeper._held.values()]


async def test_redis_down_for_three_ttls_re_runs_no_finished_step(
    redis: ThrowawayRedis, pg_schema: Callable[[], str]
) -> None:
    """R2.4: a step that finished while the lease store was down commits under its token;
    R3.5: nothing starts without a live lease; SPEC §8: no new durable work meanwhile."""
    ledger.clear()
    in_two.clear()
    release_two.clear()
    schema = pg_schema()
    hosts: list[flowx.FlowHost] = []
    taps: list[WriteTap] = []
    try:
        for name in ("N1", "N2"):
            host = flowx.FlowHost(
                store=flowx.with_leases(postgres(PG_DSN, schema=schema), redis_leases(redis.url)),
                flows=[FLOW],
                settings=flowx.HostSettings(
                    lease_ttl=TTL, recovery_scan_interval=SCAN, node_id=name, timers=False
                ),
            )
            with on_node(name):
                await host.open()
            hosts.append(host)
            taps.append(WriteTap(host, name))

        ids = []
        for n in range(INSTANCES):
            host = hosts[n % 2]
            with on_node(host.node_id):
                ids.append((await host.start(FLOW, Work(name=f"w{n}"))).instance_id)
        await until(
            lambda: len(in_two) == INSTANCES, within=STEP + 15, what="every instance in step two"
        )
        assert len(_leases(hosts)) == INSTANCES

        redis.stop()
        killed = time.monotonic()

        # SPEC §8: no new durable work while the lease store is down; retryable.
        with on_node("N1"), pytest.raises(flowx.LeaseUnavailable) as refused:
            await hosts[0].start(FLOW, Work(name="refused"))
        assert refused.value.retryable and refused.value.http_status == 503
        assert hosts[0].store is not None
        listed = await hosts[0].store.catalog.list_instances(InstanceQuery())
        assert sorted(r.instance_id for r in listed) == sorted(ids)  # nothing half-started

        # The steps in flight outlast every lease: each runs out locally first.
        def all_ran_out() -> bool:
            held = _leases(hosts)
            return len(held) == INSTANCES and not any(lease.live for lease in held)

        await until(all_ran_out, within=MARGIN + 10, what="every lease ran out locally")
        release_two.set()

        # R2.4: each finished step commits under the token it ran with; the journal accepts
        # it (nobody raised the fence). R3.5: no run starts step three without a lease.
        journal = hosts[0].store.journal

        async def two_committed() -> bool:
            return all([len(await journal.steps(iid)) == 2 for iid in ids])

        await until(two_committed, within=10, what="every step two committed, Redis down")
        await until(
            lambda: all(h.in_flight == 0 for h in hosts), within=10, what="every run stopped"
        )
        assert not [e for e in ledger.effects if e.step == "three"]
        assert time.monotonic() - killed < OUTAGE, "the outage ended before its checks ran"

        # The rest of the 3 × TTL outage: its length is the fault, not a wait for an outcome.
        await asyncio.sleep(killed + OUTAGE - time.monotonic())
        assert not [e for e in ledger.effects if e.step == "three"]
        for iid in ids:
            assert len(await journal.steps(iid)) == 2
        redis.start()  # empty: every counter and lease forgotten
        back = time.monotonic()

        async def all_completed() -> bool:
            records = [await hosts[0].get(iid) for iid in ids]
            return all(r.state is flowx.InstanceState.COMPLETED for r in records)

        await until(
            all_completed, within=TTL + SCAN * 2 + STEP + 20, what="every instance completed"
        )
        recovered = time.monotonic() - back
        with on_node("N2"):
            fresh = await hosts[1].start(FLOW, Work(name="fresh", quick=True))
        assert (await fresh.result(timeout=20)).three == "N2"  # starts are accepted again
        print(f"\nall {INSTANCES} completed {recovered:.2f}s after Redis came back")

        for iid in ids:
            assert [(s.step_name, s.outcome) for s in await journal.steps(iid)] == [
                (step, Outcome.SUCCESS) for step in STEPS
            ]
            # 0 duplicates: every step finished while the journal was up, so ran once.
            for step in ("one", "two", "three"):
                assert ledger.count(iid, step) == 1, (iid, step, ledger.nodes(iid, step))
            assert ledger.count(iid, "undo") == 0
            # The empty Redis issued tokens above the journal's fence (its floor).
            opened = [o.token for t in taps for o in t.opens if o.instance_id == iid]
            before = max(w.token for t in taps for w in t.of(iid) if w.step == STEPS[1])
            assert opened and min(opened) > before
            assert (await hosts[0].get(iid)).fence == max(opened)
        assert writes_past_a_fence(*taps) == []
    finally:
        for host in hosts:
            await host.drain(timeout=3)
