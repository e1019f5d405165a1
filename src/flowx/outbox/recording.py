"""A publisher that keeps what it is sent, for engine and host tests. It can be told to accept
only part of a batch, to refuse an event, or to be down, so the publisher loop's handling of
each outcome is tested without a broker."""

from __future__ import annotations

from collections.abc import Sequence

from flowx.outbox.publisher import PublishFailure, PublishResult
from flowx.stores.records import EventRecord


class RecordingPublisher:
    """An in-memory publisher for tests: keeps what it is given and can be told to fail
    (``down``, ``accept_at_most``, ``refuse``) to exercise a relay's retries."""

    def __init__(self, name: str = "recording") -> None:
        self._name = name
        self.received: list[EventRecord] = []
        self.calls = 0
        #: Accept at most this many events per call, then fail transiently (None: no limit).
        self.accept_at_most: int | None = None
        #: Event ids refused permanently, with the reason.
        self.refuse: dict[str, str] = {}
        self.down = False

    @property
    def name(self) -> str:
        return self._name

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def publish(self, events: Sequence[EventRecord]) -> PublishResult:
        self.calls += 1
        if self.down:
            return PublishResult(0, PublishFailure("broker is down", permanent=False))
        for i, event in enumerate(events):
            if self.accept_at_most is not None and i >= self.accept_at_most:
                return PublishResult(i, PublishFailure("broker accepted part", permanent=False))
            if event.event_id in self.refuse:
                return PublishResult(i, PublishFailure(self.refuse[event.event_id], True))
            self.received.append(event)
        return PublishResult(len(events))
