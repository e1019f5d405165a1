"""Replay from a chosen step (R2.15; R2.2 history never rewritten; R2.5 a re-run is a new
request), on the memory store;
``tests/hosting/test_constructs_on_stores.py`` runs these same tests on SQLite and PostgreSQL.

A stopped instance — ``Failed``, ``TimedOut`` (given a new deadline), ``Cancelled`` or
``Terminated`` — re-runs from a step the operator picks: the steps before it keep their
journaled results, effects of that step and later ones that still stand are undone first,
then they run again under new idempotency keys. Every try is a new row; none is changed.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

import flowx
from flowx.engine.runner import child_instance_id
from flowx.plan.model import walk
from flowx.stores.protocols import InstanceQuery
from flowx.stores.records import InstanceState, Outcome
from flowx.testing import FakeClock
from tests.engine import kit
from tests.engine.kit import Ledger, rows_of, until_state
from tests.engine.kit import fresh_ledgers as _reset  # noqa: F401 - autouse
from tests.support.polling import until

ledger = Ledger("rr")
calls, broken = ledger.calls, ledger.broken
#: ``(capability, ctx.idempotency_key)`` of every call of the capabilities below, in order.
keys: list[tuple[str, str]] = ledger.also_clears([])
#: What each refund was handed as the result of the charge it undoes.
refunded: list[Any] = ledger.also_clears([])

note = ledger.capability("note")  # no compensation: re-run, never undone
reserve = ledger.capability("reserve", returns=kit.reservation)
release = ledger.undo("release")
pack = ledger.capability("pack")


@flowx.capability("rr.charge", version="1.0.0")
async def charge(ctx: flowx.StepContext, order: kit.Order) -> str:
    calls["charge"] += 1
    keys.append(("charge", ctx.idempotency_key))
    if "charge" in broken:
        raise flowx.NonRetryableError("card declined")
    return f"P-{calls['charge']}"


@flowx.capability("rr.refund", version="1.0.0")
async def refund(ctx: flowx.StepContext, order: kit.Order) -> None:
    calls["refund"] += 1
    keys.append(("refund", ctx.idempotency_key))
    refunded.append(ctx.step_result)
    if "refund" in broken:
        raise RuntimeError("refund refused by the gateway")


class OrderState(BaseModel):
    reservation: str | None = None
    payment: str | None = None


NO_RETRY = flowx.Retry(attempts=1)


def order_flow() -> flowx.Plan:
    """note → reserve (undone by release) → charge (undone by refund) → wait for ``go`` →
    pack; a deadline of one hour."""
    return (
        flowx.flow("rr.order", version="1", input=kit.Order, state=OrderState, deadline="1h")
        .step(note)
        .step(reserve, into="reservation", compensate=release)
        .step(charge, into="payment", compensate=refund, compensate_retry=NO_RETRY)
        .await_signal("go", dict)
        .step(pack)
        .build()
    )


def names(plan: flowx.Plan) -> list[str]:
    return [n.name for n in walk(plan.body)]


def key_of(plan: flowx.Plan, iid: str, step: str, generation: int = 0) -> str:
    step_id = plan.node_named(step).step_id  # type: ignore[union-attr]
    return f"{iid}//{step_id}" + (f"/g{generation}" if generation else "")


async def _waiting(host: flowx.FlowHost, plan: flowx.Plan, order: str) -> str:
    handle = await host.start(plan, kit.Order(order_id=order))
    await until_state(host, handle.instance_id, InstanceState.SUSPENDED)
    return handle.instance_id


async def _terminated(host_factory: Any, plan: flowx.Plan, order: str) -> tuple[Any, str]:
    """A host running ``plan``, and an instance of it terminated while it waited for ``go``
    (reserve and charge done, nothing undone)."""
    host = await host_factory(plan)
    iid = await _waiting(host, plan, order)
    await host.terminate(iid, "stuck", by="ops")
    await until_state(host, iid, InstanceState.TERMINATED)
    return host, iid


async def _finish(host: flowx.FlowHost, iid: str) -> OrderState:
    await until_state(host, iid, InstanceState.SUSPENDED)
    await host.signal(iid, "go", {})
    record = await until_state(host, iid, InstanceState.COMPLETED)
    return OrderState.model_validate_json(record.state_bag)


async def test_a_cancelled_instance_replays_from_the_first_step_its_cancel_undid(
    host_factory: Any,
) -> None:
    plan = order_flow()
    host = await host_factory(plan)
    iid = await _waiting(host, plan, "c1")
    await host.cancel(iid, "customer asked", by="ann")
    await until_state(host, iid, InstanceState.CANCELLED)
    assert (calls["release"], calls["refund"]) == (1, 1)
    before = await rows_of(host, iid)

    # The cancel undid reserve and charge: a replay from later would build on effects that
    # are gone.
    with pytest.raises(flowx.IllegalState) as later:
        await host.replay(iid, "rr.pack")
    assert "step 'rr.reserve' before it was undone" in str(later.value)
    assert "replay --from 'rr.reserve'" in str(later.value)

    dry = await host.replay(iid, "rr.reserve", dry_run=True)
    assert (dry.mode, dry.kept, dry.undo) == ("forward", ("rr.note",), ())
    assert list(dry.reruns) == names(plan)[1:]
    assert await rows_of(host, iid) == before  # a dry run writes nothing

    await host.replay(iid, "rr.reserve")
    record = await until_state(host, iid, InstanceState.SUSPENDED)
    assert record.stop_request is None  # no longer being stopped
    assert record.replay_from == plan.node_named("rr.reserve").step_id  # type: ignore[union-attr]
    state = await _finish(host, iid)
    assert (state.reservation, state.payment) == ("R-c1", "P-2")
    # note kept its result; reserve and charge ran again; nothing was undone twice.
    assert (calls["note"], calls["reserve"], calls["charge"], calls["pack"]) == (1, 2, 2, 1)
    assert (calls["release"], calls["refund"]) == (1, 1)
    after = await rows_of(host, iid)
    assert after[: len(before)] == before  # history kept, unchanged (R2.2)
    assert [(r.step_name, r.outcome) for r in after[len(before) :]] == [
        ("rr.reserve", Outcome.SUCCESS),
        ("rr.charge", Outcome.SUCCESS),
        ("go", Outcome.SUCCESS),
        ("rr.pack", Outcome.SUCCESS),
    ]
    # The re-run charge is a new request downstream, not the refunded one recognised.
    assert [k for name, k in keys if name == "charge"] == [
        key_of(plan, iid, "rr.charge"),
        key_of(plan, iid, "rr.charge", 1),
    ]


async def test_a_timed_out_instance_replays_only_with_a_new_deadline(
    host_factory: Any, clock: FakeClock
) -> None:
    plan = order_flow()
    host = await host_factory(plan)
    iid = await _waiting(host, plan, "t1")
    clock.advance(hours=2)
    await host.timers.run_once()
    await until_state(host, iid, InstanceState.TIMED_OUT)

    with pytest.raises(flowx.IllegalState) as late:
        await host.replay(iid, "rr.reserve")
    assert "passed its deadline" in str(late.value) and "--deadline" in str(late.value)
    with pytest.raises(flowx.RequestInvalid):
        await host.replay(iid, "rr.reserve", deadline=clock.now() - timedelta(minutes=1))

    dry = await host.replay(iid, "rr.reserve", dry_run=True, deadline=timedelta(hours=1))
    assert dry.deadline_at == clock.now() + timedelta(hours=1)
    assert dry.kept == ("rr.note",)
    await host.replay(iid, "rr.reserve", deadline=timedelta(hours=1))
    record = await until_state(host, iid, InstanceState.SUSPENDED)
    assert record.deadline_at == clock.now() + timedelta(hours=1)
    await _finish(host, iid)
    assert (calls["note"], calls["reserve"], calls["charge"]) == (1, 2, 2)


async def test_a_terminated_instance_undoes_the_effects_it_re_runs_first(
    host_factory: Any,
) -> None:
    """A terminate undid nothing: replayed from charge, the charge that stands is refunded
    (with its own result, under its own compensation key) before charge runs again, and
    reserve, before the chosen step, keeps its result."""
    plan = order_flow()
    host, iid = await _terminated(host_factory, plan, "x1")
    assert (calls["release"], calls["refund"]) == (0, 0)
    before = await rows_of(host, iid)

    dry = await host.replay(iid, "rr.charge", dry_run=True)
    assert dry.undo == ("undo rr.charge",)
    assert list(dry.reruns) == ["undo rr.charge", *names(plan)[2:]]
    assert dry.kept == ("rr.note", "rr.reserve")

    await host.replay(iid, "rr.charge")
    state = await _finish(host, iid)
    assert (state.reservation, state.payment) == ("R-x1", "P-2")
    assert (calls["reserve"], calls["refund"], calls["charge"], calls["release"]) == (1, 1, 2, 0)
    assert refunded == ["P-1"]  # the refund undid the first charge, by its result
    assert keys == [
        ("charge", key_of(plan, iid, "rr.charge")),
        ("refund", key_of(plan, iid, "rr.charge") + ":compensate"),
        ("charge", key_of(plan, iid, "rr.charge", 1)),
    ]
    after = await rows_of(host, iid)
    assert after[: len(before)] == before
    assert [(r.step_name, r.attempt, r.outcome) for r in after[len(before) :]][:2] == [
        ("rr.charge", 2, Outcome.COMPENSATED),
        ("rr.charge", 3, Outcome.SUCCESS),
    ]


async def test_an_undo_that_runs_out_ends_compensation_failed_and_replays_forward_again(
    host_factory: Any,
) -> None:
    plan = order_flow()
    host, iid = await _terminated(host_factory, plan, "u1")
    broken.add("refund")
    await host.replay(iid, "rr.charge")
    record = await until_state(host, iid, InstanceState.COMPENSATION_FAILED)
    error = flowx.codec.loads(record.error or "null")
    assert error["code"] == "replay.undo_failed"
    assert error["compensation"]["step"] == "rr.charge"
    assert calls["charge"] == 1  # nothing re-ran before its effect was undone

    broken.clear()
    again = await host.replay(iid, "rr.charge")
    assert (again.mode, again.undo) == ("forward", ("undo rr.charge",))
    state = await _finish(host, iid)
    assert state.payment == "P-2"
    assert (calls["refund"], calls["charge"]) == (2, 2)


async def test_a_failed_instance_replays_from_an_earlier_step_than_the_one_that_failed(
    host_factory: Any,
) -> None:
    """A step with no compensation before the failed one: its effect stands, so it simply
    runs again (under a new key), and the failed step after it gets a fresh budget."""
    plan = (
        flowx.flow("rr.mail", version="1", input=kit.Order, state=OrderState)
        .step(reserve, into="reservation")
        .step(charge, into="payment")
        .build()
    )
    host = await host_factory(plan)
    broken.add("charge")
    handle = await host.start(plan, kit.Order(order_id="f1"))
    await until_state(host, handle.instance_id, InstanceState.FAILED)
    with pytest.raises(flowx.IllegalState) as past:
        await host.replay(handle.instance_id, 3)
    assert "has no step 3" in str(past.value)
    broken.clear()
    dry = await host.replay(handle.instance_id, "rr.reserve", dry_run=True)
    assert (dry.kept, dry.undo, dry.reruns) == ((), (), ("rr.reserve", "rr.charge"))
    await host.replay(handle.instance_id, "rr.reserve")
    record = await until_state(host, handle.instance_id, InstanceState.COMPLETED)
    assert OrderState.model_validate_json(record.state_bag).payment == "P-2"
    assert (calls["reserve"], calls["charge"]) == (2, 2)
    assert [k for name, k in keys if name == "charge"] == [
        key_of(plan, handle.instance_id, "rr.charge"),
        key_of(plan, handle.instance_id, "rr.charge"),  # it never succeeded: a retry
    ]


async def test_a_replay_cannot_start_after_where_the_instance_stopped(host_factory: Any) -> None:
    plan = (
        flowx.flow("rr.three", version="1", input=kit.Order, state=OrderState)
        .step(reserve, into="reservation")
        .step(charge, into="payment")
        .step(pack)
        .build()
    )
    host = await host_factory(plan)
    broken.add("charge")
    handle = await host.start(plan, kit.Order(order_id="s1"))
    await until_state(host, handle.instance_id, InstanceState.FAILED)
    with pytest.raises(flowx.IllegalState) as skipped:
        await host.replay(handle.instance_id, "rr.pack")
    message = str(skipped.value)
    assert "step 'rr.charge' before it is where the instance stopped" in message
    assert "replay --from 'rr.charge'" in message


async def test_a_re_run_wait_takes_the_signal_it_took_before(host_factory: Any) -> None:
    """The signal a wait took is still in the inbox: re-run by a replay, the wait takes it
    again (the re-run sees the inputs the run it replaces saw) instead of waiting for one
    its once-only admission would refuse."""
    plan = order_flow()
    host = await host_factory(plan)
    iid = await _waiting(host, plan, "w1")
    broken.add("pack")
    await host.signal(iid, "go", {"approved": True})
    await until_state(host, iid, InstanceState.FAILED)
    broken.clear()
    await host.replay(iid, "rr.reserve")
    record = await until_state(host, iid, InstanceState.COMPLETED)
    assert OrderState.model_validate_json(record.state_bag).payment == "P-2"
    rows = await rows_of(host, iid)
    taken = [flowx.codec.loads(r.result) for r in rows if r.step_name == "go"]
    assert len(taken) == 2 and taken[0]["seq"] == taken[1]["seq"]
    assert taken[1]["payload"] == {"approved": True}


async def test_an_instance_replayed_twice_undoes_and_re_runs_the_current_generation(
    host_factory: Any,
) -> None:
    """Terminated, replayed from charge, terminated again, replayed from reserve: the second
    replay undoes the charge the first one made (by its result, under its key) and the
    reservation, then runs both again under keys of a new generation."""
    plan = order_flow()
    host, iid = await _terminated(host_factory, plan, "g1")
    await host.replay(iid, "rr.charge")
    await until_state(host, iid, InstanceState.SUSPENDED)
    await host.terminate(iid, "stuck again", by="ops")
    await until_state(host, iid, InstanceState.TERMINATED)

    dry = await host.replay(iid, "rr.reserve", dry_run=True)
    assert dry.undo == ("undo rr.charge", "undo rr.reserve")
    await host.replay(iid, "rr.reserve")
    state = await _finish(host, iid)
    assert (state.reservation, state.payment) == ("R-g1", "P-3")
    assert refunded == ["P-1", "P-2"]
    assert (calls["release"], calls["reserve"], calls["charge"], calls["note"]) == (1, 2, 3, 1)
    charge_key = key_of(plan, iid, "rr.charge")
    assert keys == [
        ("charge", charge_key),
        ("refund", f"{charge_key}:compensate"),
        ("charge", f"{key_of(plan, iid, 'rr.charge', 1)}"),
        ("refund", f"{key_of(plan, iid, 'rr.charge', 1)}:compensate"),
        ("charge", f"{key_of(plan, iid, 'rr.charge', 2)}"),
    ]
    attempts = [(r.attempt, r.outcome) for r in await rows_of(host, iid) if r.step_id == 3]
    assert [a for a, _ in attempts] == sorted({a for a, _ in attempts})  # never reused


async def test_a_failing_re_run_then_fails_and_compensates_only_what_it_made(
    host_factory: Any,
) -> None:
    """After a replay from charge, a re-run that fails compensates what is current: the new
    charge and the kept reservation, each once."""
    plan = order_flow()
    host, iid = await _terminated(host_factory, plan, "f2")
    broken.add("pack")
    await host.replay(iid, "rr.charge")
    await until_state(host, iid, InstanceState.SUSPENDED)
    await host.signal(iid, "go", {})
    await until_state(host, iid, InstanceState.FAILED)
    assert refunded == ["P-1", "P-2"]  # the replay's undo of the first, then the second
    assert (calls["release"], calls["charge"]) == (1, 2)


async def test_an_undo_cut_by_a_drain_is_finished_by_another_node_without_repeating_any(
    host_factory: Any,
) -> None:
    """The replay's undo is journaled step by step: a node drained while undoing hands the
    instance back, and the node that takes it over undoes only what is left (the refund is
    not repeated), then re-runs."""
    plan = order_flow()
    first = await host_factory(plan)
    iid = await _waiting(first, plan, "d1")
    await first.terminate(iid, "stuck", by="ops")
    await until_state(first, iid, InstanceState.TERMINATED)
    gate = ledger.gates["release"] = asyncio.Event()
    await first.replay(iid, "rr.reserve")  # undo charge, then reserve (held at the gate)

    async def releasing() -> bool:
        return calls["release"] == 1

    await until(releasing, within=5, what="the replay's release under way")
    await first.drain(timeout=0.05)
    second = await host_factory(plan)
    assert (await second.get(iid)).state is InstanceState.PENDING  # handed back
    assert calls["refund"] == 1

    gate.set()
    assert await second.resume(iid, queued=True) == "resumed"
    state = await _finish(second, iid)
    assert (state.reservation, state.payment) == ("R-d1", "P-2")
    assert (calls["refund"], calls["release"], calls["reserve"], calls["charge"]) == (1, 2, 2, 2)


ship = ledger.capability("ship", non_retryable=True)


def parcel_flows() -> tuple[flowx.Plan, flowx.Plan]:
    """A child that ships (refused while ``ship`` is broken), and a parent: note → the child
    as a sub-flow → pack."""
    child = flowx.flow("rr.child", version="1", input=kit.Order).step(ship).build()
    parent = (
        flowx.flow("rr.parent", version="1", input=kit.Order, state=OrderState)
        .step(note)
        .sub_flow(child, lambda order, state: order)
        .step(pack)
        .build()
    )
    return child, parent


async def test_a_parent_failed_by_its_child_replays_once_the_child_is_replayed(
    host_factory: Any,
) -> None:
    """A sub-flow re-run takes the result of the child it started (found by its derived
    id): the child is replayed first, then the parent from the sub-flow, and no second
    child is ever started."""
    child, parent = parcel_flows()
    host = await host_factory(parent, child)
    broken.add("ship")
    handle = await host.start(parent, kit.Order(order_id="p1"))
    iid = handle.instance_id
    await until_state(host, iid, InstanceState.FAILED)
    sub_flow = names(parent)[1]
    child_id = child_instance_id(iid, "", parent.node_named(sub_flow).step_id)  # type: ignore[union-attr]
    assert (await host.get(child_id)).state is InstanceState.FAILED

    with pytest.raises(flowx.IllegalState) as first_the_child:
        await host.replay(iid, sub_flow)
    assert f"flowx replay --instance {child_id}" in str(first_the_child.value)

    broken.clear()
    await host.replay(child_id, "rr.ship")
    await until_state(host, child_id, InstanceState.COMPLETED)
    dry = await host.replay(iid, sub_flow, dry_run=True)
    assert (dry.kept, dry.reruns) == (("rr.note",), (sub_flow, "rr.pack"))
    await host.replay(iid, sub_flow)
    await until_state(host, iid, InstanceState.COMPLETED)
    assert (calls["note"], calls["ship"], calls["pack"]) == (1, 2, 1)
    assert host.store is not None
    children = await host.store.catalog.list_instances(InstanceQuery(parent_id=iid))
    assert [r.instance_id for r in children] == [child_id]  # no second child


def sleepy_flow() -> flowx.Plan:
    """reserve (undone by release) → a 2 h sleep → a wait for ``go`` with a 2 h timeout →
    pack, under a deadline of one hour."""
    return (
        flowx.flow("rr.sleepy", version="1", input=kit.Order, state=OrderState, deadline="1h")
        .step(reserve, into="reservation", compensate=release)
        .sleep("2h")
        .await_signal("go", dict, timeout="2h")
        .step(pack)
        .build()
    )


async def test_a_re_run_sleep_and_wait_start_afresh_not_at_the_old_wake(
    host_factory: Any, clock: FakeClock
) -> None:
    """The wait an instance was sealed at is forgotten by a forward replay: the re-run sleep
    sleeps its 2 h again, and the wait after it gets its whole timeout."""
    plan = sleepy_flow()
    host = await host_factory(plan)
    handle = await host.start(plan, kit.Order(order_id="z1"))
    iid = handle.instance_id
    await until_state(host, iid, InstanceState.SUSPENDED)
    clock.advance(hours=2)
    await host.timers.run_once()
    await until_state(host, iid, InstanceState.TIMED_OUT)
    replayed_at = clock.now()
    await host.replay(iid, "rr.reserve", deadline=timedelta(hours=5))
    record = await until_state(host, iid, InstanceState.SUSPENDED)
    assert record.wake_at == replayed_at + timedelta(hours=2)  # sleeping again, in full
    assert calls["pack"] == 0
    clock.advance(hours=2, minutes=1)
    await host.timers.run_once()
    record = await until_state(host, iid, InstanceState.SUSPENDED)
    assert record.wake_signal == "go"
    assert record.wake_at == replayed_at + timedelta(hours=4, minutes=1)  # its whole timeout
    await host.signal(iid, "go", {})
    await until_state(host, iid, InstanceState.COMPLETED)
    assert (calls["reserve"], calls["release"], calls["pack"]) == (2, 1, 1)


async def test_a_re_run_whose_own_compensation_ran_out_finishes_compensating_on_replay(
    host_factory: Any,
) -> None:
    """After a forward replay, the re-run fails and its refund runs out: a replay then
    finishes the compensation — it does not charge again."""
    plan = order_flow()
    host, iid = await _terminated(host_factory, plan, "cf")
    await host.replay(iid, "rr.charge")
    await until_state(host, iid, InstanceState.SUSPENDED)
    broken.update({"pack", "refund"})
    await host.signal(iid, "go", {})
    await until_state(host, iid, InstanceState.COMPENSATION_FAILED)
    broken.discard("refund")
    dry = await host.replay(iid, "rr.charge", dry_run=True)
    assert (dry.mode, dry.reruns) == ("compensation", ("undo rr.charge", "undo rr.reserve"))
    charges = calls["charge"]
    await host.replay(iid, "rr.charge")
    await until_state(host, iid, InstanceState.FAILED)
    assert calls["charge"] == charges  # nothing forward re-ran
    assert refunded[-1] == "P-2" and calls["release"] == 1


async def test_a_parent_stopped_while_its_child_ran_replays_once_the_child_completed(
    host_factory: Any,
) -> None:
    """A terminate reaches a parent waiting on its child (no row for the sub-flow yet) and
    the child: replaying the parent from the sub-flow is refused until the child, replayed
    in turn, has completed — then the parent takes its result."""
    child = (
        flowx.flow("rr.slow_child", version="1", input=kit.Order)
        .await_signal("ok", dict)
        .step(ship)
        .build()
    )
    parent = (
        flowx.flow("rr.waiting_parent", version="1", input=kit.Order, state=OrderState)
        .step(note)
        .sub_flow(child, lambda order, state: order)
        .step(pack)
        .build()
    )
    host = await host_factory(parent, child)
    handle = await host.start(parent, kit.Order(order_id="pw"))
    iid = handle.instance_id
    sub_flow = names(parent)[1]
    child_id = child_instance_id(iid, "", parent.node_named(sub_flow).step_id)  # type: ignore[union-attr]
    await until_state(host, iid, InstanceState.SUSPENDED)
    await until_state(host, child_id, InstanceState.SUSPENDED)
    await host.terminate(iid, "stuck", by="ops")
    await until_state(host, child_id, InstanceState.TERMINATED)
    await until_state(host, iid, InstanceState.TERMINATED)

    with pytest.raises(flowx.IllegalState) as first_the_child:
        await host.replay(iid, sub_flow, dry_run=True)
    assert "which is Terminated; replay the child first" in str(first_the_child.value)
    await host.replay(child_id, "ok")
    await until_state(host, child_id, InstanceState.SUSPENDED)
    await host.signal(child_id, "ok", {})
    await until_state(host, child_id, InstanceState.COMPLETED)
    await host.replay(iid, sub_flow)
    await until_state(host, iid, InstanceState.COMPLETED)
    assert (calls["note"], calls["ship"], calls["pack"]) == (1, 1, 1)


def _napping(first: str | None = None) -> flowx.Plan:
    """note (named ``first``, to change the plan under its version) → reserve → a 1 h sleep
    → charge → wait for ``go`` → pack."""
    return (
        flowx.flow("rr.nap", version="1", input=kit.Order, state=OrderState)
        .step(note, name=first)
        .step(reserve, into="reservation", compensate=release)
        .sleep("1h")
        .step(charge, into="payment", compensate=refund, compensate_retry=NO_RETRY)
        .await_signal("go", dict)
        .step(pack)
        .build()
    )


async def test_a_replayed_instance_quarantined_then_put_back_resumes_its_re_run(
    host_factory: Any, clock: FakeClock
) -> None:
    """A forward replay, then a node with a plan changed under the same version sets the
    instance aside; put back, it resumes the re-run where it was (its frontier counted
    after the replay), instead of compensating what the replay re-ran."""
    plan = _napping()
    host = await host_factory(plan)
    handle = await host.start(plan, kit.Order(order_id="q1"))
    iid = handle.instance_id
    await until_state(host, iid, InstanceState.SUSPENDED)
    clock.advance(hours=1, minutes=1)
    await host.timers.run_once()
    await until_state(host, iid, InstanceState.SUSPENDED)  # at "go", charged
    await host.terminate(iid, "stuck", by="ops")
    await until_state(host, iid, InstanceState.TERMINATED)
    await host.replay(iid, "rr.reserve")  # undo charge and reserve, re-run reserve, sleep
    await until_state(host, iid, InstanceState.SUSPENDED)
    changed = await host_factory(_napping(first="renamed"))
    clock.advance(hours=1, minutes=1)
    await changed.timers.run_once()
    # Idle on the node that set it aside too: until it lets go of its lease, a replay is
    # refused as busy.
    await until_state(changed, iid, InstanceState.QUARANTINED)

    with pytest.raises(flowx.IllegalState) as frontier:
        await host.replay(iid, "go", dry_run=True)
    assert "stopped before step 'sleep:1h'" in str(frontier.value)
    await host.replay(iid, "sleep:1h")
    await until_state(host, iid, InstanceState.SUSPENDED)
    assert (calls["charge"], calls["refund"], calls["release"]) == (2, 1, 1)
    state = await _finish(host, iid)
    assert (state.reservation, state.payment) == ("R-q1", "P-2")
