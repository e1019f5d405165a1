"""The publisher suite (R5.4), run against every broker adapter on a real server.

A test module provides one fixture, ``broker``, yielding a ``BrokerHarness``: the publisher
under test and the few broker-specific moves the suite needs (read back what arrived, make the
broker take only the first part of a batch, point a publisher at nothing).
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from flowx.outbox.publisher import EventPublisher
from flowx.stores.records import EventRecord


@dataclass(frozen=True, slots=True)
class Received:
    """One message as a consumer of the broker read it."""

    event_id: str
    partition_key: str | None
    type: str
    payload: str
    headers: dict[str, str]


class BrokerHarness(Protocol):
    publisher: EventPublisher

    async def received(self) -> list[Received]:
        """Everything that arrived, in the order a consumer reads it (per key for brokers
        with a stream per key: a key's messages are in order, keys in any order)."""
        ...

    async def take_only_first(self, events: Sequence[EventRecord], count: int) -> None:
        """Arrange for the broker to acknowledge only ``events[:count]`` of the next batch."""
        ...

    async def restore(self) -> None:
        """Undo ``take_only_first``."""
        ...

    def unreachable(self) -> EventPublisher:
        """A publisher of the same kind pointed at an address where nothing listens."""
        ...


def events(keys: Sequence[str | None], *, instance_id: str | None = None) -> list[EventRecord]:
    iid = instance_id or str(uuid.uuid4())
    now = datetime.now(UTC)
    return [
        EventRecord(
            event_id=str(uuid.uuid4()),
            instance_id=iid,
            sequence=n,
            ordinal=0,
            staged_seq=n,
            type="conformance.happened",
            schema_version="2",
            partition_key=k,
            payload='{"n":' + str(n) + ', "note":"kept byte for byte \\u00e9"}',
            published_at=None,
            staged_at=now,
        )
        for n, k in enumerate(keys, start=1)
    ]


def first_deliveries_by_key(got: Sequence[Received]) -> dict[str | None, list[str]]:
    seen: set[str] = set()
    per_key: dict[str | None, list[str]] = defaultdict(list)
    for r in got:
        if r.event_id not in seen:
            seen.add(r.event_id)
            per_key[r.partition_key].append(r.event_id)
    return per_key


def expected_by_key(sent: Sequence[EventRecord]) -> dict[str | None, list[str]]:
    per_key: dict[str | None, list[str]] = defaultdict(list)
    for e in sent:
        per_key[e.partition_key].append(e.event_id)
    return per_key


class PublisherConformance:
    async def test_a_batch_arrives_whole_in_order_byte_for_byte(self, broker: Any) -> None:
        sent = events(["a", "b", "a", None, "c", "a", "b", None] * 5)
        result = await broker.publisher.publish(sent)
        assert (result.acknowledged, result.failure) == (len(sent), None)
        got = await broker.received()
        assert len(got) == len(sent)
        assert dict(first_deliveries_by_key(got)) == dict(expected_by_key(sent))
        by_id = {e.event_id: e for e in sent}
        for r in got:
            e = by_id[r.event_id]
            assert r.payload == e.payload
            assert r.type == e.type
            assert r.headers["schema_version"] == "2"
            assert r.headers["instance_id"] == e.instance_id
            assert r.headers["sequence"] == str(e.sequence)

    async def test_an_empty_batch_is_acknowledged_and_sends_nothing(self, broker: Any) -> None:
        result = await broker.publisher.publish([])
        assert (result.acknowledged, result.failure) == (0, None)
        assert await broker.received() == []

    async def test_a_batch_taken_in_part_reports_the_prefix_and_the_suffix_goes_again_in_order(
        self, broker: Any
    ) -> None:
        sent = events(["a", "b", "a", "b", "c", "a", "d", "b", "a"])
        await broker.take_only_first(sent, 4)
        result = await broker.publisher.publish(sent)
        await broker.restore()
        assert result.acknowledged == 4
        assert result.failure is not None and result.failure.reason
        again = await broker.publisher.publish(sent[4:])
        assert (again.acknowledged, again.failure) == (len(sent) - 4, None)
        got = await broker.received()
        assert {r.event_id for r in got} == {e.event_id for e in sent}
        assert dict(first_deliveries_by_key(got)) == dict(expected_by_key(sent))

    async def test_a_republished_batch_is_a_duplicate_not_a_loss(self, broker: Any) -> None:
        sent = events(["a", "b", "a"])
        await broker.publisher.publish(sent)
        await broker.publisher.publish(sent)
        got = await broker.received()
        assert {r.event_id for r in got} == {e.event_id for e in sent}
        assert dict(first_deliveries_by_key(got)) == dict(expected_by_key(sent))

    async def test_an_unreachable_broker_is_a_transient_failure_not_a_hang(
        self, broker: Any
    ) -> None:
        publisher = broker.unreachable()
        started = time.monotonic()
        try:
            result = await publisher.publish(events(["a", "b"]))
        finally:
            await publisher.close()
        assert result.acknowledged == 0
        assert result.failure is not None and result.failure.permanent is False
        assert time.monotonic() - started < 30, "the publisher hung on a dead broker"
