"""``FlowHost``: one node. A thin facade over the node's parts.

It starts instances (lease first, R3.3), delivers signals, replays failed instances, and
drains on exit: stop taking work, let in-flight steps finish within
``shutdown_drain_timeout``, release every lease explicitly so a peer need not wait a TTL
(R7.2). The work itself is done by its parts: ``NodeContext`` (what every part needs),
``InstanceRunner`` (the only code that runs an instance), ``NodeServices`` (the recovery
scan, the timer service, the clock watch, the outbox loop) and ``flowx.engine.admission``
(which signals an instance can take).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar, overload

from pydantic import BaseModel

from flowx import codec, sealing
from flowx.capability import CapabilityRegistry, default_registry
from flowx.clock import Clock, SystemClock
from flowx.engine import admission
from flowx.engine.replay_plan import ReplayPlan
from flowx.engine.runner import RunResult
from flowx.errors import (
    FlowXError,
    IdempotencyConflict,
    InstanceNotFound,
    SettingsError,
)
from flowx.hosting import creation, replaying, stopping
from flowx.hosting.alerts import AlertSink, LoggingAlertSink
from flowx.hosting.archive import Archiver
from flowx.hosting.catalog import PlanCatalog, refuse_unsealable
from flowx.hosting.clock_offset import JournalClock
from flowx.hosting.context import NodeContext
from flowx.hosting.creation import INSTANCE_NAMESPACE, new_instance, started_input, validated_input
from flowx.hosting.handle import FlowHandle
from flowx.hosting.instance_runner import InstanceRunner
from flowx.hosting.lease import LeaseKeeper
from flowx.hosting.recovery import RecoveryScanResult, RecoveryService, ResumeVerdict
from flowx.hosting.retention import SweepReport
from flowx.hosting.services import NodeServices
from flowx.hosting.settings import HostSettings
from flowx.hosting.stopping import StopOutcome, request_of
from flowx.hosting.storable import same_input, signal_payload, storable_id
from flowx.hosting.threads import CapabilityThreads
from flowx.hosting.timers import TimerService
from flowx.names import name_problem, shown
from flowx.outbox import EventPublisher, OutboxPublisher
from flowx.plan.model import Plan
from flowx.stores.errors import InstanceFinished, UnknownInstance
from flowx.stores.protocols import Stores
from flowx.stores.records import InstanceRecord, SignalReceipt, StopRequest
from flowx.tracing import annotate, span

#: What ``start(plan, input)`` checks the input against, and what its handle's ``result()`` is.
InputT = TypeVar("InputT", bound=BaseModel)
StateT = TypeVar("StateT", bound=BaseModel)

log = logging.getLogger("flowx.host")

__all__ = ["INSTANCE_NAMESPACE", "FlowHandle", "FlowHost"]


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
        clock: Clock | None = None,
        registry: CapabilityRegistry | None = None,
        publisher: EventPublisher | None = None,
        alerts: AlertSink | None = None,
        archiver: Archiver | None = None,
    ) -> None:
        settings = settings if settings is not None else HostSettings.load()
        node_id = settings.node_id
        if node_id and name_problem(node_id) is not None:  # "" or None: a generated id
            # It goes into lease rows and every log line: no forged lines, no driver errors.
            raise SettingsError(f"node_id {shown(node_id)} {name_problem(node_id)}")
        clock = clock or SystemClock()
        plans = PlanCatalog()
        for plan in flows:
            plans.register(plan)
        if settings.keyring is None:
            refuse_unsealable(plans.all())
        if publisher is not None and store is None:
            raise FlowXError(
                "a publisher needs a store whose outbox it drains; pass store=... too",
                code="host.publisher_without_store",
            )
        self._ctx = ctx = NodeContext(
            store=store,
            settings=settings,
            node_id=node_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}",
            clock=clock,
            journal_clock=JournalClock(clock),
            registry=registry or default_registry,
            plans=plans,
            alerts=alerts if alerts is not None else LoggingAlertSink(),
            outbox=(
                OutboxPublisher(
                    store.outbox, publisher, batch_size=settings.outbox_batch_size, clock=clock
                )
                if publisher is not None and store is not None
                else None
            ),
        )
        self._runner = InstanceRunner(ctx)
        self._services = NodeServices(
            ctx,
            self._runner,
            run_recovery=settings.recovery,
            run_timers=settings.timers,
            archiver=archiver,
        )

    # -- what the node is made of (read-only views of its parts) ---------------------------

    @property
    def store(self) -> Stores | None:
        """The journal, leases and waits this node runs Durable flows on (``None``: none)."""
        return self._ctx.store

    @property
    def settings(self) -> HostSettings:
        """Every tunable of this node, validated when it was built (R3.6)."""
        return self._ctx.settings

    @property
    def node_id(self) -> str:
        """This node's name in lease rows and log lines."""
        return self._ctx.node_id

    @property
    def clock(self) -> Clock:
        """The clock runs and sweeps read (a test clock in tests)."""
        return self._ctx.clock

    @property
    def journal_clock(self) -> JournalClock:
        """This node's clock moved to the journal's, for scheduling sweeps (R9.2)."""
        return self._ctx.journal_clock

    @property
    def registry(self) -> CapabilityRegistry:
        """Where plans' capabilities are looked up by id and version."""
        return self._ctx.registry

    @property
    def alerts(self) -> AlertSink:
        """Told once per instance that ends CompensationFailed here (SPEC §8)."""
        return self._ctx.alerts

    @property
    def outbox(self) -> OutboxPublisher | None:
        """The outbox publisher loop, when the host was given a broker (SPEC §5)."""
        return self._ctx.outbox

    @property
    def recovery(self) -> RecoveryService | None:
        """The recovery scan (R3.4), built whenever there is a store."""
        return self._services.recovery

    @property
    def timers(self) -> TimerService | None:
        """The timer service that wakes due waits, built whenever there is a store."""
        return self._services.timers

    @property
    def _tasks(self) -> dict[str, asyncio.Task[RunResult | None]]:
        # Tests watch what runs here; the runner owns it.
        return self._runner.tasks

    @property
    def _threads(self) -> CapabilityThreads | None:
        # Tests inspect the pool; the context owns it.
        return self._ctx.threads

    @property
    def _keeper(self) -> LeaseKeeper | None:
        # Tests inspect the keeper; the context owns it.
        return self._ctx.keeper

    # -- registration ----------------------------------------------------------------------

    def register(self, plan: Plan) -> None:
        """Carry ``plan`` on this node. Several versions of one flow may be carried at once."""
        self._ctx.plans.register(plan)

    def plan(self, flow: Plan | str, version: str | None = None) -> Plan:
        """The carried plan for a flow id (and version; the highest one by default)."""
        return self._ctx.plans.plan(flow, version)

    @property
    def plans(self) -> list[Plan]:
        """Every plan this host carries, sub-flows included, by flow id then version."""
        return self._ctx.plans.all()

    def carries(self, flow_id: str, version: str) -> bool:
        """Whether this host has the plan ``flow_id@version``: a worker resumes only
        instances of plans it carries."""
        return self._ctx.plans.carries(flow_id, version)

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
        ctx = self._ctx
        if ctx.opened:
            return
        ctx.threads = CapabilityThreads(ctx.settings.capability_threads, node=ctx.node_id)
        self._services.reset()  # holds the collector's threshold: ``closed`` lets it go
        try:
            # /metrics first: it answers (journal_up 0) while the journal is still out of reach.
            self._services.metrics.start()
            if ctx.store is not None:
                await self._services.connect_or_retry()
        except BaseException:
            await self._services.closed()
            ctx.threads.shutdown(wait=False, cancel_futures=True)
            ctx.threads = None
            raise
        ctx.opened = True
        ctx.accepting = True

    @property
    def metrics_port(self) -> int | None:
        """The port ``/metrics`` is served on while open (``metrics_port`` setting), else
        ``None``."""
        return self._services.metrics.port

    @property
    def ready(self) -> bool:
        """Readiness (R7.1): open, accepting work, and every configured store reachable."""
        ctx = self._ctx
        return ctx.opened and ctx.accepting and (ctx.store is None or ctx.store_ready)

    @property
    def draining(self) -> bool:
        """Open, but accepting no new work: a drain has begun (R7.2)."""
        return self._ctx.opened and not self._ctx.accepting

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until ``ready`` (for probes, tests and the CLI)."""
        if self._ctx.store is not None and not self._ctx.store_ready:
            await asyncio.wait_for(self._services.connected.wait(), timeout)
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
        await self._services.drain(self._runner, timeout)

    # -- starting --------------------------------------------------------------------------

    @overload
    async def start(
        self,
        flow: Plan[InputT, StateT],
        input: InputT | Mapping[str, Any],
        *,
        version: str | None = None,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
        run_here: bool = True,
    ) -> FlowHandle[StateT]: ...

    @overload
    async def start(
        self,
        flow: str,
        input: Any,
        *,
        version: str | None = None,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
        run_here: bool = True,
    ) -> FlowHandle[BaseModel]: ...

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
        ctx = self._ctx
        ctx.require_accepting()
        plan = self.plan(flow, version)
        value = validated_input(plan, input)
        instance_id, input_text = started_input(
            plan,
            value,
            ctx.sealing,
            idempotency_key=idempotency_key,
            correlation_id=correlation_id,
            store=ctx.placement if plan.durable else None,
        )
        if not plan.durable:
            return await self._start_ephemeral(plan, value)
        ctx.require_stores()  # none, or not reachable: the clear error before anything else
        if idempotency_key is not None:
            existing = await creation.find_started(ctx, plan.flow_id, idempotency_key, instance_id)
            if existing is not None:
                return self._existing(plan, existing, input_text)
        attrs = {"flow": plan.flow_id, "version": plan.version, "tenant": None}
        with span("flowx.start", attrs) as started, codec.sealing(ctx.sealing(instance_id)):
            new = new_instance(
                plan,
                value,
                input_text,
                instance_id=instance_id,
                idempotency_key=idempotency_key,
                correlation_id=correlation_id,
                run_here=run_here,
                now=ctx.clock.now(),
            )
            annotate(started, instance=new.instance_id, tenant=new.tenant_id)
            launched = await self._runner.launch(plan, new, run_here=run_here)
        if launched.existing is not None:
            return self._existing(plan, launched.existing, input_text)
        return FlowHandle(self, plan, launched.instance_id, created=launched.created)

    def _existing(self, plan: Plan, record: InstanceRecord, input_text: str) -> FlowHandle[Any]:
        if record.flow_id != plan.flow_id or not same_input(
            self._ctx.sealing(record.instance_id), record, input_text
        ):
            raise IdempotencyConflict(
                f"idempotency key {record.idempotency_key!r} already started instance "
                f"{record.instance_id} of {record.flow_id} with a different input; use a new "
                "key for a different request"
            )
        return FlowHandle(
            self, self.plan(record.flow_id, record.flow_version), record.instance_id, created=False
        )

    def sealing_for(self, instance_id: str) -> sealing.Sealing | None:
        """How this node seals and opens ``instance_id``'s sensitive members (R9.8)."""
        return self._ctx.sealing(instance_id)

    async def _start_ephemeral(self, plan: Plan, value: BaseModel) -> FlowHandle[Any]:
        instance_id = str(uuid.uuid4())
        result = await self._runner.run_ephemeral(plan, instance_id, value)
        handle: FlowHandle[Any] = FlowHandle(self, plan, instance_id, created=True)
        handle._ephemeral = result
        return handle

    async def resume(self, instance_id: str, *, queued: bool = False) -> ResumeVerdict:
        """Take over an instance and run it from its last commit. Losing the race is a skip."""
        return await self._runner.resume(instance_id, queued=queued)

    async def recover_once(self) -> RecoveryScanResult:
        """One recovery sweep now (tests and `flowx` tooling drive it directly)."""
        self._ctx.require_stores()  # no journal, or not reachable yet: a clear error, not a scan
        assert self.recovery is not None  # nosec B101  # invariant: built whenever there is a store
        return await self.recovery.run_once()

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
        stores = self._ctx.require_stores()
        record = await self.get(instance_id)
        if record.state.terminal and key is None:  # checked again under the row lock
            raise InstanceFinished(instance_id, record.state.value)
        plan = self.plan(record.flow_id, record.flow_version)
        target = admission.target(plan, name)
        value = target.parse(payload)
        with codec.sealing(self._ctx.sealing(instance_id)):  # R9.8: sealed for its instance
            text = signal_payload(plan, name, value, key=key)  # R9.5: refused before writing
        steps = (
            await stores.journal.steps(instance_id) if admission.needs_steps(target, record) else ()
        )
        admitted = admission.admit(target, record, steps)
        if admitted.settled is not None:
            return admitted.settled
        attrs = {"flow": record.flow_id, "instance": instance_id, "signal": name}
        with span("flowx.signal", attrs, parent=record.trace_context) as delivered:
            try:
                receipt = await stores.waits.signal(
                    instance_id, name, text, key=key, now=self._ctx.clock.now(),
                    limit=admitted.limit,
                )  # fmt: skip
            except UnknownInstance as exc:
                raise InstanceNotFound(instance_id) from exc
            annotate(delivered, status=receipt.status)
        if receipt.status == "woken" and run_here:
            self._runner.wake(instance_id)
        return receipt

    async def replay(
        self,
        instance_id: str,
        from_step: str | int,
        *,
        dry_run: bool = False,
        deadline: datetime | timedelta | None = None,
        run_here: bool = True,
    ) -> ReplayPlan:
        """Re-run a stopped instance after its fault is fixed (SPEC §8): ``flowx replay``.

        A ``Failed``, ``TimedOut`` or ``Cancelled`` instance re-runs forward from
        ``from_step``, any step up to where it stopped: the steps before it keep their
        journaled results; the effects of that step and later ones that still stand are
        undone first by their compensations (newest first), then they run again, each as a
        new request (a new idempotency key). A timed-out instance needs ``deadline`` (a
        moment, or a duration from now). A ``CompensationFailed`` instance re-runs its
        remaining compensations, starting with the one that ran out (``from_step`` must name
        it); a ``Quarantined`` one resumes where it stopped. Retry budgets start afresh and
        every try is journaled as a new attempt; no row is changed or removed. ``dry_run``
        only says what would run; ``run_here=False`` leaves the re-armed instance for a
        worker. Raises ``FlowXError`` with code ``instance.illegal_state``
        when the instance cannot be replayed from there (the message says from where).
        """
        record = await self.get(instance_id)
        plan = self.plan(record.flow_id, record.flow_version)
        target, when = await replaying.planned(self._ctx, plan, record, from_step, deadline)
        if dry_run:
            return target
        await replaying.rearm(self._ctx, self._runner, record, target, when)
        log.info(
            "instance %s re-armed for a replay from %r (%s): %s",
            instance_id,
            target.step,
            target.mode,
            ", ".join(target.reruns),
        )
        if run_here and self._ctx.accepting and self.carries(record.flow_id, record.flow_version):
            await self.resume(instance_id, queued=True)
        return target

    # -- cancel and terminate ----------------------------------------------------------------

    async def cancel(self, instance_id: str, reason: str, *, by: str = "") -> StopOutcome:
        """Cancel an instance and its unfinished sub-flow children (R9.4): each stops at its
        next boundary (a running step is cut as a step timeout cuts it), compensates what
        had finished, and ends ``Cancelled`` with who and why as its error.

        ``by`` names who asked (default: this node). The request is journaled before this
        returns; an instance running on another node stops at that node's next lease
        renewal. A ``Pending`` or ``Suspended`` instance is stopped here: run here if this
        host carries its flow, ended here if it has no finished step to compensate, else
        left ``Pending`` for a worker that carries the flow (``StopOutcome.waiting``).
        Repeating it is inert. Raises ``InstanceNotFound``, ``IllegalState`` (it has already
        ended other than by a stop), or ``RequestInvalid`` (no reason)."""
        request = request_of("cancel", reason, by, self._ctx)
        return await self._stop(instance_id, request)

    async def terminate(self, instance_id: str, reason: str, *, by: str = "") -> StopOutcome:
        """Terminate an instance and its unfinished sub-flow children (R9.4): like
        ``cancel``, but nothing is compensated — not even a compensation already under way —
        and it ends ``Terminated``. A terminate may follow a cancel; never the reverse. Any
        node can end a waiting instance this way: no flow code runs."""
        request = request_of("terminate", reason, by, self._ctx)
        return await self._stop(instance_id, request)

    async def _stop(self, instance_id: str, request: StopRequest) -> StopOutcome:
        if not storable_id(instance_id):  # no journal could hold it, so none does
            raise InstanceNotFound(instance_id)
        return await stopping.stop(self._ctx, self._runner, instance_id, request)

    # -- retention ---------------------------------------------------------------------------

    async def sweep_retention(self, *, dry_run: bool = False) -> SweepReport:
        """Delete what is past its retention window now (R2.13), archiving it first if the
        host has an archiver (``archiver=``, or ``retention_archive_dir``); ``dry_run`` only
        counts. Workers sweep on their own every ``retention_sweep_interval``; one node
        sweeps at a time, and a node that finds another sweeping answers ``busy``."""
        self._ctx.require_stores()
        return await self._services.retention.sweep_once(dry_run=dry_run)

    # -- reading ---------------------------------------------------------------------------

    async def get(self, instance_id: str) -> InstanceRecord:
        """The instance's record from the journal; ``InstanceNotFound`` if there is none."""
        if not storable_id(instance_id):  # no journal could hold it, so none does
            raise InstanceNotFound(instance_id)
        record = await self._ctx.require_stores().journal.get(instance_id)
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
        return len(self._runner.tasks)

    @property
    def stuck_threads(self) -> int:
        """Capability threads still inside a call their step abandoned (a timeout, a drain);
        also exported as ``flowx_capability_threads_stuck{node}``."""
        threads = self._ctx.threads
        return threads.stuck if threads is not None else 0

    @property
    def threads_all_stuck(self) -> bool:
        """Every capability thread is stuck: this node can run no sync capability (health)."""
        threads = self._ctx.threads
        return threads is not None and threads.all_stuck

    async def wait_idle(self, timeout: float | None = None) -> None:
        """Wait until no instance runs on this node, nor is about to: a wake under way (a
        child's end resuming its parent here) counts (for tests and the demo)."""
        runner = self._runner

        async def idle() -> None:
            while runner.tasks or runner.wakers:
                # ``wait``, not ``gather``: a timeout leaves what it waited for running (a
                # wake cut between its lease and its run would hold the lease for a TTL).
                await asyncio.wait([*runner.tasks.values(), *runner.wakers])

        await asyncio.wait_for(idle(), timeout)
