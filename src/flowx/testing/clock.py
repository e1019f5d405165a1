"""A clock tests move by hand."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta


class FakeClock:
    """``Clock`` whose time moves only when told; ``sleep`` advances it and yields once, so a
    retry back-off of five minutes passes instantly."""

    def __init__(self, start: datetime | None = None, *, monotonic_start: float = 0.0) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        #: Moves with ``_now``: what ``time.monotonic()`` reads in code under test.
        self._monotonic = monotonic_start
        self.slept: list[float] = []

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        """Seconds on a clock that only moves forward, with ``advance`` and ``sleep``: stands
        in for ``time.monotonic()`` (and an event loop's ``time()``), so a lease's liveness
        and renewal rounds run on test time, and a 30 s TTL passes instantly."""
        return self._monotonic

    def store_time(self) -> datetime:
        """Stores follow this clock too, so a test moves lease expiry and recovery with it."""
        return self._now

    def advance(self, delta: timedelta | None = None, **kwargs: float) -> datetime:
        """Move time on: ``advance(days=2)`` or ``advance(timedelta(seconds=5))``."""
        step = delta if delta is not None else timedelta(**kwargs)
        self._now += step
        self._monotonic += max(step.total_seconds(), 0.0)  # wall time may step back; this not
        return self._now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self._now += timedelta(seconds=seconds)
        self._monotonic += max(seconds, 0.0)
        await asyncio.sleep(0)
