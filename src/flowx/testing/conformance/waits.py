"""``WaitStore`` conformance: suspend, the timer's due list, a child waking its parent, and
replay (R2.11, R6.3); signals (R2.10) are ``SignalConformance``, which this suite inherits."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowx.stores.errors import FencedOut, UnknownInstance
from flowx.stores.records import CHILD_WAIT, InstanceState, Outcome, StepCommit, StopRequest
from flowx.testing.conformance._support import (
    at,
    commit,
    each_shard_in_order,
    new_id,
    sharded,
    step,
)
from flowx.testing.conformance._support import make_instance as _make
from flowx.testing.conformance._support import suspend_commit as _suspend
from flowx.testing.conformance.signals import SignalConformance


def _child_ends(iid: str, *, token: int = 1, now: float, **fields: Any) -> StepCommit:
    """The commit that ends ``iid`` Completed and wakes its parent if it waits for it."""
    return commit(
        iid, token=token, now=now, state=InstanceState.COMPLETED, notify_parent=True, **fields
    )


class WaitStoreConformance(SignalConformance):
    """Subclass it where a ``stores`` fixture (class or module level) yields an opened,
    empty ``Stores``."""

    # ------------------------------------------------------------------ suspend

    async def test_a_new_instance_waits_for_nothing(self, stores: Any) -> None:
        got = await stores.journal.get(await _make(stores))
        assert (got.wake_at, got.wake_step_id, got.wake_scope, got.wake_signal) == (
            None,
            None,
            None,
            None,
        )
        assert (got.replay_sequence, got.resume_from_step) == (None, None)

    async def test_suspend_seals_the_instance_at_its_wait(self, stores: Any) -> None:
        iid = await _make(stores)
        await stores.journal.commit(commit(iid, token=1, now=1, step=step(1)))
        sealed = await stores.waits.suspend(
            _suspend(
                iid,
                step_id=2,
                scope="3/1",
                wake_at=60,
                signal="approval",
                state_bag='{"b":1, "a":2}',
            )
        )
        assert sealed is True
        got = await stores.journal.get(iid)
        assert got.state is InstanceState.SUSPENDED
        assert got.wake_at == at(60)
        assert (got.wake_step_id, got.wake_scope, got.wake_signal) == (2, "3/1", "approval")
        assert got.state_bag == '{"b":1, "a":2}'
        assert got.updated_at == at(5)
        # No step row and no sequence: a wait is a property of the instance.
        assert got.next_sequence == 2
        assert [r.step_id for r in await stores.journal.steps(iid)] == [1]

    async def test_suspend_without_a_state_bag_keeps_the_last_one(self, stores: Any) -> None:
        iid = await _make(stores, state_bag='{"kept": true}')
        assert await stores.waits.suspend(_suspend(iid, wake_at=30)) is True
        got = await stores.journal.get(iid)
        assert got.state_bag == '{"kept": true}'
        assert got.wake_signal is None and got.wake_at == at(30)

    async def test_suspend_under_a_stale_token_is_refused_and_writes_nothing(
        self, stores: Any
    ) -> None:
        iid = await _make(stores, token=5)
        with pytest.raises(FencedOut) as refused:
            await stores.waits.suspend(
                _suspend(iid, token=4, wake_at=60, signal="go", state_bag='{"z":1}')
            )
        assert (refused.value.token, refused.value.fence) == (4, 5)
        got = await stores.journal.get(iid)
        assert got.state is InstanceState.RUNNING
        assert (got.wake_at, got.wake_step_id, got.wake_scope, got.wake_signal) == (
            None,
            None,
            None,
            None,
        )
        assert got.state_bag == "{}"
        assert got.updated_at == at(0)

    async def test_suspend_of_an_unknown_instance_is_refused(self, stores: Any) -> None:
        with pytest.raises(UnknownInstance):
            await stores.waits.suspend(_suspend(new_id(), signal="go"))

    async def test_suspend_does_not_seal_while_an_unconsumed_signal_waits(
        self, stores: Any
    ) -> None:
        iid = await _make(stores)
        first = await stores.waits.signal(iid, "approval", '{"ok":1}', key=None, now=at(1))
        assert first.status == "kept"
        sealed = await stores.waits.suspend(
            _suspend(iid, wake_at=60, signal="approval", state_bag='{"x":1}')
        )
        assert sealed is False
        got = await stores.journal.get(iid)
        assert got.state is InstanceState.RUNNING
        assert (got.wake_at, got.wake_signal, got.state_bag) == (None, None, "{}")
        assert got.updated_at == at(0)
        # Once that signal is consumed, the next wait for the same name seals.
        assert (
            await stores.waits.suspend(
                _suspend(iid, wake_at=60, signal="approval", consumed=(first.seq,))
            )
            is True
        )
        got = await stores.journal.get(iid)
        assert (got.state, got.wake_signal) == (InstanceState.SUSPENDED, "approval")

    async def test_only_a_signal_of_the_awaited_name_stops_the_seal(self, stores: Any) -> None:
        iid = await _make(stores)
        await stores.waits.signal(iid, "other", "{}", key=None, now=at(1))
        assert await stores.waits.suspend(_suspend(iid, signal="approval")) is True
        assert (await stores.journal.get(iid)).state is InstanceState.SUSPENDED

    async def test_suspend_does_not_seal_when_the_child_has_already_ended(
        self, stores: Any
    ) -> None:
        parent = await _make(stores)
        ended = await _make(stores, parent_instance_id=parent, parent_step_id=4, parent_scope="")
        await stores.journal.commit(commit(ended, token=1, now=2, state=InstanceState.FAILED))
        sealed = await stores.waits.suspend(
            _suspend(parent, step_id=4, signal=CHILD_WAIT, child=ended)
        )
        assert sealed is False
        assert (await stores.journal.get(parent)).state is InstanceState.RUNNING
        running = await _make(stores, parent_instance_id=parent, parent_step_id=4, parent_scope="")
        sealed = await stores.waits.suspend(
            _suspend(parent, step_id=4, signal=CHILD_WAIT, child=running)
        )
        assert sealed is True
        got = await stores.journal.get(parent)
        assert (got.state, got.wake_signal, got.wake_step_id) == (
            InstanceState.SUSPENDED,
            CHILD_WAIT,
            4,
        )

    # ------------------------------------------------------------------ timers

    async def test_suspends_at_once_each_get_their_own_outcome(self, stores: Any) -> None:
        """Suspends that arrive together (group-committed on PostgreSQL) are each sealed, or
        not, or refused, exactly as alone: a signal already in the inbox stops only its own
        seal unless consumed, a stale token only its own, an unknown instance only its own."""
        sealing = [await _make(stores) for _ in range(12)]
        signalled = await _make(stores)
        kept = await stores.waits.signal(signalled, "go", "{}", key=None, now=at(1))
        consumed = await _make(stores)
        taken = await stores.waits.signal(consumed, "go", "{}", key=None, now=at(1))
        stale = await _make(stores, token=3)
        missing = new_id()
        commits = [
            *(_suspend(i, signal="go", state_bag=f'{{"n":{n}}}') for n, i in enumerate(sealing)),
            _suspend(signalled, signal="go"),
            _suspend(consumed, signal="go", consumed=(taken.seq,)),
            _suspend(stale, token=2, signal="go"),
            _suspend(missing, signal="go"),
        ]
        outcomes = await asyncio.gather(
            *(stores.waits.suspend(c) for c in commits), return_exceptions=True
        )
        assert outcomes[:12] == [True] * 12
        assert outcomes[12:14] == [False, True]
        assert isinstance(outcomes[14], FencedOut) and isinstance(outcomes[15], UnknownInstance)
        for n, iid in enumerate(sealing):
            got = await stores.journal.get(iid)
            assert (got.state, got.wake_signal, got.state_bag) == (
                InstanceState.SUSPENDED,
                "go",
                f'{{"n":{n}}}',
            )
        assert (await stores.journal.get(signalled)).state is InstanceState.RUNNING
        assert (await stores.journal.get(consumed)).state is InstanceState.SUSPENDED
        assert (await stores.journal.get(stale)).state is InstanceState.RUNNING
        assert kept.status == "kept"

    async def test_find_due_returns_due_suspended_instances_earliest_first(
        self, stores: Any
    ) -> None:
        late = await _make(stores)
        await stores.waits.suspend(_suspend(late, wake_at=30))
        early = await _make(stores)
        await stores.waits.suspend(_suspend(early, wake_at=10))
        exactly_now = await _make(stores)
        await stores.waits.suspend(_suspend(exactly_now, wake_at=40, signal="go"))
        not_yet = await _make(stores)
        await stores.waits.suspend(_suspend(not_yet, wake_at=41))
        no_timer = await _make(stores)
        await stores.waits.suspend(_suspend(no_timer, signal="go"))
        woken = await _make(stores)
        await stores.waits.suspend(_suspend(woken, wake_at=5, signal="go"))
        await stores.waits.signal(woken, "go", "{}", key=None, now=at(6))  # Pending now
        await _make(stores)  # running, never waited

        due = await stores.waits.find_due(now=at(40), limit=10)
        page = await stores.waits.find_due(now=at(40), limit=2)
        expected = [early, late, exactly_now]
        if sharded(stores):
            # README "Sharding the journal": due timers are each shard's earliest first,
            # interleaved across shards (all of them due); so each shard's, in order.
            got = [c.instance_id for c in due]
            assert sorted(got) == sorted(expected)
            assert each_shard_in_order(stores, got, expected)
            paged = [c.instance_id for c in page]
            assert len(paged) == 2 and each_shard_in_order(stores, paged, expected)
        else:
            assert [c.instance_id for c in due] == expected
            assert [c.instance_id for c in page] == [early, late]
        assert all(c.state is InstanceState.SUSPENDED for c in due)
        assert all(c.flow_id == "conformance.flow" and c.flow_version == "1.0.0" for c in due)
        assert next(c for c in due if c.instance_id == early).updated_at == at(5)
        assert list(await stores.waits.find_due(now=at(9), limit=10)) == []

    async def test_next_wake_is_the_earliest_timer_of_a_suspended_instance(
        self, stores: Any
    ) -> None:
        assert await stores.waits.next_wake() is None
        no_timer = await _make(stores)
        await stores.waits.suspend(_suspend(no_timer, signal="go"))
        assert await stores.waits.next_wake() is None
        later = await _make(stores)
        await stores.waits.suspend(_suspend(later, wake_at=90))
        sooner = await _make(stores)
        await stores.waits.suspend(_suspend(sooner, wake_at=20, signal="go"))
        assert await stores.waits.next_wake() == at(20)
        await stores.waits.signal(sooner, "go", "{}", key=None, now=at(7))  # no longer waits
        assert await stores.waits.next_wake() == at(90)

    async def test_open_runs_a_suspended_instance(self, stores: Any) -> None:
        iid = await _make(stores)
        await stores.waits.suspend(_suspend(iid, step_id=2, scope="1", wake_at=30))
        history = await stores.journal.open(iid, token=2, now=at(31))
        assert history.instance.state is InstanceState.RUNNING
        assert history.instance.fence == 2
        assert (history.instance.wake_at, history.instance.wake_step_id) == (at(30), 2)
        got = await stores.journal.get(iid)
        assert got.state is InstanceState.RUNNING
        assert list(await stores.waits.find_due(now=at(60), limit=10)) == []

    # ------------------------------------------------------------------ sub-flows

    async def test_a_childs_end_wakes_only_the_parent_waiting_for_it(self, stores: Any) -> None:
        parent = await _make(stores)
        await stores.waits.suspend(_suspend(parent, step_id=4, scope="2", signal=CHILD_WAIT))
        child = await _make(stores, parent_instance_id=parent, parent_step_id=4, parent_scope="2")
        # Another parent, waiting on a child at another step: its child's end at step 4 is
        # not what it waits for.
        elsewhere = await _make(stores)
        await stores.waits.suspend(_suspend(elsewhere, step_id=5, scope="2", signal=CHILD_WAIT))
        stray = await _make(
            stores, parent_instance_id=elsewhere, parent_step_id=4, parent_scope="2"
        )
        # A parent in another scope, and one waiting for a signal at the same step.
        other_scope = await _make(stores)
        await stores.waits.suspend(_suspend(other_scope, step_id=4, scope="3", signal=CHILD_WAIT))
        stray_scope = await _make(
            stores, parent_instance_id=other_scope, parent_step_id=4, parent_scope="2"
        )
        on_signal = await _make(stores)
        await stores.waits.suspend(_suspend(on_signal, step_id=4, scope="2", signal="go"))
        stray_signal = await _make(
            stores, parent_instance_id=on_signal, parent_step_id=4, parent_scope="2"
        )

        seq = await stores.journal.commit(_child_ends(child, now=20, step=step(1)))
        assert seq == 1
        got = await stores.journal.get(parent)
        assert (got.state, got.updated_at) == (InstanceState.PENDING, at(20))
        assert (await stores.journal.get(child)).state is InstanceState.COMPLETED
        for iid in (stray, stray_scope, stray_signal):
            await stores.journal.commit(_child_ends(iid, now=21))
        for waiting in (elsewhere, other_scope, on_signal):
            got = await stores.journal.get(waiting)
            assert (got.state, got.updated_at) == (InstanceState.SUSPENDED, at(5))

    async def test_a_commit_that_does_not_notify_leaves_the_parent_waiting(
        self, stores: Any
    ) -> None:
        parent = await _make(stores)
        await stores.waits.suspend(_suspend(parent, step_id=4, signal=CHILD_WAIT))
        child = await _make(stores, parent_instance_id=parent, parent_step_id=4, parent_scope="")
        await stores.journal.commit(commit(child, token=1, now=20, state=InstanceState.COMPLETED))
        assert (await stores.journal.get(parent)).state is InstanceState.SUSPENDED

    async def test_a_refused_notifying_commit_wakes_nobody(self, stores: Any) -> None:
        parent = await _make(stores)
        await stores.waits.suspend(_suspend(parent, step_id=4, signal=CHILD_WAIT))
        child = await _make(
            stores, token=3, parent_instance_id=parent, parent_step_id=4, parent_scope=""
        )
        with pytest.raises(FencedOut):
            await stores.journal.commit(_child_ends(child, token=2, now=20, step=step(1)))
        assert (await stores.journal.get(parent)).state is InstanceState.SUSPENDED
        assert (await stores.journal.get(child)).state is InstanceState.RUNNING

    async def test_notify_parent_without_a_parent_is_a_plain_commit(self, stores: Any) -> None:
        iid = await _make(stores)
        seq = await stores.journal.commit(
            _child_ends(iid, now=3, step=step(1), state_bag='{"done":1}')
        )
        assert seq == 1
        got = await stores.journal.get(iid)
        assert (got.state, got.state_bag, got.next_sequence) == (
            InstanceState.COMPLETED,
            '{"done":1}',
            2,
        )

    async def test_no_wake_up_is_lost_between_a_parent_suspend_and_its_childs_end(
        self, stores: Any
    ) -> None:
        for _ in range(12):
            parent = await _make(stores)
            child = await _make(
                stores, parent_instance_id=parent, parent_step_id=1, parent_scope=""
            )
            sealed, _seq = await asyncio.gather(
                stores.waits.suspend(_suspend(parent, step_id=1, signal=CHILD_WAIT, child=child)),
                stores.journal.commit(_child_ends(child, now=6, step=step(1))),
            )
            got = await stores.journal.get(parent)
            expected = InstanceState.PENDING if sealed else InstanceState.RUNNING
            assert got.state is expected

    # ------------------------------------------------------------------ replay

    async def test_rearm_reopens_a_finished_instance_for_a_replay(self, stores: Any) -> None:
        iid = await _make(stores)
        j = stores.journal
        await j.commit(commit(iid, token=1, now=1, step=step(1)))
        await j.commit(
            commit(
                iid,
                token=1,
                now=2,
                step=step(2, outcome=Outcome.FAILURE, result='{"e":1}'),
            )
        )
        await j.commit(
            commit(
                iid,
                token=1,
                now=3,
                state=InstanceState.COMPENSATION_FAILED,
                error='{"why": "x"}',
            )
        )
        opened = await j.open(iid, token=2, now=at(4))
        assert opened.instance.resume_count == 1
        record = await stores.waits.rearm(iid, token=2, now=at(9), from_step=2)
        assert record.state is InstanceState.PENDING
        assert record.resume_count == 0  # an operator stepped in: takeovers counted afresh
        assert record.replay_sequence == 3  # the next_sequence it had
        assert record.next_sequence == 3
        assert record.resume_from_step == 2
        assert record.error == '{"why": "x"}'
        assert record.updated_at == at(9)
        assert await j.get(iid) == record
        # The history is not rewritten.
        rows = await j.steps(iid)
        assert [(r.step_id, r.outcome) for r in rows] == [
            (1, Outcome.SUCCESS),
            (2, Outcome.FAILURE),
        ]

    async def test_a_rearm_to_re_run_from_a_step_clears_the_stop_and_sets_the_deadline(
        self, stores: Any
    ) -> None:
        iid = await _make(stores)
        request = StopRequest(mode="cancel", reason="asked", by="ann", at=at(2))
        await stores.stops.request_stop(iid, request)
        await stores.journal.commit(
            commit(iid, token=1, now=3, state=InstanceState.CANCELLED, error='{"why": "x"}')
        )
        await stores.journal.open(iid, token=2, now=at(4))
        kept = await stores.waits.rearm(iid, token=2, now=at(5), from_step=1)
        assert (kept.replay_from, kept.deadline_at) == (None, None)
        assert kept.stop_request is not None  # any other replay keeps it
        record = await stores.waits.rearm(
            iid, token=2, now=at(9), from_step=2, rerun_from=2, deadline=at(100)
        )
        assert (record.state, record.replay_from, record.resume_from_step) == (
            InstanceState.PENDING,
            2,
            2,
        )
        assert (record.stop_request, record.deadline_at) == (None, at(100))
        assert await stores.journal.get(iid) == record
        again = await stores.waits.rearm(iid, token=2, now=at(10), from_step=1)
        assert (again.replay_from, again.deadline_at) == (None, at(100))  # kept when not given

    async def test_rearm_is_fenced(self, stores: Any) -> None:
        iid = await _make(stores, token=4)
        await stores.journal.commit(commit(iid, token=4, now=1, state=InstanceState.FAILED))
        with pytest.raises(FencedOut):
            await stores.waits.rearm(iid, token=3, now=at(9), from_step=1)
        got = await stores.journal.get(iid)
        assert (got.state, got.replay_sequence, got.resume_from_step, got.updated_at) == (
            InstanceState.FAILED,
            None,
            None,
            at(1),
        )
        with pytest.raises(UnknownInstance):
            await stores.waits.rearm(new_id(), token=1, now=at(9), from_step=1)
