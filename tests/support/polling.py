"""Bounded waiting, the one way a test polls (issue 13): every loop that waits for something
to become true has a deadline and, past it, fails saying what did not happen, instead of
hanging until pytest's 180 s timeout kills the run without a word.

Prefer waiting on a signal (an ``asyncio.Event``, a future) where the code offers one; poll
only across a boundary that offers none (another process, a store written by another task).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable


async def until(
    check: Callable[[], object],
    *,
    within: float,
    what: str,
    every: float = 0.05,
) -> float:
    """Poll ``check`` (a function, or a coroutine function) until what it returns is true;
    fail saying ``what`` did not happen within ``within`` seconds. Returns the seconds it
    took."""
    began = time.monotonic()
    while True:
        outcome = check()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return time.monotonic() - began
        if time.monotonic() - began > within:
            raise AssertionError(f"{what}: not within {within:g}s")
        await asyncio.sleep(every)


def until_sync(
    check: Callable[[], object], *, within: float, what: str, every: float = 0.02
) -> float:
    """``until`` for code with no event loop (a worker process's files, a server's port)."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > within:
            raise AssertionError(f"{what}: not within {within:g}s")
        time.sleep(every)
    return time.monotonic() - began
