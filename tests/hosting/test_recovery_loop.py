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
        self.abandoned_reads = 0
        self.read_once = asyncio.Event()
        self.read_again = asyncio.Event()

    async def find_abandoned(self, **kw: Any) -> list[Any]:
        self.abandoned_reads += 1
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


class Claims:
    """A claim that records the room it was given and answers as if it took ``take`` rows."""

    def __init__(self, free: list[int] | None = None) -> None:
        self.rooms: list[int] = []
        self.take = 0
        self.asked = asyncio.Event()
        self._free = free

    async def __call__(self, room: int) -> int:
        self.rooms.append(room)
        self.asked.set()
        taken = min(self.take, room)
        if self._free is not None:
            self._free[0] -= taken  # what it took now runs in those slots
        return taken


def _claiming(free: list[int], claims: Claims, prefetch: int) -> RecoveryService:
    async def resume(candidate: Any, queued: bool) -> Any:
        return "resumed"

    service = RecoveryService(
        index=FlakyIndex(),  # type: ignore[arg-type]
        settings=flowx.HostSettings.load(recovery_scan_interval="10m", queue_prefetch=prefetch),
        clock=FakeClock(),
        in_flight=lambda: 0,
        resume=resume,
        free_flow_slots=lambda: free[0],
        rng=random.Random(3),
    )
    service.claim = claims
    return service


async def test_a_claim_takes_the_free_slots_and_the_prefetch_and_no_more() -> None:
    """R6.4: a page sized to the free slots plus ``queue_prefetch``; none past that."""
    free, claims = [5], Claims()
    service = _claiming(free, claims, prefetch=3)
    await service.run_queued()
    free[0] = -3  # every slot busy and the prefetch waiting: nothing more is taken
    await service.run_queued()
    free[0] = -1  # two of those started as slots freed: two more are taken
    await service.run_queued()
    assert claims.rooms == [8, 2]  # the full node's pass claimed nothing at all
    plain = Claims()
    await _claiming([5], plain, prefetch=0).run_queued()
    assert plain.rooms == [5]


async def test_a_freed_slot_with_wakeups_waiting_claims_at_once() -> None:
    """A full node that was poked claims as soon as a slot frees with the queued pass alone,
    not with a whole sweep after a pause: no abandoned row is read."""
    free = [1]
    claims = Claims(free)
    claims.take = 1
    service = _claiming(free, claims, prefetch=0)
    index = service._index  # type: ignore[attr-defined]
    assert not service.claims_queued  # not running yet: a wake must not rely on it
    stop = asyncio.Event()
    loop = asyncio.create_task(service.run_forever(stop))
    try:
        # The first pass fills the one slot: the node is full.
        await asyncio.wait_for(claims.asked.wait(), timeout=30)
        assert service.claims_queued and claims.rooms == [1] and free == [0]
        claims.asked.clear()
        service.poke()  # work arrives while every slot is busy
        free[0] = 1
        service.slot_freed()
        await asyncio.wait_for(claims.asked.wait(), timeout=30)
        assert claims.rooms == [1, 1]
        assert index.abandoned_reads == 0
    finally:
        stop.set()
        await asyncio.wait_for(loop, timeout=30)
    assert not service.claims_queued


async def test_a_full_node_on_a_backlog_claims_again_as_slots_free_without_a_sweep() -> None:
    """R6.4: the last pass filled every slot, so work is likely still queued: as slots free
    the node claims the next page with the queued pass alone, with no wake-up and no whole
    sweep (no abandoned row is read), until a pass finds nothing more."""
    free = [2]
    claims = Claims(free)
    claims.take = 2
    service = _claiming(free, claims, prefetch=0)
    index = service._index  # type: ignore[attr-defined]
    stop = asyncio.Event()
    loop = asyncio.create_task(service.run_forever(stop))
    try:
        await asyncio.wait_for(claims.asked.wait(), timeout=30)
        assert claims.rooms == [2] and free == [0]  # full
        for _ in range(3):  # both runs end, one after the other, with no wake-up between
            claims.asked.clear()
            free[0] += 1
            service.slot_freed()
            free[0] += 1
            service.slot_freed()
            await asyncio.wait_for(claims.asked.wait(), timeout=30)
        claims.take = 0  # the queue is empty now
        claims.asked.clear()
        free[0] += 2
        service.slot_freed()
        await asyncio.wait_for(claims.asked.wait(), timeout=30)
        assert sum(claims.rooms) >= 8 and all(room >= 1 for room in claims.rooms)
        assert index.abandoned_reads == 0
    finally:
        stop.set()
        await asyncio.wait_for(loop, timeout=30)
