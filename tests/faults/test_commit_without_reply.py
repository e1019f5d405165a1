"""A COMMIT whose reply never arrives (R9.1, R2.4, R3.5), against a real PostgreSQL.

Node A reaches the journal through a fault proxy; node B reaches it directly and runs the
recovery scan. While A runs an instance's ``effect`` step, the proxy is told to withhold the
reply to the next request carrying that step's commit: the server receives it, executes it
(the row lands), and its answer never comes back, the connection left open — a pooler that
lost its server side, a frozen backend.

When only that reply is lost, A settles the outcome itself (the first test): its commit ends
at the deadline with ``JournalNoAnswer``, A re-reads the instance under the lease it still
holds, finds the row landed and runs on — same owner, same token, nothing run twice.

When A then cannot reach the journal at all (a partition right after: the second test):

(a) A's commit fails at its client deadline (TTL/2) with ``JournalNoAnswer``, an unknown
    outcome; A cannot re-read, stops the run and compensates nothing (R3.5);
(b) B takes the instance over within TTL + a scan interval of that write, and completes it;
(c) the effect ran once: the commit had landed, so B re-reads it and does not re-run it; the
    journal holds exactly one success row for the step;
(d) nothing A wrote is past the fence: every row from A committed before B's token existed,
    and the instance's fence is B's (R2.4);
(e) A is not wedged: once the proxy forwards again, a new instance started on A completes
    there.
"""

from __future__ import annotations

from datetime import timedelta

import flowx
from flowx.stores.errors import JournalNoAnswer
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

DEADLINE = TTL / 2  # what a host bounds every round trip to (HostSettings.round_trip_timeout)


async def test_a_commit_without_reply_is_settled_by_its_owner_under_the_same_lease(
    proxy: FaultProxy, make_node: MakeNode, schema: str
) -> None:
    """R9.1: an unknown outcome is settled by re-reading under the lease still held, not by
    a takeover a TTL later; R2.4: no new token is issued."""
    a = await make_node("A", proxied=True, recovery=False)
    b = await make_node("B", proxied=False, recovery=True)
    tap = WriteTap(a, "A")
    tap_b = WriteTap(b, "B")

    gated_flow.hold("settled")
    with on_node("A"):
        victim = await a.start(FLOW, Job(name="settled"))
    iid = victim.instance_id
    await signalled(gated_flow.entered["settled"], within=10, what="the effect started on A")
    caught = proxy.withhold_next_reply(commit_of(gated_flow.EFFECT))
    gated_flow.gates["settled"].set()
    await signalled(caught, within=10, what="the proxy caught the effect's commit")

    # A's run ends by itself, on A, well inside a TTL of the lost reply.
    assert await victim.result(timeout=TTL + 10) == gated_flow.JobState(effect="A", after="A")
    [write, after] = tap.of(iid)
    assert write.step == gated_flow.EFFECT and isinstance(write.error, JournalNoAnswer)
    assert after.step == gated_flow.AFTER and after.error is None
    assert after.token == write.token  # the same lease throughout
    # A re-read under that token, after the landed row: it resumed from it.
    assert [(o.token, o.next_sequence) for o in tap.opens if o.instance_id == iid] == [
        (write.token, 2)
    ]
    steps = await rows(
        schema,
        "SELECT step_name, outcome, result FROM flow_step WHERE instance_id = %s ORDER BY sequence",
        iid,
    )
    assert steps == [(gated_flow.EFFECT, "Success", "A"), (gated_flow.AFTER, "Success", "A")]
    [(fence,)] = await rows(schema, "SELECT fence FROM flow_instance WHERE instance_id = %s", iid)
    assert fence == write.token
    assert ledger.nodes(iid, "effect") == ["A"]
    assert ledger.nodes(iid, "after") == ["A"]
    assert ledger.count(iid, "undo") == 0
    assert tap_b.of(iid) == [] and not [o for o in tap_b.opens if o.instance_id == iid]
    await proxy.forward()


