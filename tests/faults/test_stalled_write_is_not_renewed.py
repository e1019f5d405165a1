"""A lease is not renewed while its instance's write gets no answer (R9.1, R2.4, R3.5).

Here the client deadline is set far past the TTL, so the one thing that can free the instance
is the lease keeper refusing to renew a lease whose journal write has been outstanding for
longer than its stall limit. Node A (through a fault proxy) has its ``effect`` commit's
reply withheld — the row lands, the answer never comes — while a second instance on A stays
healthy. The stalled instance's lease runs out and node B takes it over within about a TTL;
the healthy one keeps its lease on A. When the late reply finally reaches A, A stops at its
next step (its lease is lost) and writes nothing more.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import flowx
from flowx.hosting.lease import LeaseKeeper
from tests.faults import gated_flow
from tests.faults.conftest import SCAN, TTL, MakeNode
from tests.faults.gated_flow import FLOW, Job, commit_of, ledger
from tests.faults.support import (
    WriteTap,
    on_node,
    rows,
    signalled,
    writes_past_a_fence,
)
from tests.support.fault_proxy import FaultProxy
from tests.support.polling import until

RENEW = TTL / 3  # the default renewal interval


async def _lease(schema: str, instance_id: str) -> tuple[str, int, datetime, datetime]:
    [row] = await rows(
        schema,
        "SELECT owner_node, fencing_token, expires_at, acquired_at FROM flow_lease "
        "WHERE instance_id = %s",
        instance_id,
    )
    return row


async def test_a_lease_whose_write_has_no_answer_is_left_to_run_out_and_taken_over(
    proxy: FaultProxy, make_node: MakeNode, schema: str
) -> None:
    """R9.1: no renewal while a commit is outstanding past the stall limit (a round trip's
    deadline plus a renewal interval), so another node takes the instance over within about
    a TTL of that — not never; R3.5: the stalled node
    starts nothing once its late answer arrives; R2.4: it writes nothing past the fence."""
    a = await make_node("A", proxied=True, recovery=False)
    assert a.store is not None
    a.store.db.round_trip_timeout = 60.0  # type: ignore[attr-defined]  # longer than any TTL
    b = await make_node("B", proxied=False, recovery=True)
    tap = WriteTap(a, "A")
    tap_b = WriteTap(b, "B")

    for name in ("victim", "healthy"):
        gated_flow.hold(name)
    with on_node("A"):
        victim = await a.start(FLOW, Job(name="victim"))
        healthy = await a.start(FLOW, Job(name="healthy"))
    for name in ("victim", "healthy"):
        await signalled(gated_flow.entered[name], within=10, what=f"{name}'s effect started")

    caught = proxy.withhold_next_reply(commit_of(gated_flow.EFFECT))
    gated_flow.gates["victim"].set()
    await signalled(caught, within=10, what="the proxy caught the effect's commit")
    _, token_a, expires_a, _ = await _lease(schema, victim.instance_id)

    keeper: LeaseKeeper = a._keeper  # type: ignore[assignment]
    stall = keeper.stall_after  # a round trip's deadline plus a renewal interval
    await until(
        lambda: keeper.withheld > 0, within=stall + RENEW * 3 + 5, what="a renewal withheld"
    )

    # Watch the victim's lease until B holds it: A's expiry never moves past one last
    # renewal sent before the write counted as stalled.
    latest_a: list[datetime] = [expires_a]

    async def taken_by_b() -> bool:
        owner, token, expires, _ = await _lease(schema, victim.instance_id)
        if token == token_a:
            latest_a.append(expires)
        return owner == "B"

    await until(
        taken_by_b, within=TTL + stall + RENEW + SCAN * 2 + 20, what="B took the stalled instance"
    )
    _, token_b, _, taken_at = await _lease(schema, victim.instance_id)
    steps = await rows(
        schema,
        "SELECT step_name, result, committed_at FROM flow_step WHERE instance_id = %s "
        "ORDER BY sequence",
        victim.instance_id,
    )
    [(_, by, landed)] = [s for s in steps if s[0] == gated_flow.EFFECT]
    assert by == "A"  # the withheld commit landed
    assert max(latest_a) <= landed + timedelta(seconds=TTL + stall + 1.5), (
        f"A's lease was renewed to {max(latest_a)} for a write sent at {landed}"
    )
    assert taken_at >= max(latest_a)  # taken once A's lease had run out, not before
    takeover = taken_at - landed
    assert takeover <= timedelta(seconds=TTL + stall + SCAN * 1.25 + 2.5), takeover
    print(f"\nwithheld {keeper.withheld}x; taken over {takeover.total_seconds():.2f}s later")
    assert not tap.of(victim.instance_id), "A's commit was answered: the fault did not hold"

    # The healthy instance's lease was renewed all along: it is still A's, live.
    owner, _, expires, _ = await _lease(schema, healthy.instance_id)
    assert owner == "A" and expires > taken_at

    await until(
        lambda: _completed(b, victim.instance_id), within=20, what="B completed the instance"
    )
    assert ledger.nodes(victim.instance_id, "after") == ["B"]

    # The late reply reaches A: its commit "succeeds", and A stops before the next step.
    await proxy.forward()
    await until(lambda: tap.of(victim.instance_id), within=10, what="A's late answer")
    [write] = tap.of(victim.instance_id)
    assert write.error is None and write.token == token_a < token_b
    gated_flow.gates["healthy"].set()
    assert await healthy.result(timeout=20) == gated_flow.JobState(effect="A", after="A")
    await until(lambda: a.in_flight == 0, within=10, what="A's stalled run stopped")
    assert len(tap.of(victim.instance_id)) == 1  # nothing written after the late answer
    assert ledger.nodes(victim.instance_id, "effect") == ["A"]
    assert ledger.nodes(victim.instance_id, "after") == ["B"]
    assert ledger.count(victim.instance_id, "undo") == 0
    record = await b.get(victim.instance_id)
    assert record.state is flowx.InstanceState.COMPLETED and record.fence == token_b
    assert writes_past_a_fence(tap, tap_b) == []


async def _completed(host: flowx.FlowHost, instance_id: str) -> bool:
    return (await host.get(instance_id)).state is flowx.InstanceState.COMPLETED
