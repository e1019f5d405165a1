"""``FlowHost``: one node. It wires a backend into the engine and runs instances.

It starts instances (lease first, R3.3), executes them in tasks, renews their leases, runs
the recovery scan and the timer service, delivers signals, and drains on exit: stop taking
work, let in-flight steps finish within ``shutdown_drain_timeout``, release every lease
explicitly so a peer need not wait a TTL (R7.2).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable
from datetime import datetime
from types import TracebackType
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from flowx import codec
from flowx.capability import CapabilityRegistry, default_registry
from flowx.clock import Clock, SystemClock
from flowx.engine.runner import Execution, RunPorts, RunResult, RunSpec
from flowx.errors import (
    DurabilityNotConfigured,
    FlowFailed,
    FlowNotFound,
    FlowXError,
    IdempotencyConflict,
    InputInvalid,
    InstanceNotFound,
    NonDeterminismError,
    NonRetryableError,
    SerialisationError,
    SettingsError,
)
from flowx.hosting.alerts import AlertSink, LoggingAlertSink
from flowx.hosting.clock_offset import ClockWatch, JournalClock
from flowx.hosting.clock_offset import check as check_clock_offsets
from flowx.hosting.clock_offset import measure as measure_clock_offsets
from flowx.hosting.lease import DurableLease, LeaseKeeper
from flowx.hosting.recovery import RecoveryScanResult, RecoveryService, ResumeVerdict
from flowx.hosting.replay import ReplayPlan, plan_replay
from flowx.hosting.settings import HostSettings
from flowx.hosting.storable import (
    partition_of,
    signal_payload,
    start_input,
    storable_id,
    tenant_key,
)
from flowx.hosting.threads import CapabilityThreads
from flowx.hosting.timers import TimerService
from flowx.metrics import COMPENSATION_FAILED, DEADLINE_EXCEEDED
from flowx.names import name_problem, shown
from flowx.outbox import EventPublisher, OutboxPublisher
from flowx.plan.model import AwaitSignalNode, ForEachNode, Plan, SubFlowNode, walk
from flowx.stores.errors import (
    FencedOut,
    InstanceFinished,
    JournalUnavailable,
    LeaseUnavailable,
    UnknownInstance,
)
from flowx.stores.protocols import LeasedCreate, RoundTripBound, Stores
from flowx.stores.records import (
    CreateResult,
    EventWrite,
    InstanceRecord,
    InstanceState,
    Lease,
    NewInstance,
    Outcome,
    RecoveryCandidate,
    SignalReceipt,
    SignalRecord,
    StepCommit,
    StepRecord,
    StepWrite,
    SuspendCommit,
    Wake,
)

log = logging.getLogger("flowx.host")
#: Seconds between two measurements of this node's clock offset to its stores (R9.2).
_CLOCK_CHECK_EVERY = 60.0

#: Instance ids from idempotency keys are derived, so two racing starts contend for one lease.
INSTANCE_NAMESPACE = uuid.UUID("b3c1f0d2-8a4e-4f6b-9c2d-1e7a5b9f3c40")

S = TypeVar("S", bound=BaseModel)


class FlowHandle(Generic[S]):
    """A started instance. ``await handle.result()`` waits for it to end."""

    def __init__(self, host: FlowHost, plan: Plan, instance_id: str, *, created: bool) -> None:
        self._host = host
        self.plan = plan
        self.instance_id = instance_id
        #: False when an idempotency key matched an instance that already existed (R4.1).
        self.created = created

    def __repr__(self) -> str:
        return f"FlowHandle({self.plan.ref}, {self.instance_id})"

    async def status(self) -> InstanceRecord:
        """The instance's current record (state, step, error) from the journal, whichever
        node runs it."""
        return await self._host.get(self.instance_id)

    async def result(self, *, timeout: float | None = None, poll: float = 0.1) -> Any:
        """The final state of a Completed instance; raises ``FlowFailed`` for a failed one.

        Waits on this node's own task when it runs the instance here, and otherwise watches
        the journal, so a handle works whichever node finishes the instance.
        """
        return await asyncio.wait_for(self._result(poll), timeout)

    async def _result(self, poll: float) -> Any:
        ephemeral = self._host._ephemeral_results.get(self.instance_id)
        if ephemeral is not None:
            return self._host._finish(self.plan, self.instance_id, ephemeral)
        task = self._host._tasks.get(self.instance_id)
        if task is not None:
            outcome: RunResult | None = None
            with contextlib.suppress(Exception):
                outcome = await asyncio.shield(task)
            if outcome is not None and outcome.final_state is not None:
                # This node ran it to the end: its result is what it committed.
                return self._host._finish(self.plan, self.instance_id, outcome)
        while True:
            record = await self._host.get(self.instance_id)
            if record.state.terminal:
                if record.state is InstanceState.COMPLETED:
                    return self.plan.state_model.model_validate_json(record.state_bag)
                raise FlowFailed(
                    self.instance_id,
                    record.state.value,
                    codec.loads(record.error) if record.error else None,
                )
            await asyncio.sleep(poll)


class _DurableCommitter:
    """Binds the engine's commits to a journal, under a live lease's token (R2.4)."""

    def __init__(self, host: FlowHost, instance_id: str, lease: DurableLease) -> None:
        self._host = host
        self._instance_id = instance_id
        self._lease = lease

    async def __call__(
        self,
        *,
        step: StepWrite | None = None,
        state_bag: str | None = None,
        state: InstanceState | None = None,
        error: str | None = None,
        events: tuple[EventWrite, ...] = (),
        notify_parent: bool = False,
    ) -> None:
        journal = self._host._require_stores().journal
        commit = StepCommit(
            instance_id=self._instance_id,
            # The token this run holds, live or not: a finished step's effect is done, and
            # the journal's fence, not this node's view of its lease, decides (R2.4).
            token=self._lease.fence_token,
            now=self._host.clock.store_time(),
            step=step,
            state_bag=state_bag,
            state=state,
            error=error,
            events=events,
            notify_parent=notify_parent,
        )
        with self._lease.writing():
            await journal.commit(commit)
        if events and self._host.outbox is not None:
            self._host.outbox.wake()


class _DurableWaits:
    """Binds the engine's waits to the stores, under the run's lease (R2.4)."""

    def __init__(self, host: FlowHost, record: InstanceRecord, lease: DurableLease) -> None:
        self._host = host
        self._record = record
        self._lease = lease

    async def signals(self, name: str) -> list[SignalRecord]:
        waits = self._host._require_stores().waits
        return list(await waits.signals(self._record.instance_id, name))

    async def suspend(
        self, wake: Wake, *, state_bag: str, consumed: tuple[int, ...], child: str | None
    ) -> bool:
        waits = self._host._require_stores().waits
        commit = SuspendCommit(
            instance_id=self._record.instance_id,
            token=self._lease.fence_token,  # the journal's fence decides (R2.4)
            now=self._host.clock.now(),
            wake=wake,
            state_bag=state_bag,
            consumed=consumed,
            child=child,
        )
        with self._lease.writing():
            return await waits.suspend(commit)

    async def child(self, instance_id: str) -> InstanceRecord | None:
        return await self._host._require_stores().journal.get(instance_id)

    async def start_child(
        self, node: SubFlowNode, child_id: str, input_value: BaseModel, scope: str
    ) -> None:
        assert node.plan is not None
        await self._host._start_child(
            node.plan, input_value, child_id, parent=self._record, scope=scope, node=node
        )

    async def compensate_child(self, child_id: str) -> None:
        # A child whose lease is held (its own undo resumed on a peer, a release that did not
        # land) is busy, not failed: wait for it without spending the compensation's budget,
        # for as long as this run may still write.
        delay = 0.2
        while True:
            try:
                await self._host._undo_child(child_id)
                return
            except FlowXError as exc:
                if exc.code != "sub_flow.child_busy":
                    raise
            self._lease.token  # noqa: B018 - raises LeaseLost once this run may not write
            await self._host.clock.sleep(delay)
            delay = min(delay * 2, 5.0)


class _EphemeralCommitter:
    """Ephemeral runs commit to nothing: the same loop, no journal."""

    async def __call__(
        self,
        *,
        step: StepWrite | None = None,
        state_bag: str | None = None,
        state: InstanceState | None = None,
        error: str | None = None,
        events: tuple[EventWrite, ...] = (),
        notify_parent: bool = False,
    ) -> None:
        return None


class FlowHost:
    """A FlowX node. Use as ``async with FlowHost(store=flowx.sqlite("flowx.db"), flows=[...])``.

    ``store=None`` gives a host that runs only Ephemeral flows; starting a Durable one is then
    refused with ``flow.durability_not_configured`` rather than run without a journal (R2.9).
    """

    def __init__(
        self,
        *,
        store: Stores | None = None,
        flows: Iterable[Plan] = (),
        settings: HostSettings | None = None,
        node_id: str | None = None,
        clock: Clock | None = None,
        registry: CapabilityRegistry | None = None,
        recovery: bool = True,
        publisher: EventPublisher | None = None,
        outbox_batch_size: int = 500,
        alerts: AlertSink | None = None,
        timers: bool = True,
    ) -> None:
        self.store = store
        self.settings = settings if settings is not None else HostSettings.load()
        if node_id and name_problem(node_id) is not None:  # "" or None: a generated id
            # It goes into lease rows and every log line: no forged lines, no driver errors.
            raise SettingsError(f"node_id {shown(node_id)} {name_problem(node_id)}")
        self.node_id = node_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.clock: Clock = clock or SystemClock()
        self.registry = registry or default_registry
        self._plans: dict[tuple[str, str], Plan] = {}
        self._latest: dict[str, Plan] = {}
        for plan in flows:
            self.register(plan)
        self._run_recovery = recovery
        self._run_timers = timers
        #: Told once per instance that ends CompensationFailed here (SPEC §8).
        self.alerts: AlertSink = alerts if alerts is not None else LoggingAlertSink()
        self._timer_task: asyncio.Task[None] | None = None
        self._wakers: set[asyncio.Task[Any]] = set()
        self._tasks: dict[str, asyncio.Task[RunResult | None]] = {}
        self._recovering: set[str] = set()
        self._ephemeral_results: dict[str, RunResult] = {}
        self._slots = asyncio.Semaphore(self.settings.max_concurrent_flows)
        self._stop = asyncio.Event()
        self._accepting = False
        self._opened = False
        self._recovery_task: asyncio.Task[None] | None = None
        self._connector: asyncio.Task[None] | None = None
        #: Why the journal could not be reached at start-up, for the error Durable calls get.
        self._unreachable_because = ""
        self._store_ready = False
        self._connected = asyncio.Event()
        self._threads: CapabilityThreads | None = None
        #: Renews every lease this node holds, in one store call per interval (R9.1).
        self._keeper: LeaseKeeper | None = None
        #: This node's clock moved to the journal's, for scheduling sweeps (R9.2).
        self.journal_clock = JournalClock(self.clock)
        self._clock_task: asyncio.Task[None] | None = None
        #: The outbox publisher loop, when the host was given a broker (SPEC §5).
        self.outbox: OutboxPublisher | None = None
        self._outbox_task: asyncio.Task[None] | None = None
        self._outbox_stop = asyncio.Event()
        if publisher is not None:
            if store is None:
                raise FlowXError(
                    "a publisher needs a store whose outbox it drains; pass store=... too",
                    code="host.publisher_without_store",
                )
            self.outbox = OutboxPublisher(
                store.outbox, publisher, batch_size=outbox_batch_size, clock=self.clock
            )
        self.recovery = (
            RecoveryService(
                index=store.recovery,
                settings=self.settings,
                clock=self.journal_clock,
                in_flight=lambda: len(self._recovering),
                resume=self._resume_candidate,
                free_flow_slots=lambda: self.settings.max_concurrent_flows - len(self._tasks),
                lease_expiry=self._lease_expiry,
            )
            if store is not None
            else None
        )
        self.timers = (
            TimerService(
                waits=store.waits,
                settings=self.settings,
                clock=self.clock,
                wake=lambda candidate: self._resume_candidate(candidate, False),
                free_flow_slots=lambda: self.settings.max_concurrent_flows - len(self._tasks),
                carried=lambda: [p.ref for p in self._plans.values()],
            )
            if store is not None
            else None
        )

    # -- registration ----------------------------------------------------------------------

    def register(self, plan: Plan) -> None:
        """Carry ``plan`` on this node. Several versions of one flow may be carried at once."""
        if not isinstance(plan, Plan):
            raise FlowXError(
                f"{plan!r} is not a built plan; call .build() on the flow definition",
                code="flow.not_a_plan",
            )
        self._plans[(plan.flow_id, plan.version)] = plan
        for node in walk(plan.body):
            # A parent carries its children: a node that runs the parent can start them.
            if (
                isinstance(node, SubFlowNode)
                and node.plan is not None
                and not self.carries(node.plan.flow_id, node.plan.version)
            ):
                self.register(node.plan)
        latest = self._latest.get(plan.flow_id)
        if latest is None or _vkey(plan.version) > _vkey(latest.version):
            self._latest[plan.flow_id] = plan

    def plan(self, flow: Plan | str, version: str | None = None) -> Plan:
        """The carried plan for a flow id (and version; the highest one by default)."""
        if isinstance(flow, Plan):
            version, flow = flow.version, flow.flow_id
        found = self._plans.get((flow, version)) if version else self._latest.get(flow)
        if found is None:
            raise FlowNotFound(flow, version, [p.ref for p in self._plans.values()])
        return found

    def carries(self, flow_id: str, version: str) -> bool:
        """Whether this host has the plan ``flow_id@version``: a worker resumes only
        instances of plans it carries."""
        return (flow_id, version) in self._plans

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> FlowHost:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.drain()

    async def open(self) -> None:
        """Connect the stores (migrating them) and start the recovery scan.

        A journal that cannot be reached *now* does not stop the node: it opens without it,
        runs Ephemeral flows, refuses Durable ones with the retryable ``JournalUnavailable``
        (SPEC §8), and keeps reconnecting in the background; ``ready`` turns true when the
        journal is back (R7.1). A store that answers but is wrong — not a FlowX journal, a
        schema newer than this code — is refused here, at once.
        """
        if self._opened:
            return
        self._stop = asyncio.Event()
        self._connected = asyncio.Event()
        self._threads = CapabilityThreads(self.settings.capability_threads, node=self.node_id)
        if self.store is not None:
            try:
                await self._connect()
            except (JournalUnavailable, LeaseUnavailable) as exc:
                self._unreachable_because = str(exc)
                log.warning(
                    "journal unavailable at start-up (%s); reconnecting in the "
                    "background, Durable flows refused until then",
                    exc,
                )
                self._connector = asyncio.get_running_loop().create_task(
                    self._reconnect(), name="flowx-reconnect"
                )
            except BaseException:
                self._threads.shutdown(wait=False, cancel_futures=True)
                self._threads = None
                raise
        self._opened = True
        self._accepting = True

    async def _connect(self) -> None:
        assert self.store is not None
        if isinstance(self.store, RoundTripBound):
            self.store.bound_round_trips(self.settings.round_trip_timeout)
        await self.store.open()
        if self.clock.store_time() is None:  # a test clock pins store time: nothing to measure
            try:
                await self._check_clock(self.store)
            except BaseException:
                await self.store.close()
                raise
        self._keep_leases(self.store)
        self._store_ready = True
        self._connected.set()
        if self._run_recovery and self.recovery is not None:
            self._recovery_task = asyncio.get_running_loop().create_task(
                self.recovery.run_forever(self._stop), name="flowx-recovery"
            )
        if self._run_timers and self.timers is not None:
            self._timer_task = asyncio.get_running_loop().create_task(
                self.timers.run_forever(self._stop), name="flowx-timers"
            )
        if self.outbox is not None and self._outbox_task is None:
            try:
                await self.outbox.publisher.open()
            except Exception as exc:
                # A broker that is down stops nothing (SPEC §8): the loop retries it.
                log.warning(
                    "broker %s unreachable at start-up (%r); events wait in the outbox",
                    self.outbox.publisher.name,
                    exc,
                )
            self._outbox_stop = asyncio.Event()
            self._outbox_task = asyncio.get_running_loop().create_task(
                self.outbox.run(self._outbox_stop), name="flowx-outbox"
            )

    async def _check_clock(self, store: Stores) -> None:
        """R9.2: refuse to start this far off the stores' clocks; then watch the offset."""
        limit = self.settings.clock_offset_limit
        offsets = await measure_clock_offsets(store, self.clock)
        check_clock_offsets(offsets, limit)
        self.journal_clock.learn(offsets)
        if offsets and self._clock_task is None:
            watch = ClockWatch(
                store,
                self.clock,
                limit=limit,
                every=_CLOCK_CHECK_EVERY,
                on_measured=self.journal_clock.learn,
            )
            self._clock_task = asyncio.get_running_loop().create_task(
                watch.run_forever(self._stop), name="flowx-clock-watch"
            )

    async def _reconnect(self) -> None:
        delay = 0.5
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=delay)
                return
            except TimeoutError:
                pass
            try:
                await self._connect()
            except (JournalUnavailable, LeaseUnavailable) as exc:
                delay = min(delay * 2, 10.0)
                log.info("journal still unavailable (%s); next try in %.1fs", exc, delay)
                continue
            except FlowXError as exc:
                log.error("journal reached but refused (%s); this node stays not ready", exc)
                return
            log.info("journal reachable again: %s", self.store.describe() if self.store else "")
            return

    @property
    def ready(self) -> bool:
        """Readiness (R7.1): open, accepting work, and every configured store reachable."""
        return self._opened and self._accepting and (self.store is None or self._store_ready)

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until ``ready`` (for probes, tests and the CLI)."""

        if self.store is not None and not self._store_ready:
            await asyncio.wait_for(self._connected.wait(), timeout)
        if not self.ready:
            raise FlowXError("the host is not open, or is draining", code="host.not_ready")

    async def drain(self, timeout: float | None = None) -> None:
        """Stop accepting work, finish in-flight steps, release every lease (R7.2).

        Each running instance finishes the step it is in, commits it, and is handed back
        (``Pending``) at that boundary, so a peer's next sweep takes it with no TTL to wait.
        The budget is one for the whole drain. Instances still running when it ends are
        cancelled — not failed: cancelling a step is not a failure, so nothing compensates; a
        sync capability's thread is abandoned and counted stuck — handed back ``Pending`` and
        their leases released, so a peer resumes them at once from their last commit.
        """
        self._accepting = False
        self._stop.set()
        if self._connector is not None:
            self._connector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connector
            self._connector = None
        budget = (
            self.settings.shutdown_drain_timeout.total_seconds() if timeout is None else timeout
        )
        # One budget for the whole drain, not one per phase: a worker told to stop within
        # ``shutdown_drain_timeout`` stops within it (issue 12 item 5).
        ends = time.monotonic() + budget

        def left() -> float:
            return max(ends - time.monotonic(), 0.0)

        # Let a recovery sweep in progress finish rather than cancel it: a takeover cancelled
        # between its lease and its first step would hold an instance for a whole TTL.
        # Whatever it takes over now yields at its first step (not accepting). The timer
        # service stops before the instances drain too: a wake now would only be handed back.
        await _stop_service(self._recovery_task, left(), "the recovery scan")
        await _stop_service(self._timer_task, left(), "the timer service")
        self._timer_task = None
        if self._wakers:
            _woken, late = await asyncio.wait(list(self._wakers), timeout=left())
            for waker in late:
                waker.cancel()
            if late:
                await asyncio.wait(late, timeout=_CANCEL_GRACE)
        tasks = list(self._tasks.values())
        if tasks:
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
                _done, stubborn = await asyncio.wait(pending, timeout=_CANCEL_GRACE)
                if stubborn:
                    log.error(
                        "drain: %d instance(s) ignored cancellation; their leases expire "
                        "after one TTL",
                        len(stubborn),
                    )
        if self._outbox_task is not None and self.outbox is not None:
            # Last: what the drained instances staged gets what is left of the budget before
            # the store closes; anything left stays in the outbox for the next publisher.
            self._outbox_stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._outbox_task, timeout=left())
            if not self._outbox_task.done():
                self._outbox_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._outbox_task
            self._outbox_task = None
            try:
                await self.outbox.publisher.close()
            except Exception:
                log.exception("drain: closing the publisher %s failed", self.outbox.publisher.name)
        await _stop_service(self._clock_task, 0, "the clock watch")
        self._clock_task = None
        if self._keeper is not None:
            # Every run has released its lease by now (each in its own ``finally``).
            await self._keeper.stop()
            self._keeper = None
        if self.store is not None and self._store_ready:
            await self.store.close()
        self._store_ready = False
        self._connected = asyncio.Event()
        self._recovery_task = None
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = None
        self._opened = False

    def _require_stores(self) -> Stores:
        if self.store is None:
            raise DurabilityNotConfigured(
                "this host has no journal, so it cannot run a Durable flow; pass "
                "store=flowx.sqlite('flowx.db') to FlowHost, or declare the flow "
                "profile=flowx.Ephemeral if losing it on a crash is acceptable"
            )
        if self._opened and not self._store_ready:
            cause = self._unreachable_because
            raise JournalUnavailable(
                f"the journal ({self.store.describe()}) has not been reachable since this "
                f"node started{f' ({cause})' if cause else ''}; it is reconnecting in the "
                "background, retry later"
            )
        return self.store

    def _require_accepting(self) -> None:
        if not self._opened:
            raise FlowXError(
                "the host is not open; use `async with FlowHost(...)`", code="host.not_open"
            )
        if not self._accepting:
            raise FlowXError("the host is draining and accepts no new work", code="host.draining")

    # -- starting --------------------------------------------------------------------------

    def _validate_input(self, plan: Plan, value: Any) -> BaseModel:
        if isinstance(value, plan.input_model):
            return value
        try:
            if isinstance(value, str | bytes):
                return plan.input_model.model_validate_json(value)
            return plan.input_model.model_validate(value)
        except ValidationError as exc:
            details = "; ".join(
                f"field '{'.'.join(str(p) for p in e['loc']) or '(root)'}': {e['msg']}"
                for e in exc.errors()
            )
            raise InputInvalid(plan.flow_id, details) from exc

    async def start(
        self,
        flow: Plan | str,
        input: Any,
        *,
        version: str | None = None,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
        run_here: bool = True,
    ) -> FlowHandle[Any]:
        """Start an instance; it is durable once this returns.

        A repeated ``idempotency_key`` returns the instance it started the first time, and
        starts nothing (R4.1); reusing it for another input raises ``IdempotencyConflict``.
        ``run_here=False`` leaves the instance ``Pending`` for any worker to pick up.
        """
        self._require_accepting()
        plan = self.plan(flow, version)
        value = self._validate_input(plan, input)
        input_text = start_input(
            plan, value, idempotency_key=idempotency_key, correlation_id=correlation_id
        )
        if not plan.durable:
            return await self._start_ephemeral(plan, value)
        stores = self._require_stores()
        if idempotency_key is not None:
            existing = await stores.journal.find_by_key(plan.flow_id, idempotency_key)
            if existing is not None:
                return self._existing(plan, existing, input_text)
            instance_id = str(
                uuid.uuid5(INSTANCE_NAMESPACE, f"{plan.flow_id}\x00{idempotency_key}")
            )
        else:
            instance_id = str(uuid.uuid4())
        now = self.clock.now()
        tenant = partition_of(plan, value)
        new = NewInstance(
            instance_id=instance_id,
            flow_id=plan.flow_id,
            flow_version=plan.version,
            input=input_text,
            state_bag=codec.dumps(plan.state_model()),
            state=InstanceState.RUNNING if run_here else InstanceState.PENDING,
            tenant_id=tenant_key(plan, tenant),
            idempotency_key=idempotency_key,
            correlation_id=correlation_id,
            deadline_at=now + plan.deadline if plan.deadline else None,
            codec_version=codec.CODEC_VERSION,
        )
        return await self._launch(plan, new, input_text, run_here=run_here)

    async def _start_child(
        self,
        plan: Plan,
        value: BaseModel,
        instance_id: str,
        *,
        parent: InstanceRecord,
        scope: str,
        node: SubFlowNode,
    ) -> None:
        """Create a sub-flow's child instance (its id derived from the parent's step, so a
        re-executed parent finds it) and run it here if this node can."""
        now = self.clock.now()
        tenant = partition_of(plan, value)
        try:  # R9.5: refused before anything is written; the parent's sub_flow step fails
            input_text = codec.dumps(value, root="input")
            tenant = tenant_key(plan, tenant)
        except SerialisationError as exc:
            raise InputInvalid(plan.flow_id, str(exc)) from exc
        new = NewInstance(
            instance_id=instance_id,
            flow_id=plan.flow_id,
            flow_version=plan.version,
            input=input_text,
            state_bag=codec.dumps(plan.state_model()),
            state=InstanceState.RUNNING if self._accepting else InstanceState.PENDING,
            tenant_id=parent.tenant_id if tenant is None else str(tenant),
            correlation_id=parent.correlation_id,
            # Never past the parent's: a parent that times out finds its child timed out too.
            deadline_at=min(
                (
                    d
                    for d in (now + plan.deadline if plan.deadline else None, parent.deadline_at)
                    if d is not None
                ),
                default=None,
            ),
            parent_instance_id=parent.instance_id,
            parent_scope=scope,
            parent_step_id=node.step_id,
            codec_version=codec.CODEC_VERSION,
        )
        # The run just read that there is no such child; if one appeared meanwhile (another
        # run of this parent), _launch finds it and starts nothing.
        await self._launch(plan, new, new.input, run_here=self._accepting, child=True)

    async def _launch(
        self,
        plan: Plan,
        new: NewInstance,
        input_text: str,
        *,
        run_here: bool,
        child: bool = False,
    ) -> FlowHandle[Any]:
        stores = self._require_stores()
        instance_id = new.instance_id
        idempotency_key = new.idempotency_key
        ttl = self.settings.lease_ttl
        sent = time.monotonic()
        created: CreateResult | None = None
        if isinstance(stores, LeasedCreate):
            # Lease first (R3.3), in the same write as the instance row.
            lease, created = await stores.create_leased(
                new, owner=self.node_id, ttl=ttl, now=self.clock.store_time()
            )
        else:
            lease = await stores.leases.acquire(
                instance_id, owner=self.node_id, ttl=ttl, now=self.clock.store_time()
            )
        if lease is None:
            # Another start with the same key holds the lease: its row is a moment away.
            for _ in range(50):
                existing = await stores.journal.get(instance_id)
                if existing is not None:
                    if child:  # the parent's own earlier run started it: it is the child
                        return FlowHandle(self, plan, instance_id, created=False)
                    return self._existing(plan, existing, input_text)
                await asyncio.sleep(0.05)
            raise JournalUnavailable(
                f"a concurrent start of {plan.flow_id} with key {idempotency_key!r} holds the "
                "lease but has not written the instance; retry"
            )
        durable = self._hold(stores, lease, sent)
        if created is None:
            try:
                # The store's clock, as for the lease (R9.2): ``updated_at`` is what the
                # recovery scan's idle filter reads if this node dies before its first commit.
                created = await stores.journal.create(
                    new, token=lease.token, now=self.clock.store_time()
                )
            except BaseException:
                await durable.release()
                raise
        if not created.created:
            await durable.release()
            if child:
                return FlowHandle(self, plan, instance_id, created=False)
            return self._existing(plan, created.instance, input_text)
        if not run_here:
            await durable.release()
            return FlowHandle(self, plan, instance_id, created=True)
        self._spawn(plan, created.instance, (), durable)
        return FlowHandle(self, plan, instance_id, created=True)

    def _existing(self, plan: Plan, record: InstanceRecord, input_text: str) -> FlowHandle[Any]:
        if record.flow_id != plan.flow_id or record.input != input_text:
            raise IdempotencyConflict(
                f"idempotency key {record.idempotency_key!r} already started instance "
                f"{record.instance_id} of {record.flow_id} with a different input; use a new "
                "key for a different request"
            )
        return FlowHandle(
            self, self.plan(record.flow_id, record.flow_version), record.instance_id, created=False
        )

    async def _start_ephemeral(self, plan: Plan, value: BaseModel) -> FlowHandle[Any]:
        instance_id = str(uuid.uuid4())
        execution = Execution(
            RunSpec.ephemeral(plan, instance_id, value),
            RunPorts(
                committer=_EphemeralCommitter(),
                clock=self.clock,
                registry=self.registry,
                executor=self._threads,
            ),
        )
        self._ephemeral_results[instance_id] = await execution.run()
        return FlowHandle(self, plan, instance_id, created=True)

    def _finish(self, plan: Plan, instance_id: str, result: RunResult) -> Any:
        if result.outcome == "completed":
            return plan.state_model.model_validate_json(result.state_bag)
        state = result.final_state
        raise FlowFailed(instance_id, state.value if state else result.outcome, result.error)

    # -- running ---------------------------------------------------------------------------

    def _spawn(
        self,
        plan: Plan,
        record: InstanceRecord,
        history: tuple[StepRecord, ...],
        lease: DurableLease,
        *,
        recovering: bool = False,
        queued: bool = False,
    ) -> None:
        lease.start()
        if recovering and not queued:
            self._recovering.add(record.instance_id)
        task = asyncio.get_running_loop().create_task(
            self._execute(plan, record, history, lease), name=f"flowx-{record.instance_id}"
        )
        self._tasks[record.instance_id] = task

        def done(t: asyncio.Task[RunResult | None], iid: str = record.instance_id) -> None:
            if self._tasks.get(iid) is t:
                del self._tasks[iid]
            self._recovering.discard(iid)
            if self.recovery is not None:
                self.recovery.slot_freed()
            if self.timers is not None:
                self.timers.slot_freed()

        task.add_done_callback(done)

    async def _execute(
        self,
        plan: Plan,
        record: InstanceRecord,
        history: tuple[StepRecord, ...],
        lease: DurableLease,
    ) -> RunResult | None:
        try:
            async with self._slots:
                execution = Execution(
                    RunSpec.from_record(
                        plan,
                        record,
                        history,
                        max_resumes=self.settings.max_resumes_without_progress,
                    ),
                    RunPorts(
                        committer=_DurableCommitter(self, record.instance_id, lease),
                        clock=self.clock,
                        registry=self.registry,
                        executor=self._threads,
                        should_yield=lambda: not self._accepting,
                        waits=_DurableWaits(self, record, lease),
                        guard=lambda: lease.token,
                    ),
                )
                try:
                    result = await execution.run()
                except asyncio.CancelledError:
                    if not self._accepting:
                        await _hand_back(execution, record.instance_id)
                    raise
                log.debug("instance %s: %s", record.instance_id, result.outcome)
            await self._after_run(plan, record, result)
            return result
        except NonDeterminismError as exc:
            log.error("instance %s cannot be resumed on this node: %s", record.instance_id, exc)
        except JournalUnavailable as exc:
            # A failed commit may have committed: re-read before re-executing anything. The
            # lease is released below, so recovery (here or on a peer) re-opens the instance
            # from what the journal really holds.
            log.warning(
                "instance %s: journal unavailable mid-run (%s); left for recovery",
                record.instance_id,
                exc,
            )
        except FlowXError as exc:
            log.error("instance %s stopped: %s", record.instance_id, exc)
        except Exception:
            log.exception("instance %s stopped by an unexpected error", record.instance_id)
        finally:
            await lease.release()
        return None

    async def _undo_child(self, child_id: str) -> None:
        """Undo a completed sub-flow child for its parent's compensation: take the child's
        lease, replay it and run its own compensations, journaled in its own history. It
        ends ``Failed`` (code ``flow.undone``), or ``CompensationFailed`` with its own alert."""
        stores = self._require_stores()
        record = await stores.journal.get(child_id)
        if record is None or record.state in (InstanceState.FAILED, InstanceState.TIMED_OUT):
            return  # never started, failed (and compensated itself), or already undone
        if record.state is InstanceState.COMPENSATION_FAILED:
            raise NonRetryableError(
                f"child instance {child_id} could not be undone: its own compensation ran out "
                f"({record.error}); replay the child, then this instance"
            )
        if record.state not in (InstanceState.COMPLETED, InstanceState.COMPENSATING):
            raise FlowXError(
                f"child instance {child_id} is {record.state.value}; it is undone once it ends",
                code="sub_flow.child_busy",
            )
        plan = self.plan(record.flow_id, record.flow_version)
        durable = await self._take_lease(stores, record)
        if durable is None:
            raise FlowXError(
                f"child instance {child_id} is held by another node; trying again",
                code="sub_flow.child_busy",
            )
        durable.start()
        try:
            history = await stores.journal.open(
                child_id, token=durable.token, now=self.clock.store_time()
            )
            child = history.instance
            execution = Execution(
                RunSpec.undo_child(plan, child, history.steps),
                RunPorts(
                    committer=_DurableCommitter(self, child_id, durable),
                    clock=self.clock,
                    registry=self.registry,
                    executor=self._threads,
                    waits=_DurableWaits(self, child, durable),
                    guard=lambda: durable.token,
                ),
            )
            result = await execution.run()
        finally:
            await durable.release()
        await self._after_run(plan, child, result, wake_parent=False)
        if result.outcome == "compensation_failed":
            raise NonRetryableError(
                f"child instance {child_id} could not be undone: its compensation ran out "
                f"({result.error}); replay the child, then this instance"
            )
        if result.final_state is None:
            raise FlowXError(
                f"undoing child instance {child_id} stopped ({result.outcome}); trying again",
                code="sub_flow.child_busy",
            )

    async def _after_run(
        self, plan: Plan, record: InstanceRecord, result: RunResult, *, wake_parent: bool = True
    ) -> None:
        """What follows a run on this node: arm the timer for a wait sealed here, raise the
        alert for a compensation that ran out, wake the parent of a child that ended."""
        if result.outcome == "suspended" and self.timers is not None:
            self.timers.poke()
        elif result.outcome == "compensation_failed" and result.alert is not None:
            COMPENSATION_FAILED.inc(plan.flow_id)
            try:
                await self.alerts.compensation_failed(result.alert)
            except Exception:
                log.exception(
                    "the alert sink failed for instance %s; the alert is also in the outbox "
                    "as a flowx.compensation_failed event",
                    record.instance_id,
                )
        elif result.outcome == "timed_out":
            DEADLINE_EXCEEDED.inc(plan.flow_id)
        parent = record.parent_instance_id
        if wake_parent and result.final_state is not None and parent is not None:
            # The child's last commit already made the parent Pending (durably); resuming it
            # here only saves the wait for a recovery sweep. Its own task: this lease is
            # released first.
            self._background(self._resume_quietly(parent), name=f"flowx-wake-{parent}")

    def _background(self, coro: Any, *, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._wakers.add(task)
        task.add_done_callback(self._wakers.discard)

    async def _resume_quietly(self, instance_id: str) -> None:
        """Resume an instance something just woke; a lost race or a draining node is fine —
        it is ``Pending``, and the next recovery sweep anywhere takes it."""
        if not self._accepting:
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

    # -- signals and replay ----------------------------------------------------------------

    async def signal(
        self,
        instance_id: str,
        name: str,
        payload: Any,
        *,
        key: str | None = None,
        run_here: bool = True,
    ) -> SignalReceipt:
        """Deliver a signal (R2.10). The payload is checked against the type the flow waits
        for; the signal is kept in the instance's inbox and, if the instance is waiting for
        it, wakes it: here if this node can run it (and ``run_here``, the default),
        otherwise it is left ``Pending`` for any worker.

        ``payload`` is a value of the awaited type (or a dict of its fields); a ``str`` or
        ``bytes`` payload is JSON text, as ``flowx signal --payload`` sends it.

        ``key`` makes a redelivery inert: a signal with a key already received writes
        nothing and returns ``status="duplicate"``, even after the instance has ended (a
        webhook sender that retries on error gets its success). So does any signal for a wait
        that can happen only once (not inside a ``for_each``) and has already taken its
        signal, or has one waiting in the inbox: of signals racing to it, exactly one is kept
        (``"late"`` if the wait timed out instead). A signal sent before the flow reaches its
        wait is kept (``"kept"``) and taken when it does. Raises ``InstanceNotFound``,
        ``InstanceFinished`` (the instance has ended and the signal is not a redelivery),
        ``FlowNotFound`` (this node does not carry the flow, so cannot check the payload), or
        ``FlowXError`` with code ``signal.unknown`` / ``signal.payload_invalid``.
        """
        stores = self._require_stores()
        record = await self.get(instance_id)
        if record.state.terminal and key is None:  # checked again under the row lock
            raise InstanceFinished(instance_id, record.state.value)
        plan = self.plan(record.flow_id, record.flow_version)
        waits = [n for n in walk(plan.body) if isinstance(n, AwaitSignalNode)]
        matching = [n for n in waits if n.signal == name]
        if not matching:
            known = ", ".join(sorted({n.signal for n in waits})) or "none"
            raise FlowXError(
                f"{plan.ref} never waits for a signal named {name!r} (it waits for: {known}); "
                "check the name",
                code="signal.unknown",
            )
        try:
            if isinstance(payload, str | bytes):
                value = TypeAdapter(matching[0].payload_type).validate_json(payload)
            else:
                value = TypeAdapter(matching[0].payload_type).validate_python(payload)
        except ValidationError as exc:
            details = "; ".join(
                f"field '{'.'.join(str(p) for p in e['loc']) or '(root)'}': {e['msg']}"
                for e in exc.errors()
            )
            raise FlowXError(
                f"signal {name!r} for {plan.ref} must be a {matching[0].payload_type!r}: {details}",
                code="signal.payload_invalid",
            ) from exc
        text = signal_payload(plan, name, value, key=key)  # R9.5: refused before any write
        limit: int | None = None
        if not record.state.terminal and self._waits_happen_once(plan, matching):
            # Each wait for this name happens once per instance, so the instance can take at
            # most one signal per wait that has not timed out: the store counts its inbox
            # against that under the lock that inserts (R2.10), so racing senders keep one.
            waiting_now = record.state is InstanceState.SUSPENDED and record.wake_signal == name
            ended: dict[int, StepRecord] = {}
            if not waiting_now or len(matching) > 1:
                ended = await self._ended_waits(instance_id, {n.step_id for n in matching})
            timed_out = [r for r in ended.values() if codec.loads(r.result).get("timed_out")]
            limit = len(matching) - len(timed_out)
            if not waiting_now and len(ended) == len(matching):
                # All of them are over: a redelivery (or too late), and keeping it would only
                # hide that.
                last = codec.loads(max(ended.values(), key=lambda r: r.sequence).result)
                return SignalReceipt(
                    instance_id=instance_id,
                    name=name,
                    seq=int(last.get("seq") or 0),
                    status="late" if last.get("timed_out") else "duplicate",
                    state=record.state,
                )
        try:
            receipt = await stores.waits.signal(
                instance_id, name, text, key=key, now=self.clock.now(), limit=limit
            )
        except UnknownInstance as exc:
            raise InstanceNotFound(instance_id) from exc
        if receipt.status == "woken" and run_here:
            self._background(self._resume_quietly(instance_id), name=f"flowx-wake-{instance_id}")
        return receipt

    @staticmethod
    def _waits_happen_once(plan: Plan, matching: list[AwaitSignalNode]) -> bool:
        """No wait among ``matching`` is inside a ``for_each`` (which runs it per element)."""
        looped = {
            n.step_id
            for loop in walk(plan.body)
            if isinstance(loop, ForEachNode)
            for n in walk(loop.body)
        }
        return all(n.step_id not in looped for n in matching)

    async def _ended_waits(self, instance_id: str, step_ids: set[int]) -> dict[int, StepRecord]:
        """The waits among ``step_ids`` that are over (took a signal or timed out), by id."""
        steps = await self._require_stores().journal.steps(instance_id)
        return {
            r.step_id: r for r in steps if r.step_id in step_ids and r.outcome is Outcome.SUCCESS
        }

    async def replay(
        self, instance_id: str, from_step: str | int, *, dry_run: bool = False
    ) -> ReplayPlan:
        """Re-run a failed instance after its fault is fixed (SPEC §8): ``flowx replay``.

        A ``CompensationFailed`` instance re-runs its remaining compensations, starting with
        the one that ran out (``from_step`` must name it). A ``Failed`` instance whose
        compensation never began re-runs forward from the step that failed (``from_step``
        must name it). Either way the retry budget starts afresh and every try is journaled as
        a new attempt; no row is changed or removed. ``dry_run`` only says what would run.
        Raises ``FlowXError`` with code ``instance.illegal_state`` when the instance cannot
        be replayed (its state, or a ``from_step`` that is not where it stopped).
        """
        stores = self._require_stores()
        record = await self.get(instance_id)
        plan = self.plan(record.flow_id, record.flow_version)
        steps = await stores.journal.steps(instance_id)
        target = plan_replay(plan, record, steps, from_step)
        if dry_run:
            return target
        durable = await self._take_lease(stores, record)
        if durable is None:
            raise FlowXError(
                f"instance {instance_id} is held by another node right now; retry",
                code="instance.busy",
            )
        try:
            current = await stores.journal.open(
                instance_id, token=durable.token, now=self.clock.store_time()
            )
            if current.instance.state is not record.state:
                raise FlowXError(
                    f"instance {instance_id} moved to {current.instance.state.value} meanwhile",
                    code="instance.illegal_state",
                )
            await stores.waits.rearm(
                instance_id, token=durable.token, now=self.clock.now(), from_step=target.step_id
            )
        finally:
            await durable.release()
        log.info(
            "instance %s re-armed for a replay from %r (%s): %s",
            instance_id,
            target.step,
            target.mode,
            ", ".join(target.reruns),
        )
        if self._accepting and self.carries(record.flow_id, record.flow_version):
            await self.resume(instance_id, queued=True)
        return target

    async def _resume_candidate(self, candidate: RecoveryCandidate, queued: bool) -> ResumeVerdict:
        if not self.carries(candidate.flow_id, candidate.flow_version):
            return "not_runnable"  # R7.3: leave it for a node that carries the version
        if candidate.instance_id in self._tasks or not self._accepting:
            return "lost_race"
        return await self.resume(candidate.instance_id, queued=queued)

    async def _lease_expiry(self, instance_id: str) -> datetime | None:
        lease = await self._require_stores().leases.current(instance_id)
        return None if lease is None else lease.expires_at

    async def resume(self, instance_id: str, *, queued: bool = False) -> ResumeVerdict:
        """Take over an instance and run it from its last commit. Losing the race is a skip."""
        stores = self._require_stores()
        record = await stores.journal.get(instance_id)
        if record is None:
            return "gone"
        if record.state.terminal:
            return "gone"
        if not self.carries(record.flow_id, record.flow_version):
            return "not_runnable"
        plan = self.plan(record.flow_id, record.flow_version)
        durable = await self._take_lease(stores, record)
        if durable is None:
            return "lost_race"
        try:
            history = await stores.journal.open(
                instance_id, token=durable.token, now=self.clock.store_time()
            )
        except (FencedOut, UnknownInstance):
            await durable.release()
            return "lost_race"
        except BaseException:
            await durable.release()
            raise
        if history.instance.state.terminal:
            await durable.release()
            return "gone"
        self._spawn(plan, history.instance, history.steps, durable, recovering=True, queued=queued)
        return "resumed"

    async def _take_lease(self, stores: Stores, record: InstanceRecord) -> DurableLease | None:
        """The lease on an existing instance, its token above the journal's fence (R2.4);
        ``None`` if another node holds it."""
        ttl = self.settings.lease_ttl
        sent = time.monotonic()
        lease = await stores.leases.acquire(
            record.instance_id,
            owner=self.node_id,
            ttl=ttl,
            now=self.clock.store_time(),
            floor=record.fence,
        )
        if lease is None:
            return None
        return self._hold(stores, lease, sent)

    def _keep_leases(self, stores: Stores) -> LeaseKeeper:
        if self._keeper is None:
            self._keeper = LeaseKeeper(
                stores.leases,
                ttl=self.settings.lease_ttl,
                renew_every=self.settings.renewal_interval,
                clock=self.clock,
                # A write queued behind others (a slow disk) and then bounded by its deadline
                # is slow, not stuck: only one outstanding for longer than both is stuck.
                stall_after=self.settings.round_trip_timeout
                + self.settings.renewal_interval.total_seconds(),
            ).start()
        return self._keeper

    def _hold(self, stores: Stores, lease: Lease, sent: float) -> DurableLease:
        """A granted lease, renewed from now on with every other lease of this node."""
        return DurableLease(
            stores.leases,
            lease,
            ttl=self.settings.lease_ttl,
            renew_every=self.settings.renewal_interval,
            clock=self.clock,
            acquired_at_monotonic=sent,
            keeper=self._keep_leases(stores),
        ).start()  # renewed from the moment it is granted, not once the run starts

    async def recover_once(self) -> RecoveryScanResult:
        """One recovery sweep now (tests and `flowx` tooling drive it directly)."""
        self._require_stores()  # no journal, or not reachable yet: a clear error, not a scan
        assert self.recovery is not None  # built whenever there is a store
        return await self.recovery.run_once()

    # -- reading ---------------------------------------------------------------------------

    async def get(self, instance_id: str) -> InstanceRecord:
        """The instance's record from the journal; ``InstanceNotFound`` if there is none."""
        if not storable_id(instance_id):  # no journal could hold it, so none does
            raise InstanceNotFound(instance_id)
        record = await self._require_stores().journal.get(instance_id)
        if record is None:
            raise InstanceNotFound(instance_id)
        return record

    def handle(
        self, instance_id: str, flow: Plan | str, version: str | None = None
    ) -> FlowHandle[Any]:
        """A handle on an existing instance (started elsewhere or earlier), to await its
        result or read its status."""
        return FlowHandle(self, self.plan(flow, version), instance_id, created=False)

    @property
    def in_flight(self) -> int:
        """How many instances this host is running right now: for a drain or a health check."""
        return len(self._tasks)

    @property
    def stuck_threads(self) -> int:
        """Capability threads still inside a call their step abandoned (a timeout, a drain);
        also exported as ``flowx_capability_threads_stuck{node}``."""
        return self._threads.stuck if self._threads is not None else 0

    @property
    def threads_all_stuck(self) -> bool:
        """Every capability thread is stuck: this node can run no sync capability (health)."""
        return self._threads is not None and self._threads.all_stuck

    async def wait_idle(self, timeout: float | None = None) -> None:
        """Wait until no instance runs on this node (for tests and the demo)."""

        async def idle() -> None:
            while self._tasks:
                await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

        await asyncio.wait_for(idle(), timeout)


#: How long a cancelled run gets to unwind (release its lease) once the drain budget is spent.
_CANCEL_GRACE = 1.0


async def _hand_back(execution: Execution, instance_id: str) -> None:
    """A run the drain cut: hand its instance back ``Pending`` (bounded; best effort — if it
    fails, the released lease still lets recovery take it, one TTL after its last write)."""
    try:
        handed = await asyncio.wait_for(execution.hand_back(), timeout=_CANCEL_GRACE / 2)
    except Exception as exc:
        log.warning("drain: instance %s not handed back (%s); recovery takes it", instance_id, exc)
        return
    if handed:
        log.info("drain: instance %s cut mid-step and handed back Pending", instance_id)


async def _stop_service(task: asyncio.Task[None] | None, budget: float, what: str) -> None:
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


def _vkey(version: str) -> tuple[int, ...]:
    core = version.split("-")[0].split("+")[0]
    return tuple(int(p) for p in core.split("."))
