"""``WaitStore.signal`` conformance: what a signal keeps, wakes, and answers (R2.10).

Split from the wait suite (``WaitStoreConformance`` inherits it) so each stays small: every
store must keep a signal and its wake-up in one write, and decide ``duplicate`` under the same
lock as the insert, so that concurrent senders cannot each see room for one more.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowx.stores.errors import InstanceFinished, UnknownInstance
from flowx.stores.records import InstanceState
from flowx.testing.conformance._support import at, commit, new_id, same_shard
from flowx.testing.conformance._support import make_instance as _make
from flowx.testing.conformance._support import suspend_commit as _suspend


class SignalConformance:
    """Subclassed by ``WaitStoreConformance``; needs the same ``stores`` fixture."""

    # ------------------------------------------------------------------ signal

    async def test_a_signal_wakes_an_instance_waiting_for_it(self, stores: Any) -> None:
        iid = await _make(stores)
        await stores.waits.suspend(_suspend(iid, step_id=3, wake_at=600, signal="approval"))
        receipt = await stores.waits.signal(iid, "approval", '{"by":"ann"}', key="k", now=at(9))
        assert (receipt.instance_id, receipt.name, receipt.status) == (iid, "approval", "woken")
        assert receipt.state is InstanceState.PENDING
        got = await stores.journal.get(iid)
        assert got.state is InstanceState.PENDING
        assert got.updated_at == at(9)
        # The wait stays readable, so the run that resumes it keeps the same deadline.
        assert (got.wake_step_id, got.wake_at, got.wake_signal) == (3, at(600), "approval")
        [kept] = await stores.waits.signals(iid, "approval")
        assert (kept.seq, kept.key, kept.payload) == (receipt.seq, "k", '{"by":"ann"}')

    async def test_a_signal_for_another_wait_or_a_running_instance_is_kept(
        self, stores: Any
    ) -> None:
        waiting = await _make(stores)
        await stores.waits.suspend(_suspend(waiting, signal="approval"))
        sleeping = await _make(stores)
        await stores.waits.suspend(_suspend(sleeping, wake_at=60))
        running = await _make(stores)
        for iid, state in (
            (waiting, InstanceState.SUSPENDED),
            (sleeping, InstanceState.SUSPENDED),
            (running, InstanceState.RUNNING),
        ):
            receipt = await stores.waits.signal(iid, "rejection", "{}", key=None, now=at(9))
            assert (receipt.status, receipt.state) == ("kept", state)
            got = await stores.journal.get(iid)
            assert got.state is state
            assert got.updated_at != at(9)
            assert [s.seq for s in await stores.waits.signals(iid, "rejection")] == [receipt.seq]

    async def test_a_repeated_key_is_a_duplicate_and_writes_nothing(self, stores: Any) -> None:
        iid = await _make(stores)
        first = await stores.waits.signal(iid, "pay", '{"n":1}', key="msg-1", now=at(1))
        again = await stores.waits.signal(iid, "pay", '{"n":2}', key="msg-1", now=at(2))
        assert first.status == "kept"
        assert (again.status, again.seq, again.state) == (
            "duplicate",
            first.seq,
            InstanceState.RUNNING,
        )
        rows = await stores.waits.signals(iid, "pay")
        assert [(r.seq, r.payload, r.received_at) for r in rows] == [(first.seq, '{"n":1}', at(1))]
        # The key is per (instance, name); no key is never a duplicate.
        other = await stores.waits.signal(iid, "refund", "{}", key="msg-1", now=at(3))
        assert other.status == "kept"
        await stores.waits.signal(iid, "pay", '{"n":3}', key=None, now=at(4))
        await stores.waits.signal(iid, "pay", '{"n":4}', key=None, now=at(5))
        rows = await stores.waits.signals(iid, "pay")
        assert [r.payload for r in rows] == ['{"n":1}', '{"n":3}', '{"n":4}']

    async def test_a_duplicate_does_not_wake_a_later_wait(self, stores: Any) -> None:
        iid = await _make(stores)
        first = await stores.waits.signal(iid, "pay", "{}", key="msg-1", now=at(1))
        await stores.waits.suspend(_suspend(iid, signal="pay", consumed=(first.seq,)))
        again = await stores.waits.signal(iid, "pay", "{}", key="msg-1", now=at(2))
        assert (again.status, again.state) == ("duplicate", InstanceState.SUSPENDED)
        assert (await stores.journal.get(iid)).state is InstanceState.SUSPENDED

    async def test_a_signal_to_an_unknown_instance_is_refused(self, stores: Any) -> None:
        missing = new_id()
        with pytest.raises(UnknownInstance):
            await stores.waits.signal(missing, "go", "{}", key=None, now=at(1))
        assert list(await stores.waits.signals(missing, "go")) == []

    @pytest.mark.parametrize(
        "state",
        [
            InstanceState.COMPLETED,
            InstanceState.FAILED,
            InstanceState.TIMED_OUT,
            InstanceState.COMPENSATION_FAILED,
        ],
    )
    async def test_a_signal_to_a_finished_instance_is_refused_and_not_kept(
        self, stores: Any, state: InstanceState
    ) -> None:
        iid = await _make(stores)
        await stores.journal.commit(commit(iid, token=1, now=1, state=state))
        with pytest.raises(InstanceFinished) as refused:
            await stores.waits.signal(iid, "go", "{}", key="k", now=at(2))
        assert (refused.value.instance_id, refused.value.state) == (iid, state.value)
        assert list(await stores.waits.signals(iid, "go")) == []
        got = await stores.journal.get(iid)
        assert (got.state, got.updated_at) == (state, at(1))

    async def test_signals_racing_to_a_wait_that_happens_once_keep_exactly_one(
        self, stores: Any
    ) -> None:
        """R2.10: eight keyless signals sent at once to a wait that happens once (``limit=1``)
        leave one kept (it wakes the instance) and seven ``duplicate``: the inbox count and
        the insert are one decision. They are released together so that, on a server, they
        are in flight on their own connections at the same time."""
        iid = await _make(stores)
        await stores.waits.suspend(_suspend(iid, signal="go"))
        # A pool grows on demand: eight reads at once leave it with connections to spare.
        await asyncio.gather(*(stores.journal.get(iid) for _ in range(8)))
        start = asyncio.Barrier(8)

        async def send(n: int) -> Any:
            await start.wait()  # all eight leave together
            return await stores.waits.signal(
                iid, "go", f'{{"n":{n}}}', key=None, now=at(6 + n), limit=1
            )

        receipts = await asyncio.gather(*(send(n) for n in range(8)))
        taken = [r for r in receipts if r.status != "duplicate"]
        assert [r.status for r in taken] == ["woken"], [r.status for r in receipts]
        assert sorted(r.status for r in receipts).count("duplicate") == 7
        [kept] = await stores.waits.signals(iid, "go")
        assert kept.seq == taken[0].seq
        assert {r.seq for r in receipts} == {kept.seq}  # each duplicate names the one kept
        assert (await stores.journal.get(iid)).state is InstanceState.PENDING

    async def test_a_limit_counts_every_signal_of_the_name_kept_so_far(self, stores: Any) -> None:
        """R2.10: with two waits that happen once, two signals are kept (taken or not), and
        a third — keyless or with a new key — is a ``duplicate`` naming the latest; a
        repeated key still names its own first copy. Other names are not counted."""
        iid = await _make(stores)
        one = await stores.waits.signal(iid, "go", '{"n":1}', key="a", now=at(1), limit=2)
        await stores.waits.signal(iid, "other", "{}", key=None, now=at(2), limit=1)
        two = await stores.waits.signal(iid, "go", '{"n":2}', key=None, now=at(3), limit=2)
        assert (one.status, two.status) == ("kept", "kept")
        for key in (None, "new"):
            full = await stores.waits.signal(iid, "go", '{"n":3}', key=key, now=at(4), limit=2)
            assert (full.status, full.seq, full.state) == (
                "duplicate",
                two.seq,
                InstanceState.RUNNING,
            )
        again = await stores.waits.signal(iid, "go", '{"n":1}', key="a", now=at(5), limit=2)
        assert (again.status, again.seq) == ("duplicate", one.seq)
        rows = await stores.waits.signals(iid, "go")
        assert [(r.seq, r.payload) for r in rows] == [(one.seq, '{"n":1}'), (two.seq, '{"n":2}')]
        # No limit (a wait inside a for_each) keeps them all.
        more = await stores.waits.signal(iid, "go", '{"n":4}', key=None, now=at(6))
        assert more.status == "kept"

    @pytest.mark.parametrize("limit", [None, 1])
    async def test_a_redelivered_key_is_a_duplicate_even_after_the_instance_ended(
        self, stores: Any, limit: int | None
    ) -> None:
        """R2.10: a webhook that retries a delivery after the instance ended gets a success
        (``duplicate``, the first copy's seq); a new key or no key is still refused."""
        iid = await _make(stores)
        await stores.waits.suspend(_suspend(iid, signal="go"))
        first = await stores.waits.signal(iid, "go", '{"n":1}', key="hook-1", now=at(6))
        assert first.status == "woken"
        await stores.journal.commit(commit(iid, token=1, now=7, state=InstanceState.COMPLETED))
        again = await stores.waits.signal(
            iid, "go", '{"n":1}', key="hook-1", now=at(8), limit=limit
        )
        assert (again.status, again.seq, again.state) == (
            "duplicate",
            first.seq,
            InstanceState.COMPLETED,
        )
        for key in ("hook-2", None):
            with pytest.raises(InstanceFinished) as refused:
                await stores.waits.signal(iid, "go", '{"n":2}', key=key, now=at(9), limit=limit)
            assert refused.value.state == "Completed"
        assert [r.seq for r in await stores.waits.signals(iid, "go")] == [first.seq]
        got = await stores.journal.get(iid)
        assert (got.state, got.updated_at) == (InstanceState.COMPLETED, at(7))

    async def test_the_inbox_is_in_arrival_order_and_byte_for_byte(self, stores: Any) -> None:
        a = await _make(stores)
        b = await _make(stores)
        odd = ['{"b":1, "a":2}', ' [1,  2.50 ,"x"] ', '{"z":1,"z":2}']
        r1 = await stores.waits.signal(a, "s", odd[0], key="one", now=at(1))
        rb = await stores.waits.signal(b, "s", "{}", key=None, now=at(2))
        r2 = await stores.waits.signal(a, "s", odd[1], key=None, now=at(3))
        await stores.waits.signal(a, "t", "{}", key=None, now=at(4))
        r3 = await stores.waits.signal(a, "s", odd[2], key="three", now=at(5))
        assert r1.seq < r2.seq < r3.seq
        # One order of arrival across instances, on one server: a sharded journal's shards
        # each number their own (README "Sharding the journal": no order across shards).
        if same_shard(stores, a, b):
            assert r1.seq < rb.seq < r2.seq
        rows = await stores.waits.signals(a, "s")
        assert [(r.instance_id, r.name, r.seq, r.key, r.payload, r.received_at) for r in rows] == [
            (a, "s", r1.seq, "one", odd[0], at(1)),
            (a, "s", r2.seq, None, odd[1], at(3)),
            (a, "s", r3.seq, "three", odd[2], at(5)),
        ]
        assert [r.seq for r in await stores.waits.signals(b, "s")] == [rb.seq]

    async def test_no_wake_up_is_lost_between_a_suspend_and_a_signal(self, stores: Any) -> None:
        """Whichever runs first, the instance either does not seal (the signal was there) or
        is woken by it: it never stays Suspended with its signal in the inbox."""
        for n in range(12):
            iid = await _make(stores)
            sealed, receipt = await asyncio.gather(
                stores.waits.suspend(_suspend(iid, signal="go")),
                stores.waits.signal(iid, "go", f'{{"n":{n}}}', key=None, now=at(6)),
            )
            got = await stores.journal.get(iid)
            if sealed:
                assert receipt.status == "woken"
                assert got.state is InstanceState.PENDING
            else:
                assert receipt.status == "kept"
                assert got.state is InstanceState.RUNNING
