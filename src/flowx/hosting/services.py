"""A node's background loops: connecting to the stores, recovery, timers, clock, outbox.

They start once the journal is reachable (at open, or later from the reconnect loop, R7.1)
and stop in a fixed order on a drain (R7.2). Kept out of the facade so ``FlowHost`` reads as
what a node does, not how its loops are wired.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import datetime

from flowx.errors import FlowXError
from flowx.hosting import collector
from flowx.hosting.archive import Archiver, JsonlArchiver
from flowx.hosting.clock_offset import ClockWatch
from flowx.hosting.clock_offset import check as check_clock_offsets
from flowx.hosting.clock_offset import measure as measure_clock_offsets
from flowx.hosting.context import NodeContext
from flowx.hosting.instance_runner import InstanceRunner
from flowx.hosting.recovery import RecoveryService
from flowx.hosting.retention import RetentionService
from flowx.hosting.sampling import MetricsService
from flowx.hosting.timers import TimerService
from flowx.stores.errors import JournalUnavailable, LeaseUnavailable
from flowx.stores.protocols import QueueClaims, RoundTripBound, Stores, WorkWakeups

log = logging.getLogger("flowx.host")
#: Seconds between two measurements of this node's clock offset to its stores (R9.2).
CLOCK_CHECK_EVERY = 60.0


class NodeServices:
    """The loops of one node, and the event that tells them to stop."""

    def __init__(
        self,
        ctx: NodeContext,
        runner: InstanceRunner,
        *,
        run_recovery: bool,
        run_timers: bool,
        archiver: Archiver | None = None,
    ) -> None:
        self._ctx = ctx
        settings, store = ctx.settings, ctx.store
        # Recovery and timers resume through the runner, like every other way an instance
        # comes to run; both are bounded by the node's free flow slots.
        self.recovery = (
            RecoveryService(
                index=store.recovery,
                settings=settings,
                clock=ctx.journal_clock,
                in_flight=lambda: len(runner.recovering),
                resume=runner.resume_candidate,
                free_flow_slots=lambda: settings.max_concurrent_flows - len(runner.tasks),
                lease_expiry=self._lease_expiry,
            )
            if store is not None
            else None
        )
        self.timers = (
            TimerService(
                waits=store.waits,
                settings=settings,
                clock=ctx.clock,
                wake=lambda candidate: runner.resume_candidate(candidate, False),
                free_flow_slots=lambda: settings.max_concurrent_flows - len(runner.tasks),
                carried=ctx.plans.refs,
            )
            if store is not None
            else None
        )
        runner.recovery, runner.timers = self.recovery, self.timers
        if archiver is None and settings.retention_archive_dir:
            archiver = JsonlArchiver(settings.retention_archive_dir)
        self.retention = RetentionService(ctx, archiver)
        self.metrics = MetricsService(ctx, lambda: len(runner.tasks))
        if self.recovery is not None and isinstance(store, QueueClaims):
            self.recovery.claim = runner.claim_queued
        self._run_recovery = run_recovery
        self._run_timers = run_timers
        self.stop = asyncio.Event()
        self.connected = asyncio.Event()
        self._recovery_task: asyncio.Task[None] | None = None
        self._timer_task: asyncio.Task[None] | None = None
        self._retention_task: asyncio.Task[None] | None = None
        self._wake_task: asyncio.Task[None] | None = None
        self._clock_task: asyncio.Task[None] | None = None
        self._connector: asyncio.Task[None] | None = None
        self._outbox_task: asyncio.Task[None] | None = None
        self._outbox_stop = asyncio.Event()
        self._collector_held = False

    async def _lease_expiry(self, instance_id: str) -> datetime | None:
        lease = await self._ctx.require_stores().leases.current(instance_id)
        return None if lease is None else lease.expires_at

    def reset(self) -> None:
        """Fresh events for a node (re)opening, and room for the garbage collector while it
        is open (``flowx.hosting.collector``)."""
        self.stop = asyncio.Event()
        self.connected = asyncio.Event()
        collector.release(self._collector_held)
        self._collector_held = collector.hold(self._ctx.settings.gc_threshold)

    async def closed(self) -> None:
        """What an open node holds whatever else happened: ``/metrics``, and the collector's
        threshold (the last node of the process to close puts it back)."""
        try:
            await self.metrics.stop()
        finally:
            collector.release(self._collector_held)
            self._collector_held = False

    async def connect_or_retry(self) -> None:
        """Connect now; a journal that cannot be reached is retried in the background
        (Durable calls refused until then, R7.1). Any other error propagates."""
        try:
            await self.connect()
        except (JournalUnavailable, LeaseUnavailable) as exc:
            self._ctx.unreachable_because = str(exc)
            log.warning(
                "journal unavailable at start-up (%s); reconnecting in the "
                "background, Durable flows refused until then",
                exc,
            )
            self._connector = asyncio.get_running_loop().create_task(
                self._reconnect(), name="flowx-reconnect"
            )

    async def connect(self) -> None:
        """Open (and migrate) the stores, check the clock, then start every loop."""
        ctx = self._ctx
        store = ctx.store
        assert store is not None  # nosec B101  # invariant: connect() runs only with a store
        if isinstance(store, RoundTripBound):
            store.bound_round_trips(ctx.settings.round_trip_timeout)
        await store.open()
        if ctx.clock.store_time() is None:  # a test clock pins store time: nothing to measure
            try:
                await self._check_clock(store)
            except BaseException:
                await store.close()
                raise
        ctx.keep_leases(store)
        ctx.store_ready = True
        self.connected.set()
        loop = asyncio.get_running_loop()
        if self._run_recovery and self.recovery is not None:
            self._recovery_task = loop.create_task(
                self.recovery.run_forever(self.stop), name="flowx-recovery"
            )
        if self._run_timers and self.timers is not None:
            self._timer_task = loop.create_task(
                self.timers.run_forever(self.stop), name="flowx-timers"
            )
        if ctx.settings.retention:
            self._retention_task = loop.create_task(
                self.retention.run_forever(self.stop), name="flowx-retention"
            )
        wanted = ctx.settings.wakeups and (self._run_recovery or self._run_timers)
        if wanted and isinstance(store, WorkWakeups):
            self._wake_task = loop.create_task(self._wake_on_work(store), name="flowx-wakeups")
        await self._start_outbox()

    async def _wake_on_work(self, store: WorkWakeups) -> None:
        """Wake-ups, not sweeps: when another process makes an instance runnable (a start, a
        signal, a child's end, a hand-back), take it now. The sweeps stay the safety net."""
        while not self.stop.is_set():
            try:
                woke = await store.wait_work(1.0)
            except Exception as exc:  # a store outage: the sweeps carry on without us
                log.debug("wake-ups unavailable (%s); retrying", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), timeout=1.0)
                continue
            if not woke:
                continue
            if self._run_recovery and self.recovery is not None:
                self.recovery.poke()
            if self._run_timers and self.timers is not None:
                self.timers.poke()

    async def _start_outbox(self) -> None:
        outbox = self._ctx.outbox
        if outbox is None or self._outbox_task is not None:
            return
        try:
            await outbox.publisher.open()
        except Exception as exc:
            # A broker that is down stops nothing (SPEC §8): the loop retries it.
            log.warning(
                "broker %s unreachable at start-up (%r); events wait in the outbox",
                outbox.publisher.name,
                exc,
            )
        self._outbox_stop = asyncio.Event()
        self._outbox_task = asyncio.get_running_loop().create_task(
            outbox.run(self._outbox_stop), name="flowx-outbox"
        )

    async def _check_clock(self, store: Stores) -> None:
        """R9.2: refuse to start this far off the stores' clocks; then watch the offset."""
        ctx = self._ctx
        limit = ctx.settings.clock_offset_limit
        offsets = await measure_clock_offsets(store, ctx.clock)
        check_clock_offsets(offsets, limit)
        ctx.journal_clock.learn(offsets)
        if offsets and self._clock_task is None:
            watch = ClockWatch(
                store,
                ctx.clock,
                limit=limit,
                every=CLOCK_CHECK_EVERY,
                on_measured=ctx.journal_clock.learn,
            )
            self._clock_task = asyncio.get_running_loop().create_task(
                watch.run_forever(self.stop), name="flowx-clock-watch"
            )

    async def _reconnect(self) -> None:
        delay = 0.5
        while not self.stop.is_set():
            try:
                await asyncio.wait_for(self.stop.wait(), timeout=delay)
                return
            except TimeoutError:
                pass
            try:
                await self.connect()
            except (JournalUnavailable, LeaseUnavailable) as exc:
                delay = min(delay * 2, 10.0)
                log.info("journal still unavailable (%s); next try in %.1fs", exc, delay)
                continue
            except FlowXError as exc:
                log.error("journal reached but refused (%s); this node stays not ready", exc)
                return
            store = self._ctx.store
            log.info("journal reachable again: %s", store.describe() if store else "")
            return

    # -- stopping, in the drain's order ----------------------------------------------------

    async def drain(self, runner: InstanceRunner, timeout: float | None) -> None:
        """``FlowHost.drain``: stop the loops and the runs within one budget, in order, then
        release what the node holds (leases, the store, the threads); ``/metrics`` is closed
        whatever happens on the way (``closed``)."""
        try:
            await self._drain(runner, timeout)
        finally:
            await self.closed()

    async def _drain(self, runner: InstanceRunner, timeout: float | None) -> None:
        ctx = self._ctx
        ctx.accepting = False
        self.stop.set()
        await self.stop_connector()
        budget = ctx.settings.shutdown_drain_timeout.total_seconds() if timeout is None else timeout
        # One budget for the whole drain, not one per phase: a worker told to stop within
        # ``shutdown_drain_timeout`` stops within it (issue 12 item 5).
        ends = time.monotonic() + budget

        def left() -> float:
            return max(ends - time.monotonic(), 0.0)

        # Whatever a sweep in progress takes over now yields at its first step (not
        # accepting); the timer service stops before the instances drain too.
        await self.stop_sweeps(left())
        await self.stop_timers(left())
        # A retention sweep in progress stops between pages (its lease is released).
        await stop_service(self._retention_task, left(), "the retention sweep")
        self._retention_task = None
        await runner.drain(left, budget)
        await self.stop_outbox(left())
        await self.stop_clock_watch()
        if ctx.keeper is not None:
            # Every run has released its lease by now (each in its own ``finally``); a
            # release the store did not answer gets a last try within the budget (2 s at
            # most: a store still down must not hold up the exit).
            await ctx.keeper.stop(owed_within=min(left(), 2.0))
            ctx.keeper = None
        if ctx.store is not None and ctx.store_ready:
            await ctx.store.close()
        ctx.store_ready = False
        self.connected = asyncio.Event()
        if ctx.threads is not None:
            ctx.threads.shutdown(wait=False, cancel_futures=True)
            ctx.threads = None
        ctx.opened = False

    async def stop_connector(self) -> None:
        if self._connector is not None:
            self._connector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connector
            self._connector = None

    async def stop_sweeps(self, budget: float) -> None:
        """Let a recovery sweep in progress finish rather than cancel it: a takeover
        cancelled between its lease and its first step would hold an instance for a whole
        TTL. The timer service stops before the instances drain too: a wake now would only
        be handed back. ``budget`` is read per service (the drain's remaining time)."""
        if self._wake_task is not None:
            self._wake_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._wake_task
            self._wake_task = None
        await stop_service(self._recovery_task, budget, "the recovery scan")
        self._recovery_task = None

    async def stop_timers(self, budget: float) -> None:
        await stop_service(self._timer_task, budget, "the timer service")
        self._timer_task = None

    async def stop_outbox(self, budget: float) -> None:
        """Last before the store closes: what the drained instances staged gets what is left
        of the budget; anything left stays in the outbox for the next publisher."""
        outbox = self._ctx.outbox
        if self._outbox_task is None or outbox is None:
            return
        self._outbox_stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._outbox_task, timeout=budget)
        if not self._outbox_task.done():
            self._outbox_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._outbox_task
        self._outbox_task = None
        try:
            await outbox.publisher.close()
        except Exception:
            log.exception("drain: closing the publisher %s failed", outbox.publisher.name)

    async def stop_clock_watch(self) -> None:
        await stop_service(self._clock_task, 0, "the clock watch")
        self._clock_task = None


async def stop_service(task: asyncio.Task[None] | None, budget: float, what: str) -> None:
    """Wait up to ``budget`` for a service loop that was told to stop, then cancel it."""
    if task is None:
        return
    try:
        await asyncio.wait_for(asyncio.shield(task), timeout=budget)
    except TimeoutError:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    except Exception:
        log.exception("drain: %s ended with an error", what)
