"""The edges of a saga: what must never run once compensation has begun, a zombie that must
not compensate (R3.5), a child undone with its parent, errors in selectors, and a timer page
that a version nobody carries must not fill (R7.3)."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

import flowx
from flowx.engine import Execution, RunPorts, RunSpec
from flowx.engine.runner import child_instance_id
from flowx.stores.errors import LeaseLost
from flowx.stores.records import InstanceState, Outcome
from flowx.testing import FakeClock
from tests.engine import kit
from tests.engine.kit import Ledger, failure_of, rows_of, until_state
from tests.engine.kit import fresh_ledgers as _reset  # noqa: F401 - autouse
from tests.support.polling import until

ledger = Ledger("edge")
calls, broken = ledger.calls, ledger.broken


class Order(kit.Order):
    box: dict[str, int] = {}


class CollectState(BaseModel):
    reservation: str | None = None
    counts: list[int] = []


class OrderState(BaseModel):
    reservation: str | None = None
    shipped: dict[str, Any] | None = None
    s1: str | None = None
    s2: str | None = None


reserve = ledger.capability("reserve")
release = ledger.capability("release")
s1 = ledger.capability("s1", delay=0.05)
u1 = ledger.capability("u1")
s2 = ledger.capability("s2")
fail_now = ledger.capability("f", non_retryable=True)
flaky = ledger.capability("flaky", delay=0.02)
slow_fail = ledger.capability("slow_fail", delay=0.07, non_retryable=True)
ship = ledger.capability("ship")
unship = ledger.capability("unship")
charge = ledger.capability("charge", non_retryable=True)

ONCE = flowx.Retry(attempts=1, backoff="none")


async def test_a_replayed_fork_runs_nothing_forward_once_compensation_has_begun(
    host_factory: Any,
) -> None:
    plan = (
        flowx.flow("edge.fork", version="1", input=Order, state=OrderState)
        .step(reserve, into="reservation", compensate=release, compensate_retry=ONCE)
        .fork(
            "f",
            lambda b: b.step(s1, into="s1", compensate=u1).step(s2, into="s2"),
            lambda b: b.step(fail_now),
        )
        .build()
    )
    host = await host_factory(plan)
    broken.update({"f", "release"})
    handle = await host.start(plan, Order(order_id="e1"))
    await failure_of(handle, timeout=5)
    assert calls["s2"] == 0  # halted at its boundary by the sibling's failure
    broken.discard("release")
    dry = await host.replay(handle.instance_id, "edge.reserve", dry_run=True)
    assert dry.reruns == ("undo edge.reserve",)
    await host.replay(handle.instance_id, "edge.reserve")
    await host.wait_idle(timeout=5)
    assert (await host.get(handle.instance_id)).state is InstanceState.FAILED
    assert calls["s2"] == 0 and calls["s1"] == 1  # the replay ran nothing forward
    forward = [r for r in await rows_of(host, handle.instance_id) if r.step_name == "edge.s2"]
    assert forward == []


async def test_a_failing_branch_stops_a_sibling_between_its_retries(host_factory: Any) -> None:
    plan = (
        flowx.flow("edge.retry", version="1", input=Order, state=OrderState)
        .fork(
            "f",
            lambda b: b.step(flaky, retry=flowx.Retry(attempts=50, backoff="none")),
            lambda b: b.step(slow_fail),
        )
        .build()
    )
    host = await host_factory(plan)
    broken.update({"flaky", "slow_fail"})
    handle = await host.start(plan, Order(order_id="e2"))
    failed = await failure_of(handle, timeout=10)
    assert failed.error["step"] == "edge.slow_fail"
    assert 1 <= calls["flaky"] < 10  # ~0.07 s / 0.02 s per try, far short of 50


LEASE = {"lost": False}


@flowx.capability("edge.charge_then_pause", version="1.0.0")
async def charge_then_pause(ctx: flowx.StepContext, order: Order) -> None:
    LEASE["lost"] = True  # the node pauses past its TTL while this step fails
    raise flowx.NonRetryableError("card declined")


async def test_a_node_that_lost_its_lease_does_not_run_the_compensation(clock: FakeClock) -> None:
    """R3.5: a compensation is an effect like any other; a zombie must stop before it."""
    plan = (
        flowx.flow("edge.zombie", version="1", input=Order, state=OrderState)
        .step(reserve, into="reservation", compensate=release)
        .step(charge_then_pause)
        .build()
    )
    LEASE["lost"] = False

    async def commit(**kw: Any) -> None:
        return None

    def guard() -> int:
        if LEASE["lost"]:
            raise LeaseLost("i", 1, "no renewal was confirmed in time")
        return 1

    execution = Execution(
        RunSpec(plan=plan, instance_id="i", input_value=Order(order_id="z")),
        RunPorts(committer=commit, clock=clock, guard=guard),
    )
    result = await execution.run()
    assert result.outcome == "aborted"
    assert calls["reserve"] == 1 and calls["release"] == 0


def reserve_ship_then(
    child_id: str, parent_id: str, ship_with: flowx.Capability, last: flowx.Capability, **kw: Any
) -> flowx.Plan:
    """A parent (deadline 1 h) that reserves, ships in a child flow (undone by ``unship``),
    then runs ``last``: one that can fail or time out after its child has completed."""
    child = (
        flowx.flow(child_id, version="1", input=Order, state=OrderState)
        .step(ship_with, into="s1", compensate=unship)
        .build()
    )
    return (
        flowx.flow(parent_id, version="1", input=Order, state=OrderState, deadline="1h")
        .step(reserve, into="reservation", compensate=release)
        .sub_flow(child, lambda o, s: o, into="shipped")
        .step(last, **kw)
        .build()
    )


async def test_a_completed_child_is_undone_when_its_parent_fails_later(host_factory: Any) -> None:
    parent = reserve_ship_then("edge.child", "edge.parent", ship, charge)
    host = await host_factory(parent)
    broken.add("charge")
    handle = await host.start(parent, Order(order_id="e4"))
    await failure_of(handle, timeout=5)
    assert calls["unship"] == 1 and calls["release"] == 1
    child_id = child_instance_id(handle.instance_id, "", 2)
    record = await host.get(child_id)
    assert record.state is InstanceState.FAILED
    assert flowx.codec.loads(record.error)["code"] == "flow.undone"
    assert record.deadline_at is not None  # capped by the parent's deadline
    assert record.deadline_at <= (await host.get(handle.instance_id)).deadline_at
    child_rows = [(r.step_name, r.outcome) for r in await rows_of(host, child_id)]
    assert child_rows == [("edge.ship", Outcome.SUCCESS), ("edge.ship", Outcome.COMPENSATED)]
    parent_rows = [(r.step_name, r.outcome) for r in await rows_of(host, handle.instance_id)]
    assert ("sub_flow:edge.child", Outcome.COMPENSATED) in parent_rows
    # Undone newest first: the child before the reservation.
    order = [r.step_name for r in await rows_of(host, handle.instance_id)]
    assert order.index("sub_flow:edge.child", 2) < order.index("edge.reserve", 1)


async def test_a_child_that_cannot_be_undone_fails_the_parents_compensation(
    host_factory: Any,
) -> None:
    child = (
        flowx.flow("edge.child2", version="1", input=Order, state=OrderState)
        .step(ship, into="s1", compensate=unship, compensate_retry=ONCE)
        .build()
    )
    parent = (
        flowx.flow("edge.parent2", version="1", input=Order, state=OrderState)
        .sub_flow(child, lambda o, s: o, into="shipped")
        .step(charge)
        .build()
    )
    sink = flowx.RecordingAlertSink()
    host = await host_factory(parent, alerts=sink)
    broken.update({"charge", "unship"})
    handle = await host.start(parent, Order(order_id="e5"))
    failed = await failure_of(handle, timeout=5)
    assert failed.state == "CompensationFailed"
    child_id = child_instance_id(handle.instance_id, "", 1)
    assert (await host.get(child_id)).state is InstanceState.COMPENSATION_FAILED
    # One alert for each instance that ran out: the child's own, and its parent's.
    assert sorted(a.capability for a in sink.alerts) == [
        "edge.unship@1.0.0",
        "sub_flow:edge.child2@1",
    ]
    dry = await host.replay(handle.instance_id, "sub_flow:edge.child2", dry_run=True)
    assert dry.reruns == ("undo sub_flow:edge.child2",)


async def test_a_selector_that_raises_fails_the_flow_instead_of_leaving_it_running(
    host_factory: Any,
) -> None:
    plan = (
        flowx.flow("edge.selector", version="1", input=Order, state=OrderState)
        .step(reserve, into="reservation", compensate=release)
        .step(ship, argument=lambda o, s: o.box["missing"])
        .build()
    )
    loop = (
        flowx.flow("edge.items", version="1", input=Order, state=OrderState)
        .step(reserve, into="reservation", compensate=release)
        .for_each("lines", lambda o, s: o.box["missing"], lambda b: b.step(ship))
        .build()
    )
    collect = (
        flowx.flow("edge.collect", version="1", input=Order, state=CollectState)
        .step(reserve, into="reservation", compensate=release)
        .for_each("lines", lambda o, s: [1, 2], lambda b: b.step(ship), into="counts")
        .build()
    )
    host = await host_factory(plan, loop, collect)
    for flow, code in (
        (plan, "step.argument_failed"),
        (loop, "for_each.items_failed"),
        (collect, "for_each.result_invalid"),
    ):
        handle = await host.start(flow, Order(order_id=flow.flow_id))
        failed = await failure_of(handle, timeout=5)
        assert failed.state == "Failed"
        assert failed.error["code"] == code
    assert calls["release"] == 3


def sleeper(flow_id: str, version: str) -> flowx.Plan:
    """A flow that naps a minute, then ships: due on the timer page after ``advance``."""
    return (
        flowx.flow(flow_id, version=version, input=Order, state=OrderState)
        .sleep("1m", name="nap")
        .step(ship, into="s1")
        .build()
    )


async def test_due_instances_of_a_version_nobody_here_carries_do_not_starve_the_rest(
    host_factory: Any, clock: FakeClock
) -> None:
    old, new = sleeper("edge.nap", "1"), sleeper("edge.nap", "2")
    both = await host_factory(old, new)
    for n in range(3):
        await both.start(old, Order(order_id=f"old-{n}"))
    clock.advance(seconds=1)
    fresh = await both.start(new, Order(order_id="new"))
    await both.wait_idle(timeout=5)
    await both.drain(timeout=1)
    clock.advance(minutes=10)
    # A page of 3 would hold only the 3 older sleepers of version 1, which this node leaves
    # alone (R7.3): asked for what it carries, it finds the one it can run.
    only_new = await host_factory(new, settings=flowx.HostSettings(timer_batch_size=3))
    sweep = await only_new.timers.run_once()
    assert (sweep.due, sweep.woken) == (1, 1)
    await only_new.wait_idle(timeout=5)
    assert (await only_new.get(fresh.instance_id)).state is InstanceState.COMPLETED


async def test_a_timer_loop_facing_only_other_versions_due_rows_does_not_spin(
    host_factory: Any, clock: FakeClock
) -> None:
    old, new = sleeper("edge.nap2", "1"), sleeper("edge.nap2", "2")
    first = await host_factory(old, new)
    await first.start(old, Order(order_id="old"))
    await first.wait_idle(timeout=5)
    await first.drain(timeout=1)
    clock.advance(minutes=5)
    host = await host_factory(new)
    assert host.timers is not None
    sweeps = 0
    run_once = host.timers.run_once

    async def counted() -> Any:
        nonlocal sweeps
        sweeps += 1
        return await run_once()

    host.timers.run_once = counted  # type: ignore[method-assign]
    stop = asyncio.Event()
    loop = asyncio.create_task(host.timers.run_forever(stop))
    await asyncio.sleep(0.5)
    stop.set()
    await loop
    assert 1 <= sweeps <= 3  # one sweep, then the poll interval (1 s): not a hot loop


slow_ship = ledger.capability("slow_ship", returns=lambda _: "shipped")


async def test_a_child_that_completes_after_its_parents_deadline_is_undone(
    host_factory: Any, clock: FakeClock
) -> None:
    parent = reserve_ship_then("edge.late-child", "edge.late-parent", slow_ship, s2, into="s2")
    ledger.gates["slow_ship"] = asyncio.Event()
    host = await host_factory(parent)
    handle = await host.start(parent, Order(order_id="late"))
    # Sealed, and the run that sealed it gone (its lease released): then a sweep can take it.
    await until_state(host, handle.instance_id, InstanceState.SUSPENDED)
    clock.advance(hours=2)  # the child's step is still running past the shared deadline
    assert (await host.timers.run_once()).woken == 1
    await asyncio.sleep(0.05)
    # Woken at its deadline, the parent waits on for the child instead of ending first.
    assert (await host.get(handle.instance_id)).state is InstanceState.SUSPENDED
    ledger.gates["slow_ship"].set()
    failed = await failure_of(handle, timeout=5)
    assert failed.state == "TimedOut"
    child_record = await host.get(child_instance_id(handle.instance_id, "", 2))
    assert flowx.codec.loads(child_record.error)["code"] == "flow.undone"
    assert calls["unship"] == 1 and calls["release"] == 1 and calls["s2"] == 0


async def test_a_child_that_times_out_with_its_parent_leaves_the_parent_timed_out(
    host_factory: Any, clock: FakeClock
) -> None:
    child = (
        flowx.flow("edge.waiting-child", version="1", input=Order, state=OrderState)
        .step(ship, into="s1", compensate=unship)
        .await_signal("go", dict)
        .build()
    )
    parent = (
        flowx.flow("edge.waiting-parent", version="1", input=Order, state=OrderState, deadline="1h")
        .step(reserve, into="reservation", compensate=release)
        .sub_flow(child, lambda o, s: o)
        .build()
    )
    host = await host_factory(parent)
    handle = await host.start(parent, Order(order_id="both"))
    child_id = child_instance_id(handle.instance_id, "", 2)
    assert host.store is not None
    journal = host.store.journal

    async def both_suspended() -> bool:
        records = [await journal.get(i) for i in (child_id, handle.instance_id)]
        sealed = all(r is not None and r.state is InstanceState.SUSPENDED for r in records)
        return sealed and not host._tasks

    await until(
        both_suspended, within=5, what="the parent and its child both suspended", every=0.01
    )
    clock.advance(hours=2)
    await host.timers.run_once()
    failed = await failure_of(handle, timeout=5)
    assert failed.state == "TimedOut"
    assert (await host.get(child_id)).state is InstanceState.TIMED_OUT
    assert calls["unship"] == 1 and calls["release"] == 1


@flowx.capability("edge.hold_child_lease", version="1.0.0")
async def hold_child_lease(ctx: flowx.StepContext, order: Order) -> None:
    """Another node takes the child's lease for 20 s (a release that never landed), then the
    parent's step fails: its compensation finds the child busy, not failed."""
    store = HELD["store"]
    child_id = child_instance_id(ctx.instance_id, "", 1)
    record = await store.journal.get(child_id)
    lease = await store.leases.acquire(
        child_id,
        owner="elsewhere",
        ttl=__import__("datetime").timedelta(seconds=20),
        now=HELD["clock"].now(),
        floor=record.fence,
    )
    assert lease is not None
    raise flowx.NonRetryableError("card declined")


HELD: dict[str, Any] = {}


async def test_a_busy_child_is_waited_for_not_counted_as_a_failed_compensation(
    host_factory: Any, clock: FakeClock
) -> None:
    child = (
        flowx.flow("edge.busy-child", version="1", input=Order, state=OrderState)
        .step(ship, into="s1", compensate=unship)
        .build()
    )
    parent = (
        flowx.flow("edge.busy-parent", version="1", input=Order, state=OrderState)
        .sub_flow(child, lambda o, s: o)
        .step(hold_child_lease)
        .build()
    )
    host = await host_factory(parent)
    HELD.update(store=host.store, clock=clock)
    handle = await host.start(parent, Order(order_id="busy"))
    failed = await failure_of(handle, timeout=10)
    assert failed.state == "Failed"  # not CompensationFailed: the lease ran out, then undo
    rows = await rows_of(host, handle.instance_id)
    assert [r.outcome for r in rows if r.outcome is Outcome.COMPENSATION_FAILURE] == []
    assert calls["unship"] == 1
