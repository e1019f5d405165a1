"""The outbox store suite (R5.2, R5.3, R5.5): claim order, the sibling hold between two
concurrent claims, the acknowledged prefix, refusals and dead letters."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest

from flowx.stores.records import ChangeBatch, EventWrite
from flowx.testing.conformance._support import (
    at,
    commit,
    event,
    make_instance,
    one_shard,
    sharded,
    step,
)


async def stage(
    stores: Any, keys: list[str | None], *, per_commit: int = 1, **fields: Any
) -> list[EventWrite]:
    """One instance (``fields`` as for ``instance``) that commits ``keys`` as events,
    ``per_commit`` to a step, in order."""
    iid = await make_instance(stores, **fields)
    staged: list[EventWrite] = []
    for n, first in enumerate(range(0, len(keys), per_commit), start=1):
        events = tuple(
            event(k, payload=f'{{"n":{first + i}}}')
            for i, k in enumerate(keys[first : first + per_commit])
        )
        await stores.journal.commit(commit(iid, token=1, now=n, step=step(n), events=events))
        staged.extend(events)
    return staged


def ids(events: Any) -> list[str]:
    return [e.event_id for e in events]


async def read_at_least(
    stores: Any, consumer: str, count: int, *, limit: int = 500, timeout: float = 10.0
) -> ChangeBatch:
    """Read ``consumer``'s feed until a batch holds ``count`` events; bounded.

    A feed may hold committed events back for a while, never skip them (R2.14): PostgreSQL
    reads below the oldest transaction that can still stage there, and one that ends just as
    a read looks holds that read back. A test asserts what the feed shows once it has caught
    up, so what else runs on the server cannot fail it."""
    deadline = time.monotonic() + timeout
    while True:
        batch: ChangeBatch = await stores.changes.read(consumer, limit=limit)
        if len(batch.events) >= count:
            return batch
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"the feed of {consumer!r} showed {len(batch.events)} of {count} committed "
                f"events after {timeout} s: something holds it back"
            )
        await asyncio.sleep(0.02)


class OutboxConformance:
    async def test_a_claim_takes_pending_events_in_staging_order(self, stores: Any) -> None:
        staged = await stage(stores, ["a", "b", None, "a", "c"], per_commit=2)
        async with stores.outbox.claim(limit=10, now=at(100), owner="p1") as claim:
            got = claim.events
            assert ids(got) == ids(staged)
            assert [e.payload for e in got] == [e.payload for e in staged]
            assert [e.staged_seq for e in got] == sorted(e.staged_seq for e in got)
            assert all(e.published_at is None and e.staged_at is not None for e in got)
        # Nothing reported: nothing marked, all still pending.
        assert await stores.outbox.pending_count() == 5

    async def test_the_acknowledged_prefix_is_marked_and_the_rest_goes_again_in_order(
        self, stores: Any
    ) -> None:
        staged = await stage(stores, ["a", "b", "a", "b", "a"])
        async with stores.outbox.claim(limit=10, now=at(100), owner="p1") as claim:
            claim.published(2)
        assert await stores.outbox.pending_count() == 3
        async with stores.outbox.claim(limit=10, now=at(101), owner="p1") as claim:
            assert ids(claim.events) == ids(staged[2:])
            claim.published(3)
        async with stores.outbox.claim(limit=10, now=at(102), owner="p1") as claim:
            assert claim.events == ()
        assert await stores.outbox.pending_count() == 0

    async def test_a_claim_that_raises_marks_nothing(self, stores: Any) -> None:
        await stage(stores, ["a", "b"])
        try:
            async with stores.outbox.claim(limit=10, now=at(100), owner="p1") as claim:
                claim.published(2)
                raise RuntimeError("the broker call blew up")
        except RuntimeError:
            pass
        assert await stores.outbox.pending_count() == 2

    async def test_a_key_held_by_another_claim_is_not_taken_out_of_order(self, stores: Any) -> None:
        """R5.3: the second publisher must not take ``a#2`` while the first holds ``a#1``."""
        # A sharded journal keeps a key's order only where its events are on one shard
        # (README "Sharding the journal": the outbox), so there both instances share one.
        staged = await stage(stores, ["a", "b"], **one_shard(stores))
        more = await stage(stores, ["a", "c", None], **one_shard(stores))
        async with stores.outbox.claim(limit=1, now=at(100), owner="p1") as first:
            assert ids(first.events) == [staged[0].event_id]  # a#1
            async with stores.outbox.claim(limit=10, now=at(100), owner="p2") as second:
                taken = ids(second.events)
                assert more[0].event_id not in taken  # a#2 held behind a#1
                assert taken == [staged[1].event_id, more[1].event_id, more[2].event_id]
                second.published(len(taken))
            first.published(1)
        async with stores.outbox.claim(limit=10, now=at(101), owner="p2") as third:
            assert ids(third.events) == [more[0].event_id]
            third.published(1)
        assert await stores.outbox.pending_count() == 0

    async def test_an_unacknowledged_event_holds_its_key_but_not_others(self, stores: Any) -> None:
        staged = await stage(stores, ["a", "a", "b"])
        async with stores.outbox.claim(limit=1, now=at(100), owner="p1"):
            pass  # a#1 claimed and released unpublished
        async with stores.outbox.claim(limit=10, now=at(101), owner="p1") as claim:
            assert ids(claim.events) == ids(staged)

    async def test_an_event_keeps_the_trace_it_was_emitted_in(self, stores: Any) -> None:
        iid = await make_instance(stores)
        traced = replace(
            event("k"), trace_context="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        )
        await stores.journal.commit(
            commit(iid, token=1, now=1, step=step(1), events=(traced, event("k")))
        )
        async with stores.outbox.claim(limit=10, now=at(100), owner="p1") as claim:
            assert [e.trace_context for e in claim.events] == [traced.trace_context, None]
        assert [e.trace_context for e in await stores.journal.events(iid)] == [
            traced.trace_context,
            None,
        ]

    async def test_the_backlog_counts_pending_and_dead_and_dates_the_oldest(
        self, stores: Any
    ) -> None:
        empty = await stores.outbox.backlog()
        assert (empty.pending, empty.oldest_staged_at, empty.dead) == (0, None, 0)
        staged = await stage(stores, ["a", "b", "c"])  # staged at at(1), at(2), at(3)
        got = await stores.outbox.backlog()
        assert (got.pending, got.oldest_staged_at, got.dead) == (3, at(1), 0)
        async with stores.outbox.claim(limit=10, now=at(100), owner="p1") as claim:
            claim.refused(staged[0].event_id, reason="refused for good", dead=True)
            claim.published(0)
        async with stores.outbox.claim(limit=10, now=at(101), owner="p1") as claim:
            assert ids(claim.events) == ids(staged[1:])
            claim.published(1)
        got = await stores.outbox.backlog()
        assert (got.pending, got.oldest_staged_at, got.dead) == (1, at(3), 1)

    async def test_a_refusal_counts_an_attempt_and_dead_letters_free_the_key(
        self, stores: Any
    ) -> None:
        staged = await stage(stores, ["a", "a", "b"])
        bad = staged[0].event_id
        async with stores.outbox.claim(limit=10, now=at(100), owner="p1") as claim:
            claim.refused(bad, reason="too large", dead=False)
        async with stores.outbox.claim(limit=10, now=at(101), owner="p1") as claim:
            assert claim.events[0].event_id == bad and claim.events[0].attempts == 1
            assert claim.events[0].last_error == "too large"
            claim.refused(bad, reason="too large, again", dead=True)
        dead = await stores.outbox.dead_letters()
        assert ids(dead) == [bad]
        assert dead[0].attempts == 2 and dead[0].dead_reason == "too large, again"
        assert dead[0].dead_at is not None
        assert await stores.outbox.pending_count() == 2
        # R5.5: a dead letter no longer holds its key.
        async with stores.outbox.claim(limit=10, now=at(102), owner="p1") as claim:
            assert ids(claim.events) == ids(staged[1:])
            claim.published(2)
        assert await stores.outbox.retry_dead_letter(bad) is True
        assert await stores.outbox.retry_dead_letter(bad) is False
        assert await stores.outbox.dead_letters() == ()
        async with stores.outbox.claim(limit=10, now=at(103), owner="p1") as claim:
            assert ids(claim.events) == [bad] and claim.events[0].attempts == 0
            claim.published(1)
        assert await stores.outbox.pending_count() == 0
        assert (
            await stores.outbox.retry_dead_letter("00000000-0000-0000-0000-000000000000") is False
        )

    async def test_a_dead_letter_can_be_made_to_hold_its_key(self, stores: Any) -> None:
        """R5.5's "unless configured to": the key waits until the dead letter is resent."""
        staged = await stage(stores, ["a", "a", "b"])
        async with stores.outbox.claim(limit=1, now=at(100), owner="p1") as claim:
            claim.refused(staged[0].event_id, reason="rejected", dead=True)
        async with stores.outbox.claim(
            limit=10, now=at(101), owner="p1", dead_letters_hold_keys=True
        ) as claim:
            assert ids(claim.events) == [staged[2].event_id]  # "a" waits, "b" goes
            claim.published(1)
        assert await stores.outbox.retry_dead_letter(staged[0].event_id)
        async with stores.outbox.claim(
            limit=10, now=at(102), owner="p1", dead_letters_hold_keys=True
        ) as claim:
            assert ids(claim.events) == ids(staged[:2])

    async def test_published_out_of_range_is_refused(self, stores: Any) -> None:
        await stage(stores, ["a"])
        async with stores.outbox.claim(limit=10, now=at(100), owner="p1") as claim:
            try:
                claim.published(2)
            except ValueError as exc:
                assert "outside this claim" in str(exc)
            else:
                raise AssertionError("published(2) on a claim of 1 was accepted")


class ChangeFeedConformance:
    """Change subscriptions (R2.14) and the purge they hold back (R2.13)."""

    async def test_an_undeclared_consumer_is_refused_by_name(self, stores: Any) -> None:
        from flowx.stores.errors import UnknownConsumer

        with pytest.raises(UnknownConsumer, match="billing"):
            await stores.changes.read("billing")
        with pytest.raises(UnknownConsumer, match="billing"):
            await stores.changes.commit("billing", (0, 1), now=at(0))

    async def test_a_subscription_reads_everything_in_order_at_least_once(
        self, stores: Any
    ) -> None:
        staged = await stage(stores, ["a", "b", None, "a", "c"], per_commit=2)
        assert await stores.changes.subscribe("billing", now=at(0)) is True
        first = await read_at_least(stores, "billing", 3, limit=3)
        assert ids(first.events) == ids(staged[:3])
        again = await read_at_least(stores, "billing", 3, limit=3)
        assert ids(again.events) == ids(staged[:3])  # not committed: read again
        await stores.changes.commit("billing", first.position, now=at(1))
        rest = await read_at_least(stores, "billing", 2)
        assert ids(rest.events) == ids(staged[3:])
        await stores.changes.commit("billing", rest.position, now=at(2))
        empty = await stores.changes.read("billing")
        assert empty.events == ()
        # A sharded feed's position names the shard read (README "Sharding the journal": the
        # change feed), and an empty read names whichever it asked first.
        assert sharded(stores) or empty.position == rest.position
        # Declaring it again keeps its cursor; a cursor never moves backwards.
        assert await stores.changes.subscribe("billing", now=at(3)) is False
        await stores.changes.commit("billing", first.position, now=at(4))
        assert (await stores.changes.read("billing")).events == ()
        later = await stage(stores, ["a"])
        assert ids((await read_at_least(stores, "billing", 1)).events) == ids(later)

    async def test_consumers_are_independent_and_can_start_from_now(self, stores: Any) -> None:
        # A sharded feed's read is one shard's batch (README "Sharding the journal": the
        # change feed), so there, to be read in one batch, the events share a shard.
        before = await stage(stores, ["a", "b"], **one_shard(stores))
        await stores.changes.subscribe("all", now=at(0))
        await stores.changes.subscribe("new", now=at(0), from_start=False)
        after = await stage(stores, ["c"], **one_shard(stores))
        assert ids((await read_at_least(stores, "all", 3)).events) == ids(before + after)
        assert ids((await read_at_least(stores, "new", 1)).events) == ids(after)
        assert await stores.changes.unsubscribe("new") is True
        assert await stores.changes.unsubscribe("new") is False

    async def test_the_purge_keeps_what_a_subscription_has_not_read(self, stores: Any) -> None:
        staged = await stage(stores, ["a", "b", "a", "b"])
        async with stores.outbox.claim(limit=10, now=at(10), owner="p") as claim:
            claim.published(3)  # the fourth stays pending
        await stores.changes.subscribe("audit", now=at(0))
        half = await read_at_least(stores, "audit", 2, limit=2)
        await stores.changes.commit("audit", half.position, now=at(11))
        purge = await stores.changes.purge_published(before=at(1000))
        assert (purge.deleted, purge.held_back) == (2, 1)
        await stores.changes.commit(
            "audit", (await read_at_least(stores, "audit", 2)).position, now=at(12)
        )
        purge = await stores.changes.purge_published(before=at(1000))
        assert (purge.deleted, purge.held_back) == (1, 0)
        # Never the pending one, and nothing newer than the window.
        assert await stores.outbox.pending_count() == 1
        remaining = (await stores.changes.read("audit")).events
        assert remaining == ()
        await stores.changes.unsubscribe("audit")
        nothing = await stores.changes.purge_published(before=at(5))
        assert (nothing.deleted, nothing.held_back) == (0, 0)
        assert staged  # the staged events were real rows
