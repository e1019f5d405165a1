"""The broker seam: one small protocol every broker adapter implements (R5.4).

A publisher is handed a batch in claim order and reports the prefix the broker acknowledged,
and, if it stopped short, why: a *transient* failure (broker down, queue full, timeout) leaves
the rest pending to go out again in order; a *permanent* refusal (too large, unroutable, wrong
type) counts against the event's retry policy and ends as a dead letter (R5.5).

On the wire every adapter sends the payload bytes exactly as staged, and the same headers:
``event_id`` (deduplicate on it: delivery is at-least-once), ``type``, ``schema_version``,
``partition_key``, ``instance_id`` and ``sequence``/``ordinal`` (the instance's commit order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from flowx.stores.records import EventRecord


@dataclass(frozen=True, slots=True)
class PublishFailure:
    """Why the broker did not acknowledge ``events[acknowledged]``."""

    reason: str
    permanent: bool


@dataclass(frozen=True, slots=True)
class PublishResult:
    """What a publisher reports instead of raising: how many events, in order, the broker
    acknowledged, and why it stopped there, so the relay marks exactly those as sent."""

    acknowledged: int
    failure: PublishFailure | None = None

    @classmethod
    def all(cls, events: Sequence[EventRecord]) -> PublishResult:
        """Every event of ``events`` acknowledged: what a publisher returns on full success."""
        return cls(len(events))


@runtime_checkable
class EventPublisher(Protocol):
    """**Protocol:** deliver events to one broker, in the order given."""

    @property
    def name(self) -> str:
        """A short name for logs and metrics (``redis-streams``, ``rabbitmq``)."""
        ...

    async def open(self) -> None:
        """Connect to the broker before the first ``publish``; a relay calls it once."""
        ...

    async def close(self) -> None:
        """Let go of the broker connection when the relay stops."""
        ...

    async def publish(self, events: Sequence[EventRecord]) -> PublishResult:
        """Send ``events`` in order; never raise for a broker failure, report it."""
        ...


def headers(event: EventRecord) -> dict[str, str]:
    """The headers every adapter sends with an event."""
    out = {
        "event_id": event.event_id,
        "type": event.type,
        "schema_version": event.schema_version,
        "instance_id": event.instance_id,
        "sequence": str(event.sequence),
        "ordinal": str(event.ordinal),
    }
    if event.partition_key is not None:
        out["partition_key"] = event.partition_key
    if event.trace_context is not None:
        # W3C trace context: the consumer's span continues the instance's trace.
        out["traceparent"] = event.trace_context
    return out
