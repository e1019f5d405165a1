"""A clock tests move by hand."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta


class FakeClock:
    """``Clock`` whose time moves only when told; ``sleep`` advances it and yields once, so a
    retry back-off of five minutes passes instantly."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self.slept: list[float] = []

    def now(self) -> datetime:
        return self._now

    def store_time(self) -> datetime:
        """Stores follow this clock too, so a test moves lease expiry and recovery with it."""
        return self._now

    def advance(self, delta: timedelta | None = None, **kwargs: float) -> datetime:
        """Move time on: ``advance(days=2)`` or ``advance(timedelta(seconds=5))``."""
        self._now += delta if delta is not None else timedelta(**kwargs)
        return self._now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self._now += timedelta(seconds=seconds)
        await asyncio.sleep(0)
