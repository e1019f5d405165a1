"""The step loop on the memory store: commit, retry, compensate, replay (R2.3–R2.8, R4.2)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Any

import pytest
from pydantic import BaseModel

import flowx
from flowx import codec
from flowx.engine import Execution, RunPorts, RunSpec
from flowx.stores.errors import FencedOut
from flowx.stores.records import InstanceState, Outcome, StepRecord
from tests.engine import kit
from tests.engine.kit import Ledger, failure_of
from tests.engine.kit import fresh_ledgers as _reset  # noqa: F401 - autouse
from tests.engine.kit import rows_of as steps_of

ledger = Ledger("ex")
calls = ledger.calls
#: Per capability name: fail the first N calls (an int) or every call ("always"); and what the
#: capabilities recorded (``released``, ``capture_keys``, ``order``, ``uuids``).
behaviour: dict[str, Any] = ledger.also_clears({})


class Order(kit.Order):
    amount: int = 10
    lines: list[int] = [1, 2, 3]


class OrderState(BaseModel):
    reservation: str | None = None
    receipt: str | None = None
    shipped: list[Any] = []
    seen_keys: list[str] = []


def _maybe_fail(name: str) -> None:
    fail = behaviour.get(name)
    if isinstance(fail, int) and calls[name] <= fail:
        raise RuntimeError(f"{name} failed (call {calls[name]})")
    if fail == "always":
        raise RuntimeError(f"{name} always fails")


@flowx.capability("ex.reserve", version="1.0.0")
async def reserve(ctx: flowx.StepContext, order: Order) -> str:
    calls["reserve"] += 1
    _maybe_fail("reserve")
    return f"R-{order.order_id}"


@flowx.capability("ex.release", version="1.0.0")
async def release(ctx: flowx.StepContext, order: Order) -> None:
    calls["release"] += 1
    behaviour.setdefault("released", []).append(ctx.step_result)
    _maybe_fail("release")


@flowx.capability("ex.capture", version="1.0.0", idempotent=False)
def capture(ctx: flowx.StepContext, order: Order) -> str:
    calls["capture"] += 1
    behaviour.setdefault("capture_keys", []).append(ctx.idempotency_key)
    _maybe_fail("capture")
    return f"P-{order.amount}"


@flowx.capability("ex.refund", version="1.0.0")
def refund(ctx: flowx.StepContext, order: Order) -> None:
    calls["refund"] += 1
    behaviour.setdefault("order", []).append("refund")


@flowx.capability("ex.ship", version="1.0.0")
async def ship(ctx: flowx.StepContext, line: int) -> dict[str, Any]:
    calls["ship"] += 1
    _maybe_fail("ship")
    return {"line": line, "scope": ctx.scope}


@flowx.capability("ex.ticket", version="1.0.0")
async def ticket(ctx: flowx.StepContext, order: Order) -> str:
    calls["ticket"] += 1
    behaviour.setdefault("uuids", []).append(str(ctx.uuid()))
    _maybe_fail("ticket")
    return "T"


@flowx.capability("ex.bad_result", version="1.0.0")
async def bad_result(ctx: flowx.StepContext, order: Order) -> float:
    calls["bad_result"] += 1
    return float("nan")


@flowx.event("order.placed", version="2", sensitive={"card"})
class OrderPlaced(BaseModel):
    order_id: str
    card: str


FAST = flowx.Retry(attempts=3, backoff="fixed", initial="2s")


def order_flow(**kw: Any) -> flowx.Plan:
    return (
        flowx.flow(
            "ex.order",
            version="1.0.0",
            input=Order,
            state=OrderState,
            partition_key=lambda o: o.tenant,
            **kw,
        )
        .step(reserve, into="reservation", compensate=release, retry=FAST)
        .step(capture, into="receipt", compensate=refund)
        .emit(OrderPlaced, lambda o, s: OrderPlaced(order_id=o.order_id, card="4242"))
        .build()
    )


async def test_a_durable_flow_commits_each_step_and_completes(host_factory: Any) -> None:
    plan = order_flow()
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="o1"))
    state = await handle.result()
    assert state == OrderState(reservation="R-o1", receipt="P-10")
    rows = await steps_of(host, handle.instance_id)
    assert [(r.step_name, r.outcome, r.sequence) for r in rows] == [
        ("ex.reserve", Outcome.SUCCESS, 1),
        ("ex.capture", Outcome.SUCCESS, 2),
        ("emit:OrderPlaced", Outcome.SUCCESS, 3),
    ]
    assert rows[0].capability_version == "1.0.0"  # R2.6: resolved version on the row
    record = await host.get(handle.instance_id)
    assert record.state is InstanceState.COMPLETED
    assert record.tenant_id == "acme"
    assert codec.loads(record.state_bag)["receipt"] == "P-10"
    assert record.state_bag_sequence == 3  # the last commit also completed the instance


async def test_an_emit_is_staged_with_its_own_step_and_redacted(host_factory: Any) -> None:
    plan = order_flow()
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="o2"))
    await handle.result()
    events = await host.store.journal.events(handle.instance_id)
    assert len(events) == 1
    event = events[0]
    assert (event.type, event.schema_version, event.partition_key) == ("order.placed", "2", "acme")
    assert event.payload == '{"card":"[redacted]","order_id":"o2"}'
    assert event.sequence == 3


async def test_a_failing_step_is_retried_with_backoff_each_attempt_a_row(
    host_factory: Any, clock: Any
) -> None:
    behaviour["reserve"] = 2  # the first two calls fail
    plan = order_flow()
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="o3"))
    await handle.result()
    rows = await steps_of(host, handle.instance_id)
    reserve_rows = [(r.attempt, r.outcome) for r in rows if r.step_id == 1]
    assert reserve_rows == [(1, Outcome.FAILURE), (2, Outcome.FAILURE), (3, Outcome.SUCCESS)]
    assert codec.loads(rows[0].result)["message"] == "reserve failed (call 1)"
    assert clock.slept == [2.0, 2.0]
    assert calls["reserve"] == 3


async def test_a_non_idempotent_capability_is_never_retried(host_factory: Any) -> None:
    behaviour["capture"] = 1
    plan = order_flow()
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="o4"))
    failed = await failure_of(handle)
    assert calls["capture"] == 1  # R4.2
    assert failed.state == "Failed"
    assert failed.error["step"] == "ex.capture"


async def test_a_failure_compensates_completed_steps_in_reverse(host_factory: Any) -> None:
    @flowx.capability("ex.final", version="1.0.0")
    def final(ctx: flowx.StepContext, order: Order) -> None:
        raise flowx.NonRetryableError("card declined")

    plan = (
        flowx.flow("ex.saga", version="1", input=Order, state=OrderState)
        .step(reserve, into="reservation", compensate=release)
        .step(capture, into="receipt", compensate=refund)
        .step(final)
        .build()
    )
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="o5"))
    await failure_of(handle)
    rows = await steps_of(host, handle.instance_id)
    assert [(r.step_id, r.attempt, r.outcome) for r in rows] == [
        (1, 1, Outcome.SUCCESS),
        (2, 1, Outcome.SUCCESS),
        (3, 1, Outcome.FAILURE),
        (2, 2, Outcome.COMPENSATED),
        (1, 2, Outcome.COMPENSATED),
    ]
    assert rows[3].capability_id == "ex.refund"
    assert behaviour["released"] == ["R-o5"]  # ctx.step_result is the compensated result
    record = await host.get(handle.instance_id)
    assert record.state is InstanceState.FAILED
    assert codec.loads(record.error)["message"] == "card declined"


async def test_a_compensation_is_retried_and_exhaustion_is_compensation_failed(
    host_factory: Any, clock: Any
) -> None:
    behaviour["release"] = "always"
    behaviour["capture"] = 1
    plan = (
        flowx.flow("ex.comp_fail", version="1", input=Order, state=OrderState)
        .step(
            reserve,
            into="reservation",
            compensate=release,
            compensate_retry=flowx.Retry(attempts=3, backoff="fixed", initial="1s"),
        )
        .step(capture)
        .build()
    )
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="o6"))
    failed = await failure_of(handle)
    assert failed.state == "CompensationFailed"
    rows = await steps_of(host, handle.instance_id)
    comp = [(r.attempt, r.outcome) for r in rows if r.step_id == 1]
    assert comp == [(1, Outcome.SUCCESS)] + [(n, Outcome.COMPENSATION_FAILURE) for n in (2, 3, 4)]
    assert calls["release"] == 3


async def test_an_unserialisable_result_fails_the_step_without_retrying(host_factory: Any) -> None:
    plan = flowx.flow("ex.nan", version="1", input=Order).step(bad_result).build()
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="o7"))
    failed = await failure_of(handle)
    # R9.5: a result the journal cannot store fails its own step with this code, naming it.
    assert failed.error["code"] == "step.result_unstorable"
    assert "NaN" in failed.error["message"]
    assert calls["bad_result"] == 1


async def test_a_result_that_does_not_fit_its_state_field_is_a_clear_failure(
    host_factory: Any,
) -> None:
    class Typed(BaseModel):
        count: int = 0

    @flowx.capability("ex.wrong_type", version="1.0.0")
    def wrong(ctx: flowx.StepContext, order: Order) -> str:
        return "not a number"

    plan = (
        flowx.flow("ex.typed", version="1", input=Order, state=Typed)
        .step(wrong, into="count")
        .build()
    )
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="o8"))
    failed = await failure_of(handle)
    assert failed.error["code"] == "step.result_invalid"
    assert "'count'" in failed.error["message"]


async def test_for_each_runs_each_element_in_its_own_scope(host_factory: Any) -> None:
    plan = (
        flowx.flow("ex.each", version="1", input=Order, state=OrderState)
        .for_each("lines", lambda o, s: o.lines, lambda b: b.step(ship), into="shipped")
        .build()
    )
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="o9", lines=[7, 8]))
    state = await handle.result()
    assert state.shipped == [{"line": 7, "scope": "0"}, {"line": 8, "scope": "1"}]
    rows = await steps_of(host, handle.instance_id)
    assert [(r.scope, r.step_id) for r in rows] == [("0", 2), ("1", 2)]


async def test_nested_for_each_scopes_are_paths(host_factory: Any) -> None:
    plan = (
        flowx.flow("ex.nested", version="1", input=Order, state=OrderState)
        .for_each(
            "outer",
            lambda o, s: [[1, 2], [3]],
            lambda b: b.for_each("inner", lambda o, s: [0], lambda c: c.step(ship)),
        )
        .build()
    )
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="o10"))
    await handle.result()
    rows = await steps_of(host, handle.instance_id)
    assert [r.scope for r in rows] == ["0/0", "1/0"]


# -- replay --------------------------------------------------------------------------------


async def _journal_prefix(
    host: flowx.FlowHost, plan: flowx.Plan, order: Order, upto: int
) -> tuple[str, list[StepRecord]]:
    """Run the flow, then keep only the first ``upto`` committed rows as the history."""
    handle = await host.start(plan, order)
    with contextlib.suppress(flowx.FlowFailed):
        await handle.result()
    rows = await steps_of(host, handle.instance_id)
    return handle.instance_id, rows[:upto]


def _execution(
    plan: Any, instance_id: str, input_value: Any, committer: Any, clock: Any, **spec: Any
) -> Execution:
    """An Execution with only a committer and a clock (no waits): the loop alone."""
    return Execution(
        RunSpec(plan=plan, instance_id=instance_id, input_value=input_value, **spec),
        RunPorts(committer=committer, clock=clock),
    )


class _Recorder:
    def __init__(self) -> None:
        self.writes: list[Any] = []

    async def __call__(self, **kw: Any) -> None:
        self.writes.append(kw)


async def test_resume_replays_committed_rows_without_calling_their_capabilities(
    host_factory: Any, clock: Any
) -> None:
    plan = order_flow()
    host = await host_factory(plan)
    iid, history = await _journal_prefix(host, plan, Order(order_id="r1"), upto=1)
    calls.clear()
    recorder = _Recorder()
    result = await _execution(
        plan,
        iid,
        Order(order_id="r1"),
        recorder,
        clock,
        history=history,
        tenant_id="acme",
    ).run()
    assert result.outcome == "completed"
    assert calls == Counter({"capture": 1})  # reserve came from the journal
    assert result.replayed == 1 and result.executed == 2
    steps = [w["step"] for w in recorder.writes if w.get("step")]
    assert [s.step_name for s in steps] == ["ex.capture", "emit:OrderPlaced"]
    assert codec.loads(result.state_bag)["reservation"] == "R-r1"


async def test_resume_continues_the_attempt_count_of_a_failing_step(
    host_factory: Any, clock: Any
) -> None:
    behaviour["reserve"] = 1
    plan = order_flow()
    host = await host_factory(plan)
    iid, history = await _journal_prefix(host, plan, Order(order_id="r2"), upto=1)
    assert history[0].outcome is Outcome.FAILURE
    recorder = _Recorder()
    await _execution(
        plan,
        iid,
        Order(order_id="r2"),
        recorder,
        clock,
        history=history,
    ).run()
    first = recorder.writes[0]["step"]
    assert (first.step_id, first.attempt, first.outcome) == (1, 2, Outcome.SUCCESS)


async def test_a_retry_replays_the_ids_its_first_attempt_drew(host_factory: Any) -> None:
    behaviour["ticket"] = 1
    plan = flowx.flow("ex.ids", version="1", input=Order).step(ticket).build()
    host = await host_factory(plan)
    handle = await host.start(plan, Order(order_id="n1"))
    await handle.result()
    first, second = behaviour["uuids"]
    assert first == second  # R2.5: captured on first use, replayed on the retry
    rows = await steps_of(host, handle.instance_id)
    assert codec.loads(rows[0].nondeterministic) == {"uuid": [first]}
    assert codec.loads(rows[1].nondeterministic) == {"uuid": [first]}


async def test_the_idempotency_key_is_stable_across_re_execution(
    host_factory: Any, clock: Any
) -> None:
    plan = order_flow()
    host = await host_factory(plan)
    iid, history = await _journal_prefix(host, plan, Order(order_id="k1"), upto=1)
    await _execution(
        plan,
        iid,
        Order(order_id="k1"),
        _Recorder(),
        clock,
        history=history,
    ).run()
    keys = behaviour["capture_keys"]
    assert len(keys) == 2 and keys[0] == keys[1] == f"{iid}//2"


async def test_a_journal_that_does_not_match_the_plan_is_nondeterminism(
    host_factory: Any, clock: Any
) -> None:
    plan = order_flow()
    host = await host_factory(plan)
    iid, history = await _journal_prefix(host, plan, Order(order_id="d1"), upto=2)
    changed = (
        flowx.flow("ex.order", version="1.0.0", input=Order, state=OrderState)
        .step(reserve, into="reservation")
        .step(ticket)
        .build()
    )
    with pytest.raises(flowx.NonDeterminismError, match=r"named 'ex\.capture'"):
        _execution(
            changed,
            iid,
            Order(order_id="d1"),
            _Recorder(),
            clock,
            history=history,
        )


async def test_a_step_that_keeps_killing_its_worker_is_failed_not_rerun(
    host_factory: Any, clock: Any
) -> None:
    plan = order_flow()
    recorder = _Recorder()
    result = await _execution(
        plan,
        "poison",
        Order(order_id="p1"),
        recorder,
        clock,
        resume_count=11,
        max_resumes=10,
    ).run()
    assert result.outcome == "failed"
    assert calls["reserve"] == 0
    assert result.error is not None and result.error["code"] == "step.poison"


async def test_a_fenced_out_commit_aborts_without_compensating(clock: Any) -> None:
    behaviour["capture"] = 1

    class Fenced:
        def __init__(self) -> None:
            self.n = 0

        async def __call__(self, **kw: Any) -> None:
            self.n += 1
            if self.n == 2:  # the capture failure's commit is refused
                raise FencedOut("x", 1, 2)

    result = await _execution(
        order_flow(),
        "z",
        Order(order_id="z1"),
        Fenced(),
        clock,
    ).run()
    assert result.outcome == "aborted"
    assert "fence 2" in (result.abort_reason or "")
    assert calls["release"] == 0 and calls["refund"] == 0  # R3.5


async def test_an_ephemeral_flow_runs_the_same_plan_with_no_journal() -> None:
    plan = (
        flowx.flow("ex.eph", version="1", input=Order, state=OrderState, profile=flowx.Ephemeral)
        .step(reserve, into="reservation")
        .build()
    )
    async with flowx.FlowHost(flows=[plan]) as host:
        handle = await host.start(plan, {"order_id": "e1"})
        assert (await handle.result()).reservation == "R-e1"


async def test_a_durable_flow_on_a_host_with_no_journal_is_refused() -> None:
    plan = order_flow()
    async with flowx.FlowHost(flows=[plan]) as host:
        with pytest.raises(flowx.DurabilityNotConfigured) as refused:
            await host.start(plan, Order(order_id="x"))
    assert refused.value.code == "flow.durability_not_configured"
    assert "store=" in refused.value.message
    assert calls["reserve"] == 0


async def test_a_repeated_idempotency_key_returns_the_same_instance(host_factory: Any) -> None:
    plan = order_flow()
    host = await host_factory(plan)
    first = await host.start(plan, Order(order_id="i1"), idempotency_key="order-i1")
    await first.result()
    again = await host.start(plan, Order(order_id="i1"), idempotency_key="order-i1")
    assert again.instance_id == first.instance_id
    assert not again.created
    assert await again.result() == await first.result()
    assert calls["reserve"] == 1  # R4.1: nothing ran twice
    with pytest.raises(flowx.IdempotencyConflict):
        await host.start(plan, Order(order_id="other"), idempotency_key="order-i1")


async def test_concurrent_starts_with_one_key_make_one_instance(host_factory: Any) -> None:
    plan = order_flow()
    host = await host_factory(plan)
    handles = await asyncio.gather(
        *[host.start(plan, Order(order_id="c1"), idempotency_key="same") for _ in range(5)]
    )
    assert len({h.instance_id for h in handles}) == 1
    assert sum(h.created for h in handles) == 1
    await handles[0].result()
    assert calls["reserve"] == 1


async def test_bad_input_names_the_field_and_writes_nothing(
    host_factory: Any, memory_store: Any
) -> None:
    plan = order_flow()
    host = await host_factory(plan)
    with pytest.raises(flowx.InputInvalid, match=r"field 'amount'"):
        await host.start(plan, {"order_id": "b1", "amount": "lots"})
    with pytest.raises(flowx.InputInvalid, match="field 'order_id'"):
        await host.start(plan, {})
    from flowx.stores.protocols import InstanceQuery

    assert list(await memory_store.catalog.list_instances(InstanceQuery())) == []


async def test_an_unknown_flow_or_version_is_a_clear_error(host_factory: Any) -> None:
    plan = order_flow()
    host = await host_factory(plan)
    with pytest.raises(flowx.FlowNotFound, match=r"ex\.order@1\.0\.0"):
        await host.start("ex.nope", {"order_id": "u"})
    with pytest.raises(flowx.FlowNotFound):
        await host.start("ex.order", {"order_id": "u"}, version="9.9.9")


async def test_an_input_with_no_json_form_is_refused_before_anything_is_written(
    host_factory: Any, memory_store: Any
) -> None:
    class Reading(BaseModel):
        value: float

    plan = flowx.flow("ex.reading", version="1", input=Reading).step(reserve).build()
    host = await host_factory(plan)
    with pytest.raises(flowx.SerialisationError, match="NaN"):
        await host.start(plan, Reading(value=float("nan")))
    from flowx.stores.protocols import InstanceQuery

    assert list(await memory_store.catalog.list_instances(InstanceQuery())) == []
    assert memory_store._data.leases == {}  # not even a lease was taken


async def test_the_last_step_commit_also_completes_the_instance(clock: Any) -> None:
    recorder = _Recorder()
    result = await _execution(
        order_flow(),
        "f1",
        Order(order_id="f1"),
        recorder,
        clock,
    ).run()
    assert result.outcome == "completed"
    assert len(recorder.writes) == 3  # three nodes, three writes: no separate "Completed"
    last = recorder.writes[-1]
    assert last["state"] is InstanceState.COMPLETED
    assert last["step"].step_name == "emit:OrderPlaced"
    assert codec.loads(last["state_bag"])["receipt"] == "P-10"
