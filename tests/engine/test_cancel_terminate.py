"""Cancel and terminate (R9.4), on the memory store; ``tests/hosting/test_constructs_on_stores.py``
runs these same tests on SQLite and PostgreSQL.

A cancel stops an instance at its next boundary (a running attempt is cut as a step timeout
cuts it), compensates what finished, and ends ``Cancelled``; a terminate compensates nothing
and ends ``Terminated``. Both reach sub-flow children, are journaled with who and why, are
inert when repeated, and refuse an instance that ended otherwise.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

import flowx
from flowx.engine.runner import child_instance_id
from flowx.stores.records import STOP_SIGNAL, InstanceState, Outcome, StopRequest
from tests.engine import kit
from tests.engine.kit import Ledger, failure_of, reservation, rows_of, until_state
from tests.engine.kit import fresh_ledgers as _reset  # noqa: F401 - autouse
from tests.support.polling import until

ledger = Ledger("stop")
calls, gates = ledger.calls, ledger.gates

reserve = ledger.capability("reserve", returns=reservation)
release = ledger.undo("release")
charge = ledger.capability("charge")
refund = ledger.undo("refund")
pack = ledger.capability("pack")
#: A plain ``def`` capability blocked on this event: cut, its thread is abandoned.
blocked = threading.Event()


@flowx.capability("stop.ship", version="1.0.0")
def ship(ctx: flowx.StepContext, order: kit.Order) -> str:
    calls["ship"] += 1
    blocked.wait(30)
    return "shipped"


class OrderState(BaseModel):
    reservation: str | None = None


class Parcel(BaseModel):
    order_id: str


def order_flow(flow_id: str = "stop.order") -> flowx.Plan:
    """reserve (undone by release) → charge (undone by refund) → pack."""
    return (
        flowx.flow(flow_id, version="1", input=kit.Order, state=OrderState)
        .step(reserve, into="reservation", compensate=release)
        .step(charge, compensate=refund)
        .step(pack)
        .build()
    )


def waiting_flow() -> flowx.Plan:
    """reserve (undone by release), then wait for a ``go`` signal."""
    return (
        flowx.flow("stop.waiting", version="1", input=kit.Order, state=OrderState)
        .step(reserve, into="reservation", compensate=release)
        .await_signal("go", dict)
        .step(pack)
        .build()
    )


child_flow = (
    flowx.flow("stop.child", version="1", input=Parcel)
    .step(charge, compensate=refund)
    .await_signal("go", dict)
    .build()
)


def parent_flow() -> flowx.Plan:
    """reserve (undone by release), then a child that charges and waits for ``go``."""
    return (
        flowx.flow("stop.parent", version="1", input=kit.Order, state=OrderState)
        .step(reserve, into="reservation", compensate=release)
        .sub_flow(child_flow, lambda o, s: Parcel(order_id=o.order_id))
        .build()
    )


async def _running(name: str, count: int = 1) -> None:
    async def started() -> bool:
        return calls[name] >= count

    await until(started, within=10, what=f"{name} running")


# -- a running instance ---------------------------------------------------------------------


async def test_a_cancel_cuts_the_running_step_compensates_and_ends_cancelled(
    host_factory: Any,
) -> None:
    plan = order_flow()
    host = await host_factory(plan)
    gates["charge"] = asyncio.Event()  # never set: only the cancel ends the attempt
    handle = await host.start(plan, kit.Order(order_id="c1"))
    await _running("charge")

    outcome = await host.cancel(handle.instance_id, "customer changed their mind", by="ann")
    assert (outcome.mode, outcome.status) == ("cancel", "requested")
    failed = await failure_of(handle)
    assert failed.state == "Cancelled"
    record = await until_state(host, handle.instance_id, InstanceState.CANCELLED)
    error = flowx.codec.loads(record.error or "null")
    assert (error["code"], error["by"], error["reason"]) == (
        "flow.cancelled",
        "ann",
        "customer changed their mind",
    )
    # The finished step was compensated, the cut one was not (it never finished), and
    # nothing after it ran.
    assert (calls["release"], calls["refund"], calls["pack"]) == (1, 0, 0)
    rows = await rows_of(host, handle.instance_id)
    assert [(r.step_name, r.outcome) for r in rows] == [
        ("stop.reserve", Outcome.SUCCESS),
        ("stop.charge", Outcome.FAILURE),
        ("stop.reserve", Outcome.COMPENSATED),
    ]
    assert flowx.codec.loads(rows[1].result)["code"] == "flow.cancelled"
    assert host.store is not None
    [journaled] = await host.store.waits.signals(handle.instance_id, STOP_SIGNAL)
    assert StopRequest.loads(journaled.payload).by == "ann"


async def test_a_cancel_cuts_a_step_running_in_a_thread(host_factory: Any) -> None:
    plan = (
        flowx.flow("stop.threaded", version="1", input=kit.Order, state=OrderState)
        .step(reserve, into="reservation", compensate=release)
        .step(ship)
        .build()
    )
    host = await host_factory(plan)
    blocked.clear()
    try:
        handle = await host.start(plan, kit.Order(order_id="t1"))
        await _running("ship")
        await host.cancel(handle.instance_id, "wrong address")
        assert (await failure_of(handle)).state == "Cancelled"
        assert calls["release"] == 1
        assert host.stuck_threads == 1  # the thread still runs; nobody waits for it
    finally:
        blocked.set()


async def test_a_cancel_ends_a_retry_s_backoff_early(host_factory: Any) -> None:
    """A step waiting an hour before its next attempt is cancelled now, not in an hour (on
    the real clock: only the cancel can end the wait within the test)."""
    plan = (
        flowx.flow("stop.backoff", version="1", input=kit.Order, state=OrderState)
        .step(reserve, into="reservation", compensate=release)
        .step(charge, retry=flowx.Retry(attempts=5, backoff="fixed", initial="1h", maximum="1h"))
        .build()
    )
    host = await host_factory(plan, clock=flowx.SystemClock())
    ledger.broken.add("charge")
    handle = await host.start(plan, kit.Order(order_id="b1"))
    await _running("charge")
    await host.cancel(handle.instance_id, "stop retrying")
    assert (await failure_of(handle)).state == "Cancelled"
    assert (calls["charge"], calls["release"]) == (1, 1)


async def test_a_terminate_stops_at_once_and_compensates_nothing(host_factory: Any) -> None:
    plan = order_flow()
    host = await host_factory(plan)
    gates["charge"] = asyncio.Event()
    handle = await host.start(plan, kit.Order(order_id="x1"))
    await _running("charge")

    outcome = await host.terminate(handle.instance_id, "fraud", by="risk-team")
    assert outcome.status == "requested"
    assert (await failure_of(handle)).state == "Terminated"
    record = await until_state(host, handle.instance_id, InstanceState.TERMINATED)
    assert flowx.codec.loads(record.error or "null")["code"] == "flow.terminated"
    assert (calls["release"], calls["refund"], calls["pack"]) == (0, 0, 0)


async def test_a_terminate_cuts_a_cancel_s_compensation(host_factory: Any) -> None:
    plan = order_flow()
    host = await host_factory(plan)
    gates["charge"] = asyncio.Event()
    handle = await host.start(plan, kit.Order(order_id="x2"))
    await _running("charge")
    gates["release"] = asyncio.Event()  # the compensation hangs
    await host.cancel(handle.instance_id, "changed mind")
    await _running("release")
    # A cancel no longer applies once compensating; a terminate does.
    again = await host.cancel(handle.instance_id, "changed mind again")
    assert again.status == "already"
    await host.terminate(handle.instance_id, "compensation is stuck")
    assert (await failure_of(handle)).state == "Terminated"
    rows = await rows_of(host, handle.instance_id)
    assert not [r for r in rows if r.outcome is Outcome.COMPENSATED]


async def test_a_cancel_from_another_node_reaches_the_run_at_its_next_renewal(
    host_factory: Any,
) -> None:
    plan = order_flow()
    fast = flowx.HostSettings.load(
        lease_ttl=timedelta(seconds=4), lease_renewal_interval=timedelta(seconds=0.2)
    )
    owner = await host_factory(plan, settings=fast)
    other = await host_factory(plan)
    gates["charge"] = asyncio.Event()
    handle = await owner.start(plan, kit.Order(order_id="r1"))
    await _running("charge")

    outcome = await other.cancel(handle.instance_id, "from the other node", by="ops")
    # Running on the owner: this node leaves it to that run.
    assert (outcome.status, outcome.state, outcome.waiting) == (
        "requested",
        InstanceState.RUNNING,
        (),
    )
    assert (await failure_of(handle)).state == "Cancelled"
    assert calls["release"] == 1


# -- instances no run holds -------------------------------------------------------------------


async def test_a_suspended_parent_and_its_child_are_cancelled_and_compensated(
    host_factory: Any,
) -> None:
    plan = parent_flow()
    host = await host_factory(plan)
    handle = await host.start(plan, kit.Order(order_id="p1"))
    child_id = child_instance_id(handle.instance_id, "", 2)
    await until_state(host, handle.instance_id, InstanceState.SUSPENDED)  # child started
    await until_state(host, child_id, InstanceState.SUSPENDED)

    outcome = await host.cancel(handle.instance_id, "order withdrawn", by="ann")
    assert outcome.reached == (handle.instance_id, child_id)
    for iid in (handle.instance_id, child_id):
        await until_state(host, iid, InstanceState.CANCELLED)
    # The parent's reservation and the child's charge were both undone, once each.
    assert (calls["release"], calls["refund"]) == (1, 1)
    child = await host.get(child_id)
    assert flowx.codec.loads(child.error or "null")["by"] == "ann"

    repeat = await host.cancel(handle.instance_id, "order withdrawn", by="ann")
    assert (repeat.status, repeat.state) == ("ended", InstanceState.CANCELLED)
    assert (calls["release"], calls["refund"]) == (1, 1)


async def test_a_pending_instance_is_cancelled_by_a_node_that_does_not_carry_its_flow(
    host_factory: Any,
) -> None:
    plan = order_flow()
    starter = await host_factory(plan)
    handle = await starter.start(plan, kit.Order(order_id="q1"), run_here=False)
    bystander = await host_factory()  # carries no flow at all

    outcome = await bystander.cancel(handle.instance_id, "not needed", by="cli")
    assert (outcome.status, outcome.state, outcome.waiting) == (
        "requested",
        InstanceState.CANCELLED,
        (),
    )
    assert sum(calls.values()) == 0  # nothing ran, nothing to compensate
    assert await rows_of(bystander, handle.instance_id) == []


async def test_a_cancel_owing_a_compensation_waits_for_a_node_that_carries_the_flow(
    host_factory: Any,
) -> None:
    plan = waiting_flow()
    first = await host_factory(plan)
    handle = await first.start(plan, kit.Order(order_id="w1"))
    await until_state(first, handle.instance_id, InstanceState.SUSPENDED)
    bystander = await host_factory()

    outcome = await bystander.cancel(handle.instance_id, "too slow")
    assert (outcome.state, outcome.waiting) == (InstanceState.PENDING, (handle.instance_id,))
    assert calls["release"] == 0
    # A node that carries the flow takes it, as a worker's queued pass would.
    assert await first.resume(handle.instance_id, queued=True) == "resumed"
    await until_state(first, handle.instance_id, InstanceState.CANCELLED)
    assert (calls["release"], calls["pack"]) == (1, 0)


async def test_a_terminate_ends_a_waiting_instance_without_its_flow_s_code(
    host_factory: Any,
) -> None:
    plan = waiting_flow()
    first = await host_factory(plan)
    handle = await first.start(plan, kit.Order(order_id="w2"))
    await until_state(first, handle.instance_id, InstanceState.SUSPENDED)
    bystander = await host_factory()

    outcome = await bystander.terminate(handle.instance_id, "abandoned")
    assert (outcome.state, outcome.waiting) == (InstanceState.TERMINATED, ())
    assert calls["release"] == 0
    with pytest.raises(flowx.InstanceFinished):
        await first.signal(handle.instance_id, "go", {})


# -- refusals -------------------------------------------------------------------------------


async def test_an_instance_that_ended_otherwise_or_does_not_exist_is_refused(
    host_factory: Any,
) -> None:
    plan = order_flow()
    host = await host_factory(plan)
    handle = await host.start(plan, kit.Order(order_id="e1"))
    await handle.result(timeout=5)
    with pytest.raises(flowx.IllegalState, match="already ended \\(Completed\\)"):
        await host.cancel(handle.instance_id, "too late")
    with pytest.raises(flowx.InstanceNotFound):
        await host.terminate("00000000-0000-4000-8000-000000000000", "no such")
    with pytest.raises(flowx.InstanceNotFound):
        await host.cancel("not an id", "no such")
    with pytest.raises(flowx.RequestInvalid, match="needs a reason"):
        await host.cancel(handle.instance_id, "   ")
    assert (await host.get(handle.instance_id)).state is InstanceState.COMPLETED


async def test_a_terminate_ends_an_instance_whose_node_died_without_its_flow_s_code(
    host_factory: Any, clock: Any
) -> None:
    """Its node stopped renewing (it died, as far as anyone can tell) and no live node
    carries its flow: a terminate takes the expired lease and ends it, fenced."""
    plan = order_flow("stop.orphan")
    dead = await host_factory(plan)
    gates["charge"] = asyncio.Event()
    handle = await dead.start(plan, kit.Order(order_id="d1"))
    await _running("charge")
    clock.advance(seconds=61)  # two TTLs without a renewal: the lease has expired
    bystander = await host_factory()
    outcome = await bystander.terminate(handle.instance_id, "retired version", by="ops")
    assert (outcome.state, outcome.waiting) == (InstanceState.TERMINATED, ())
    gates["charge"].set()  # the zombie's attempt returns: its commit is fenced out
    await dead.wait_idle(timeout=10)
    record = await dead.get(handle.instance_id)
    assert record.state is InstanceState.TERMINATED
    rows = await rows_of(dead, handle.instance_id)
    assert [r.step_name for r in rows] == ["stop.reserve"]  # nothing past the fence
