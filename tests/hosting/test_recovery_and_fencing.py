"""Leases, takeover and recovery between hosts on one store (R3.1–R3.6, R7.2, R7.3).

Real process kills are in tests/crash; here two hosts in one process share a store, so the
takeover sequence can be checked arrow by arrow.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

import flowx
from flowx import codec
from flowx.hosting.recovery import RecoveryService
from flowx.stores.records import InstanceState, NewInstance, Outcome

gate: dict[str, asyncio.Event] = {}
log: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    gate.clear()
    log.clear()


class Job(BaseModel):
    name: str


class JobState(BaseModel):
    first: str | None = None
    second: str | None = None


@flowx.capability("rec.first", version="1.0.0")
async def first(ctx: flowx.StepContext, job: Job) -> str:
    log.append(f"first:{ctx.attempt}")
    return "one"


@flowx.capability("rec.undo_first", version="1.0.0")
async def undo_first(ctx: flowx.StepContext, job: Job) -> None:
    log.append("undo_first")


@flowx.capability("rec.second", version="1.0.0")
async def second(ctx: flowx.StepContext, job: Job) -> str:
    log.append("second")
    event = gate.get(job.name)
    if event is not None:
        await event.wait()
        if job.name.startswith("fail"):
            raise flowx.NonRetryableError("boom after the pause")
    return "two"


PLAN = (
    flowx.flow("rec.job", version="1.0.0", input=Job, state=JobState)
    .step(first, into="first", compensate=undo_first)
    .step(second, into="second")
    .build()
)


def settings(**kw: Any) -> flowx.HostSettings:
    return flowx.HostSettings(lease_ttl="30s", **kw)


async def test_the_host_takes_the_lease_before_the_first_step_and_releases_it(
    host_factory: Any, memory_store: Any, clock: Any
) -> None:
    host = await host_factory(PLAN, settings=settings())
    handle = await host.start(PLAN, Job(name="a"))
    lease = await memory_store.leases.current(handle.instance_id)
    assert lease is not None and lease.owner == host.node_id  # R3.3
    record = await host.get(handle.instance_id)
    assert record.fence == lease.token
    await handle.result()
    await host.wait_idle()
    after = await memory_store.leases.current(handle.instance_id)
    assert after.expires_at <= clock.now()  # released in the finally, not deleted


async def test_a_zombie_is_fenced_out_and_runs_no_compensation(
    host_factory: Any, memory_store: Any, clock: Any
) -> None:
    """The chapter's sequence: node-1 pauses, node-2 takes over, node-1's commit is refused."""
    paused = gate["fail-zombie"] = asyncio.Event()
    node1 = await host_factory(PLAN, settings=settings(), node_id="node-1")
    node2 = await host_factory(PLAN, settings=settings(), node_id="node-2")
    handle = await node1.start(PLAN, Job(name="fail-zombie"))
    while "second" not in log:
        await asyncio.sleep(0)
    old = await memory_store.leases.current(handle.instance_id)
    clock.advance(seconds=31)  # node-1 stops renewing (paused); its lease lapses in the store
    del gate["fail-zombie"]  # node-2 runs step 2 without pausing and succeeds
    assert await node2.resume(handle.instance_id) == "resumed"
    await node2.wait_idle()
    new = await memory_store.leases.current(handle.instance_id)
    assert new.token > old.token
    record = await node2.get(handle.instance_id)
    assert record.state is InstanceState.COMPLETED
    assert record.fence == new.token
    rows_before = list(await memory_store.journal.steps(handle.instance_id))
    # node-1 wakes up unaware: its step fails, and its failure commit must be refused.
    paused.set()
    await node1.wait_idle()
    assert "undo_first" not in log  # R3.5: no compensation of an instance node-2 finished
    assert list(await memory_store.journal.steps(handle.instance_id)) == rows_before
    assert (await node1.get(handle.instance_id)).state is InstanceState.COMPLETED


async def test_the_recovery_scan_resumes_an_abandoned_instance_from_its_last_commit(
    host_factory: Any, memory_store: Any, clock: Any
) -> None:
    # A dead node's leftovers: an instance with step 1 committed, a lease never renewed.
    iid = "11111111-1111-4111-8111-111111111111"
    lease = await memory_store.leases.acquire(
        iid, owner="dead", ttl=timedelta(seconds=30), now=clock.now()
    )
    await memory_store.journal.create(
        NewInstance(
            instance_id=iid,
            flow_id="rec.job",
            flow_version="1.0.0",
            input=codec.dumps(Job(name="r")),
            state_bag="{}",
        ),
        token=lease.token,
        now=clock.now(),
    )
    from flowx.stores.records import StepCommit, StepWrite

    await memory_store.journal.commit(
        StepCommit(
            instance_id=iid,
            token=lease.token,
            now=clock.now(),
            state_bag='{"first":"one"}',
            step=StepWrite(
                scope="",
                step_id=1,
                attempt=1,
                step_name="rec.first",
                outcome=Outcome.SUCCESS,
                result='"one"',
                capability_id="rec.first",
                capability_version="1.0.0",
            ),
        )
    )
    host = await host_factory(PLAN, settings=settings())
    early = await host.recover_once()
    assert early.found == 0  # written to less than a TTL ago: not abandoned yet
    clock.advance(seconds=31)
    result = await host.recover_once()
    assert (result.found, result.resumed) == (1, 1)
    await host.wait_idle()
    assert log == ["second"]  # step 1 was not re-executed
    record = await host.get(iid)
    assert record.state is InstanceState.COMPLETED
    assert record.fence > lease.token


async def test_losing_the_race_for_a_lease_is_a_skip(
    host_factory: Any, memory_store: Any, clock: Any
) -> None:
    gate["held"] = asyncio.Event()
    owner = await host_factory(PLAN, settings=settings())
    handle = await owner.start(PLAN, Job(name="held"))
    clock.advance(seconds=20)
    await memory_store.leases.renew(
        await memory_store.leases.current(handle.instance_id),
        ttl=timedelta(seconds=30),
        now=clock.now(),
    )
    clock.advance(seconds=11)  # idle past a TTL, but its owner renewed: the lease is live
    other = await host_factory(PLAN, settings=settings())
    result = await other.recover_once()
    assert (result.found, result.resumed, result.lost_race) == (1, 0, 1)
    gate["held"].set()
    await handle.result()


async def test_a_candidate_pinned_to_a_version_this_node_lacks_is_left_alone(
    host_factory: Any, memory_store: Any, clock: Any
) -> None:
    v2 = (
        flowx.flow("rec.job", version="2.0.0", input=Job, state=JobState)
        .step(first, into="first")
        .build()
    )
    old_node = await host_factory(PLAN, settings=settings())
    handle = await old_node.start(PLAN, Job(name="pinned"), run_here=False)
    new_node = await host_factory(v2, settings=settings())
    result = await new_node.recover_once()
    assert (result.found, result.not_runnable, result.resumed) == (1, 1, 0)
    assert (await memory_store.leases.current(handle.instance_id)).expires_at <= clock.now()
    assert (await old_node.recover_once()).resumed == 1  # R7.3: the node that carries it
    await old_node.wait_idle()
    assert (await old_node.get(handle.instance_id)).flow_version == "1.0.0"


async def test_a_pending_instance_is_picked_up_without_waiting_a_ttl(host_factory: Any) -> None:
    producer = await host_factory(PLAN, settings=settings())
    handle = await producer.start(PLAN, Job(name="queued"), run_here=False)
    assert (await producer.get(handle.instance_id)).state is InstanceState.PENDING
    worker = await host_factory(PLAN, settings=settings())
    assert (await worker.recover_once()).resumed == 1
    assert (await handle.result()).second == "two"


async def _abandon(memory_store: Any, clock: Any, names: list[str]) -> list[str]:
    """Instances a dead node left Running: created under a lease nobody renews."""
    ids = []
    for name in names:
        iid = f"abandoned-{name}"
        await memory_store.leases.acquire(
            iid, owner="dead", ttl=timedelta(seconds=30), now=clock.now()
        )
        await memory_store.journal.create(
            NewInstance(
                instance_id=iid,
                flow_id="rec.job",
                flow_version="1.0.0",
                input=codec.dumps(Job(name=name)),
                state_bag="{}",
                state=InstanceState.RUNNING,
            ),
            token=(await memory_store.leases.current(iid)).token,
            now=clock.now(),
        )
        ids.append(iid)
    return ids


async def test_a_scan_asks_for_no_more_than_its_free_recovery_slots(
    host_factory: Any, memory_store: Any, clock: Any
) -> None:
    gate.update({f"slot{i}": asyncio.Event() for i in range(5)})
    await _abandon(memory_store, clock, [f"slot{i}" for i in range(5)])
    clock.advance(seconds=31)
    worker = await host_factory(
        PLAN, settings=settings(max_concurrent_recoveries=2, recovery_scan_batch_size=10)
    )
    first_scan = await worker.recover_once()
    assert (first_scan.found, first_scan.resumed, first_scan.full) == (2, 2, True)
    busy = await worker.recover_once()
    assert busy.skipped_busy and busy.full  # R3.4: no second page yet
    for event in gate.values():
        event.set()
    await worker.wait_idle()
    assert (await worker.recover_once()).resumed == 2


async def test_queued_instances_are_bounded_by_flow_slots_not_recovery_slots(
    host_factory: Any,
) -> None:
    gate.update({f"q{i}": asyncio.Event() for i in range(5)})
    producer = await host_factory(PLAN, settings=settings())
    for i in range(5):
        await producer.start(PLAN, Job(name=f"q{i}"), run_here=False)
    worker = await host_factory(
        PLAN, settings=settings(max_concurrent_recoveries=1, max_concurrent_flows=3)
    )
    scan = await worker.recover_once()
    assert (scan.queued, scan.full) == (3, True)
    assert worker.in_flight == 3
    assert (await worker.recover_once()).queued == 0  # no free flow slot
    for event in gate.values():
        event.set()
    await worker.wait_idle()
    assert (await worker.recover_once()).queued == 2


async def test_a_scan_looks_ahead_and_wakes_when_the_first_candidate_is_due(
    host_factory: Any, memory_store: Any, clock: Any
) -> None:
    """Resume latency ~ one TTL, not a TTL plus a scan interval (issue 4)."""
    [iid] = await _abandon(memory_store, clock, ["ahead"])
    worker = await host_factory(PLAN, settings=settings(recovery_scan_interval="10s"))
    clock.advance(seconds=25)  # due in 5 s; the next sweep would come 7.5–12.5 s from now
    scan = await worker.recover_once()
    assert (scan.found, scan.upcoming) == (0, 1)
    assert scan.wake_at == clock.now() + timedelta(seconds=5)
    assert (await memory_store.journal.get(iid)).fence == 1  # looked at, not touched
    clock.advance(seconds=5.05)  # the loop sleeps until just past wake_at
    assert (await worker.recover_once()).resumed == 1


async def test_a_due_candidate_with_a_live_lease_wakes_the_scan_when_the_lease_runs_out(
    host_factory: Any, memory_store: Any, clock: Any
) -> None:
    [iid] = await _abandon(memory_store, clock, ["renewed"])
    clock.advance(seconds=5)  # the dead node renewed once more before it died
    lease = await memory_store.leases.current(iid)
    await memory_store.leases.renew(lease, ttl=timedelta(seconds=30), now=clock.now())
    clock.advance(seconds=26)  # idle 31 s: due, but the lease runs 4 s more
    worker = await host_factory(PLAN, settings=settings())
    scan = await worker.recover_once()
    assert (scan.found, scan.lost_race) == (1, 1)
    assert scan.wake_at == clock.now() + timedelta(seconds=4)
    clock.advance(seconds=4)
    assert (await worker.recover_once()).resumed == 1


async def test_drain_releases_leases_so_a_peer_resumes_at_once(
    host_factory: Any, memory_store: Any, clock: Any
) -> None:
    gate["slow"] = asyncio.Event()
    node1 = await host_factory(PLAN, settings=settings())
    handle = await node1.start(PLAN, Job(name="slow"))
    while "second" not in log:
        await asyncio.sleep(0)
    await node1.drain(timeout=0.05)  # budget runs out: cancelled, not failed
    lease = await memory_store.leases.current(handle.instance_id)
    assert lease.expires_at <= clock.now()  # R7.2: explicitly released
    assert "undo_first" not in log
    # Cut mid-step, it is handed back Pending under its token (issue 12 item 5), so a sweep
    # takes it as queued work too.
    assert (await memory_store.journal.get(handle.instance_id)).state is InstanceState.PENDING
    gate["slow"].set()
    node2 = await host_factory(PLAN, settings=settings())
    assert await node2.resume(handle.instance_id) == "resumed"  # no TTL wait
    await node2.wait_idle()
    assert (await node2.get(handle.instance_id)).state is InstanceState.COMPLETED


async def test_the_scan_walks_from_a_random_offset_and_wraps_round(
    memory_store: Any, clock: Any
) -> None:
    import random

    for i in range(6):
        await memory_store.journal.create(
            NewInstance(
                instance_id=f"i{i}",
                flow_id="rec.job",
                flow_version="1.0.0",
                input="{}",
                state_bag="{}",
            ),
            token=1,
            now=clock.now() + timedelta(seconds=i),
        )
    clock.advance(seconds=60)  # all six are idle past a TTL
    seen: list[str] = []

    async def resume(candidate: Any, queued: bool) -> Any:
        seen.append(candidate.instance_id)
        return "resumed"

    service = RecoveryService(
        index=memory_store.recovery,
        settings=settings(recovery_scan_batch_size=10),
        clock=clock,
        in_flight=lambda: 0,
        resume=resume,
        rng=random.Random(7),
    )
    result = await service.run_once()
    assert result.found == 6
    assert sorted(seen) == [f"i{i}" for i in range(6)]  # every one, once
    assert seen != sorted(seen)  # not always from the head


def test_settings_are_validated_at_start_up() -> None:
    with pytest.raises(flowx.SettingsError, match="lease_renewal_interval"):
        flowx.HostSettings.load(lease_ttl="30s", lease_renewal_interval="20s")
    with pytest.raises(flowx.SettingsError, match="recovery_scan_batch_size"):
        flowx.HostSettings.load(recovery_scan_batch_size=0)
    with pytest.raises(flowx.SettingsError, match="not a duration"):
        flowx.HostSettings.load(lease_ttl="forever")
    with pytest.raises(flowx.SettingsError, match="queue_prefetch must be at least 0"):
        flowx.HostSettings.load(queue_prefetch=-1)
    assert flowx.HostSettings.load(queue_prefetch=0).queue_prefetch == 0  # claims no spare
    ok = flowx.HostSettings.load(lease_ttl="9s")
    assert ok.renewal_interval == timedelta(seconds=3)  # R3.2: TTL/3


def test_settings_come_from_the_environment_and_arguments_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLOWX_LEASE_TTL", "12s")
    monkeypatch.setenv("FLOWX_RECOVERY_SCAN_INTERVAL", "2s")
    loaded = flowx.HostSettings.load(recovery_scan_interval="3s")
    assert loaded.lease_ttl == timedelta(seconds=12)
    assert loaded.recovery_scan_interval == timedelta(seconds=3)
    monkeypatch.setenv("FLOWX_MAX_CONCURRENT_FLOWS", "zero")
    with pytest.raises(flowx.SettingsError, match="max_concurrent_flows"):
        flowx.HostSettings.load()


async def test_drain_finishes_the_step_in_flight_and_hands_the_instance_back(
    host_factory: Any, memory_store: Any, clock: Any
) -> None:
    """R7.2: the step running at SIGTERM commits; the rest is left Pending for a peer."""
    gate["handback"] = asyncio.Event()
    two_steps = (
        flowx.flow("rec.handback", version="1.0.0", input=Job, state=JobState)
        .step(second, into="second")
        .step(first, into="first")
        .build()
    )
    node1 = await host_factory(two_steps, settings=settings())
    handle = await node1.start(two_steps, Job(name="handback"))
    while "second" not in log:
        await asyncio.sleep(0)
    draining = asyncio.ensure_future(node1.drain(timeout=5))
    await asyncio.sleep(0)
    gate["handback"].set()  # the step in flight finishes inside the budget
    await draining
    record = await memory_store.journal.get(handle.instance_id)
    assert record.state is InstanceState.PENDING
    assert [r.step_name for r in await memory_store.journal.steps(handle.instance_id)] == [
        "rec.second"
    ]
    assert not any(entry.startswith("first") for entry in log)  # the next step did not start
    assert (await memory_store.leases.current(handle.instance_id)).expires_at <= clock.now()
    node2 = await host_factory(two_steps, settings=settings())
    scan = await node2.recover_once()  # no clock advance: no TTL to wait
    assert scan.queued == 1
    await node2.wait_idle()
    done = await node2.get(handle.instance_id)
    assert done.state is InstanceState.COMPLETED
    assert log.count("second") == 1  # not re-executed
