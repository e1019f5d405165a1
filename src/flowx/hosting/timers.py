"""The timer service: every node wakes Suspended instances whose time has come (R2.11).

A wait is a row (``wake_at`` under a partial index over Suspended rows), never a task: a node
holds nothing for an instance that sleeps a week (R6.3). The service asks the index for what
is due, and for each one takes the instance's lease *first* and only then opens it — so two
nodes that see the same due row never both wake it: one gets the lease, the other skips
(R3.4's "losing the race is a skip"). A wake found late (the node was down at the time) still
happens, late; nothing is ever dropped because its moment passed.

Between sweeps it sleeps until the earliest known ``wake_at`` or ``timer_poll_interval``,
whichever is sooner. A wait sealed on this node pokes it, so a short sleep wakes on time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from flowx.clock import Clock
from flowx.errors import FlowXError
from flowx.hosting.recovery import ResumeVerdict
from flowx.hosting.settings import HostSettings
from flowx.stores.protocols import WaitStore
from flowx.stores.records import RecoveryCandidate

log = logging.getLogger("flowx.timers")

#: Due instances woken at once by one sweep (each takes a lease and opens the instance).
_PARALLEL_WAKES = 16
#: ``wake(candidate)``: take the lease, open the instance and run it here.
Wake = Callable[[RecoveryCandidate], Awaitable[ResumeVerdict]]


@dataclass(frozen=True, kw_only=True, slots=True)
class TimerSweep:
    """What one sweep of the timer service found and did."""

    due: int = 0
    woken: int = 0
    lost_race: int = 0
    not_runnable: int = 0
    #: No free flow slot: nothing was asked for.
    skipped_busy: bool = False
    #: The earliest wake still ahead, if the store knows one.
    next_wake: datetime | None = None


class TimerService:
    """One node's timer waker."""

    def __init__(
        self,
        *,
        waits: WaitStore,
        settings: HostSettings,
        clock: Clock,
        wake: Wake,
        free_flow_slots: Callable[[], int],
        carried: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        self._waits = waits
        self._settings = settings
        self._clock = clock
        self._wake = wake
        self._free = free_flow_slots
        self._carried = carried
        self._poked = asyncio.Event()
        # The last sweep left due work behind for want of a free flow slot: a slot freeing
        # up is then worth a sweep at once, rather than at the next poll.
        self._starved = False

    def slot_freed(self) -> None:
        """Called by the host whenever an instance stops running here."""
        if self._starved:
            self._starved = False
            self._poked.set()

    def poke(self) -> None:
        """A wait was sealed here, or a slot came free: sweep again now, which also learns
        the new earliest wake."""
        self._poked.set()

    async def run_once(self) -> TimerSweep:
        free = self._free()
        if free <= 0:
            self._starved = True
            return TimerSweep(skipped_busy=True)
        now = self._clock.now()
        limit = min(free, self._settings.timer_batch_size)
        flows = None if self._carried is None else self._carried()
        due = await self._waits.find_due(now=now, limit=limit, flows=flows)
        self._starved = len(due) >= limit
        counts = {"resumed": 0, "lost_race": 0, "not_runnable": 0, "gone": 0}
        # Each wake is a lease and an open, two round trips: taken one by one, a page of 100
        # due instances would wake the last of them a page of round trips late.
        gate = asyncio.Semaphore(_PARALLEL_WAKES)

        async def wake(candidate: RecoveryCandidate) -> ResumeVerdict:
            async with gate:
                try:
                    return await self._wake(candidate)
                except FlowXError as exc:
                    log.warning("timer: waking %s failed: %s", candidate.instance_id, exc)
                    return "lost_race"

        for verdict in await asyncio.gather(*(wake(c) for c in due)):
            counts[verdict] += 1
        upcoming = await self._waits.next_wake(flows=flows)
        return TimerSweep(
            due=len(due),
            woken=counts["resumed"],
            lost_race=counts["lost_race"],
            not_runnable=counts["not_runnable"],
            next_wake=upcoming,
        )

    async def run_forever(self, stop: asyncio.Event) -> None:
        poll = self._settings.timer_poll_interval.total_seconds()
        while not stop.is_set():
            self._poked.clear()
            delay = poll
            try:
                sweep = await self.run_once()
            except Exception as exc:  # a store outage: keep the loop, say so, try again
                log.warning("timer sweep failed (%s); retrying in %.1fs", exc, poll)
            else:
                # A due row it could not take (not carried here, or lost to a peer that is
                # about to run it) must not turn the loop hot: then it waits the full poll.
                stuck = sweep.due > 0 and sweep.woken == 0
                # And a wake in the past that the sweep did not return (taken meanwhile, or
                # not ours) must not either.
                stuck = stuck or (
                    sweep.next_wake is not None
                    and sweep.next_wake <= self._clock.now()
                    and sweep.due == 0
                )
                if sweep.next_wake is not None and not stuck:
                    ahead = (sweep.next_wake - self._clock.now()).total_seconds()
                    delay = min(poll, max(ahead, 0.0))
            stopped = asyncio.ensure_future(stop.wait())
            poked = asyncio.ensure_future(self._poked.wait())
            try:
                await asyncio.wait(
                    [stopped, poked], timeout=delay, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                stopped.cancel()
                poked.cancel()
