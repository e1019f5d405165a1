"""The recovery scan: finds instances a dead node left behind and resumes them here (R3.4).

``run_once()`` does one sweep and returns what it did, so tests drive single iterations; the
loop around it sleeps the scan interval with jitter. A sweep asks for at most as many
candidates as this node has free recovery slots — so no second page is taken until earlier
recoveries finish — and walks the page from a random offset, wrapping round to the head, so
nodes that scan at the same moment do not all fight over the same oldest rows.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from flowx.clock import Clock
from flowx.errors import FlowXError
from flowx.hosting.settings import HostSettings
from flowx.stores.protocols import RecoveryIndex
from flowx.stores.records import RecoveryCandidate

log = logging.getLogger("flowx.recovery")

ResumeVerdict = Literal["resumed", "lost_race", "not_runnable", "gone"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RecoveryScanResult:
    """What one sweep found and did."""

    found: int = 0
    resumed: int = 0
    #: Another node's lease was live, or it won the acquisition: a skip, not an error.
    lost_race: int = 0
    #: Pinned to a flow version this node does not carry; left for a node that does (R7.3).
    not_runnable: int = 0
    #: No free recovery slot, so no page was asked for.
    skipped_busy: bool = False


class RecoveryService:
    """One node's half of crash recovery."""

    def __init__(
        self,
        *,
        index: RecoveryIndex,
        settings: HostSettings,
        clock: Clock,
        in_flight: Callable[[], int],
        resume: Callable[[RecoveryCandidate], Awaitable[ResumeVerdict]],
        rng: random.Random | None = None,
    ) -> None:
        self._index = index
        self._settings = settings
        self._clock = clock
        self._in_flight = in_flight
        self._resume = resume
        self._rng = rng or random.Random()

    async def run_once(self) -> RecoveryScanResult:
        free = self._settings.max_concurrent_recoveries - self._in_flight()
        if free <= 0:
            return RecoveryScanResult(skipped_busy=True)
        limit = min(free, self._settings.recovery_scan_batch_size)
        now = self._clock.now()
        idle = self._settings.lease_ttl
        offset = self._rng.randrange(limit)
        page = list(
            await self._index.find_abandoned(now=now, idle_for=idle, limit=limit, offset=offset)
        )
        if offset and len(page) < limit:
            # Wrap round: the rows before the offset are candidates too.
            head = await self._index.find_abandoned(
                now=now, idle_for=idle, limit=min(offset, limit - len(page)), offset=0
            )
            seen = {c.instance_id for c in page}
            page.extend(c for c in head if c.instance_id not in seen)
        if len(page) < limit:
            # Queued instances (started for any worker) need no TTL to pass.
            seen = {c.instance_id for c in page}
            queued = await self._index.find_queued(limit=limit - len(page))
            page.extend(c for c in queued if c.instance_id not in seen)
        counts = {"resumed": 0, "lost_race": 0, "not_runnable": 0, "gone": 0}
        for candidate in page:
            counts[await self._resume(candidate)] += 1
        return RecoveryScanResult(
            found=len(page),
            resumed=counts["resumed"],
            lost_race=counts["lost_race"] + counts["gone"],
            not_runnable=counts["not_runnable"],
        )

    def next_delay(self) -> float:
        base = self._settings.recovery_scan_interval.total_seconds()
        jitter = self._settings.recovery_scan_jitter
        return base * self._rng.uniform(1 - jitter, 1 + jitter)

    async def run_forever(self, stop: asyncio.Event) -> None:
        # Start at a random point of the first interval, not in step with the rest of a fleet.
        delay = self._rng.uniform(0, self.next_delay())
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
                return
            except TimeoutError:
                pass
            try:
                result = await self.run_once()
                if result.found:
                    log.info("recovery scan: %s", result)
            except FlowXError as exc:
                log.warning("recovery scan failed (%s); next scan as scheduled", exc)
            delay = self.next_delay()
