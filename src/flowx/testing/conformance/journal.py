"""``FlowJournal`` conformance: append-only, atomic, fenced, ordered (R2.2–R2.4, R2.8)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flowx.stores.errors import DuplicateStep, FencedOut, UnknownInstance
from flowx.stores.protocols import StoreClock
from flowx.stores.records import InstanceState, Outcome
from flowx.testing.conformance._support import (
    at,
    commit,
    event,
    instance,
    make_instance,
    new_id,
    same_shard,
    step,
)


class JournalConformance:
    """Subclass it where a ``stores`` fixture (class or module level) yields an opened,
    empty ``Stores``."""

    async def test_create_keeps_payloads_byte_for_byte(self, stores: Any) -> None:
        odd = '{"z": 1,  "a":[1,2.50,  "x"], "z": 2}'
        created = await stores.journal.create(
            instance(input=odd, state_bag='{"b":1, "a":2}'), token=3, now=at(0)
        )
        assert created.created
        got = await stores.journal.get(created.instance.instance_id)
        assert got.input == odd
        assert got.state_bag == '{"b":1, "a":2}'
        assert got.fence == 3
        assert got.next_sequence == 1
        assert got.state is InstanceState.RUNNING
        assert got.created_at == at(0)
        assert got.updated_at == at(0)

    async def test_without_a_pinned_time_create_stamps_the_store_clock(self, stores: Any) -> None:
        """R9.2: ``now=None`` stamps ``created_at``/``updated_at`` with the journal's clock,
        which is what the recovery scan's idle filter compares with."""
        created = await stores.journal.create(instance(), token=1, now=None)
        got = await stores.journal.get(created.instance.instance_id)
        clock: object = stores
        if isinstance(clock, StoreClock):
            reference = (await clock.store_clock())[0][1]  # the journal's clock is first
        else:
            reference = datetime.now(UTC)  # stores in this process share its clock
        assert got.created_at == got.updated_at
        assert abs(got.updated_at - reference) < timedelta(seconds=5)

    async def test_a_repeated_idempotency_key_returns_the_first_instance(self, stores: Any) -> None:
        first = await stores.journal.create(
            instance(idempotency_key="order-42"), token=1, now=at(0)
        )
        again = await stores.journal.create(
            instance(idempotency_key="order-42", input='{"other":true}'), token=9, now=at(5)
        )
        assert not again.created
        assert again.instance.instance_id == first.instance.instance_id
        stored = await stores.journal.get(first.instance.instance_id)
        assert stored.fence == 1
        assert stored.input == first.instance.input
        found = await stores.journal.find_by_key("conformance.flow", "order-42")
        assert found.instance_id == first.instance.instance_id
        assert await stores.journal.find_by_key("another.flow", "order-42") is None

    async def test_a_repeated_instance_id_writes_nothing(self, stores: Any) -> None:
        iid = new_id()
        await stores.journal.create(instance(iid, input='{"a":1}'), token=1, now=at(0))
        again = await stores.journal.create(instance(iid, input='{"a":2}'), token=2, now=at(1))
        assert not again.created
        assert (await stores.journal.get(iid)).input == '{"a":1}'

    async def test_commits_allocate_sequences_in_commit_order(self, stores: Any) -> None:
        iid = await make_instance(stores)
        seqs = []
        for sid in (3, 1, 2):  # commit order, not step order
            seqs.append(await stores.journal.commit(commit(iid, token=1, now=sid, step=step(sid))))
        assert seqs == [1, 2, 3]
        rows = await stores.journal.steps(iid)
        assert [(r.step_id, r.sequence) for r in rows] == [(3, 1), (1, 2), (2, 3)]
        assert (await stores.journal.get(iid)).next_sequence == 4

    async def test_an_instance_keeps_the_trace_it_was_started_in(self, stores: Any) -> None:
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        traced = await stores.journal.create(instance(trace_context=parent), token=1, now=at(0))
        untraced = await stores.journal.create(instance(), token=1, now=at(0))
        assert traced.instance.trace_context == parent
        assert (await stores.journal.get(traced.instance.instance_id)).trace_context == parent
        assert (await stores.journal.get(untraced.instance.instance_id)).trace_context is None

    async def test_a_step_row_keeps_the_node_that_wrote_it(self, stores: Any) -> None:
        """The step timeline names the node of each attempt, alone or grouped with others
        (a store that batches concurrent commits writes it in both paths)."""
        j = stores.journal
        iid, other = await make_instance(stores), await make_instance(stores)
        await j.commit(commit(iid, token=1, now=1, step=replace(step(1), node_id="node-a")))
        await asyncio.gather(
            j.commit(commit(iid, token=1, now=2, step=replace(step(2), node_id="node-b"))),
            j.commit(commit(other, token=1, now=2, step=replace(step(1), node_id="node-c"))),
            j.commit(commit(other, token=1, now=3, step=step(2))),
        )
        assert [r.node_id for r in await j.steps(iid)] == ["node-a", "node-b"]
        assert sorted((r.step_id, r.node_id) for r in await j.steps(other)) == [
            (1, "node-c"),
            (2, None),
        ]

    async def test_a_stale_token_is_refused_and_writes_nothing(self, stores: Any) -> None:
        iid = await make_instance(stores, token=5)
        with pytest.raises(FencedOut) as refused:
            await stores.journal.commit(
                commit(
                    iid,
                    token=4,
                    now=1,
                    step=step(1),
                    state_bag='{"x":1}',
                    state=InstanceState.COMPLETED,
                    events=(event(),),
                )
            )
        assert refused.value.token == 4
        assert refused.value.fence == 5
        after = await stores.journal.get(iid)
        assert after.state_bag == "{}"
        assert after.state is InstanceState.RUNNING
        assert after.next_sequence == 1
        assert after.updated_at == at(0)
        assert list(await stores.journal.steps(iid)) == []
        assert list(await stores.journal.events(iid)) == []

    async def test_the_fence_rises_on_open_before_any_write(self, stores: Any) -> None:
        iid = await make_instance(stores)
        await stores.journal.commit(commit(iid, token=1, now=1, step=step(1)))
        history = await stores.journal.open(iid, token=2, now=at(2))
        assert history.instance.fence == 2
        with pytest.raises(FencedOut):  # the old owner is a zombie from this moment on
            await stores.journal.commit(commit(iid, token=1, now=3, step=step(2)))
        assert await stores.journal.commit(commit(iid, token=2, now=3, step=step(2))) == 2

    async def test_open_with_a_token_below_the_fence_is_refused(self, stores: Any) -> None:
        iid = await make_instance(stores, token=7)
        with pytest.raises(FencedOut):
            await stores.journal.open(iid, token=6, now=at(1))
        assert (await stores.journal.get(iid)).fence == 7

    async def test_unknown_instances_are_refused(self, stores: Any) -> None:
        with pytest.raises(UnknownInstance):
            await stores.journal.open(new_id(), token=1, now=at(0))
        with pytest.raises(UnknownInstance):
            await stores.journal.commit(commit(new_id(), token=1, now=0, step=step(1)))
        assert await stores.journal.get(new_id()) is None

    async def test_a_duplicate_step_raises_and_writes_nothing(self, stores: Any) -> None:
        iid = await make_instance(stores)
        await stores.journal.commit(commit(iid, token=1, now=1, step=step(1), state_bag='{"v":1}'))
        with pytest.raises(DuplicateStep) as dup:
            await stores.journal.commit(
                commit(
                    iid,
                    token=1,
                    now=2,
                    step=step(1, result='"other"'),
                    state_bag='{"v":2}',
                    events=(event(),),
                )
            )
        assert (dup.value.step_id, dup.value.attempt) == (1, 1)
        after = await stores.journal.get(iid)
        assert after.state_bag == '{"v":1}'
        assert after.next_sequence == 2
        rows = await stores.journal.steps(iid)
        assert [r.result for r in rows] == ['"ok"']
        assert list(await stores.journal.events(iid)) == []

    async def test_the_same_step_in_another_scope_or_attempt_is_not_a_duplicate(
        self, stores: Any
    ) -> None:
        iid = await make_instance(stores)
        for write in (
            step(4, scope="0"),
            step(4, scope="1"),
            step(4, scope="1", attempt=2),
            step(4, scope="1/0"),
        ):
            await stores.journal.commit(commit(iid, token=1, now=1, step=write))
        rows = await stores.journal.steps(iid)
        assert [(r.scope, r.attempt) for r in rows] == [("0", 1), ("1", 1), ("1", 2), ("1/0", 1)]

    async def test_the_frontier_of_a_partial_history(self, stores: Any) -> None:
        iid = await make_instance(stores)
        j = stores.journal
        await j.commit(commit(iid, token=1, now=1, step=step(1), state_bag='{"s":1}'))
        await j.commit(
            commit(
                iid,
                token=1,
                now=2,
                step=step(2, outcome=Outcome.FAILURE, result='{"e":1}'),
            )
        )
        await j.commit(commit(iid, token=1, now=3, step=step(2, 2)))
        history = await j.open(iid, token=2, now=at(10))
        assert [(r.step_id, r.attempt, r.outcome, r.sequence) for r in history.steps] == [
            (1, 1, Outcome.SUCCESS, 1),
            (2, 1, Outcome.FAILURE, 2),
            (2, 2, Outcome.SUCCESS, 3),
        ]
        assert history.instance.state_bag == '{"s":1}'
        assert history.instance.state_bag_sequence == 1  # the snapshot is of commit 1
        row = history.steps[0]
        assert row.capability_id == "conformance.cap"
        assert row.capability_version == "1.0.0"
        assert row.duration_ms == 3
        assert row.committed_at == at(1)

    async def test_resume_count_counts_takeovers_since_the_last_commit(self, stores: Any) -> None:
        iid = await make_instance(stores)
        assert (await stores.journal.open(iid, token=2, now=at(1))).instance.resume_count == 1
        assert (await stores.journal.open(iid, token=3, now=at(2))).instance.resume_count == 2
        await stores.journal.commit(commit(iid, token=3, now=3, step=step(1)))
        assert (await stores.journal.get(iid)).resume_count == 0

    async def test_open_moves_a_pending_instance_to_running(self, stores: Any) -> None:
        created = await stores.journal.create(
            instance(state=InstanceState.PENDING), token=1, now=at(0)
        )
        assert created.instance.state is InstanceState.PENDING
        history = await stores.journal.open(created.instance.instance_id, token=2, now=at(1))
        assert history.instance.state is InstanceState.RUNNING

    async def test_a_transition_without_a_step_consumes_no_sequence(self, stores: Any) -> None:
        iid = await make_instance(stores)
        seq = await stores.journal.commit(
            commit(
                iid,
                token=1,
                now=4,
                state=InstanceState.FAILED,
                error='{"m":"x"}',
                state_bag='{"end":true}',
            )
        )
        assert seq is None
        after = await stores.journal.get(iid)
        assert after.state is InstanceState.FAILED
        assert after.error == '{"m":"x"}'
        assert after.state_bag == '{"end":true}'
        assert after.next_sequence == 1
        assert after.updated_at == at(4)

    async def test_events_are_staged_with_their_step_in_order(self, stores: Any) -> None:
        a = await make_instance(stores)
        b = await make_instance(stores)
        first, second, third = event("k1"), event("k2"), event(None)
        await stores.journal.commit(commit(a, token=1, now=1, step=step(1), events=(first, second)))
        await stores.journal.commit(commit(b, token=1, now=2, step=step(1), events=(third,)))
        ea = await stores.journal.events(a)
        eb = await stores.journal.events(b)
        assert [(e.event_id, e.sequence, e.ordinal) for e in ea] == [
            (first.event_id, 1, 0),
            (second.event_id, 1, 1),
        ]
        assert ea[0].payload == first.payload
        assert ea[1].partition_key == "k2"
        assert eb[0].partition_key is None
        assert ea[0].staged_seq < ea[1].staged_seq
        # Across instances only on one server: a sharded journal's ``staged_seq`` is each
        # shard's own sequence (README "Sharding the journal": no order across shards).
        if same_shard(stores, a, b):
            assert ea[1].staged_seq < eb[0].staged_seq
        assert all(e.published_at is None for e in (*ea, *eb))

    async def test_concurrent_commits_succeed_or_fail_one_by_one(self, stores: Any) -> None:
        """A store that groups commits (one transaction for many) must keep each atomic."""
        j = stores.journal
        good = await make_instance(stores)
        fenced = await make_instance(stores, token=5)
        dup = await make_instance(stores)
        await j.commit(commit(dup, token=1, now=1, step=step(1)))
        results = await asyncio.gather(
            j.commit(
                commit(
                    good,
                    token=1,
                    now=2,
                    step=step(1),
                    state_bag='{"g":1}',
                    events=(event(),),
                )
            ),
            j.commit(
                commit(
                    fenced,
                    token=4,
                    now=2,
                    step=step(1),
                    state_bag='{"f":1}',
                    events=(event(),),
                )
            ),
            j.commit(commit(dup, token=1, now=2, step=step(1), state_bag='{"d":1}')),
            j.commit(commit(good, token=1, now=3, step=step(2))),
            return_exceptions=True,
        )
        assert results[0] == 1 and results[3] == 2
        assert isinstance(results[1], FencedOut)
        assert isinstance(results[2], DuplicateStep)
        assert (await j.get(good)).state_bag == '{"g":1}'
        assert len(await j.events(good)) == 1
        assert (await j.get(fenced)).state_bag == "{}"
        assert list(await j.steps(fenced)) == [] and list(await j.events(fenced)) == []
        assert (await j.get(dup)).state_bag == "{}"
        assert len(await j.steps(dup)) == 1
