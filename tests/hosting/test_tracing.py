"""Tracing (R9.6): one instance is one trace, across nodes and into its sub-flow children —
the start, every run (here and on the node that took it over), every step attempt and
compensation, and a delivered signal — recorded by the OpenTelemetry SDK's in-memory
exporter."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

import flowx
from flowx import tracing
from flowx.engine.runner import child_instance_id
from flowx.outbox.publisher import headers
from flowx.outbox.recording import RecordingPublisher
from flowx.stores.records import InstanceState
from flowx.testing import FakeClock
from tests.engine import kit
from tests.engine.kit import Ledger, until_state
from tests.engine.kit import fresh_ledgers as _reset  # noqa: F401 - autouse
from tests.support.polling import until

ledger = Ledger("trc")
calls, gates = ledger.calls, ledger.gates
reserve = ledger.capability("reserve")
release = ledger.undo("release")
charge = ledger.capability("charge")
ship = ledger.capability("ship", non_retryable=True)


class State(BaseModel):
    reservation: str | None = None


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    try:
        yield exporter
    finally:
        tracing.use(None)


def _of(exporter: InMemorySpanExporter, instance: str) -> list[ReadableSpan]:
    return [
        s
        for s in exporter.get_finished_spans()
        if s.attributes is not None and s.attributes.get("flowx.instance") == instance
    ]


async def test_a_run_taken_over_by_another_node_continues_the_same_trace(
    host_factory: Any, spans: InMemorySpanExporter, clock: FakeClock
) -> None:
    plan = (
        flowx.flow("trc.order", version="1", input=kit.Order, state=State)
        .step(reserve, into="reservation")
        .step(charge)
        .build()
    )
    first = await host_factory(plan)
    gates["charge"] = asyncio.Event()  # held: the first node "dies" in charge
    handle = await first.start(plan, kit.Order(order_id="t1"))
    iid = handle.instance_id
    await until(lambda: calls["charge"] == 1, within=5, what="charge running")
    assert first.store is not None
    held = await first.store.leases.current(iid)
    assert held is not None
    await first.store.leases.release(held, now=clock.now())  # as if its node had died
    second = await host_factory(plan)
    clock.advance(seconds=1)  # past the released lease
    assert await second.resume(iid) == "resumed"  # fence raised: the first node's commit fails
    await until(lambda: calls["charge"] == 2, within=5, what="charge re-run on the second")
    gates["charge"].set()
    await until_state(second, iid, InstanceState.COMPLETED)
    await until(lambda: len([s for s in _of(spans, iid) if s.name == "flowx.run"]) == 2,
                within=5, what="both runs ended")  # fmt: skip

    mine = _of(spans, iid)
    by_name: dict[str, list[ReadableSpan]] = {}
    for s in mine:
        by_name.setdefault(s.name, []).append(s)
    [start] = by_name["flowx.start"]
    assert start.context is not None
    trace_id = start.context.trace_id
    assert {s.context.trace_id for s in mine if s.context is not None} == {trace_id}
    runs = by_name["flowx.run"]
    assert all(r.parent is not None and r.parent.span_id == start.context.span_id for r in runs)
    steps = [(s.attributes or {}).get("flowx.step") for s in by_name["flowx.step"]]
    assert steps.count("trc.reserve") == 1 and steps.count("trc.charge") == 2  # re-run once
    run_ids = {r.context.span_id for r in runs if r.context is not None}
    assert all(s.parent is not None and s.parent.span_id in run_ids for s in by_name["flowx.step"])
    assert {(r.attributes or {}).get("flowx.outcome") for r in runs} >= {"completed"}


async def test_a_child_a_compensation_and_a_signal_are_in_the_parent_s_trace(
    host_factory: Any, spans: InMemorySpanExporter
) -> None:
    child = (
        flowx.flow("trc.child", version="1", input=kit.Order)
        .await_signal("go", dict)
        .step(ship)
        .build()
    )
    parent = (
        flowx.flow("trc.parent", version="1", input=kit.Order, state=State)
        .step(reserve, into="reservation", compensate=release)
        .sub_flow(child, lambda order, state: order)
        .build()
    )
    host = await host_factory(parent, child)
    ledger.broken.add("ship")  # the child fails, so the parent compensates its reservation
    handle = await host.start(parent, kit.Order(order_id="t2"))
    iid = handle.instance_id
    child_id = child_instance_id(iid, "", parent.body[1].step_id)
    await until_state(host, iid, InstanceState.SUSPENDED)  # waiting on its child
    await until_state(host, child_id, InstanceState.SUSPENDED)
    await host.signal(child_id, "go", {})
    await until_state(host, iid, InstanceState.FAILED)

    [start] = [s for s in _of(spans, iid) if s.name == "flowx.start"]
    assert start.context is not None
    trace_id = start.context.trace_id
    theirs = _of(spans, child_id)
    assert {s.name for s in theirs} >= {"flowx.run", "flowx.signal", "flowx.step"}
    assert {s.context.trace_id for s in theirs if s.context is not None} == {trace_id}
    [undo] = [s for s in _of(spans, iid) if s.name == "flowx.compensate"]
    assert undo.context is not None and undo.context.trace_id == trace_id
    assert (undo.attributes or {}).get("flowx.step") == "trc.reserve"
    failed = [s for s in theirs if s.name == "flowx.step"]
    assert failed and not failed[0].status.is_ok


@flowx.event("trc.reserved", version="1")
class Reserved(BaseModel):
    order_id: str


async def test_an_emitted_event_carries_the_instance_s_trace_to_its_consumer(
    host_factory: Any, spans: InMemorySpanExporter
) -> None:
    """The event is staged with the trace context it was emitted in, and every broker
    adapter sends it as the W3C ``traceparent`` header (``outbox.publisher.headers``)."""
    plan = (
        flowx.flow("trc.emits", version="1", input=kit.Order, state=State)
        .step(reserve, into="reservation")
        .emit(Reserved, lambda o, s: Reserved(order_id=o.order_id))
        .build()
    )
    host = await host_factory(plan)
    handle = await host.start(plan, kit.Order(order_id="t3"))
    await handle.result(timeout=5)
    [start] = [s for s in _of(spans, handle.instance_id) if s.name == "flowx.start"]
    assert host.store is not None
    [event] = await host.store.journal.events(handle.instance_id)
    assert event.trace_context is not None and start.context is not None
    assert event.trace_context.split("-")[1] == f"{start.context.trace_id:032x}"
    assert headers(event)["traceparent"] == event.trace_context


async def test_publishing_a_batch_is_a_span_of_its_own(
    host_factory: Any, spans: InMemorySpanExporter
) -> None:
    plan = (
        flowx.flow("trc.emits2", version="1", input=kit.Order, state=State)
        .emit(Reserved, lambda o, s: Reserved(order_id=o.order_id))
        .build()
    )
    broker = RecordingPublisher()
    host = await host_factory(plan, publisher=broker)
    handle = await host.start(plan, kit.Order(order_id="t5"))
    await handle.result(timeout=5)
    await until(lambda: len(broker.received) == 1, within=5, what="the event published")
    await until(
        lambda: any(s.name == "flowx.publish" for s in spans.get_finished_spans()),
        within=5,
        what="the publish span ended",
    )
    [sent] = [s for s in spans.get_finished_spans() if s.name == "flowx.publish"]
    assert (sent.attributes or {}).get("flowx.broker") == "recording"
    assert (sent.attributes or {}).get("flowx.acknowledged") == 1
    [start] = [s for s in _of(spans, handle.instance_id) if s.name == "flowx.start"]
    assert start.context is not None
    traceparent = headers(broker.received[0])["traceparent"]
    assert traceparent.split("-")[1] == f"{start.context.trace_id:032x}"  # the instance's


async def test_a_due_timer_is_woken_in_the_instance_s_trace(
    host_factory: Any, spans: InMemorySpanExporter, clock: FakeClock
) -> None:
    plan = flowx.flow("trc.nap", version="1", input=kit.Order).sleep("1m").step(reserve).build()
    host = await host_factory(plan)
    handle = await host.start(plan, kit.Order(order_id="t4"))
    iid = handle.instance_id
    await until_state(host, iid, InstanceState.SUSPENDED)
    clock.advance(minutes=3)
    await host.timers.run_once()
    await until_state(host, iid, InstanceState.COMPLETED)
    mine = _of(spans, iid)
    [start] = [s for s in mine if s.name == "flowx.start"]
    [woke] = [s for s in mine if s.name == "flowx.timer_wake"]
    assert start.context is not None and woke.context is not None
    assert woke.context.trace_id == start.context.trace_id
    assert (woke.attributes or {}).get("flowx.late_ms") == 120_000


def test_without_an_sdk_a_child_span_is_not_made_and_a_kept_context_still_carries() -> None:
    """No SDK: the API's no-op tracer would hand back the current span for a child, so FlowX
    makes none (the commit path's cost, issue 14); a span with a kept ``traceparent`` is
    still made, so what it starts keeps the trace (R9.6)."""
    from opentelemetry import trace

    kept = "00-0af7651916cd43dd8441e5322e1f2c41-b7ad6b7169203331-01"
    before = trace.get_current_span()
    with tracing.span("flowx.step", {"flow": "f"}) as made:
        assert made is None
        assert trace.get_current_span() is before
    with tracing.span("flowx.run", {"flow": "f"}, parent=kept):
        assert tracing.current_context() == kept


def test_with_a_provider_given_a_child_span_is_made(spans: InMemorySpanExporter) -> None:
    with tracing.span("flowx.step", {"flow": "f"}) as made:
        assert made is not None and made.is_recording()
    assert [s.name for s in spans.get_finished_spans()] == ["flowx.step"]


def test_a_root_span_without_an_sdk_drops_the_inherited_span_and_nothing_else() -> None:
    """No SDK: a run's root span is not made; the block only loses the span it inherited
    (a sub-flow it starts keeps no trace of its caller's), while baggage and every other
    context entry stay visible to it, as under the API's own no-op root span."""
    from opentelemetry import baggage, context, trace
    from opentelemetry.propagate import inject

    assert tracing.quiet()
    caller = trace.NonRecordingSpan(
        trace.SpanContext(0x0AF7651916CD43DD8441E5322E1F2C41, 0xB7AD6B7169203331, True)
    )
    token = context.attach(trace.set_span_in_context(caller, baggage.set_baggage("tenant", "acme")))
    try:
        assert tracing.current_context() is not None
        with tracing.span("flowx.run", {"flow": "f"}, root=True):
            assert not trace.get_current_span().get_span_context().is_valid
            assert tracing.current_context() is None
            assert baggage.get_baggage("tenant") == "acme"
            carrier: dict[str, str] = {}
            inject(carrier)
            assert carrier == {"baggage": "tenant=acme"}
        assert tracing.current_context() is not None  # the caller's span is back after it
    finally:
        context.detach(token)


def test_a_provider_installed_globally_is_seen_at_once() -> None:
    """Spans are made from the moment an application installs an SDK provider globally,
    even after FlowX looked and found none (a global provider cannot be unset: a process of
    its own)."""
    import subprocess
    import sys

    script = (
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from flowx import tracing\n"
        "assert tracing.quiet()\n"
        "trace.set_tracer_provider(TracerProvider())\n"
        "assert not tracing.quiet()\n"
        "print('seen')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "seen"
