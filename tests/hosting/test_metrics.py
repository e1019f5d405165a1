"""``/metrics`` (R9.6): the families an operator scrapes, fed at their seams and served over
HTTP while the node is open — counted commits and outcomes, a takeover and its delay, a late
timer, and the sampled gauges (in flight, leases, journal up, outbox backlog)."""

from __future__ import annotations

import asyncio
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

import flowx
from flowx import metrics
from flowx.stores.records import InstanceState
from flowx.testing import FakeClock
from tests.engine import kit
from tests.engine.kit import Ledger, until_state
from tests.engine.kit import fresh_ledgers as _reset  # noqa: F401 - autouse
from tests.support.polling import until

ledger = Ledger("met")
calls, broken = ledger.calls, ledger.broken
reserve = ledger.capability("reserve")
charge = ledger.capability("charge")


@flowx.capability("met.flaky", version="1.0.0")
async def flaky(ctx: flowx.StepContext, order: kit.Order) -> str:
    """Fails its first call, then succeeds: one Failure row and one Success row."""
    calls["flaky"] += 1
    if calls["flaky"] == 1:
        raise RuntimeError("a blip")
    return "ok"


@flowx.event("met.charged", version="1")
class Charged(BaseModel):
    order_id: str


def order_flow() -> flowx.Plan:
    return (
        flowx.flow("met.order", version="1", input=kit.Order)
        .step(reserve)
        .step(flaky, retry=flowx.Retry(attempts=2, backoff="none"))
        .step(charge)
        .emit(Charged, lambda o, s: Charged(order_id=o.order_id))
        .build()
    )


def napping_flow() -> flowx.Plan:
    return flowx.flow("met.nap", version="1", input=kit.Order).sleep("1m").step(reserve).build()


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``/metrics`` over HTTP, parsed: sample name → labels → value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


async def test_a_node_serves_what_it_committed_and_how_its_flows_ended(
    tmp_path: Path,
) -> None:
    host = flowx.FlowHost(
        store=flowx.sqlite(tmp_path / "m.db"),
        flows=[order_flow()],
        settings=flowx.HostSettings.load(metrics_port=0, metrics_interval="0.1s"),
    )
    committed = metrics.STEP_COMMITS.get(("met.order", "Success"))
    failed = metrics.STEP_COMMITS.get(("met.order", "Failure"))
    ended = metrics.FLOWS_ENDED.get(("met.order", "completed"))
    timed = metrics.STEP_COMMIT_SECONDS.count("met.order")
    async with host:
        port = host.metrics_port
        assert port is not None and port > 0
        handle = await host.start(order_flow(), kit.Order(order_id="m1"))
        await handle.result(timeout=10)
        assert metrics.STEP_COMMITS.get(("met.order", "Success")) == committed + 4
        assert metrics.STEP_COMMITS.get(("met.order", "Failure")) == failed + 1
        assert metrics.FLOWS_ENDED.get(("met.order", "completed")) == ended + 1

        def sampled() -> bool:
            got = scrape(port)
            node = (("node", host.node_id),)
            return (  # sampled once the run has let go of everything
                got.get("flowx_journal_up", {}).get(node) == 1.0
                and got.get("flowx_outbox_pending", {}).get(()) == 1.0
                and got.get("flowx_instances_in_flight", {}).get(node) == 0.0
                and got.get("flowx_leases_held", {}).get(node) == 0.0
            )

        await until(lambda: asyncio.to_thread(sampled), within=10, what="the gauges sampled")
        got = await asyncio.to_thread(scrape, port)
        node = (("node", host.node_id),)
        flow_ok = (("flow", "met.order"), ("outcome", "Success"))
        # What the endpoint serves is what was counted (process-wide: compared to before).
        assert got["flowx_step_commits_total"][flow_ok] == committed + 4
        ended_ok = (("flow", "met.order"), ("outcome", "completed"))
        assert got["flowx_flows_ended_total"][ended_ok] == ended + 1
        assert got["flowx_step_commit_seconds_count"][(("flow", "met.order"),)] == timed + 5
        buckets = got["flowx_step_commit_seconds_bucket"]
        assert buckets[(("flow", "met.order"), ("le", "+Inf"))] == timed + 5
        assert got["flowx_journal_up"][node] == 1.0
        assert got["flowx_outbox_dead_letters"][()] == 0.0
        assert got["flowx_outbox_lag_seconds"][()] > 0.0  # its one event waits: no broker
    with pytest.raises(OSError):  # closed with the node
        await asyncio.to_thread(scrape, port)


