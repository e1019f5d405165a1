"""The recovery loop outlives a bug in one sweep: an unexpected exception is logged with its
traceback and the next pass runs, rather than the loop dying while the node looks ready."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import pytest

import flowx
from flowx.hosting.recovery import RecoveryService
from flowx.testing import FakeClock


class FlakyIndex:
    """A recovery index whose first queued read raises a plain bug, then works."""

    def __init__(self) -> None:
        self.queued_reads = 0
        self.read_once = asyncio.Event()
        self.read_again = asyncio.Event()

    async def find_abandoned(self, **kw: Any) -> list[Any]:
        return []

    async def find_queued(self, *, limit: int, offset: int = 0) -> list[Any]:
        self.queued_reads += 1
        if self.queued_reads == 1:
            self.read_once.set()
            raise KeyError("a bug in a sweep")
        self.read_again.set()
        return []


async def test_a_bug_in_a_pass_is_logged_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    index = FlakyIndex()
    settings = flowx.HostSettings.load(recovery_scan_interval="10m")

    async def resume(candidate: Any, queued: bool) -> Any:
        return "resumed"

    service = RecoveryService(
        index=index,  # type: ignore[arg-type]
        settings=settings,
        clock=FakeClock(),
        in_flight=lambda: 0,
        resume=resume,
        rng=random.Random(3),
    )
    stop = asyncio.Event()
    with caplog.at_level(logging.ERROR, logger="flowx.recovery"):
        loop = asyncio.create_task(service.run_forever(stop))
        await asyncio.wait_for(index.read_once.wait(), timeout=30)  # the first pass raises
        await asyncio.sleep(0)  # and is logged
        service.poke()  # another process made work: the loop, still alive, looks again
        await asyncio.wait_for(index.read_again.wait(), timeout=30)
        stop.set()
        await asyncio.wait_for(loop, timeout=30)
    assert any(r.exc_info for r in caplog.records), caplog.text
