"""How far this node's clock is from the clocks its stores decide lease time with (R9.2).

Leases, the recovery scan and ``updated_at`` use the store's clock, so a skewed node neither
takes live work nor starves. What still reads the node's clock — ``ctx.now()``, sleep and
signal timeouts, deadlines — is only as right as the node's time, so a node further off than
the skew the design tolerates (a third of the lease TTL, SPEC §8) refuses to start; every
offset is logged and exported as ``flowx_clock_offset_seconds``.

The offset is ``store_time − local midpoint`` of one round trip: the error is at most half
the round trip, far below anything that matters here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from flowx.clock import Clock
from flowx.errors import FlowXError
from flowx.metrics import CLOCK_OFFSET
from flowx.stores.protocols import StoreClock, Stores

log = logging.getLogger("flowx.clock")


class ClockSkewError(FlowXError):
    """This node's clock is further from a store's than the tolerated skew. Not retryable:
    fix the node's time synchronisation."""

    code = "host.clock_skew"


@dataclass(frozen=True, kw_only=True, slots=True)
class ClockOffset:
    """One store clock, and how far ahead of this node's it is (negative: behind)."""

    store: str
    offset: timedelta

    def describe(self) -> str:
        seconds = self.offset.total_seconds()
        way = "behind" if seconds > 0 else "ahead of"
        return f"this node's clock is {abs(seconds):.3f}s {way} the clock of {self.store}"


async def measure(stores: Stores, clock: Clock) -> list[ClockOffset]:
    """Each store clock's offset to ``clock``; none for stores that share the node's."""
    if not isinstance(stores, StoreClock):
        return []
    before = clock.now()
    readings = await stores.store_clock()
    after = clock.now()
    midpoint = before + (after - before) / 2
    return [ClockOffset(store=what, offset=at - midpoint) for what, at in readings]


def check(offsets: list[ClockOffset], limit: timedelta) -> None:
    """Raise ``ClockSkewError`` for the first offset beyond ``limit``; export them all."""
    for o in offsets:
        CLOCK_OFFSET.set(o.store, o.offset.total_seconds())
        log.info("%s", o.describe())
    for o in offsets:
        if abs(o.offset) > limit:
            raise ClockSkewError(
                f"{o.describe()}; FlowX tolerates {limit.total_seconds():g}s (a third of "
                "lease_ttl, or max_clock_offset / FLOWX_MAX_CLOCK_OFFSET). Fix this "
                "machine's time synchronisation (NTP/chrony) and start it again"
            )


class ClockWatch:
    """Measures the offsets again every ``every``: a node that drifts past the limit after
    it started is reported (an ERROR line and the gauge), not stopped — its leases are safe,
    only the times its flows read are off."""

    def __init__(
        self,
        stores: Stores,
        clock: Clock,
        *,
        limit: timedelta,
        every: float,
        on_measured: Callable[[list[ClockOffset]], None] | None = None,
    ) -> None:
        self._stores = stores
        self._clock = clock
        self._limit = limit
        self._every = every
        self._on_measured = on_measured
        self.last: list[ClockOffset] = []

    async def run_once(self) -> list[ClockOffset]:
        self.last = await measure(self._stores, self._clock)
        if self._on_measured is not None:
            self._on_measured(self.last)
        try:
            check(self.last, self._limit)
        except ClockSkewError as exc:
            log.error("%s", exc)
        return self.last

    async def run_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._every):  # no extra task
                    await stop.wait()
            if stop.is_set():
                return
            try:
                await self.run_once()
            except FlowXError as exc:
                log.debug("clock offset not measured (%s)", exc)


class JournalClock:
    """This node's clock moved by its measured offset to the journal's.

    The recovery scan reads it to *schedule* its next sweep in the journal's time; which rows
    are due is still decided by the store on its own clock (``store_time`` passes through).
    """

    def __init__(self, base: Clock) -> None:
        self.base = base
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return self.base.now() + self.offset

    async def sleep(self, seconds: float) -> None:
        await self.base.sleep(seconds)

    def store_time(self) -> datetime | None:
        return self.base.store_time()

    def learn(self, offsets: list[ClockOffset]) -> None:
        """Take the journal's offset (the first clock a store reports is its journal's)."""
        if offsets:
            self.offset = offsets[0].offset
