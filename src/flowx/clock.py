"""Time as a parameter: everything time-dependent asks a ``Clock``, so tests can move it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    """**Protocol:** wall-clock time for leases, scans and ``ctx.now()``.

    ``sleep`` is part of the clock so that a fake clock can make a back-off pass instantly.
    """

    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""
        ...

    def store_time(self) -> datetime | None:
        """The time stores stamp leases, recovery and ``updated_at`` with: ``None`` asks
        each store for its own clock (R9.2), so a node whose clock is off neither takes
        live work nor starves; a test clock returns its own time so stores follow it."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def store_time(self) -> datetime | None:
        return None


def utc(moment: datetime) -> datetime:
    """Refuse naive datetimes: a naive time is a bug waiting for a server in another zone."""
    if moment.tzinfo is None:
        raise ValueError("naive datetime: pass a timezone-aware UTC datetime")
    return moment.astimezone(UTC)


def or_process_now(now: datetime | None) -> datetime:
    """``now``, or this process's clock: the store's own clock for stores that live in the
    node's process or on its machine (memory, SQLite), where ``now=None`` asks for it."""
    return now if now is not None else datetime.now(UTC)
