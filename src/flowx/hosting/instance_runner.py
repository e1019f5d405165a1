"""``InstanceRunner``: the only code on a node that runs an instance.

Every way an instance comes to run here — a start, a resume (recovery, the timer service, a
signal, a child waking its parent), a parent's compensation undoing a child, a replay, an
Ephemeral run — goes the same way: take the lease (R2.4, R3.3) → open the history → build the
``Execution`` (in one place, ``_execution``) → run it → handle the outcome (timers, alerts,
waking a parent, handing back on a drain). One path means a new concern (cancel, tracing,
step timeouts) is added once, not once per entry point.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pydantic import BaseModel

from flowx import codec
from flowx.engine.runner import Execution, RunPorts, RunResult, RunSpec
from flowx.errors import (
    CapabilityVersionMissing,
    FlowXError,
    NonDeterminismError,
)
from flowx.hosting import stopping
from flowx.hosting.context import NodeContext
from flowx.hosting.creation import child_instance
from flowx.hosting.lease import DurableLease
from flowx.hosting.outcomes import after_run, hand_back, run_span, taken_over
from flowx.hosting.ports import DurableCommitter, DurableWaits, EphemeralCommitter
from flowx.hosting.quarantine import quarantine
from flowx.hosting.recovery import RecoveryService, ResumeVerdict
from flowx.hosting.settling import renew_late, reopen
from flowx.hosting.threads import RunThreads
from flowx.hosting.timers import TimerService
from flowx.hosting.undo import undoable, undone
from flowx.plan.model import Plan, SubFlowNode
from flowx.stores.errors import (
    FencedOut,
    JournalNoAnswer,
    JournalUnavailable,
    UnknownInstance,
)
from flowx.stores.protocols import LeasedCreate, QueueClaims, Stores
from flowx.stores.records import (
    CreateResult,
    History,
    InstanceRecord,
    InstanceState,
    NewInstance,
    RecoveryCandidate,
    SignalRecord,
    StepRecord,
)
from flowx.tracing import annotate

T = TypeVar("T")

log = logging.getLogger("flowx.host")
QUARANTINED = InstanceState.QUARANTINED

#: How long a cancelled run gets to unwind (release its lease) once the drain budget is spent.
CANCEL_GRACE = 1.0


@dataclass(frozen=True, slots=True)
class Launched:
    """What a start did: ``created`` a new instance, or found ``existing`` (same id)."""

    instance_id: str
    created: bool
    existing: InstanceRecord | None = None


class InstanceRunner:
    """Runs this node's instances; owns their tasks, the flow slots and background wakes."""

    def __init__(self, ctx: NodeContext) -> None:
        self._ctx = ctx
        #: The instances running here, by id.
        self.tasks: dict[str, asyncio.Task[RunResult | None]] = {}
        #: Each running instance's outcome, settled as soon as it is committed — before the
        #: run's lease is released, so a caller waiting on a result does not wait for that
        #: round trip too. ``None``: the run ended without one (the caller reads the journal).
        self.outcomes: dict[str, asyncio.Future[RunResult | None]] = {}
        #: Those taken over by a recovery sweep (not queued): they count against its slots.
        self.recovering: set[str] = set()
        self._wakers: set[asyncio.Task[Any]] = set()
        self._slots = asyncio.Semaphore(ctx.settings.max_concurrent_flows)
        # Recent Ephemeral results, for ``FlowHost.handle(...).result()``; bounded, since a
        # long-lived worker runs any number of them (the start's own handle keeps its own).
        self._ephemeral: OrderedDict[str, RunResult] = OrderedDict()
        self.recovery: RecoveryService | None = None
        self.timers: TimerService | None = None

    # -- entry points ----------------------------------------------------------------------

    async def launch(self, plan: Plan, new: NewInstance, *, run_here: bool) -> Launched:
        """Create ``new`` under a fresh lease (R3.3) and, if ``run_here``, run it. An instance
        that already has this id (an idempotency key, a child a parent started before) is
        returned as ``existing`` and nothing starts."""
        ctx = self._ctx
        stores = ctx.require_stores()
        instance_id = new.instance_id
        sent = time.monotonic()
        created: CreateResult | None = None
        if ctx.leased_create:
            # Lease first (R3.3), in the same write as the instance row.
            lease, created = await cast(LeasedCreate, stores).create_leased(
                new, owner=ctx.node_id, ttl=ctx.settings.lease_ttl, now=ctx.clock.store_time()
            )
        else:
            lease = await stores.leases.acquire(
                instance_id,
                owner=ctx.node_id,
                ttl=ctx.settings.lease_ttl,
                now=ctx.clock.store_time(),
            )
        if lease is None:
            # Another start with the same key holds the lease: its row is a moment away.
            for _ in range(50):
                existing = await stores.journal.get(instance_id)
                if existing is not None:
                    return Launched(instance_id, created=False, existing=existing)
                await asyncio.sleep(0.05)
            raise JournalUnavailable(
                f"a concurrent start of {plan.flow_id} with key {new.idempotency_key!r} holds "
                "the lease but has not written the instance; retry"
            )
        durable = ctx.hold(stores, lease, sent)
        if created is None:
            try:
                # The store's clock, as for the lease (R9.2): ``updated_at`` is what the
                # recovery scan's idle filter reads if this node dies before its first commit.
                created = await stores.journal.create(
                    new, token=lease.token, now=ctx.clock.store_time()
                )
            except BaseException:
                await durable.release()
                raise
        if not created.created:
            await durable.release()
            return Launched(instance_id, created=False, existing=created.instance)
        if not run_here:
            await durable.release()
        else:
            self._spawn(plan, created.instance, (), durable)
        return Launched(instance_id, created=True)

    async def start_child(
        self,
        plan: Plan,
        value: BaseModel,
        instance_id: str,
        *,
        parent: InstanceRecord,
        scope: str,
        node: SubFlowNode,
    ) -> None:
        """Create a sub-flow's child and run it here if this node accepts work."""
        running = self._ctx.accepting
        with codec.sealing(self._ctx.sealing(instance_id)):  # the child's own, not the parent's
            new = child_instance(
                plan,
                value,
                instance_id,
                parent=parent,
                scope=scope,
                node=node,
                running=running,
                now=self._ctx.clock.now(),
            )
        # The run just read that there is no such child; if one appeared meanwhile (another
        # run of this parent), launch finds it and starts nothing.
        await self.launch(plan, new, run_here=running)

    async def resume(self, instance_id: str, *, queued: bool = False) -> ResumeVerdict:
        """Take over an instance and run it from its last commit. Losing the race is a skip."""
        ctx = self._ctx
        stores = ctx.require_stores()
        record = await stores.journal.get(instance_id)
        if record is None or record.state.terminal or record.state is QUARANTINED:
            return "gone"  # ended, or set aside until a replay puts it back
        if not ctx.plans.carries(record.flow_id, record.flow_version):
            return "not_runnable"
        plan = ctx.plans.plan(record.flow_id, record.flow_version)
        try:
            claimed = await self.claim(stores, record)
        except (FencedOut, UnknownInstance):
            return "lost_race"
        if claimed is None:
            return "lost_race"
        durable, history = claimed
        if history.instance.state.terminal:
            await durable.release()
            return "gone"
        taken_over(record, ctx.journal_clock.now())
        self._spawn(plan, history.instance, history.steps, durable, recovering=True, queued=queued)
        return "resumed"

    async def claim_queued(self, limit: int) -> int:
        """Take up to ``limit`` queued instances in one claim (``QueueClaims``) and run them
        here; how many were taken."""
        ctx = self._ctx
        stores = ctx.require_stores()
        if not ctx.accepting or not isinstance(stores, QueueClaims):
            return 0
        sent = time.monotonic()
        claimed = await stores.claim_queued(
            owner=ctx.node_id,
            ttl=ctx.settings.lease_ttl,
            limit=limit,
            flows=ctx.plans.refs(),
            now=ctx.clock.store_time(),
        )
        if claimed and time.monotonic() - sent > ctx.settings.renewal_interval.total_seconds():
            claimed, sent = await renew_late(ctx, stores, claimed)
        for lease, history in claimed:
            durable = ctx.hold(stores, lease, sent)
            record = history.instance
            plan = ctx.plans.plan(record.flow_id, record.flow_version)
            self._spawn(
                plan,
                record,
                history.steps,
                durable,
                recovering=True,
                queued=True,
                inbox=history.inbox,
            )
        return len(claimed)

    async def resume_candidate(self, candidate: RecoveryCandidate, queued: bool) -> ResumeVerdict:
        """A recovery sweep's or the timer service's pick: resumed unless it is not ours."""
        if not self._ctx.plans.carries(candidate.flow_id, candidate.flow_version):
            return "not_runnable"  # R7.3: leave it for a node that carries the version
        if candidate.instance_id in self.tasks or not self._ctx.accepting:
            return "lost_race"
        return await self.resume(candidate.instance_id, queued=queued)

    async def undo_child(self, child_id: str) -> None:
        """Undo a completed sub-flow child for its parent's compensation: take the child's
        lease, replay it and run its own compensations, journaled in its own history. It
        ends ``Failed`` (code ``flow.undone``), or ``CompensationFailed`` with its own alert."""
        ctx = self._ctx
        stores = ctx.require_stores()
        record = await stores.journal.get(child_id)
        if not undoable(child_id, record):
            return  # it undid itself, or was undone already
        assert record is not None  # nosec B101  # invariant: undoable() refuses None
        plan = ctx.plans.plan(record.flow_id, record.flow_version)
        claimed = await self.claim(stores, record)
        if claimed is None:
            raise FlowXError(
                f"child instance {child_id} is held by another node; trying again",
                code="sub_flow.child_busy",
            )
        durable, history = claimed
        child = history.instance
        ctx.stops.enter(child_id)
        try:
            with codec.sealing(ctx.sealing(child_id)):
                execution = self._execution(
                    RunSpec.undo_child(plan, child, history.steps), durable, child
                )
                result = await execution.run()
        finally:
            ctx.stops.leave(child_id)
            await durable.release()
        with codec.sealing(ctx.sealing(child_id)):
            await after_run(ctx, plan, child, result, timers=self.timers, wake=None, counted=False)
        undone(child_id, result)
        if result.final_state is None:
            raise FlowXError(
                f"undoing child instance {child_id} stopped ({result.outcome}); trying again",
                code="sub_flow.child_busy",
            )

    async def run_ephemeral(self, plan: Plan, instance_id: str, value: BaseModel) -> RunResult:
        """Run an Ephemeral instance to its end, here and now, with no journal (R2.9)."""
        with codec.sealing(self._ctx.sealing(instance_id)):
            result = await self._execution(RunSpec.ephemeral(plan, instance_id, value)).run()
        kept = self._ephemeral
        kept[instance_id] = result
        while len(kept) > self._ctx.settings.ephemeral_results_kept:
            kept.popitem(last=False)  # the oldest: its start handle still holds it
        return result

    def ephemeral_result(self, instance_id: str) -> RunResult | None:
        return self._ephemeral.get(instance_id)

    @property
    def ephemeral_kept(self) -> int:
        """How many Ephemeral results this node keeps (bounded by a setting)."""
        return len(self._ephemeral)

    def wake(self, instance_id: str) -> None:
        """Resume, in the background, an instance something just made ``Pending``.

        Where recovery claims queued work (``QueueClaims``), the wake is a poke: one claim
        takes this instance with every other woken one, a page per write, rather than a read,
        a lease and an open for each. A claim passes over an instance whose lease is still
        held (the run that suspended it has not released it yet); that release wakes the node
        again, so this holds only where wake-ups are on."""
        recovery = self.recovery
        if recovery is not None and recovery.claims_queued and self._ctx.settings.wakeups:
            recovery.poke()
            return
        self._background(self._resume_quietly(instance_id), name=f"flowx-wake-{instance_id}")

    # -- the one path ----------------------------------------------------------------------

    async def claim(
        self, stores: Stores, record: InstanceRecord
    ) -> tuple[DurableLease, History] | None:
        """Lease an existing instance and read its history under that lease; ``None`` when
        another node holds it. An error opening releases the lease, then propagates."""
        durable = await self._ctx.take_lease(stores, record)
        if durable is None:
            return None
        try:
            history = await stores.journal.open(
                record.instance_id, token=durable.token, now=self._ctx.clock.store_time()
            )
        except BaseException:
            await durable.release()
            raise
        return durable, history

    def _execution(
        self,
        spec: RunSpec,
        lease: DurableLease | None = None,
        record: InstanceRecord | None = None,
        inbox: tuple[SignalRecord, ...] | None = None,
        threads: RunThreads | None = None,
    ) -> Execution:
        """The one place a node builds an ``Execution``: ``spec`` says which run (from a
        record, undoing a child, Ephemeral); the ports bind it to this node. A durable run
        (``lease`` and ``record``) commits and waits under its lease; only a forward one
        yields to a drain — an undo is compensation, which a drain never interrupts."""
        ctx = self._ctx
        durable = lease is not None and record is not None
        return Execution(
            spec,
            RunPorts(
                committer=(
                    DurableCommitter(ctx, spec.instance_id, lease, spec.plan.flow_id).commit
                    if lease is not None
                    else EphemeralCommitter().commit
                ),
                clock=ctx.clock,
                registry=ctx.registry,
                executor=threads if threads is not None else ctx.threads,
                waits=(
                    DurableWaits(ctx, record, lease, self, inbox=inbox)
                    if record is not None and lease is not None
                    else None
                ),
                should_yield=(lambda: not ctx.accepting) if durable and not spec.undo else None,
                guard=lease.check if lease is not None else None,
                stop=ctx.stops.watch(record) if durable and record is not None else None,
                node_id=ctx.node_id,
            ),
        )

    def _spawn(
        self,
        plan: Plan,
        record: InstanceRecord,
        history: tuple[StepRecord, ...],
        lease: DurableLease,
        *,
        recovering: bool = False,
        queued: bool = False,
        inbox: tuple[SignalRecord, ...] | None = None,
    ) -> None:
        lease.start()
        iid = record.instance_id
        if recovering and not queued:
            self.recovering.add(iid)
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[RunResult | None] = loop.create_future()
        run = self._execute(plan, record, history, lease, inbox, outcome)
        sealed = self._ctx.settings.keyring is not None
        task = loop.create_task(self._sealed(iid, run) if sealed else run, name=f"flowx-{iid}")
        self.tasks[iid] = task
        self.outcomes[iid] = outcome
        self._ctx.stops.enter(iid)

        def done(t: asyncio.Task[RunResult | None]) -> None:
            if self.tasks.get(iid) is t:
                del self.tasks[iid]
            if self.outcomes.get(iid) is outcome:
                del self.outcomes[iid]
            if not outcome.done():
                if t.cancelled():
                    outcome.cancel()
                else:
                    outcome.set_result(None if t.exception() is not None else t.result())
            self.recovering.discard(iid)
            self._ctx.stops.leave(iid)
            if self.recovery is not None:
                self.recovery.slot_freed()
            if self.timers is not None:
                self.timers.slot_freed()

        task.add_done_callback(done)

    async def _sealed(self, iid: str, run: Awaitable[T]) -> T:
        """``run`` with the instance's sensitive members sealed and opened under its own id
        (R9.8); the run's task and the tasks it starts inherit it."""
        with codec.sealing(self._ctx.sealing(iid)):
            return await run

    async def _execute(
        self,
        plan: Plan,
        record: InstanceRecord,
        history: tuple[StepRecord, ...],
        lease: DurableLease,
        inbox: tuple[SignalRecord, ...] | None,
        outcome: asyncio.Future[RunResult | None],
    ) -> RunResult | None:
        iid = record.instance_id
        try:
            async with self._slots:
                result = await self._run_durable(plan, record, history, lease, inbox)
            if result is None:
                return None  # its end was committed before the journal fell silent
            await after_run(self._ctx, plan, record, result, timers=self.timers, wake=self.wake)
            await self._after_stop(iid, result)
            # Committed: whoever waits for it has it now, without waiting for the release
            # below to be answered. One turn of the loop lets the outcome's callbacks run
            # first; a waiter resumes in the turn after, while the release is under way.
            outcome.set_result(result)
            await asyncio.sleep(0)
            return result
        except CapabilityVersionMissing as exc:  # this node's problem, not the instance's
            log.error("instance %s cannot be resumed on this node: %s", iid, exc)
        except NonDeterminismError as exc:
            await quarantine(self._ctx, lease, record, exc)
        except JournalUnavailable as exc:
            # A failed commit may have committed, and it could not be re-read here under the
            # lease: released below, so recovery (here or on a peer) re-opens the instance
            # from what the journal really holds.
            log.warning(
                "instance %s: journal unavailable mid-run (%s); left for recovery", iid, exc
            )
        except FlowXError as exc:
            log.error("instance %s stopped: %s", iid, exc)
        except Exception:
            log.exception("instance %s stopped by an unexpected error", iid)
        finally:
            await lease.release()
        return None

    async def _run_durable(
        self,
        plan: Plan,
        record: InstanceRecord,
        history: tuple[StepRecord, ...],
        lease: DurableLease,
        inbox: tuple[SignalRecord, ...] | None,
    ) -> RunResult | None:
        """Run to the end of this turn. A journal write with no answer within its deadline
        (a slow disk, a lost reply: the journal is there, its outcome unknown) does not end
        the turn while the lease holds: the instance is re-opened under the same lease —
        which waits for that write if the server is still committing it — and runs on from
        what the journal holds (R9.1). A journal that refuses connections ends it: the run
        is left for recovery, as before.
        ``None``: the write was the instance's end, and it landed."""
        iid = record.instance_id
        while True:
            spec = RunSpec.from_record(
                plan, record, history, max_resumes=self._ctx.settings.max_resumes_without_progress
            )
            threads = RunThreads(self._ctx.threads) if self._ctx.threads is not None else None
            execution = self._execution(spec, lease, record, inbox, threads)
            try:
                with run_span(plan, record) as current:
                    result = await execution.run()
                    annotate(current, outcome=result.outcome)
            except asyncio.CancelledError:
                if not self._ctx.accepting:
                    await hand_back(execution, iid, CANCEL_GRACE / 2)
                raise
            except JournalNoAnswer as exc:
                reopened = await reopen(self._ctx, lease, threads, exc)
                if reopened is None:
                    raise
                record, history, inbox = reopened.instance, reopened.steps, None
                if record.state.terminal:
                    # Its end landed: that commit made a parent Pending, as after_run
                    # would have resumed it here; without this it waits for a sweep.
                    if record.parent_instance_id is not None:
                        self.wake(record.parent_instance_id)
                    return None
                continue
            log.debug("instance %s: %s", iid, result.outcome)
            return result

    async def _after_stop(self, instance_id: str, result: RunResult) -> None:
        """R9.4: an instance an operator stopped passes the request on once more as it ends
        (a child started just before its run learned of it is reached too); one that sealed
        a wait after the request came is ``Pending`` (the seal saw the request), and is run
        again here to stop."""
        request = self._ctx.stops.request(instance_id)
        if request is None:
            return
        if result.outcome == "suspended":
            self.wake(instance_id)
        elif result.outcome in ("cancelled", "terminated"):
            try:
                await stopping.stop(self._ctx, self, instance_id, request)
            except FlowXError as exc:
                log.warning(
                    "instance %s: its %s did not reach its sub-flows once more (%s); a "
                    "repeated command does",
                    instance_id,
                    request.mode,
                    exc,
                )

    # -- background wakes and the drain ----------------------------------------------------

    @property
    def wakers(self) -> tuple[asyncio.Task[None], ...]:
        """The background wakes under way (``wake``)."""
        return tuple(self._wakers)

    def _background(self, coro: Coroutine[Any, Any, None], *, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._wakers.add(task)
        task.add_done_callback(self._wakers.discard)

    async def _resume_quietly(self, instance_id: str) -> None:
        """Resume an instance something just woke; a lost race or a draining node is fine —
        it is ``Pending``, and the next recovery sweep anywhere takes it."""
        if not self._ctx.accepting:
            return
        for _ in range(20):
            try:
                verdict = await self.resume(instance_id, queued=True)
            except FlowXError as exc:
                log.info("waking %s here failed (%s); recovery will take it", instance_id, exc)
                return
            if verdict != "lost_race":
                return
            # Most often the run that woke it still holds the lease for a moment.
            await asyncio.sleep(0.05)

    async def drain(self, left: Callable[[], float], budget: float) -> None:
        """Let background wakes and running instances end within what is ``left`` of the
        drain's budget; cancel the rest, which hand their instances back and release their
        leases in their own ``finally`` (R7.2)."""
        if self._wakers:
            _woken, late = await asyncio.wait(list(self._wakers), timeout=left())
            for waker in late:
                waker.cancel()
            if late:
                await asyncio.wait(late, timeout=CANCEL_GRACE)
        tasks = list(self.tasks.values())
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=left())
        for task in pending:
            # A step in an async capability is cancelled; one in a thread is abandoned
            # (counted stuck) — either way the run ends now and releases its lease in its
            # own ``finally``, so a peer resumes the instance from its last commit.
            task.cancel()
        if pending:
            log.warning(
                "drain: %d instance(s) still running after %.1fs; cancelled, leases released",
                len(pending),
                budget,
            )
            _done, stubborn = await asyncio.wait(pending, timeout=CANCEL_GRACE)
            if stubborn:
                log.error(
                    "drain: %d instance(s) ignored cancellation; their leases expire after one TTL",
                    len(stubborn),
                )
