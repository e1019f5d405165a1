"""What every backend's outbox claim shares: the outcome a publisher reports, kept until the
claim ends and then written in one go.

The backends differ in how they hold a claim (PostgreSQL: row locks in an open transaction;
SQLite: a stamp on the rows; memory: a set), not in what a publisher may report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from flowx.stores.records import EventRecord


@dataclass(frozen=True, slots=True)
class Refusal:
    event_id: str
    reason: str
    dead: bool


@dataclass(slots=True)
class ClaimOutcome:
    """A claim's events and what the publisher reported about them."""

    events: Sequence[EventRecord]
    acknowledged: int = 0
    refusals: list[Refusal] = field(default_factory=list)

    def published(self, count: int) -> None:
        if not 0 <= count <= len(self.events):
            raise ValueError(
                f"published({count}) is outside this claim of {len(self.events)} events"
            )
        self.acknowledged = max(self.acknowledged, count)

    def refused(self, event_id: str, *, reason: str, dead: bool) -> None:
        if all(e.event_id != event_id for e in self.events):
            raise ValueError(f"event {event_id} is not in this claim")
        self.refusals.append(Refusal(event_id, reason[:2000], dead))

    @property
    def published_ids(self) -> list[str]:
        return [e.event_id for e in self.events[: self.acknowledged]]
