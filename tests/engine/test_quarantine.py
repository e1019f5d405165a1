"""Quarantine: an instance whose journal no longer matches its plan is set aside once, visibly,
instead of being retried on every sweep; a replay puts it back once the right code runs.
On the memory store; ``tests/hosting/test_constructs_on_stores.py`` runs it on SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import flowx
from flowx.capability import CapabilityRegistry, capability_of
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceState, Outcome, StopRequest
from tests.engine.kit import T0, Ledger, Order, rows_of, until_state
from tests.engine.kit import fresh_ledgers as _reset  # noqa: F401 - autouse
from tests.support.polling import until

ledger = Ledger("quar")
calls = ledger.calls
one = ledger.capability("one")
two = ledger.capability("two")


pay_v1 = ledger.capability("pay")


@flowx.capability("quar.pay", version="2.0.0")
async def pay_v2(ctx: flowx.StepContext, order: Order) -> str:
    return "paid-v2"


def pinned_v1() -> flowx.Plan:
    return flowx.flow("quar.pinned", version="1", input=Order).step(pay_v1).build()


def pinned_v2() -> flowx.Plan:
    """The same flow version on a node that registers only pay 2.0.0."""
    return flowx.flow("quar.pinned", version="1", input=Order).step(pay_v2, name="quar.pay").build()


def original() -> flowx.Plan:
    return flowx.flow("quar.order", version="1", input=Order).step(one).step(two).build()


def changed() -> flowx.Plan:
    """The same flow and version, its first step renamed: a deploy that forgot to bump it."""
    return (
        flowx.flow("quar.order", version="1", input=Order).step(one, name="first").step(two).build()
    )


async def _half_done(host_factory: Any) -> str:
    """An instance of ``original`` handed back after its first step, mid-second."""
    plan = original()
    first = await host_factory(plan)
    ledger.gates["two"] = asyncio.Event()
    handle = await first.start(plan, Order(order_id="q1"))

    async def in_two() -> bool:
        return calls["two"] == 1

    await until(in_two, within=10, what="the second step running")
    await first.drain(timeout=0.05)  # cut mid-step: handed back Pending
    return handle.instance_id


async def test_a_changed_plan_quarantines_the_instance_once_and_a_replay_resumes_it(
    host_factory: Any,
) -> None:
    iid = await _half_done(host_factory)
    wrong = await host_factory(changed())
    assert await wrong.resume(iid, queued=True) == "resumed"
    record = await until_state(wrong, iid, InstanceState.QUARANTINED)
    error = flowx.codec.loads(record.error or "null")
    assert error["code"] == "flow.nondeterminism"
    assert "named 'quar.one', but quar.order@1 names that step 'first'" in error["message"]
    assert error["flow"] == "quar.order@1"
    assert wrong.store is not None
    listed = await wrong.store.catalog.list_instances(
        InstanceQuery(state=InstanceState.QUARANTINED)
    )
    assert [r.instance_id for r in listed] == [iid]
    # Set aside: neither a resume nor a recovery sweep runs it again.
    assert await wrong.resume(iid) == "gone"
    await wrong.recover_once()
    assert (await wrong.get(iid)).state is InstanceState.QUARANTINED
    assert calls["one"] == 1

    right = await host_factory(original())
    ledger.gates["two"].set()
    planned = await right.replay(iid, "quar.two")
    assert (planned.mode, planned.reruns) == ("resume", ("quar.two",))
    await until_state(right, iid, InstanceState.COMPLETED)
    assert calls["one"] == 1  # what had finished did not run again
    rows = await rows_of(right, iid)
    assert [(r.step_name, r.outcome) for r in rows] == [
        ("quar.one", Outcome.SUCCESS),
        ("quar.two", Outcome.SUCCESS),
    ]


async def test_a_replay_names_where_a_quarantined_instance_stopped(host_factory: Any) -> None:
    iid = await _half_done(host_factory)
    wrong = await host_factory(changed())
    await wrong.resume(iid, queued=True)
    await until_state(wrong, iid, InstanceState.QUARANTINED)
    right = await host_factory(original())
    with pytest.raises(flowx.IllegalState, match=r"replay --from 'quar\.two'"):
        await right.replay(iid, "quar.one", dry_run=True)


async def test_a_quarantined_instance_is_terminated_without_its_code(host_factory: Any) -> None:
    iid = await _half_done(host_factory)
    wrong = await host_factory(changed())
    await wrong.resume(iid, queued=True)
    await until_state(wrong, iid, InstanceState.QUARANTINED)
    outcome = await wrong.terminate(iid, "abandoned after a bad deploy", by="ops")
    assert outcome.state is InstanceState.TERMINATED
    assert calls["two"] == 1


async def test_a_terminate_that_came_as_it_was_set_aside_is_carried_out(
    host_factory: Any,
) -> None:
    iid = await _half_done(host_factory)
    wrong = await host_factory(changed())
    assert wrong.store is not None
    request = StopRequest(mode="terminate", reason="bad deploy", by="ops", at=T0)
    await wrong.store.stops.request_stop(iid, request)  # kept; nobody runs it yet
    await wrong.resume(iid, queued=True)  # the resume finds the mismatch, then the request
    record = await until_state(wrong, iid, InstanceState.TERMINATED)
    assert flowx.codec.loads(record.error or "null")["by"] == "ops"


async def test_a_missing_capability_version_is_this_node_s_problem_not_a_quarantine(
    host_factory: Any,
) -> None:
    """A node that does not register a version the journal pinned leaves the instance for a
    node that does, instead of setting it aside for an operator."""
    first = await host_factory(pinned_v1())
    ledger.broken.add("pay")
    handle = await first.start(pinned_v1(), Order(order_id="p1"))
    await until_state(first, handle.instance_id, InstanceState.FAILED)
    await first.replay(handle.instance_id, "quar.pay", dry_run=True)  # replayable: sound
    ledger.broken.clear()
    tried = calls["pay"]
    only_v2 = CapabilityRegistry()  # this node's registry: pay 2.0.0, not the pinned 1.0.0
    cap = capability_of(pay_v2)
    assert cap is not None
    only_v2.register(cap)
    second = await host_factory(pinned_v2(), registry=only_v2)
    await second.replay(handle.instance_id, "quar.pay")

    async def left_alone() -> bool:
        return handle.instance_id not in second._tasks

    await until(left_alone, within=10, what="the run on the node without v1 ending")
    record = await second.get(handle.instance_id)
    assert record.state is not InstanceState.QUARANTINED
    assert calls["pay"] == tried  # nothing ran on the node without 1.0.0
    # A node that carries 1.0.0 finishes it.
    third = await host_factory(pinned_v1())
    assert await third.resume(handle.instance_id, queued=True) == "resumed"
    await until_state(third, handle.instance_id, InstanceState.COMPLETED)
