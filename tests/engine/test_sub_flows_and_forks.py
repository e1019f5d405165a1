"""Sub-flows, forks and nested for_each on the memory store ("Flow constructs", R2.1)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

import flowx
from flowx.engine.runner import child_instance_id
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceState, Outcome
from tests.engine import kit
from tests.engine.kit import Ledger, failure_of, reservation, rows_of, until_state
from tests.engine.kit import fresh_ledgers as _reset  # noqa: F401 - autouse

ledger = Ledger("sf")
calls, gates, broken, seen = ledger.calls, ledger.gates, ledger.broken, ledger.seen


class Order(kit.Order):
    lines: list[list[int]] = [[1, 2], [3]]


class Parcel(BaseModel):
    order_id: str
    weight: int = 1


class ParcelState(BaseModel):
    label: str | None = None


class OrderState(BaseModel):
    reservation: str | None = None
    parcel: ParcelState | None = None
    paid: str | None = None
    packed: str | None = None
    picked: list[Any] = []


reserve = ledger.capability("reserve", returns=reservation)
release = ledger.undo("release", scoped=True)
label = ledger.capability(
    "label",
    returns=lambda parcel: f"L-{parcel.order_id}-{parcel.weight}",
    non_retryable=True,
    fails_with="the carrier refused the parcel",
)


label_flow = (
    flowx.flow("sf.label", version="1", input=Parcel, state=ParcelState)
    .step(label, into="label")
    .build()
)


async def meet(ctx: flowx.StepContext, me: str, other: str) -> None:
    """Two fork branches running at once: each opens its own gate, then waits (bounded) for
    the other's, so neither can finish before both have started."""
    calls[me] += 1
    seen.append((me, ctx.scope))
    gates.setdefault(me, asyncio.Event()).set()
    await asyncio.wait_for(gates.setdefault(other, asyncio.Event()).wait(), 2)


@flowx.capability("sf.pay", version="1.0.0")
async def pay(ctx: flowx.StepContext, order: Order) -> str:
    await meet(ctx, "pay", "pack")
    if "pay" in broken:
        raise RuntimeError("card declined")
    return "paid"


refund = ledger.undo("refund", scoped=True)


@flowx.capability("sf.pack", version="1.0.0")
async def pack(ctx: flowx.StepContext, order: Order) -> str:
    await meet(ctx, "pack", "pay")
    return "packed"


unpack = ledger.undo("unpack", scoped=True)


@flowx.capability("sf.pick", version="1.0.0")
async def pick(ctx: flowx.StepContext, item: int) -> dict[str, Any]:
    calls["pick"] += 1
    if item in {int(x) for x in broken if x.isdigit()}:
        raise flowx.NonRetryableError(f"item {item} is out of stock")
    return {"item": item, "scope": ctx.scope}


unpick = ledger.undo("unpick", scoped=True)


def parent_flow() -> flowx.Plan:
    return (
        flowx.flow("sf.order", version="1", input=Order, state=OrderState)
        .step(reserve, into="reservation", compensate=release)
        .sub_flow(label_flow, lambda o, s: Parcel(order_id=o.order_id, weight=3), into="parcel")
        .build()
    )


# -- sub_flow --------------------------------------------------------------------------------


async def test_a_sub_flow_is_its_own_instance_and_the_parent_waits_durably(
    host_factory: Any,
) -> None:
    plan = parent_flow()
    host = await host_factory(plan)  # registering the parent carries the child
    assert host.carries("sf.label", "1")
    gates["label"] = asyncio.Event()
    handle = await host.start(plan, Order(order_id="p1"))
    child_id = child_instance_id(handle.instance_id, "", 2)

    await until_state(host, handle.instance_id, InstanceState.SUSPENDED, idle=False)
    parent = await host.get(handle.instance_id)
    assert parent.wake_signal == "flowx.sub_flow" and parent.wake_step_id == 2
    child = await host.get(child_id)
    assert (child.parent_instance_id, child.parent_scope, child.parent_step_id) == (
        handle.instance_id,
        "",
        2,
    )
    assert child.tenant_id == parent.tenant_id
    gates["label"].set()
    state = await handle.result(timeout=5)
    assert state.parcel == ParcelState(label="L-p1-3")
    assert (await host.get(child_id)).state is InstanceState.COMPLETED
    rows = await rows_of(host, handle.instance_id)
    assert [(r.step_name, r.outcome) for r in rows] == [
        ("sf.reserve", Outcome.SUCCESS),
        ("sub_flow:sf.label", Outcome.SUCCESS),
    ]


