"""The publisher loop: drain the outbox to a broker, at-least-once, in per-key order.

Each round claims one batch (``batch_size``, default 500), hands it to the broker in claim
order, and marks the acknowledged prefix published when the claim ends (R5.2). A transient
failure leaves the rest pending and backs off; a permanent refusal counts an attempt against
the event and, at ``dead_after`` attempts, moves it aside as a dead letter so it no longer
holds its key (R5.5). Several loops, in one process or many, may drain one outbox at once:
the store's claim keeps each key in order (R5.3).

An idle loop polls with back-off up to ``poll_interval``; ``wake()`` (called by whoever just
staged events) cuts the wait short.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass

from flowx.clock import Clock, SystemClock
from flowx.outbox.publisher import EventPublisher, PublishFailure
from flowx.stores.protocols import OutboxStore, StagedWakeups
from flowx.tracing import annotate, span

log = logging.getLogger("flowx.outbox")


@dataclass(frozen=True, slots=True)
class Round:
    """What one claim-publish-mark round did."""

    claimed: int
    published: int
    failure: PublishFailure | None = None
    dead_lettered: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class RelayPolicy:
    """When the relay gives an event up, and how it paces itself between rounds.

    A broker that refuses an event ``dead_after`` times makes it a dead letter (R5.5); a
    transient failure backs off from ``retry_backoff`` doubling up to ``max_backoff``; an idle
    loop polls with back-off up to ``poll_interval`` seconds.
    """

    dead_after: int = 5
    poll_interval: float = 1.0
    retry_backoff: float = 0.5
    max_backoff: float = 10.0

    def __post_init__(self) -> None:
        if self.dead_after < 1:
            raise ValueError(f"dead_after must be at least 1, got {self.dead_after}")
        if self.poll_interval <= 0 or self.retry_backoff <= 0 or self.max_backoff <= 0:
            raise ValueError("poll_interval, retry_backoff and max_backoff must be positive")


class OutboxPublisher:
    """Relay the outbox to a broker: claim staged events, publish them in order per
    partition key, mark them sent; retries with back-off and dead-letters an event a broker
    refuses ``dead_after`` times, so events committed with a step reach the world (R2.14)."""

    def __init__(
        self,
        outbox: OutboxStore,
        publisher: EventPublisher,
        *,
        batch_size: int = 500,
        policy: RelayPolicy | None = None,
        clock: Clock | None = None,
        owner: str | None = None,
        dead_letters_hold_keys: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self._outbox = outbox
        self.publisher = publisher
        self.batch_size = batch_size
        policy = policy or RelayPolicy()
        self.dead_after = policy.dead_after
        self.poll_interval = policy.poll_interval
        self.retry_backoff = policy.retry_backoff
        self.max_backoff = policy.max_backoff
        #: R5.5 "unless configured to": a dead letter keeps its key waiting until resent.
        self.dead_letters_hold_keys = dead_letters_hold_keys
        self._clock = clock or SystemClock()
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{publisher.name}"
        self._wake = asyncio.Event()
        self.published = 0
        self.dead_lettered = 0
        self.failures = 0

    def wake(self) -> None:
        """Events were staged: stop waiting and claim now."""
        self._wake.set()

    async def publish_once(self) -> Round:
        """One round: claim, publish, mark — one transaction where the store has them."""
        now = self._clock.now()
        async with self._outbox.claim(
            limit=self.batch_size,
            now=now,
            owner=self.owner,
            dead_letters_hold_keys=self.dead_letters_hold_keys,
        ) as claim:
            events = claim.events
            if not events:
                return Round(0, 0)
            with span(
                "flowx.publish", {"broker": self.publisher.name, "events": len(events)}
            ) as sent:
                result = await self.publisher.publish(events)
                annotate(sent, acknowledged=result.acknowledged)
            acknowledged = max(0, min(result.acknowledged, len(events)))
            claim.published(acknowledged)
            failure = result.failure if acknowledged < len(events) else None
            dead = 0
            if acknowledged < len(events) and failure is None:
                failure = PublishFailure("the broker acknowledged only part of the batch", False)
            if failure is not None and failure.permanent:
                event = events[acknowledged]
                dead = int(event.attempts + 1 >= self.dead_after)
                claim.refused(event.event_id, reason=failure.reason, dead=bool(dead))
                if dead:
                    log.error(
                        "outbox: event %s (%s, key %r) is a dead letter after %d attempts: %s",
                        event.event_id,
                        event.type,
                        event.partition_key,
                        event.attempts + 1,
                        failure.reason,
                        extra={
                            "instance": event.instance_id,
                            "event": event.event_id,
                            "event_type": event.type,
                            "outcome": "dead_letter",
                        },
                    )
        self.published += acknowledged
        self.dead_lettered += dead
        return Round(len(events), acknowledged, failure, dead)

    async def drain(self, *, max_rounds: int = 1_000_000) -> int:
        """Publish until a round claims nothing or fails; the number published."""
        total = 0
        for _ in range(max_rounds):
            r = await self.publish_once()
            total += r.published
            if r.claimed == 0 or (r.failure is not None and not r.dead_lettered):
                break
        return total

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Publish until ``stop`` is set (or the task is cancelled)."""
        stop = stop or asyncio.Event()
        idle = 0.005
        backoff = self.retry_backoff
        while not stop.is_set():
            try:
                r = await self.publish_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                # Nothing was marked (the claim rolled back); say so and try again later.
                self.failures += 1
                log.exception("outbox: a publish round failed; retrying in %.1f s", backoff)
                await self._pause(stop, backoff)
                backoff = min(backoff * 2, self.max_backoff)
                continue
            if r.failure is not None and not r.dead_lettered:
                self.failures += 1
                log.warning(
                    "outbox: %s did not take the batch (%s); %d of %d published, retrying in "
                    "%.1f s",
                    self.publisher.name,
                    r.failure.reason,
                    r.published,
                    r.claimed,
                    backoff,
                )
                await self._pause(stop, backoff)
                backoff = min(backoff * 2, self.max_backoff)
                continue
            backoff = self.retry_backoff
            if r.claimed >= self.batch_size or r.dead_lettered:
                idle = 0.005
                continue
            if r.claimed:
                # A short batch: the rest may be held by another publisher's claim.
                idle = 0.005
                await self._pause(stop, idle)
                continue
            await self._pause(stop, idle)
            idle = min(idle * 2, self.poll_interval)
        # Stopping: one more pass, so what was staged just before the stop goes out now.
        try:
            await self.drain(max_rounds=20)
        except Exception:
            log.exception("outbox: the last round before stopping failed; events stay pending")

    async def _pause(self, stop: asyncio.Event, seconds: float) -> None:
        if self._wake.is_set():
            self._wake.clear()
            return
        waits: list[asyncio.Future[bool]] = [
            asyncio.ensure_future(self._wake.wait()),
            asyncio.ensure_future(stop.wait()),
        ]
        if isinstance(self._outbox, StagedWakeups):
            waits.append(asyncio.ensure_future(self._outbox.wait_staged(seconds)))
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        self._wake.clear()
