"""``StopStore`` conformance: what a cancel or terminate request keeps, wakes and answers
(R9.4). Every store must reach the whole tree of an instance in one write, keep the request
both on the instance and as a journaled inbox row, and make a repeat inert."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowx.stores.errors import InstanceFinished, UnknownInstance
from flowx.stores.records import STOP_SIGNAL, InstanceState, StopRequest
from flowx.testing.conformance._support import at, commit, new_id
from flowx.testing.conformance._support import make_instance as _make
from flowx.testing.conformance._support import suspend_commit as _suspend


def _request(mode: str = "cancel", *, by: str = "ann", when: float = 9) -> StopRequest:
    return StopRequest(mode=mode, reason=f"{mode} it", by=by, at=at(when))


class StopStoreConformance:
    """Needs a ``stores`` fixture yielding opened ``Stores``."""

    async def test_a_request_is_kept_on_the_instance_and_journaled_in_its_inbox(
        self, stores: Any
    ) -> None:
        iid = await _make(stores)
        receipt = await stores.stops.request_stop(iid, _request())
        assert (receipt.instance_id, receipt.mode, receipt.status) == (iid, "cancel", "requested")
        assert receipt.state is InstanceState.RUNNING
        assert receipt.affected == ((iid, InstanceState.RUNNING),)
        got = await stores.journal.get(iid)
        assert got.state is InstanceState.RUNNING
        assert got.updated_at == at(0)  # a running instance's idle clock is not reset
        assert StopRequest.loads(got.stop_request) == _request()
        [row] = await stores.waits.signals(iid, STOP_SIGNAL)
        assert row.key == "cancel"
        assert StopRequest.loads(row.payload) == _request()
        assert await stores.stops.stop_requests([iid, new_id()]) == {iid: got.stop_request}

    async def test_a_suspended_instance_is_made_pending_so_a_node_stops_it_at_once(
        self, stores: Any
    ) -> None:
        iid = await _make(stores)
        await stores.waits.suspend(_suspend(iid, wake_at=600, signal="approval"))
        receipt = await stores.stops.request_stop(iid, _request("terminate"))
        assert (receipt.status, receipt.state) == ("requested", InstanceState.PENDING)
        got = await stores.journal.get(iid)
        assert (got.state, got.updated_at) == (InstanceState.PENDING, at(9))

    async def test_a_repeat_writes_nothing_and_a_terminate_outranks_a_cancel(
        self, stores: Any
    ) -> None:
        iid = await _make(stores)
        await stores.stops.request_stop(iid, _request("cancel"))
        again = await stores.stops.request_stop(iid, _request("cancel", by="bob", when=20))
        assert again.status == "already"
        kept = StopRequest.loads((await stores.journal.get(iid)).stop_request)
        assert kept.by == "ann"
        harder = await stores.stops.request_stop(iid, _request("terminate", by="bob"))
        assert harder.status == "requested"
        softer = await stores.stops.request_stop(iid, _request("cancel", by="cy"))
        assert softer.status == "already"
        kept = StopRequest.loads((await stores.journal.get(iid)).stop_request)
        assert (kept.mode, kept.by) == ("terminate", "bob")
        rows = await stores.waits.signals(iid, STOP_SIGNAL)
        assert [r.key for r in rows] == ["cancel", "terminate"]

    async def test_a_request_reaches_every_unfinished_descendant_in_one_write(
        self, stores: Any
    ) -> None:
        parent = await _make(stores)
        child = await _make(stores, parent_instance_id=parent, parent_scope="", parent_step_id=2)
        grandchild = await _make(
            stores, parent_instance_id=child, parent_scope="", parent_step_id=1
        )
        done = await _make(stores, parent_instance_id=parent, parent_scope="", parent_step_id=3)
        await stores.journal.commit(commit(done, token=1, now=3, state=InstanceState.COMPLETED))
        await stores.waits.suspend(_suspend(child, wake_at=600))
        other = await _make(stores)
        receipt = await stores.stops.request_stop(parent, _request())
        assert receipt.affected[0] == (parent, InstanceState.RUNNING)
        assert dict(receipt.affected) == {
            parent: InstanceState.RUNNING,
            child: InstanceState.PENDING,
            grandchild: InstanceState.RUNNING,
        }
        for iid in (parent, child, grandchild):
            assert (await stores.journal.get(iid)).stop_request is not None
        for iid in (done, other):
            assert (await stores.journal.get(iid)).stop_request is None
        assert (await stores.journal.get(done)).state is InstanceState.COMPLETED

    async def test_an_ended_instance_answers_by_how_it_ended(self, stores: Any) -> None:
        completed = await _make(stores)
        await stores.journal.commit(
            commit(completed, token=1, now=3, state=InstanceState.COMPLETED)
        )
        with pytest.raises(InstanceFinished):
            await stores.stops.request_stop(completed, _request())
        cancelled = await _make(stores)
        await stores.stops.request_stop(cancelled, _request())
        await stores.journal.commit(
            commit(cancelled, token=1, now=4, state=InstanceState.CANCELLED, error='{"x":1}')
        )
        again = await stores.stops.request_stop(cancelled, _request("terminate"))
        assert (again.status, again.state, again.affected) == (
            "ended",
            InstanceState.CANCELLED,
            (),
        )
        with pytest.raises(UnknownInstance):
            await stores.stops.request_stop(new_id(), _request())

    async def test_racing_requests_keep_one_of_each_mode(self, stores: Any) -> None:
        iid = await _make(stores)
        receipts = await asyncio.gather(
            *(stores.stops.request_stop(iid, _request("cancel", by=f"n{n}")) for n in range(6))
        )
        assert sorted(r.status for r in receipts) == ["already"] * 5 + ["requested"]
        assert len(await stores.waits.signals(iid, STOP_SIGNAL)) == 1

    async def test_a_seal_after_a_request_leaves_the_instance_runnable(self, stores: Any) -> None:
        """A run that learned of the request too late to stop before its wait still seals;
        the seal makes the instance Pending, not Suspended, so it is not left asleep."""
        iid = await _make(stores)
        await stores.stops.request_stop(iid, _request())
        assert await stores.waits.suspend(_suspend(iid, wake_at=600, signal="approval"))
        assert (await stores.journal.get(iid)).state is InstanceState.PENDING

    async def test_an_instance_ended_by_a_stop_still_passes_it_to_a_late_child(
        self, stores: Any
    ) -> None:
        parent = await _make(stores)
        await stores.stops.request_stop(parent, _request())
        await stores.journal.commit(
            commit(parent, token=1, now=4, state=InstanceState.CANCELLED, error="{}")
        )
        late = await _make(stores, parent_instance_id=parent, parent_scope="", parent_step_id=2)
        receipt = await stores.stops.request_stop(parent, _request())
        assert (receipt.status, receipt.state) == ("ended", InstanceState.CANCELLED)
        assert receipt.affected == ((late, InstanceState.RUNNING),)
        assert (await stores.journal.get(late)).stop_request is not None

    async def test_a_repeat_wakes_an_instance_set_aside_with_a_request_not_carried_out(
        self, stores: Any
    ) -> None:
        """A request kept on an instance that went to sleep or was quarantined as it came
        would otherwise never be carried out: a repeat writes no new request, but makes it
        Pending again for a node to stop."""
        iid = await _make(stores)
        await stores.stops.request_stop(iid, _request("terminate"))
        await stores.journal.commit(commit(iid, token=1, now=12, state=InstanceState.QUARANTINED))
        again = await stores.stops.request_stop(iid, _request("cancel", by="bob", when=20))
        assert (again.status, again.state) == ("already", InstanceState.PENDING)
        kept = StopRequest.loads((await stores.journal.get(iid)).stop_request)
        assert (kept.mode, kept.by) == ("terminate", "ann")
        assert len(await stores.waits.signals(iid, STOP_SIGNAL)) == 1