async def test_a_child_failure_is_the_parents_step_failure_and_it_compensates(
    host_factory: Any,
) -> None:
    plan = parent_flow()
    host = await host_factory(plan)
    broken.add("label")
    handle = await host.start(plan, Order(order_id="p2"))
    failed = await failure_of(handle, timeout=5)
    assert failed.state == "Failed"
    error = failed.error
    assert error["code"] == "sub_flow.failed" and error["child_state"] == "Failed"
    assert "refused the parcel" in error["child_error"]["message"]
    assert calls["release"] == 1
    child = await host.get(child_instance_id(handle.instance_id, "", 2))
    assert child.state is InstanceState.FAILED  # the child's own row says why, legibly


async def test_a_parent_resumed_on_another_node_finds_its_child_and_starts_no_second(
    host_factory: Any,
) -> None:
    plan = parent_flow()
    first = await host_factory(plan)
    gates["label"] = asyncio.Event()
    handle = await first.start(plan, Order(order_id="p3"))
    await until_state(first, handle.instance_id, InstanceState.SUSPENDED, idle=False)
    gates["label"].set()
    await first.wait_idle(timeout=5)
    await first.drain(timeout=1)
    second = await host_factory(plan)
    # The child finished on the first node, whose last commit made the parent Pending: any
    # node's recovery sweep takes it from there.
    assert (await second.get(handle.instance_id)).state in (
        InstanceState.PENDING,
        InstanceState.COMPLETED,
    )
    await second.recover_once()
    await second.wait_idle(timeout=5)
    record = await second.get(handle.instance_id)
    assert record.state is InstanceState.COMPLETED
    assert second.store is not None
    listed = await second.store.catalog.list_instances(InstanceQuery(flow_id="sf.label"))
    children = [r for r in listed if r.parent_instance_id == handle.instance_id]
    assert len(children) == 1 and calls["label"] == 1


# -- fork ------------------------------------------------------------------------------------


def fork_flow() -> flowx.Plan:
    return (
        flowx.flow("sf.fork", version="1", input=Order, state=OrderState)
        .step(reserve, into="reservation", compensate=release)
        .fork(
            "fulfil",
            lambda b: b.step(pay, into="paid", compensate=refund),
            lambda b: b.step(pack, into="packed", compensate=unpack),
        )
        .build()
    )


async def test_fork_branches_run_concurrently_in_their_own_scopes_and_join(
    host_factory: Any,
) -> None:
    plan = fork_flow()
    host = await host_factory(plan)
    # pay and pack each wait for the other to have started: sequential branches would hang.
    state = await (await host.start(plan, Order(order_id="f1"))).result(timeout=5)
    assert (state.paid, state.packed) == ("paid", "packed")
    assert sorted(s for n, s in seen if n in ("pay", "pack")) == ["2.0", "2.1"]


async def test_a_branch_failure_compensates_the_finished_branches(host_factory: Any) -> None:
    plan = fork_flow()
    host = await host_factory(plan)
    broken.add("pay")
    handle = await host.start(plan, Order(order_id="f2"))
    failed = await failure_of(handle, timeout=5)
    assert failed.error["step"] == "sf.pay" and failed.error["scope"] == "2.0"
    # pack finished in the sibling branch: undone, newest first, then the reservation.
    assert [n for n, _ in seen if n in ("unpack", "release", "refund")] == ["unpack", "release"]
    assert ("unpack", "2.1") in seen


async def test_a_resumed_fork_compensates_in_commit_order_not_replay_order(
    host_factory: Any,
) -> None:
    plan = fork_flow()
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="f3"))
    await handle.result(timeout=5)
    rows = await rows_of(host, handle.instance_id)
    order = [r.step_name for r in rows]
    assert order[0] == "sf.reserve" and set(order[1:]) == {"sf.pay", "sf.pack"}


# -- for_each, nested ------------------------------------------------------------------------


def picking_flow() -> flowx.Plan:
    return (
        flowx.flow("sf.pick", version="1", input=Order, state=OrderState)
        .step(reserve, into="reservation", compensate=release)
        .for_each(
            "boxes",
            lambda o, s: o.lines,
            lambda box: box.for_each(
                "items",
                lambda line, s: line,  # inside a for_each, a selector gets the element
                lambda b: b.step(pick, compensate=unpick),
            ),
            into="picked",
        )
        .build()
    )