async def test_a_takeover_and_a_late_timer_are_measured_where_the_instance_is_taken(
    host_factory: Any, clock: FakeClock
) -> None:
    nap = napping_flow()
    host = await host_factory(nap)
    handle = await host.start(nap, kit.Order(order_id="t1"))
    await until_state(host, handle.instance_id, InstanceState.SUSPENDED)
    late = metrics.TIMER_LATENESS_SECONDS.count("met.nap")
    clock.advance(minutes=3)  # due one minute in; woken two minutes late
    await host.timers.run_once()
    await until_state(host, handle.instance_id, InstanceState.COMPLETED)
    assert metrics.TIMER_LATENESS_SECONDS.count("met.nap") == late + 1

    flow = order_flow()
    first = await host_factory(flow)
    gate = ledger.gates["charge"] = asyncio.Event()
    running = await first.start(flow, kit.Order(order_id="t2"))
    await until(lambda: calls["charge"] == 1, within=5, what="charge running")  # past flaky
    assert first.store is not None
    held = await first.store.leases.current(running.instance_id)
    assert held is not None
    await first.store.leases.release(held, now=None)  # as if its node had died
    taken = metrics.TAKEOVERS.get("met.order")
    delays = metrics.TAKEOVER_DELAY_SECONDS.count("met.order")
    total_before = metrics.TAKEOVER_DELAY_SECONDS.child("met.order").total
    second = await host_factory(flow)
    clock.advance(timedelta(seconds=40))
    assert await second.resume(running.instance_id) == "resumed"
    gate.set()
    assert metrics.TAKEOVERS.get("met.order") == taken + 1
    delay = metrics.TAKEOVER_DELAY_SECONDS.child("met.order")
    assert delay.count == delays + 1 and delay.total - total_before >= 40.0  # the 40 s it sat


def test_a_port_that_is_taken_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        host = flowx.FlowHost(
            store=flowx.sqlite(tmp_path / "p.db"),
            flows=[order_flow()],
            settings=flowx.HostSettings.load(metrics_port=port),
        )
        with pytest.raises(flowx.FlowXError) as taken:
            asyncio.run(host.open())
    assert taken.value.code == "settings.metrics_port_unavailable"
    assert "--metrics-port" in str(taken.value)


def test_a_histogram_is_served_as_prometheus_client_would_serve_it() -> None:
    """The histograms count in-process and are exported when scraped (issue 14): the same
    observations give the same buckets, count and sum as prometheus-client's own histogram,
    a value on a bound counted in that bound's bucket (``le``)."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    values = [0.0, 0.0005, 0.0007, 0.001, 0.02, 2.5, 3.0, 1e9]
    family = metrics.STEP_COMMIT_SECONDS
    flow = "met.histogram"
    registry = CollectorRegistry()
    theirs = Histogram("theirs", "x", ["flow"], buckets=metrics.COMMIT_BUCKETS, registry=registry)
    for value in values:
        family.observe(flow, value)
        theirs.labels(flow).observe(value)

    def served(text: str, name: str) -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}
        for fam in text_string_to_metric_families(text):
            for sample in fam.samples:
                if sample.labels.get("flow") == flow and sample.name.startswith(name):
                    out[(sample.name.removeprefix(name), sample.labels.get("le", ""))] = (
                        sample.value
                    )
        return out

    from prometheus_client import REGISTRY

    ours = served(generate_latest(REGISTRY).decode(), "flowx_step_commit_seconds")
    expected = served(generate_latest(registry).decode(), "theirs")
    # ``_created`` is when each series began: served by both, equal only in name.
    assert ours.pop(("_created", "")) > 0 and expected.pop(("_created", "")) > 0
    assert ours == expected
    assert ours[("_bucket", "0.0005")] == 2 and ours[("_bucket", "+Inf")] == len(values)


def test_a_counter_is_served_as_prometheus_client_would_serve_it() -> None:
    """Same samples as prometheus-client's own counter (its ``_created`` included), and a
    series with the wrong number of labels refused when it is made, as there."""
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, generate_latest

    registry = CollectorRegistry()
    theirs = Counter("theirs", "x", ["flow", "outcome"], registry=registry)
    metrics.STEP_COMMITS.inc(("met.counter", "Success"), 3)
    theirs.labels("met.counter", "Success").inc(3)

    def served(text: str, name: str) -> dict[str, float]:
        return {
            sample.name.removeprefix(name): sample.value
            for fam in text_string_to_metric_families(text)
            for sample in fam.samples
            if sample.labels.get("flow") == "met.counter" and sample.name.startswith(name)
        }

    ours = served(generate_latest(REGISTRY).decode(), "flowx_step_commits")
    expected = served(generate_latest(registry).decode(), "theirs")
    assert ours.pop("_created") > 0 and expected.pop("_created") > 0
    assert ours == expected == {"_total": 3.0}
    with pytest.raises(ValueError, match="labels"):
        metrics.STEP_COMMITS.inc("met.counter")
