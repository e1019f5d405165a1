"""Compensation that fails: retried, every attempt a row, CompensationFailed, one alert, and a
replay that re-runs it once the fault is fixed (SPEC §8, "Flow constructs")."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

import flowx
from flowx.hosting.alerts import RecordingAlertSink
from flowx.stores.records import InstanceState, Outcome
from tests.engine.kit import Ledger, Order, failure_of, reservation, rows_of
from tests.engine.kit import fresh_ledgers as _reset  # noqa: F401 - autouse

ledger = Ledger("saga")
calls, broken = ledger.calls, ledger.broken


class OrderState(BaseModel):
    reservation: str | None = None
    receipt: str | None = None


reserve = ledger.capability("reserve", returns=reservation)
release = ledger.undo("release", fails_with="inventory service refused the release")
capture = ledger.capability(
    "capture", returns=lambda _: "P-1", fails_with="card declined by the gateway"
)
refund = ledger.undo("refund")
notify = ledger.capability("notify", returns=lambda _: "sent", fails_with="mail relay down")


COMP = flowx.Retry(attempts=3, backoff="fixed", initial="1s")


def saga() -> flowx.Plan:
    return (
        flowx.flow(
            "saga.order",
            version="1",
            input=Order,
            state=OrderState,
            partition_key=lambda o: o.tenant,
        )
        .step(reserve, into="reservation", compensate=release, compensate_retry=COMP)
        .step(capture, into="receipt", compensate=refund, retry=flowx.Retry(attempts=2))
        .build()
    )


async def failed_saga(host_factory: Any) -> tuple[flowx.FlowHost, str, RecordingAlertSink]:
    sink = RecordingAlertSink()
    plan = saga()
    host = await host_factory(plan, alerts=sink)
    broken.update({"capture", "release"})
    handle = await host.start(plan, Order(order_id="c1"))
    failed = await failure_of(handle, timeout=5)
    assert failed.state == "CompensationFailed"
    return host, handle.instance_id, sink


async def test_exhausted_compensation_is_compensation_failed_with_every_attempt_a_row(
    host_factory: Any,
) -> None:
    host, iid, _ = await failed_saga(host_factory)
    rows = await rows_of(host, iid)
    comp = [(r.step_name, r.attempt) for r in rows if r.outcome is Outcome.COMPENSATION_FAILURE]
    assert comp == [("saga.reserve", 2), ("saga.reserve", 3), ("saga.reserve", 4)]
    assert calls["release"] == 3
    record = await host.get(iid)
    error = flowx.codec.loads(record.error)
    assert error["step"] == "saga.capture"  # what failed first
    assert error["compensation"]["step"] == "saga.reserve"  # what could not be undone


async def test_the_alert_is_raised_exactly_once_with_everything_an_operator_needs(
    host_factory: Any,
) -> None:
    before = flowx.metrics.COMPENSATION_FAILED.get("saga.order")
    host, iid, sink = await failed_saga(host_factory)
    assert len(sink.alerts) == 1
    alert = sink.alerts[0]
    assert (alert.flow_id, alert.instance_id, alert.step) == ("saga.order", iid, "saga.reserve")
    assert alert.capability == "saga.release@1.0.0"
    assert alert.attempts == 3
    assert "refused the release" in alert.last_error["message"]
    assert flowx.metrics.COMPENSATION_FAILED.get("saga.order") == before + 1
    # Durable too: staged in the outbox by the same commit that ended the instance.
    events = [e for e in await host.store.journal.events(iid)]
    assert [e.type for e in events] == ["flowx.compensation_failed"]
    assert flowx.codec.loads(events[0].payload)["attempts"] == 3
    assert events[0].partition_key == "acme"
    # A terminal instance is not resumed, so nothing raises it a second time.
    assert await host.resume(iid) == "gone"
    assert len(sink.alerts) == 1


async def test_replay_reruns_the_compensation_as_new_attempts_never_rewriting_history(
    host_factory: Any,
) -> None:
    host, iid, sink = await failed_saga(host_factory)
    before = await rows_of(host, iid)
    dry = await host.replay(iid, "saga.reserve", dry_run=True)
    assert (dry.mode, dry.reruns) == ("compensation", ("undo saga.reserve",))
    assert await rows_of(host, iid) == before  # a dry run writes nothing
    broken.discard("release")  # the fault is fixed
    plan = await host.replay(iid, "saga.reserve")
    assert plan.step == "saga.reserve"
    await host.wait_idle(timeout=5)
    record = await host.get(iid)
    assert record.state is InstanceState.FAILED
    after = await rows_of(host, iid)
    assert after[: len(before)] == before  # every earlier row kept, unchanged
    new = [(r.step_name, r.attempt, r.outcome) for r in after[len(before) :]]
    assert new == [("saga.reserve", 5, Outcome.COMPENSATED)]
    assert calls["capture"] == 2 and calls["reserve"] == 1  # nothing forward re-ran
    assert record.resume_from_step == 1
    assert len(sink.alerts) == 1


async def test_a_replay_that_fails_again_alerts_again_once(host_factory: Any) -> None:
    host, iid, sink = await failed_saga(host_factory)
    await host.replay(iid, "saga.reserve")  # not fixed
    await host.wait_idle(timeout=5)
    assert (await host.get(iid)).state is InstanceState.COMPENSATION_FAILED
    assert len(sink.alerts) == 2
    rows = await rows_of(host, iid)
    attempts = [r.attempt for r in rows if r.outcome is Outcome.COMPENSATION_FAILURE]
    assert attempts == [2, 3, 4, 5, 6, 7]  # a fresh budget of 3, numbered on


async def test_replay_refuses_what_it_cannot_do_safely(host_factory: Any) -> None:
    host, iid, _ = await failed_saga(host_factory)
    with pytest.raises(flowx.FlowXError) as wrong_step:
        await host.replay(iid, "saga.capture")
    assert wrong_step.value.code == "instance.illegal_state"
    assert "--from 'saga.reserve'" in str(wrong_step.value)
    with pytest.raises(flowx.FlowXError) as no_step:
        await host.replay(iid, "no-such-step")
    assert "saga.reserve" in str(no_step.value)
    broken.clear()
    done = await host.start(saga(), Order(order_id="ok"))
    await done.result(timeout=5)
    with pytest.raises(flowx.FlowXError) as completed:
        await host.replay(done.instance_id, "saga.reserve")
    assert completed.value.code == "instance.illegal_state"


async def test_a_failed_step_with_no_compensation_begun_replays_forward(
    host_factory: Any,
) -> None:
    plan = (
        flowx.flow("saga.mail", version="1", input=Order, state=OrderState)
        .step(reserve, into="reservation")
        .step(notify, into="receipt", retry=flowx.Retry(attempts=2, backoff="none"))
        .build()
    )
    host = await host_factory(plan)
    broken.add("notify")
    handle = await host.start(plan, Order(order_id="f1"))
    await failure_of(handle, timeout=5)
    broken.clear()
    target = await host.replay(handle.instance_id, "saga.notify")
    assert target.mode == "forward" and target.reruns == ("saga.notify",)
    await host.wait_idle(timeout=5)
    record = await host.get(handle.instance_id)
    assert record.state is InstanceState.COMPLETED
    assert OrderState.model_validate_json(record.state_bag).receipt == "sent"
    rows = await rows_of(host, handle.instance_id)
    assert [(r.step_name, r.attempt, r.outcome) for r in rows] == [
        ("saga.reserve", 1, Outcome.SUCCESS),
        ("saga.notify", 1, Outcome.FAILURE),
        ("saga.notify", 2, Outcome.FAILURE),
        ("saga.notify", 3, Outcome.SUCCESS),
    ]
    assert calls["reserve"] == 1