async def test_nested_for_each_runs_each_element_in_a_nested_scope(host_factory: Any) -> None:
    plan = picking_flow()
    host = await host_factory(plan)
    state = await (await host.start(plan, Order(order_id="n1"))).result(timeout=5)
    assert state.picked == [
        [{"item": 1, "scope": "0/0"}, {"item": 2, "scope": "0/1"}],
        [{"item": 3, "scope": "1/0"}],
    ]


async def test_a_failure_deep_in_a_nested_loop_compensates_every_scope_newest_first(
    host_factory: Any,
) -> None:
    plan = picking_flow()
    host = await host_factory(plan)
    broken.add("3")
    handle = await host.start(plan, Order(order_id="n2"))
    failed = await failure_of(handle, timeout=5)
    assert failed.error["scope"] == "1/0"
    assert seen == [("unpick", "0/1"), ("unpick", "0/0"), ("release", "")]


async def test_a_sleep_inside_a_loop_resumes_in_the_right_scope(
    host_factory: Any, clock: Any
) -> None:
    plan = (
        flowx.flow("sf.drip", version="1", input=Order, state=OrderState)
        .for_each(
            "boxes",
            lambda o, s: o.lines,
            lambda box: box.sleep("1m", name="pause").step(pick, argument=lambda line, s: line[0]),
            into="picked",
        )
        .build()
    )
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="n3"))
    for scope in ("0", "1"):
        await until_state(host, handle.instance_id, InstanceState.SUSPENDED, idle=False)
        await host.wait_idle(timeout=5)
        assert (await host.get(handle.instance_id)).wake_scope == scope
        clock.advance(minutes=2)
        assert (await host.timers.run_once()).woken == 1
    state = await handle.result(timeout=5)
    assert state.picked == [{"item": 1, "scope": "0"}, {"item": 3, "scope": "1"}]


# -- build-time diagnostics ------------------------------------------------------------------


def test_a_wait_inside_a_fork_branch_is_refused_at_build() -> None:
    with pytest.raises(flowx.PlanError) as info:
        (
            flowx.flow("sf.bad", version="1", input=Order, state=OrderState)
            .fork("f", lambda b: b.step(pay), lambda b: b.sleep("1h"))
            .build()
        )
    assert info.value.code == "FLOWX1019"


def test_two_branches_writing_one_field_are_refused_at_build() -> None:
    with pytest.raises(flowx.PlanError) as info:
        (
            flowx.flow("sf.bad2", version="1", input=Order, state=OrderState)
            .fork("f", lambda b: b.step(pay, into="paid"), lambda b: b.step(pack, into="paid"))
            .build()
        )
    assert info.value.code == "FLOWX1020" and "'paid'" in str(info.value)


def test_a_sub_flow_of_an_ephemeral_child_is_refused_at_build() -> None:
    ephemeral = (
        flowx.flow("sf.eph", version="1", input=Parcel, profile=flowx.Ephemeral).step(label).build()
    )
    with pytest.raises(flowx.PlanError) as info:
        (
            flowx.flow("sf.bad3", version="1", input=Order)
            .sub_flow(ephemeral, lambda o, s: Parcel(order_id=o.order_id))
            .build()
        )
    assert info.value.code == "FLOWX1022"


def test_an_on_timeout_branch_needs_a_timeout() -> None:
    with pytest.raises(flowx.PlanError) as info:
        (
            flowx.flow("sf.bad4", version="1", input=Order, state=OrderState)
            .await_signal("go", dict, on_timeout=lambda b: b.step(reserve))
            .build()
        )
    assert info.value.code == "FLOWX1009"


def test_a_signal_name_in_flowxs_own_namespace_is_refused_at_build() -> None:
    with pytest.raises(flowx.PlanError) as info:
        (
            flowx.flow("sf.bad5", version="1", input=Order, state=OrderState)
            .await_signal("flowx.sub_flow", dict)
            .build()
        )
    assert info.value.code == "FLOWX1023"


def test_one_signal_name_with_two_payload_types_is_refused_at_build() -> None:
    with pytest.raises(flowx.PlanError) as info:
        (
            flowx.flow("sf.bad6", version="1", input=Order, state=OrderState)
            .await_signal("go", dict, name="first")
            .await_signal("go", int, name="second")
            .build()
        )
    assert info.value.code == "FLOWX1021" and "'go'" in str(info.value)
