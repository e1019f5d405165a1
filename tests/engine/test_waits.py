"""Signals, durable timers and deadlines on the memory store (R2.10, R2.11, SPEC §8).

The timer service is driven one sweep at a time (``host.timers.run_once()``) against a fake
clock, so every wake-up here happens because a test moved time, never because a test slept.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

import flowx
from flowx.stores.errors import InstanceFinished
from flowx.stores.records import InstanceState, Outcome
from flowx.testing import FakeClock
from tests.engine.kit import Ledger, Order, failure_of, reservation, rows_of, until_state
from tests.engine.kit import fresh_ledgers as _reset  # noqa: F401 - autouse
from tests.support.polling import until

ledger = Ledger("wait")
calls, gates = ledger.calls, ledger.gates


class Shipment(BaseModel):
    carrier: str
    tracking: str


class OrderState(BaseModel):
    reservation: str | None = None
    shipment: Shipment | None = None
    note: str | None = None


reserve = ledger.capability("reserve", returns=reservation)
release = ledger.undo("release")
chase = ledger.capability("chase", returns=lambda _: "chased the carrier")


@flowx.capability("wait.flaky", version="1.0.0")
async def flaky(ctx: flowx.StepContext, order: Order) -> str:
    calls["flaky"] += 1
    raise RuntimeError("the gateway is down")


def shipped_or_chase(builder: Any, *, timeout: str, **kw: Any) -> Any:
    """``builder`` then a wait for the ``shipped`` signal that, past ``timeout``, chases the
    carrier instead (the timeout branch writes ``note``)."""
    return builder.await_signal(
        "shipped", Shipment, timeout=timeout, on_timeout=lambda b: b.step(chase, into="note"), **kw
    )


def shipping_flow(**kw: Any) -> flowx.Plan:
    return (
        flowx.flow("wait.ship", version="1", input=Order, state=OrderState, **kw)
        .step(reserve, into="reservation", compensate=release)
        .await_signal("shipped", Shipment, into="shipment", timeout="2d")
        .build()
    )


# -- signals ---------------------------------------------------------------------------------


async def test_await_signal_seals_the_instance_and_a_signal_resumes_it(host_factory: Any) -> None:
    plan = shipping_flow()
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="o1"))
    record = await until_state(host, handle.instance_id, InstanceState.SUSPENDED)
    # R6.3: a suspended instance is a row, not a task; its lease is released.
    assert host.in_flight == 0
    assert record.wake_signal == "shipped" and record.wake_step_id == 2
    assert record.wake_scope == ""
    lease = await host.store.leases.current(handle.instance_id)
    assert lease is not None and lease.expires_at <= host.clock.now()

    receipt = await host.signal(
        handle.instance_id, "shipped", {"carrier": "dhl", "tracking": "T1"}, key="hook-1"
    )
    assert receipt.status == "woken"
    state = await handle.result(timeout=5)
    assert state.shipment == Shipment(carrier="dhl", tracking="T1")
    rows = await rows_of(host, handle.instance_id)
    signal_rows = [r for r in rows if r.step_id == 2]
    assert [(r.outcome, r.attempt) for r in signal_rows] == [(Outcome.SUCCESS, 1)]
    taken = flowx.codec.loads(signal_rows[0].result)
    assert taken["key"] == "hook-1"
    assert taken["payload"] == {"carrier": "dhl", "tracking": "T1"}


async def test_a_redelivered_signal_is_inert_and_says_so(host_factory: Any) -> None:
    plan = shipping_flow()
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="o2"))
    await until_state(host, handle.instance_id, InstanceState.SUSPENDED)
    payload = {"carrier": "ups", "tracking": "T2"}
    first = await host.signal(handle.instance_id, "shipped", payload, key="delivery-7")
    again = await host.signal(handle.instance_id, "shipped", payload, key="delivery-7")
    assert (first.status, again.status) == ("woken", "duplicate")
    assert again.seq == first.seq
    await handle.result(timeout=5)
    assert len(await host.store.waits.signals(handle.instance_id, "shipped")) == 1
    # Once the instance has ended, a signal is refused rather than kept where nothing reads it.
    with pytest.raises(InstanceFinished) as info:
        await host.signal(handle.instance_id, "shipped", payload, key="delivery-8")
    assert info.value.state == "Completed"
    with pytest.raises(InstanceFinished):
        await host.signal(handle.instance_id, "shipped", payload)
    # R2.10: but a sender retrying a delivery it already made gets its success.
    retried = await host.signal(handle.instance_id, "shipped", payload, key="delivery-7")
    assert (retried.status, retried.seq) == ("duplicate", first.seq)
    assert retried.state is InstanceState.COMPLETED
    assert len(await host.store.waits.signals(handle.instance_id, "shipped")) == 1
    rows = await rows_of(host, handle.instance_id)
    assert len([r for r in rows if r.step_id == 2]) == 1


async def test_a_signal_that_arrives_before_the_wait_is_kept_and_taken(host_factory: Any) -> None:
    plan = shipping_flow()
    host = await host_factory(plan)
    gates["reserve"] = asyncio.Event()
    handle = await host.start(plan, Order(order_id="o3"))
    await asyncio.sleep(0.01)
    assert (await host.get(handle.instance_id)).state is InstanceState.RUNNING
    receipt = await host.signal(handle.instance_id, "shipped", {"carrier": "a", "tracking": "b"})
    assert receipt.status == "kept"
    gates["reserve"].set()
    state = await handle.result(timeout=5)
    assert state.shipment == Shipment(carrier="a", tracking="b")


async def test_bad_signals_are_clear_errors_and_keep_nothing(host_factory: Any) -> None:
    plan = shipping_flow()
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="o4"))
    await until_state(host, handle.instance_id, InstanceState.SUSPENDED)
    with pytest.raises(flowx.InstanceNotFound):
        await host.signal("5b0c1d7e-0000-4000-8000-000000000000", "shipped", {})
    with pytest.raises(flowx.SignalUnknown) as unknown:
        await host.signal(handle.instance_id, "delivered", {"carrier": "a", "tracking": "b"})
    assert unknown.value.code == "signal.unknown" and "shipped" in str(unknown.value)
    with pytest.raises(flowx.SignalPayloadInvalid) as wrong:
        await host.signal(handle.instance_id, "shipped", {"carrier": "a"})
    assert wrong.value.code == "signal.payload_invalid" and "tracking" in str(wrong.value)
    assert list(await host.store.waits.signals(handle.instance_id, "shipped")) == []
    assert (await host.get(handle.instance_id)).state is InstanceState.SUSPENDED


async def test_a_signal_resumes_the_instance_on_another_node(host_factory: Any) -> None:
    plan = shipping_flow()
    first = await host_factory(plan)
    handle = await first.start(plan, Order(order_id="o5"))
    await until_state(first, handle.instance_id, InstanceState.SUSPENDED)
    await first.drain(timeout=1)
    second = await host_factory(plan)
    receipt = await second.signal(handle.instance_id, "shipped", '{"carrier":"x","tracking":"y"}')
    assert receipt.status == "woken"
    done = await until_state(second, handle.instance_id, InstanceState.COMPLETED)
    assert OrderState.model_validate_json(done.state_bag).shipment == Shipment(
        carrier="x", tracking="y"
    )


async def test_a_signal_timeout_takes_the_timeout_branch(
    host_factory: Any, clock: FakeClock
) -> None:
    plan = shipped_or_chase(
        flowx.flow("wait.branch", version="1", input=Order, state=OrderState).step(
            reserve, into="reservation"
        ),
        into="shipment",
        timeout="2d",
    ).build()
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="o6"))
    record = await until_state(host, handle.instance_id, InstanceState.SUSPENDED)
    assert record.wake_at == clock.now() + timedelta(days=2)
    assert (await host.timers.run_once()).woken == 0  # not due yet
    clock.advance(days=2, seconds=1)
    sweep = await host.timers.run_once()
    assert sweep.woken == 1
    done = await until_state(host, handle.instance_id, InstanceState.COMPLETED)
    state = OrderState.model_validate_json(done.state_bag)
    assert state.note == "chased the carrier" and state.shipment is None
    rows = await rows_of(host, handle.instance_id)
    assert [r.step_name for r in rows] == ["wait.reserve", "shipped", "wait.chase"]
    assert flowx.codec.loads(rows[1].result)["timed_out"] is True


async def test_a_signal_timeout_with_no_branch_fails_the_flow_and_compensates(
    host_factory: Any, clock: FakeClock
) -> None:
    plan = shipping_flow()
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="o7"))
    await until_state(host, handle.instance_id, InstanceState.SUSPENDED)
    clock.advance(days=3)
    assert (await host.timers.run_once()).woken == 1
    failed = await failure_of(handle, timeout=5)
    assert failed.state == "Failed"
    assert failed.error["code"] == "signal.timed_out"
    assert calls["release"] == 1


# -- durable sleep ---------------------------------------------------------------------------


def sleepy_flow() -> flowx.Plan:
    return (
        flowx.flow("wait.sleep", version="1", input=Order, state=OrderState)
        .step(reserve, into="reservation")
        .sleep("1h", name="cool-off")
        .step(chase, into="note")
        .build()
    )


async def test_a_sleep_parks_and_schedules_in_one_write_and_wakes_when_due(
    host_factory: Any, clock: FakeClock
) -> None:
    plan = sleepy_flow()
    host = await host_factory(plan)
    started = clock.now()
    handle = await host.start(plan, Order(order_id="s1"))
    record = await until_state(host, handle.instance_id, InstanceState.SUSPENDED)
    assert record.wake_at == started + timedelta(hours=1)
    assert (record.wake_step_id, record.wake_scope, record.wake_signal) == (2, "", None)
    assert [r.step_name for r in await rows_of(host, handle.instance_id)] == ["wait.reserve"]
    assert await host.store.waits.next_wake() == started + timedelta(hours=1)
    clock.advance(minutes=59)
    assert (await host.timers.run_once()).woken == 0
    clock.advance(minutes=2)
    assert (await host.timers.run_once()).woken == 1
    done = await until_state(host, handle.instance_id, InstanceState.COMPLETED)
    assert OrderState.model_validate_json(done.state_bag).note == "chased the carrier"
    assert calls["reserve"] == 1
    names = [r.step_name for r in await rows_of(host, handle.instance_id)]
    assert names == ["wait.reserve", "cool-off", "wait.chase"]


async def test_a_worker_restarted_after_the_wake_time_wakes_it_late_not_never(
    host_factory: Any, clock: FakeClock
) -> None:
    plan = sleepy_flow()
    first = await host_factory(plan)
    handle = await first.start(plan, Order(order_id="s2"))
    await until_state(first, handle.instance_id, InstanceState.SUSPENDED)
    await first.drain(timeout=1)
    clock.advance(days=30)  # every worker was down when it fell due
    later = await host_factory(plan)
    assert (await later.timers.run_once()).woken == 1
    await until_state(later, handle.instance_id, InstanceState.COMPLETED)


async def test_two_nodes_sweeping_at_once_wake_an_instance_once(
    host_factory: Any, clock: FakeClock
) -> None:
    plan = sleepy_flow()
    a = await host_factory(plan)
    b = await host_factory(plan)
    handles = [await a.start(plan, Order(order_id=f"s3-{i}")) for i in range(20)]
    for h in handles:
        await until_state(a, h.instance_id, InstanceState.SUSPENDED)
    clock.advance(hours=2)
    sweeps = await asyncio.gather(a.timers.run_once(), b.timers.run_once())
    assert sum(s.woken for s in sweeps) == 20
    for h in handles:
        await until_state(a, h.instance_id, InstanceState.COMPLETED)
        rows = await rows_of(a, h.instance_id)
        assert [r.step_name for r in rows].count("cool-off") == 1
    assert calls["chase"] == 20


async def test_the_timer_service_wakes_a_short_sleep_on_its_own(memory_store: Any) -> None:
    plan = (
        flowx.flow("wait.nap", version="1", input=Order, state=OrderState)
        .sleep("200ms", name="nap")
        .step(chase, into="note")
        .build()
    )
    async with flowx.FlowHost(
        store=memory_store,
        flows=[plan],
        settings=flowx.HostSettings.load(recovery=False),
    ) as host:
        handle = await host.start(plan, Order(order_id="s4"))
        state = await handle.result(timeout=5)
    assert state.note == "chased the carrier"


async def test_many_suspended_instances_hold_no_task_or_lease(host_factory: Any) -> None:
    plan = sleepy_flow()
    host = await host_factory(plan)
    handles = [await host.start(plan, Order(order_id=f"m{i}")) for i in range(300)]
    await host.wait_idle(timeout=10)
    assert host.in_flight == 0
    for h in handles[::50]:
        assert (await host.get(h.instance_id)).state is InstanceState.SUSPENDED
        lease = await host.store.leases.current(h.instance_id)
        assert lease is not None and lease.expires_at <= host.clock.now()


# -- deadlines -------------------------------------------------------------------------------


async def test_a_deadline_passed_while_sleeping_times_out_and_compensates(
    host_factory: Any, clock: FakeClock
) -> None:
    plan = (
        flowx.flow("wait.deadline", version="1", input=Order, state=OrderState, deadline="1h")
        .step(reserve, into="reservation", compensate=release)
        .sleep("1d", name="too-long")
        .step(chase, into="note")
        .build()
    )
    host = await host_factory(plan)
    started = clock.now()
    handle = await host.start(plan, Order(order_id="d1"))
    record = await until_state(host, handle.instance_id, InstanceState.SUSPENDED)
    assert record.wake_at == started + timedelta(hours=1)  # the deadline comes first
    clock.advance(hours=1)
    assert (await host.timers.run_once()).woken == 1
    failed = await failure_of(handle, timeout=5)
    assert failed.state == "TimedOut"
    assert failed.error["code"] == "flow.deadline_exceeded"
    assert calls["release"] == 1 and calls["chase"] == 0
    rows = await rows_of(host, handle.instance_id)
    # The deadline is journaled as the failure of the step it stopped (the sleep), so a
    # compensation resumed after a crash finds why it began in the rows.
    assert [(r.step_name, r.outcome) for r in rows] == [
        ("wait.reserve", Outcome.SUCCESS),
        ("too-long", Outcome.FAILURE),
        ("wait.reserve", Outcome.COMPENSATED),
    ]
    assert flowx.codec.loads(rows[1].result)["code"] == "flow.deadline_exceeded"
    assert flowx.metrics.DEADLINE_EXCEEDED.get("wait.deadline") >= 1


async def test_a_deadline_passed_between_retries_times_out(host_factory: Any) -> None:
    plan = (
        flowx.flow("wait.late", version="1", input=Order, state=OrderState, deadline="10s")
        .step(reserve, into="reservation", compensate=release)
        .step(flaky, retry=flowx.Retry(attempts=10, backoff="fixed", initial="4s"))
        .build()
    )
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="d2"))
    failed = await failure_of(handle, timeout=5)
    assert failed.state == "TimedOut"
    assert 1 <= calls["flaky"] < 10  # stopped by the deadline, not by the retry budget
    assert calls["release"] == 1


async def test_a_keyless_redelivery_to_a_wait_already_passed_is_inert_and_says_so(
    host_factory: Any,
) -> None:
    plan = (
        flowx.flow("wait.twice", version="1", input=Order, state=OrderState)
        .await_signal("shipped", Shipment, into="shipment")
        .step(reserve, into="reservation")
        .build()
    )
    host = await host_factory(plan)
    gates["reserve"] = asyncio.Event()  # holds the instance after its wait
    handle = await host.start(plan, Order(order_id="o8"))
    await until_state(host, handle.instance_id, InstanceState.SUSPENDED)
    payload = {"carrier": "dhl", "tracking": "T8"}
    assert (await host.signal(handle.instance_id, "shipped", payload)).status == "woken"
    await until(lambda: calls["reserve"], within=5, what="reserve started", every=0.01)
    again = await host.signal(handle.instance_id, "shipped", payload)
    assert again.status == "duplicate" and again.state is InstanceState.RUNNING
    assert len(await host.store.waits.signals(handle.instance_id, "shipped")) == 1
    gates["reserve"].set()
    await handle.result(timeout=5)


async def test_a_signal_after_its_wait_timed_out_is_late_and_kept_nowhere(
    host_factory: Any, clock: FakeClock
) -> None:
    plan = (
        shipped_or_chase(
            flowx.flow("wait.late-signal", version="1", input=Order, state=OrderState),
            timeout="1h",
        )
        .step(reserve, into="reservation")
        .build()
    )
    host = await host_factory(plan)
    gates["reserve"] = asyncio.Event()
    handle = await host.start(plan, Order(order_id="o9"))
    await until_state(host, handle.instance_id, InstanceState.SUSPENDED)
    clock.advance(hours=2)
    assert (await host.timers.run_once()).woken == 1
    await until(lambda: calls["reserve"], within=5, what="reserve started", every=0.01)
    late = await host.signal(handle.instance_id, "shipped", {"carrier": "a", "tracking": "b"})
    assert late.status == "late"
    assert list(await host.store.waits.signals(handle.instance_id, "shipped")) == []
    gates["reserve"].set()
    await handle.result(timeout=5)


async def _race(host: flowx.FlowHost, iid: str, senders: int) -> list[str]:
    """``senders`` keyless signals released at once; their statuses, sorted. A store may
    deliver them one after another (PostgreSQL batches deliveries and sends those to one
    instance in turn), so the woken flow can end before the last is delivered: that one is
    refused as ``ended`` (``InstanceFinished``), which is what a signal sent after the end
    gets."""
    start = asyncio.Barrier(senders)

    async def send(n: int) -> str:
        await start.wait()
        payload = {"carrier": f"c{n}", "tracking": f"T{n}"}
        try:
            return (await host.signal(iid, "shipped", payload)).status
        except flowx.InstanceFinished:
            return "ended"

    return sorted(await asyncio.gather(*(send(n) for n in range(senders))))


async def test_keyless_signals_racing_to_a_wait_that_happens_once_take_one(
    host_factory: Any,
) -> None:
    """R2.10: eight keyless signals sent at once to a Suspended wait: one wakes it, the seven
    others are ``duplicate`` (or, delivered after the flow ended, refused) and nothing of them
    is kept; the flow goes on with the one taken."""
    plan = shipping_flow()
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="race"))
    await until_state(host, handle.instance_id, InstanceState.SUSPENDED)
    statuses = await _race(host, handle.instance_id, 8)
    assert statuses.count("woken") == 1, statuses
    assert set(statuses) <= {"woken", "duplicate", "ended"}, statuses
    [kept] = await host.store.waits.signals(handle.instance_id, "shipped")
    state = await handle.result(timeout=5)
    assert state.shipment == Shipment.model_validate_json(kept.payload)


def twice_flow() -> flowx.Plan:
    return (
        shipped_or_chase(
            flowx.flow("wait.ship-twice", version="1", input=Order, state=OrderState).step(
                reserve, into="reservation"
            ),
            name="first-parcel",
            timeout="1h",
        )
        .await_signal("shipped", Shipment, into="shipment", name="second-parcel")
        .build()
    )


async def test_a_flow_that_waits_twice_keeps_two_signals_and_no_third(
    host_factory: Any,
) -> None:
    """R2.10: two waits that happen once take two signals, so of three sent before the flow
    reaches them two are kept and the third is a ``duplicate``."""
    plan = twice_flow()
    host = await host_factory(plan)
    gates["reserve"] = asyncio.Event()
    handle = await host.start(plan, Order(order_id="twice"))
    await until(lambda: calls["reserve"], within=5, what="reserve started", every=0.01)
    assert await _race(host, handle.instance_id, 3) == ["duplicate", "kept", "kept"]
    gates["reserve"].set()
    state = await handle.result(timeout=5)
    inbox = await host.store.waits.signals(handle.instance_id, "shipped")
    assert len(inbox) == 2
    assert state.shipment == Shipment.model_validate_json(inbox[1].payload)


async def test_a_wait_that_timed_out_leaves_no_room_for_a_second_signal(
    host_factory: Any, clock: FakeClock
) -> None:
    """R2.10: after the first of two waits timed out, only one signal can still be taken:
    of two sent at once to the second wait, one wakes it and one is a ``duplicate`` (or
    refused, if the flow has ended by the time it is delivered)."""
    plan = twice_flow()
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="timed-out"))
    await until_state(host, handle.instance_id, InstanceState.SUSPENDED)
    clock.advance(hours=2)
    assert (await host.timers.run_once()).woken == 1
    record = await until_state(host, handle.instance_id, InstanceState.SUSPENDED)
    assert record.wake_at is None  # now at the second wait, which has no timer
    assert calls["chase"] == 1
    statuses = await _race(host, handle.instance_id, 2)
    assert statuses in (["duplicate", "woken"], ["ended", "woken"]), statuses
    await handle.result(timeout=5)
    assert len(await host.store.waits.signals(handle.instance_id, "shipped")) == 1