async def test_a_commit_without_reply_is_taken_over_within_a_ttl_and_runs_nothing_twice(
    proxy: FaultProxy, make_node: MakeNode, schema: str
) -> None:
    """R9.1 (a bounded commit, no stall), R2.4 (the fence decides), R3.5 (no compensation
    on a lost journal)."""
    a = await make_node("A", proxied=True, recovery=False)
    b = await make_node("B", proxied=False, recovery=True)
    assert a.store is not None and a.store.db.round_trip_timeout == DEADLINE  # type: ignore[attr-defined]
    tap = WriteTap(a, "A")
    tap_b = WriteTap(b, "B")

    gated_flow.hold("victim")
    with on_node("A"):
        victim = await a.start(FLOW, Job(name="victim"))
    iid = victim.instance_id
    await signalled(gated_flow.entered["victim"], within=10, what="the effect started on A")

    # Arm the fault and let the capability finish in one step: its commit is the request.
    caught = proxy.withhold_next_reply(commit_of(gated_flow.EFFECT))
    gated_flow.gates["victim"].set()
    await signalled(caught, within=10, what="the proxy caught the effect's commit")
    await proxy.blackhole()  # and A reaches the journal no more: it cannot settle it

    # (a) A's commit ends at its deadline, as an unknown outcome; A's run stops.
    await until(lambda: tap.of(iid), within=DEADLINE + 10, what="A's commit ended")
    [write] = tap.of(iid)
    assert write.step == gated_flow.EFFECT
    assert isinstance(write.error, JournalNoAnswer), repr(write.error)
    took = write.ended - write.sent
    assert DEADLINE <= took < TTL, f"the commit ended after {took:.2f}s"
    await until(lambda: a.in_flight == 0, within=10, what="A's run stopped")
    left = await b.get(iid)  # left for recovery: not failed, not compensating (R3.5)
    assert left.state in (flowx.InstanceState.RUNNING, flowx.InstanceState.COMPLETED)
    assert left.error is None

    # (b) B takes it over and completes it.
    await until(
        lambda: _state(b, iid, flowx.InstanceState.COMPLETED),
        within=TTL + SCAN * 2 + 20,
        what="the instance completed on B",
    )
    steps = await rows(
        schema,
        "SELECT step_name, outcome, result, committed_at FROM flow_step "
        "WHERE instance_id = %s ORDER BY sequence",
        iid,
    )
    [(owner, fence_b, taken_at)] = await rows(
        schema,
        "SELECT owner_node, fencing_token, acquired_at FROM flow_lease WHERE instance_id = %s",
        iid,
    )
    assert owner == "B"
    effect_row = next(s for s in steps if s[0] == gated_flow.EFFECT)
    takeover = taken_at - effect_row[3]  # both on the server's clock
    limit = timedelta(seconds=TTL + SCAN * 1.25 + 2.5)  # + a margin for a loaded box
    assert timedelta(seconds=TTL) <= takeover <= limit, f"taken over {takeover} after the write"
    print(f"\ncommit ended after {took:.2f}s; B took over {takeover.total_seconds():.2f}s later")

    # (c) The withheld commit landed, so nothing ran twice, and nothing compensated.
    assert [(s[0], s[1], s[2]) for s in steps] == [
        (gated_flow.EFFECT, "Success", "A"),
        (gated_flow.AFTER, "Success", "B"),
    ]
    assert ledger.nodes(iid, "effect") == ["A"]
    assert ledger.nodes(iid, "after") == ["B"]
    assert ledger.count(iid, "undo") == 0

    # (d) Nothing past the fence: A wrote only before B's token was issued, and the fence is
    # B's. A attempted no write after its unanswered one.
    [(fence,)] = await rows(schema, "SELECT fence FROM flow_instance WHERE instance_id = %s", iid)
    assert fence == fence_b > write.token
    assert all(s[3] < taken_at for s in steps if s[2] == "A")
    assert len(tap.of(iid)) == 1
    assert [(o.token, o.next_sequence) for o in tap_b.opens if o.instance_id == iid] == [
        (fence_b, 2)  # B opened after the landed row: it resumed from it
    ]
    assert writes_past_a_fence(tap, tap_b) == []

    # (e) A still serves: with the proxy forwarding, a new instance completes on A.
    await proxy.forward()
    with on_node("A"):
        fresh = await a.start(FLOW, Job(name="fresh"))
    assert await fresh.result(timeout=20) == gated_flow.JobState(effect="A", after="A")
    assert ledger.nodes(fresh.instance_id, "effect") == ["A"]
    assert ledger.nodes(fresh.instance_id, "after") == ["A"]


async def _state(host: flowx.FlowHost, instance_id: str, state: flowx.InstanceState) -> bool:
    return (await host.get(instance_id)).state is state
