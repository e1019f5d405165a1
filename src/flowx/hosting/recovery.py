"""The recovery scan: finds instances a dead node left behind and resumes them here (R3.4).

``run_once()`` does one sweep and returns what it did, so tests drive single iterations; the
loop around it sleeps the scan interval with jitter. A sweep asks for at most as many
candidates as this node has free recovery slots — so no second page is taken until earlier
recoveries finish — and walks the page from a random offset, wrapping round to the head, so
nodes that scan at the same moment do not all fight over the same oldest rows.

Two things keep resume latency near one TTL rather than a TTL plus a scan interval plus a
queue (measured by ``benchmarks/chaos.py``):

* **Looking ahead.** When every due instance fit in its page, a sweep also reads the next
  one — the first that will have been idle for a TTL before the next sweep. It does not
  touch it; it wakes again the moment it falls due, instead of up to a whole interval later.
  (A wake for a row whose owner is alive finds nothing due and costs two indexed reads.)
  When a due candidate's lease is still live (its owner renewed after its last commit), the
  sweep reads when that lease runs out and wakes then too, if that is before the next sweep.
* **No idle wait behind a full page.** A sweep that filled every free slot, or found no free
  slot, is followed by another as soon as a recovery finishes, not an interval later: after a
  node with hundreds of instances dies, the survivors drain the backlog at the speed they run
  it.

Queued instances (``Pending``: started for any worker, or handed back by a draining node) are
work, not recovery: they are bounded by the node's free flow slots, not its recovery slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from flowx.clock import Clock
from flowx.errors import FlowXError
from flowx.hosting.settings import HostSettings
from flowx.metrics import RECOVERY_RESUMED, RECOVERY_SWEEPS
from flowx.stores.protocols import RecoveryIndex
from flowx.stores.records import RecoveryCandidate

log = logging.getLogger("flowx.recovery")

ResumeVerdict = Literal["resumed", "lost_race", "not_runnable", "gone"]
#: ``resume(candidate, queued)``: take the instance over and run it here.
Resume = Callable[[RecoveryCandidate, bool], Awaitable[ResumeVerdict]]
#: When the lease on an instance runs out, if anyone holds it.
LeaseExpiry = Callable[[str], Awaitable[datetime | None]]
#: The shortest pause between sweeps: a wake-up for an instance due sooner waits this long.
_MIN_EARLY = 0.05
#: A sweep woken for an upcoming instance comes at least this long after the last one.
_MIN_WAKE = 0.25


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
    #: Queued instances taken (part of ``found`` and ``resumed``).
    queued: int = 0
    #: Idle instances not yet due; the sweep wakes again when the first is.
    upcoming: int = 0
    #: When this sweep wants the next one (``None``: at the regular interval).
    wake_at: datetime | None = None
    #: Every free slot was used: more work may be waiting right now.
    full: bool = False

    def sentence(self) -> str:
        """What the sweep did, for a log line a person reads."""
        parts = [f"resumed {self.resumed} of {self.found} found ({self.queued} queued)"]
        if self.lost_race:
            parts.append(f"{self.lost_race} taken by another node first")
        if self.not_runnable:
            parts.append(f"{self.not_runnable} of a flow version this node does not carry")
        if self.upcoming:
            parts.append(f"{self.upcoming} idle but not yet due")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class _QueuedPass:
    counts: dict[str, int]
    page: int
    #: Every free flow slot was used (or none was free).
    full: bool


class RecoveryService:
    """One node's half of crash recovery."""

    def __init__(
        self,
        *,
        index: RecoveryIndex,
        settings: HostSettings,
        clock: Clock,
        in_flight: Callable[[], int],
        resume: Resume,
        free_flow_slots: Callable[[], int] | None = None,
        lease_expiry: LeaseExpiry | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._index = index
        self._settings = settings
        self._clock = clock
        self._in_flight = in_flight
        self._resume = resume
        self._free_flow_slots = free_flow_slots
        self._lease_expiry = lease_expiry
        self._rng = rng or random.Random()  # nosec B311  # scan jitter, not a secret
        self._slot_freed = asyncio.Event()
        self._poked = asyncio.Event()
        #: Takes up to n queued instances in one claim and runs them, returning how many
        #: (``InstanceRunner.claim_queued``, where the stores claim: ``QueueClaims``). Unset,
        #: each queued row is read, then taken over one by one.
        self.claim: Callable[[int], Awaitable[int]] | None = None
        self._running = False

    @property
    def claims_queued(self) -> bool:
        """Whether a ``poke`` has queued work claimed here soon: the loop runs and claims
        a page per write (``claim``)."""
        return self._running and self.claim is not None

    def slot_freed(self) -> None:
        """Called by the host when a recovered or queued instance stops running here."""
        self._slot_freed.set()

    def poke(self) -> None:
        """Another process made an instance runnable (``WorkWakeups``): take queued work now
        rather than at the next sweep. The regular sweep keeps its schedule."""
        self._poked.set()

    @property
    def lookahead(self) -> timedelta:
        """How far past the TTL cutoff a sweep reads: up to the latest the next sweep can
        come. It reads one row there, and touches nothing."""
        s = self._settings
        return s.recovery_scan_interval * (1 + s.recovery_scan_jitter)

    async def run_once(self) -> RecoveryScanResult:
        # Which rows are due is the store's call, on its own clock (R9.2); ``now`` is this
        # node's estimate of that clock, used only to schedule the next sweep.
        now = self._clock.now()
        at = self._clock.store_time()
        ttl = self._settings.lease_ttl
        free = self._settings.max_concurrent_recoveries - self._in_flight()
        counts = {"resumed": 0, "lost_race": 0, "not_runnable": 0, "gone": 0}
        wake: datetime | None = None
        due: list[RecoveryCandidate] = []
        taken: set[str] = set()
        upcoming = 0
        if free > 0:
            limit = min(free, self._settings.recovery_scan_batch_size)
            due = await self._abandoned(at, ttl, limit)
            taken = {c.instance_id for c in due}
            if len(due) < limit:
                # Every due row is in this page, so the next row past them is the first that
                # falls due: wake for it rather than a whole interval later.
                ahead = await self._index.find_abandoned(
                    now=at, idle_for=ttl - self.lookahead, limit=1, offset=len(due)
                )
                for c in ahead:
                    eligible = c.updated_at + ttl
                    if c.instance_id not in taken and eligible > now:
                        upcoming += 1
                        wake = eligible
            verdicts = await self._take(due, queued=False)
            for verdict in verdicts:
                counts[verdict] += 1
            held = [c for c, v in zip(due, verdicts, strict=True) if v == "lost_race"]
            if held and self._lease_expiry is not None:
                expiries = await asyncio.gather(*(self._lease_expiry(c.instance_id) for c in held))
                for expires in expiries:
                    if expires is not None and expires > now:
                        wake = expires if wake is None else min(wake, expires)
        queued = await self._queued(taken)
        for kind, n in queued.counts.items():
            counts[kind] += n
        RECOVERY_SWEEPS.inc(())
        RECOVERY_RESUMED.inc((), counts["resumed"])
        return RecoveryScanResult(
            found=len(due) + queued.page,
            resumed=counts["resumed"],
            lost_race=counts["lost_race"] + counts["gone"],
            not_runnable=counts["not_runnable"],
            skipped_busy=free <= 0,
            queued=queued.counts["resumed"],
            upcoming=upcoming,
            wake_at=wake,
            full=free <= 0 or len(due) >= free or queued.full,
        )

    async def run_queued(self) -> RecoveryScanResult:
        """Only the queued half of a sweep: what a wake-up (``poke``) asks for. It reads no
        abandoned rows, so it costs one indexed read when a slot is free and none when not."""
        queued = await self._queued(set())
        RECOVERY_RESUMED.inc((), queued.counts["resumed"])
        return RecoveryScanResult(
            found=queued.page,
            resumed=queued.counts["resumed"],
            lost_race=queued.counts["lost_race"] + queued.counts["gone"],
            not_runnable=queued.counts["not_runnable"],
            queued=queued.counts["resumed"],
            full=queued.full,
        )

    async def _queued(self, taken: set[str]) -> _QueuedPass:
        counts = {"resumed": 0, "lost_race": 0, "not_runnable": 0, "gone": 0}
        room = self._queued_room()
        if room <= 0:
            return _QueuedPass(counts=counts, page=0, full=True)
        if self.claim is not None:
            # Claimed in one write: nothing another worker is taking, nothing taken twice.
            counts["resumed"] = page = await self.claim(room)
        else:
            candidates = await self._index.find_queued(limit=room)
            queued = [c for c in candidates if c.instance_id not in taken]
            for verdict in await self._take(queued, queued=True):
                counts[verdict] += 1
            page = len(queued)
        if page >= room and self._queued_room() >= self._page_worth():
            # A full page and a page's worth of slots free again: a backlog. Take the next
            # page at once (the sweep's schedule is unchanged). Fewer free slots wait for
            # more to free (the loop's backlog pause): a claim is a write, and one for every
            # slot that frees during the last claim would cost more than the runs it feeds.
            self._poked.set()
        return _QueuedPass(counts=counts, page=page, full=page >= room)

    def _page_worth(self) -> int:
        """How many free slots make a claim worth its write: a quarter of the largest page
        (the scan batch, or the node's flow slots if fewer)."""
        most = self._settings.recovery_scan_batch_size
        if self._free_flow_slots is not None:
            most = min(most, self._settings.max_concurrent_flows)
        return max(1, most // 4)

    async def _some_slots_free(self, until: float) -> None:
        """Wait until a page's worth of slots is free, or ``until`` (the loop's clock),
        whichever comes first."""
        loop = asyncio.get_running_loop()
        enough = self._page_worth()
        while self._queued_room() < enough and loop.time() < until:
            self._slot_freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._slot_freed.wait(), until - loop.time())

    def _queued_room(self) -> int:
        batch = self._settings.recovery_scan_batch_size
        if self._free_flow_slots is None:
            return batch
        free = self._free_flow_slots()
        if self.claim is not None:
            # A claim leases what it takes: a few beyond the free slots wait, leased, for
            # the next slot to free instead of a claim's round trip (``queue_prefetch``).
            free += self._settings.queue_prefetch
        return min(batch, free)

    async def _abandoned(
        self, now: datetime | None, idle: timedelta, limit: int
    ) -> list[RecoveryCandidate]:
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
        return page

    async def _take(
        self, candidates: list[RecoveryCandidate], *, queued: bool
    ) -> list[ResumeVerdict]:
        # Concurrently: each takeover is a few round trips, and a backlog after a node dies
        # should cost the slowest of them, not their sum.
        if not candidates:
            return []
        return list(await asyncio.gather(*(self._resume(c, queued) for c in candidates)))

    def next_delay(self) -> float:
        base = self._settings.recovery_scan_interval.total_seconds()
        jitter = self._settings.recovery_scan_jitter
        return base * self._rng.uniform(1 - jitter, 1 + jitter)

    def _delay_after(self, result: RecoveryScanResult | None) -> float:
        delay = self.next_delay()
        if result is not None and result.wake_at is not None:
            early = (result.wake_at - self._clock.now()).total_seconds() + _MIN_EARLY
            delay = max(_MIN_WAKE, min(delay, early))
        return delay

    async def run_forever(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        # Start at a random point of the first interval, not in step with the rest of a fleet.
        sweep_at = loop.time() + self._rng.uniform(0, self.next_delay())
        # Queued work is taken at once, though: a worker started on a backlog (or restarted
        # after an outage) must not idle until its first sweep. No wake-up tells it of rows
        # queued before it was listening.
        self._poked.set()
        self._running = True
        try:
            await self._loop(stop, sweep_at)
        finally:
            self._running = False

    async def _loop(self, stop: asyncio.Event, sweep_at: float) -> None:
        loop = asyncio.get_running_loop()
        full = False
        while not stop.is_set():
            self._slot_freed.clear()
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._poked.wait())]
            if full:
                waits.append(asyncio.ensure_future(self._slot_freed.wait()))
            try:
                await asyncio.wait(
                    waits,
                    timeout=max(sweep_at - loop.time(), 0.0),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                for w in waits:
                    w.cancel()
            if stop.is_set():
                return
            backlog = full and self._slot_freed.is_set() and not self._poked.is_set()
            if backlog and loop.time() < sweep_at:
                # The last pass filled every slot, so queued work is likely left: claim again
                # as slots free — a page at a time (a quarter of the slots, or what freed
                # within a short pause), not a claim per slot — without a whole sweep, which
                # keeps its schedule. A pass that finds the queue empty ends this.
                await self._some_slots_free(loop.time() + _MIN_EARLY)
                self._poked.set()
            elif backlog:
                # Let a few more finish, so a busy node sweeps a few times a second at most.
                await asyncio.sleep(_MIN_EARLY)
            if self._poked.is_set() and loop.time() < sweep_at:
                # A wake-up between sweeps (or a freed slot with wake-ups still waiting for
                # one): the queued half only, at once — it claims a page sized to the slots
                # free by then — and the sweep keeps its schedule.
                self._poked.clear()
                try:
                    full = (await self.run_queued()).full
                except FlowXError as exc:
                    log.warning("taking queued work failed (%s); next scan as scheduled", exc)
                except Exception:  # a bug: say so loudly, but keep the node recovering
                    log.exception("taking queued work failed; next scan as scheduled")
                continue
            self._poked.clear()
            result: RecoveryScanResult | None
            try:
                result = await self.run_once()
                if result.resumed:
                    log.info("recovery scan: %s", result.sentence())
            except FlowXError as exc:
                result = None
                log.warning("recovery scan failed (%s); next scan as scheduled", exc)
            except Exception:  # a bug: a dead recovery loop would strand every instance
                result = None
                log.exception("recovery scan failed; next scan as scheduled")
            full = result is not None and result.full
            sweep_at = loop.time() + self._delay_after(result)
