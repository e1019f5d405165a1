"""The step loop: run one instance of a plan, or resume it from its journal.

A fresh run and a resume are the same loop (R2.8). The loop walks the plan; at each node it
looks up the rows already committed for ``(scope, step_id)``. A ``Success`` row is replayed —
its recorded result is applied to the state exactly as a live result is, without calling the
capability — and anything else is executed and committed. So the frontier (what to skip) is
derived from the rows, never stored.

The loop does no I/O of its own: it commits through a ``Committer``, which the host binds to a
journal and a lease (Durable) or to nothing (Ephemeral), and it waits through a ``WaitPort``
(signals, timers, sub-flows), which only a Durable run has.

A wait ends the run, not the instance: the instance is sealed ``Suspended`` at its frontier
and the run returns ``suspended``, holding no task and no lease (R6.3). Whatever wakes it —
a signal, its timer, its child's end — resumes it through this same loop, on any node.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NoReturn, Protocol

from pydantic import BaseModel, TypeAdapter, ValidationError

from flowx import codec
from flowx.capability import Capability, CapabilityRegistry, default_registry
from flowx.clock import Clock
from flowx.engine.context import StepContext
from flowx.engine.timeouts import DeadlineReached, attempt_limit, invoke_bounded
from flowx.errors import (
    CapabilityNotFound,
    FlowXError,
    InputInvalid,
    NonDeterminismError,
    NonRetryableError,
    SerialisationError,
)
from flowx.plan.events import contract_of
from flowx.plan.model import (
    DEFAULT_COMPENSATION_RETRY,
    NO_RETRY,
    AwaitSignalNode,
    EmitNode,
    ForEachNode,
    ForkNode,
    Node,
    Plan,
    Retry,
    SleepNode,
    StepNode,
    SubFlowNode,
    walk,
)
from flowx.stores.errors import FencedOut, LeaseLost
from flowx.stores.records import (
    CHILD_WAIT,
    EventWrite,
    InstanceRecord,
    InstanceState,
    Outcome,
    SignalRecord,
    StepRecord,
    StepWrite,
    Wake,
)

log = logging.getLogger("flowx.engine")

#: Event ids are derived, so an emit re-executed after a crash stages the same id.
EVENT_NAMESPACE = uuid.UUID("6f1c3b8e-2b0a-4c57-9d3e-4e1f0c9a7d21")
#: Child instance ids are derived from (parent, scope, step), so a parent re-executed after a
#: crash finds the child it already started instead of starting a second one.
CHILD_NAMESPACE = uuid.UUID("0c5e7a1d-93f4-4b2e-8d6a-5f1b2c3d4e70")
#: The error code of a flow past its deadline (SPEC §8); its failure row ends it TimedOut.
DEADLINE_EXCEEDED = "flow.deadline_exceeded"
#: The event staged with a CompensationFailed transition: the alert, kept durably (SPEC §8).
COMPENSATION_FAILED_EVENT = "flowx.compensation_failed"
#: R9.5: a result the journal cannot store (or the state it makes) fails its own step, once.
RESULT_UNSTORABLE = "step.result_unstorable"


def compensable(node: StepNode | SubFlowNode) -> bool:
    """A step with a compensation, or a sub-flow whose child has something to undo."""
    if isinstance(node, StepNode):
        return node.compensate is not None
    return node.plan is not None and any(
        isinstance(n, SubFlowNode) or (isinstance(n, StepNode) and n.compensate is not None)
        for n in walk(node.plan.body)
    )


def child_instance_id(parent_id: str, scope: str, step_id: int) -> str:
    return str(uuid.uuid5(CHILD_NAMESPACE, f"{parent_id}/{scope}/{step_id}"))


class Committer(Protocol):
    """**Protocol:** write one step boundary; raise ``FencedOut``/``LeaseLost`` if this node
    may no longer write."""

    def __call__(
        self,
        *,
        step: StepWrite | None = None,
        state_bag: str | None = None,
        state: InstanceState | None = None,
        error: str | None = None,
        events: tuple[EventWrite, ...] = (),
        notify_parent: bool = False,
    ) -> Awaitable[None]: ...


class WaitPort(Protocol):
    """**Protocol:** what a run needs to wait: the signal inbox, the seal, the child it waits
    for. The host binds it to the stores and the run's lease; the seal is fenced like a
    commit, and raises ``FencedOut``/``LeaseLost`` the same way."""

    async def signals(self, name: str) -> Sequence[SignalRecord]: ...

    async def suspend(
        self, wake: Wake, *, state_bag: str, consumed: tuple[int, ...], child: str | None
    ) -> bool: ...

    async def child(self, instance_id: str) -> InstanceRecord | None: ...

    async def start_child(
        self, node: SubFlowNode, child_id: str, input_value: BaseModel, scope: str
    ) -> None: ...

    async def compensate_child(self, child_id: str) -> None:
        """Undo a child that completed: run its own compensations. Raises
        ``NonRetryableError`` if they ran out, another error to be tried again."""
        ...


class _ChildUndo:
    """A completed sub-flow's compensation, shaped like a capability: its undo is the child's
    own compensations, run in the child's journal (its attempts are rows there)."""

    idempotent = True

    def __init__(self, waits: WaitPort, child_id: str, node: SubFlowNode) -> None:
        assert node.plan is not None
        self._waits = waits
        self._child_id = child_id
        self.id = f"sub_flow:{node.plan.flow_id}"
        self.version = node.plan.version
        self.ref = f"{self.id}@{self.version}"

    async def invoke(self, ctx: StepContext, argument: Any, executor: Executor | None) -> None:
        await self._waits.compensate_child(self._child_id)


@dataclass(frozen=True, kw_only=True, slots=True)
class CompensationAlert:
    """Raised once when an instance ends ``CompensationFailed`` (SPEC §8): which compensation
    ran out of attempts, and what it said last. Fix the fault, then ``flowx replay``."""

    flow_id: str
    flow_version: str
    instance_id: str
    tenant_id: str | None
    step: str
    scope: str
    capability: str
    attempts: int
    last_error: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """The alert as plain JSON-ready fields, for a log line, a ticket or a webhook."""
        return {
            "flow_id": self.flow_id,
            "flow_version": self.flow_version,
            "instance_id": self.instance_id,
            "tenant_id": self.tenant_id,
            "step": self.step,
            "scope": self.scope,
            "capability": self.capability,
            "attempts": self.attempts,
            "last_error": self.last_error,
        }


RunOutcome = Literal[
    "completed",
    "failed",
    "timed_out",
    "compensation_failed",
    "aborted",
    "yielded",
    "suspended",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class RunResult:
    """How one run of an instance ended on this node."""

    outcome: RunOutcome
    state_bag: str
    error: dict[str, Any] | None = None
    #: Why the run stopped without finishing: this node lost the right to write (R3.5).
    abort_reason: str | None = None
    executed: int = 0
    replayed: int = 0
    #: A suspended run: when its timer is due (``None``: only a signal or a child wakes it).
    wake_at: datetime | None = None
    #: A run that ended CompensationFailed: what to tell the operator.
    alert: CompensationAlert | None = None

    @property
    def final_state(self) -> InstanceState | None:
        return {
            "completed": InstanceState.COMPLETED,
            "failed": InstanceState.FAILED,
            "timed_out": InstanceState.TIMED_OUT,
            "compensation_failed": InstanceState.COMPENSATION_FAILED,
        }.get(self.outcome)


class _StepFailed(Exception):
    def __init__(self, node: Node, scope: str, error: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.node = node
        self.scope = scope
        self.error = error


class _Yield(Exception):
    """Raised at a step boundary when the host asks the run to hand the instance back."""


class _Suspended(Exception):
    """Raised once the instance is sealed at a wait: the run ends here, the instance does not."""

    def __init__(self, wake_at: datetime | None) -> None:
        super().__init__("suspended")
        self.wake_at = wake_at


class _DeadlineExceeded(Exception):
    def __init__(
        self, node: Node, scope: str, deadline: datetime, *, running: bool = False
    ) -> None:
        super().__init__(f"deadline {deadline.isoformat()} passed")
        self.node = node
        self.scope = scope
        self.deadline = deadline
        #: Reached while the step ran (its attempt was cancelled), not at a step boundary.
        self.running = running


class _Halted(Exception):
    """Raised instead of running anything new: a fork sibling failed, or the instance is
    compensating (resumed or replayed after its compensation began)."""

    def __init__(self, node: Node | None = None, scope: str = "") -> None:
        super().__init__("halted")
        self.node = node
        self.scope = scope


class _Abort(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(kw_only=True, slots=True)
class _Done:
    node: StepNode | SubFlowNode
    scope: str
    argument: Any
    result: Any
    #: Commit order: ``(0, sequence)`` for a replayed row, ``(1, n)`` for this run's n-th
    #: commit. Compensation runs in reverse of it, which is the order the effects happened
    #: in even when fork branches replay in another interleaving.
    order: tuple[int, int] = (0, 0)


@dataclass(kw_only=True, slots=True)
class _Attempts:
    """What the journal (plus this run's own commits) says about one ``(scope, step_id)``."""

    last_attempt: int = 0
    success: StepRecord | None = None
    failures: list[dict[str, Any]] = field(default_factory=list)
    last_failure_drawn: dict[str, list[Any]] | None = None
    compensated: bool = False
    compensation_failures: list[dict[str, Any]] = field(default_factory=list)
    capability_version: str | None = None


def error_payload(exc: BaseException, *, retryable: bool | None = None) -> dict[str, Any]:
    """The JSON stored as a failed attempt's result."""
    if retryable is None:
        retryable = not isinstance(
            exc, NonRetryableError | SerialisationError | ValidationError | NonDeterminismError
        )
    payload: dict[str, Any] = {
        "type": type(exc).__qualname__,
        # R9.5: a failure row must be storable even when its message quotes a value that is not.
        "message": codec.printable(str(exc)[:4000]),
        "code": getattr(exc, "code", None),
        "retryable": retryable,
    }
    if isinstance(exc, SerialisationError) and exc.path is not None:
        payload["field"] = codec.printable(exc.path)
    return payload


def _exhausted(failures: list[dict[str, Any]], policy: Retry) -> bool:
    return bool(failures) and (
        not failures[-1].get("retryable", True) or len(failures) >= policy.attempts
    )


class Execution:
    """One run of one instance on this node. Create, ``await run()``, discard."""

    def __init__(
        self,
        *,
        plan: Plan,
        instance_id: str,
        input_value: BaseModel,
        committer: Committer,
        clock: Clock,
        history: Sequence[StepRecord] = (),
        resume_count: int = 0,
        max_resumes: int = 10,
        tenant_id: str | None = None,
        registry: CapabilityRegistry | None = None,
        on_step: Callable[[str, StepWrite], None] | None = None,
        executor: Executor | None = None,
        should_yield: Callable[[], bool] | None = None,
        waits: WaitPort | None = None,
        deadline_at: datetime | None = None,
        last_wake: Wake | None = None,
        replay_sequence: int | None = None,
        is_child: bool = False,
        state: InstanceState | None = None,
        guard: Callable[[], object] | None = None,
        undo: bool = False,
    ) -> None:
        self.plan = plan
        # Asked before each new step attempt: a draining node finishes the step it is in,
        # then hands the instance back (``Pending``) so a peer takes it without waiting a
        # TTL (R7.2). Compensation is never interrupted this way.
        self._should_yield = should_yield
        self.instance_id = instance_id
        self.input = input_value
        self.commit = committer
        self.clock = clock
        self.registry = registry or default_registry
        self.tenant_id = tenant_id
        self.state: BaseModel = plan.state_model()
        self.completed: list[_Done] = []
        self.executed = 0
        self.replayed = 0
        self._on_step = on_step
        self._executor = executor
        self._waits = waits
        self._deadline_at = deadline_at
        # The wait this instance was last sealed at: a run that reaches the same wait again
        # keeps its deadline instead of starting the timeout (or the sleep) over.
        self._last_wake = last_wake
        self._is_child = is_child
        # Called before every capability (a step, a compensation): raises ``LeaseLost`` once
        # this node may no longer write, so a zombie stops before an effect, not after (R3.5).
        self._guard = guard
        # Fork branches commit concurrently: commits (and the state they snapshot) take turns.
        self._lock = asyncio.Lock()
        self._commits = 0
        self._halted = False
        # R4.3 hazard: a step that kills its process would be resumed for ever. Every takeover
        # without a step commit in between is counted by the journal; past the limit, the step
        # about to run is failed instead of run again.
        self._poisoned = resume_count > max_resumes
        self._resume_count = resume_count
        self._attempts: dict[tuple[str, int], _Attempts] = {}
        #: Inbox seqs of the signals each wait has already taken, by signal name.
        self._consumed: dict[str, set[int]] = {}
        # The last body node's success commit also completes the instance: one write fewer
        # per flow on the hot path, and no window in which the last step is in but the
        # instance is not yet Completed.
        last = plan.body[-1]
        self._final_node: Node | None = last if isinstance(last, StepNode | EmitNode) else None
        self._completed = False
        # Set once this run is ending the instance (failing, compensating, timing out): a run
        # cut from then on is not handed back ``Pending`` — it resumes from its own rows.
        self._ending = False
        nodes = {n.step_id: n for n in walk(plan.body)}
        # A replay (``flowx replay``) gives retry budgets afresh from ``replay_sequence`` on:
        # the compensation's, when compensation had begun; otherwise the failed step's.
        self._replay_sequence = replay_sequence
        began = any(
            r.outcome in (Outcome.COMPENSATED, Outcome.COMPENSATION_FAILURE) for r in history
        )
        self._forward_replay = replay_sequence is not None and not began
        # Once compensation has begun, nothing forward runs again: a resumed (or replayed)
        # run only replays what committed, finds the failure again, and compensates. Without
        # this a fork's healthy branch would run its next step before its sibling's
        # journaled failure is reached.
        # ``undo``: a completed child undone by its parent's compensation — replay it whole,
        # then compensate it.
        self._compensating = (
            undo
            or began
            or state
            in (
                InstanceState.COMPENSATING,
                InstanceState.COMPENSATION_FAILED,
            )
        )
        for row in history:
            node = nodes.get(row.step_id)
            expected = node.name if node is not None else None
            if expected != row.step_name:
                raise NonDeterminismError(
                    f"instance {instance_id} has a journal row for step {row.step_id} "
                    f"named {row.step_name!r}, but {plan.ref} names that step "
                    f"{expected!r}; a running instance's plan changed without a new version. "
                    "Deploy the old version beside the new one until its instances finish"
                )
            if (
                isinstance(node, AwaitSignalNode)
                and row.outcome is Outcome.SUCCESS
                and (taken := codec.loads(row.result).get("seq")) is not None
            ):
                self._consumed.setdefault(node.signal, set()).add(int(taken))
            self._absorb(
                (row.scope, row.step_id),
                row.attempt,
                row.outcome,
                row.result,
                row.nondeterministic,
                row.capability_version,
                row,
            )

    # -- bookkeeping ---------------------------------------------------------------------

    def _absorb(
        self,
        key: tuple[str, int],
        attempt: int,
        outcome: Outcome,
        result: str,
        drawn: str | None,
        version: str | None,
        row: StepRecord | None,
    ) -> None:
        a = self._attempts.setdefault(key, _Attempts())
        a.last_attempt = max(a.last_attempt, attempt)
        before_replay = (
            row is not None
            and self._replay_sequence is not None
            and row.sequence < self._replay_sequence
        )
        if outcome is Outcome.SUCCESS:
            a.success = row
            a.capability_version = version
        elif outcome is Outcome.FAILURE:
            if not (before_replay and self._forward_replay):
                a.failures.append(codec.loads(result))
            a.last_failure_drawn = codec.loads(drawn) if drawn else None
            a.capability_version = a.capability_version or version
        elif outcome is Outcome.COMPENSATED:
            a.compensated = True
        elif not before_replay:
            a.compensation_failures.append(codec.loads(result))

    def _order(self, row: StepRecord | None) -> tuple[int, int]:
        if row is not None:
            return (0, row.sequence)
        return (1, self._commits)

    async def _write(
        self,
        key: tuple[str, int],
        step: StepWrite,
        *,
        apply: tuple[str | None, Any] | None = None,
        prepared: tuple[BaseModel, BaseModel, str | None] | None = None,
        snapshot: bool = False,
        events: tuple[EventWrite, ...] = (),
        state: InstanceState | None = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        """Commit one row. ``apply=(into, value)`` puts a result into the state under the
        commit lock, so concurrent fork branches never overwrite each other's fields.
        ``prepared=(base, new, bag)`` is that state (and its encoding, if known) already
        computed from ``base``: used as is when no other branch moved the state meanwhile
        (always, outside a fork)."""
        async with self._lock:
            bag = None
            if apply is None:
                new_state = self.state
            elif prepared is not None and prepared[0] is self.state:
                new_state, bag = prepared[1], prepared[2]
            else:
                new_state = self._applied(*apply)
            wants_bag = snapshot or (apply is not None and apply[0] is not None)
            notify = self._is_child and state is not None and state.terminal
            try:
                await self.commit(
                    step=step,
                    state_bag=(bag or codec.dumps(new_state)) if wants_bag else None,
                    events=events,
                    state=state,
                    error=codec.dumps(error) if error is not None else None,
                    notify_parent=notify,
                )
            except (FencedOut, LeaseLost) as exc:
                raise _Abort(str(exc)) from exc
            self.state = new_state
            self._commits += 1
        self._absorb(
            key,
            step.attempt,
            step.outcome,
            step.result,
            step.nondeterministic,
            step.capability_version,
            None,
        )
        if self._on_step is not None:
            self._on_step(self.instance_id, step)

    async def _transition(
        self,
        state: InstanceState,
        *,
        error: dict[str, Any] | None = None,
        events: tuple[EventWrite, ...] = (),
    ) -> None:
        async with self._lock:
            try:
                await self.commit(
                    state=state,
                    state_bag=codec.dumps(self.state),
                    error=codec.dumps(error) if error is not None else None,
                    events=events,
                    notify_parent=self._is_child and state.terminal,
                )
            except (FencedOut, LeaseLost) as exc:
                raise _Abort(str(exc)) from exc

    async def _suspend(
        self,
        node: Node,
        scope: str,
        *,
        at: datetime | None,
        signal: str | None,
        child: str | None,
        clamp: bool = True,
    ) -> bool:
        """Seal the instance at this wait; ``False`` if what it waits for is already there.
        The timer is armed at the deadline too, unless ``clamp`` is off."""
        assert self._waits is not None  # FLOWX1017: waits exist only in Durable flows
        if clamp and self._deadline_at is not None:
            at = self._deadline_at if at is None else min(at, self._deadline_at)
        wake = Wake(step_id=node.step_id, scope=scope, at=at, signal=signal)
        async with self._lock:
            try:
                sealed = await self._waits.suspend(
                    wake,
                    state_bag=codec.dumps(self.state),
                    consumed=tuple(sorted(self._consumed.get(signal or "", ()))),
                    child=child,
                )
            except (FencedOut, LeaseLost) as exc:
                raise _Abort(str(exc)) from exc
        if sealed:
            self._last_wake = wake
            raise _Suspended(at)
        return False

    def _applied(self, into: str | None, value: Any) -> BaseModel:
        if into is None:
            return self.state
        data = self.state.model_dump(mode="json")
        data[into] = value
        return self.plan.state_model.model_validate(data)

    def _pinned(self, node: StepNode, attempts: _Attempts) -> Capability:
        version = attempts.capability_version
        if version is None or version == node.capability.version:
            return node.capability
        try:
            return self.registry.resolve(node.capability.id, version)
        except CapabilityNotFound as exc:
            raise NonDeterminismError(
                f"instance {self.instance_id} ran step {node.name!r} with "
                f"{node.capability.id}@{version}, which this node does not carry (R2.6)"
            ) from exc

    def _live(self) -> None:
        if self._guard is not None:
            try:
                self._guard()
            except (FencedOut, LeaseLost) as exc:
                raise _Abort(str(exc)) from exc

    def _forward(self, node: Node, scope: str) -> None:
        """About to run ``node`` anew: refused while compensating, or once a sibling failed."""
        if self._compensating or self._halted:
            raise _Halted(node, scope)

    def _check_deadline(self, node: Node, scope: str) -> None:
        """SPEC §8: a flow past its deadline runs no further step; it compensates and ends
        ``TimedOut``. Checked at every step boundary; a step already running is cut by
        ``invoke_bounded`` when the deadline comes first (issue 12 item 4)."""
        if self._deadline_at is not None and self.clock.now() >= self._deadline_at:
            raise _DeadlineExceeded(node, scope, self._deadline_at)

    def _wait_until(self, node: Node, scope: str, duration: Any) -> datetime:
        w = self._last_wake
        if w is not None and w.step_id == node.step_id and w.scope == scope and w.at is not None:
            return w.at
        moment: datetime = self.clock.now() + duration
        return moment

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> RunResult:
        """Run to the end, to a wait, or until this node loses the right to write."""
        try:
            try:
                await self._nodes(self.plan.body, "", None, has_item=False)
            except _StepFailed as failed:
                timed_out = failed.error.get("code") == DEADLINE_EXCEEDED
                return await self._fail(
                    failed.node, failed.scope, failed.error, timed_out=timed_out
                )
            except _DeadlineExceeded as late:
                self._ending = True
                error = error_payload(
                    FlowXError(
                        f"{self.plan.ref} passed its deadline ({late.deadline.isoformat()}) "
                        f"{'while' if late.running else 'before'} step {late.node.name!r}"
                        f"{' ran; the attempt was cancelled' if late.running else ''}",
                        code=DEADLINE_EXCEEDED,
                    ),
                    retryable=False,
                )
                # Journaled as that step's failure, so a resumed compensation finds why it
                # began in the rows, never by asking the clock again.
                key = (late.scope, late.node.step_id)
                attempt = (self._attempts.get(key) or _Attempts()).last_attempt + 1
                await self._write(
                    key, self._row(late.node, None, late.scope, attempt, Outcome.FAILURE, error)
                )
                return await self._fail(late.node, late.scope, error, timed_out=True)
            except _Halted as halted:
                # Compensating, and the failure that began it left no row to find again.
                error = error_payload(
                    FlowXError(
                        f"{self.plan.ref} was compensating when it was resumed",
                        code="flow.compensation_resumed",
                    ),
                    retryable=False,
                )
                node = halted.node or self.plan.body[0]
                return await self._fail(node, halted.scope, error)
            if self._compensating:
                # Every step is in and nothing failed: this run undoes a finished instance
                # (a child its parent is compensating, or such an undo resumed).
                error = error_payload(
                    FlowXError(
                        f"{self.plan.ref} was undone by its parent's compensation",
                        code="flow.undone",
                    ),
                    retryable=False,
                )
                return await self._fail(self.plan.body[-1], "", error)
            if not self._completed:
                await self._transition(InstanceState.COMPLETED)
            return self._result("completed")
        except _Suspended as parked:
            return self._result("suspended", wake_at=parked.wake_at)
        except _Yield:
            return self._result("yielded")
        except _Abort as abort:
            # R3.5: another node owns this instance now. Discard, and never compensate.
            log.warning(
                "instance %s: aborting without compensation: %s", self.instance_id, abort.reason
            )
            return self._result("aborted", abort_reason=abort.reason)

    async def hand_back(self) -> bool:
        """After this run was cut mid-step (a drain's budget ran out): hand the instance back
        ``Pending`` under this run's token, as a yield at a boundary does, so a peer's next
        sweep resumes it from its last commit instead of a TTL later (R7.2). Not once the
        run was ending the instance (failing, compensating, completed): that resumes from its
        own rows. ``False`` when nothing was handed back (or the fence refused it)."""
        if self._ending or self._completed or self._compensating or self._halted:
            return False
        try:
            await self._transition(InstanceState.PENDING)
        except _Abort:
            return False
        return True

    def _result(self, outcome: RunOutcome, **extra: Any) -> RunResult:
        return RunResult(
            outcome=outcome,
            state_bag=codec.dumps(self.state),
            executed=self.executed,
            replayed=self.replayed,
            **extra,
        )

    async def _fail(
        self, node: Node, scope: str, failure: dict[str, Any], *, timed_out: bool = False
    ) -> RunResult:
        self._ending = True
        error = {**failure, "step": node.name, "scope": scope}
        outcome: RunOutcome = "timed_out" if timed_out else "failed"
        final = InstanceState.TIMED_OUT if timed_out else InstanceState.FAILED
        if any(compensable(d.node) for d in self.completed):
            await self._transition(InstanceState.COMPENSATING)
            ended = await self._compensate(error)
            if ended is not None:
                alert, sealed = ended
                error = {**error, "compensation": alert.as_dict()}
                if not sealed:
                    # Exhausted by rows an earlier run wrote: end it now (no event: that run
                    # died between its last attempt and this transition, before staging one).
                    await self._transition(InstanceState.COMPENSATION_FAILED, error=error)
                return self._result("compensation_failed", error=error, alert=alert)
        await self._transition(final, error=error)
        return self._result(outcome, error=error)

    def _alert_event(self, alert: CompensationAlert, attempt: int) -> EventWrite:
        return EventWrite(
            event_id=str(
                uuid.uuid5(
                    EVENT_NAMESPACE,
                    f"{self.instance_id}/{COMPENSATION_FAILED_EVENT}/{alert.scope}/"
                    f"{alert.step}/{attempt}",
                )
            ),
            type=COMPENSATION_FAILED_EVENT,
            schema_version="1",
            partition_key=self.tenant_id,
            payload=codec.dumps(alert.as_dict()),
        )

    async def _nodes(
        self, nodes: tuple[Node, ...], scope: str, item: Any, *, has_item: bool
    ) -> Any:
        last: Any = None
        for node in nodes:
            if self._halted:
                raise _Halted
            if isinstance(node, StepNode):
                last = await self._step(node, scope, item, has_item)
            elif isinstance(node, EmitNode):
                last = await self._emit(node, scope, item, has_item)
            elif isinstance(node, ForEachNode):
                last = await self._for_each(node, scope, item, has_item)
            elif isinstance(node, AwaitSignalNode):
                last = await self._await_signal(node, scope, item, has_item)
            elif isinstance(node, SleepNode):
                last = await self._sleep(node, scope)
            elif isinstance(node, SubFlowNode):
                last = await self._sub_flow(node, scope, item, has_item)
            elif isinstance(node, ForkNode):
                last = await self._fork(node, scope, item, has_item)
            else:  # pragma: no cover - every node kind the builder makes is handled above
                raise FlowXError(
                    f"{node.kind} {node.name!r} is declared in {self.plan.ref}, but this "
                    "release of FlowX does not execute it",
                    code="flow.construct_not_supported",
                )
        return last

    def _replay_done(
        self, node: StepNode | SubFlowNode, scope: str, row: StepRecord, argument: Any
    ) -> Any:
        """A committed result, applied as a live one is and kept for compensation."""
        value = codec.loads(row.result)
        self.state = self._applied(node.into, value)
        self._keep(node, scope, argument, value, row)
        self.replayed += 1
        return value

    def _keep(
        self,
        node: StepNode | SubFlowNode,
        scope: str,
        argument: Any,
        result: Any,
        row: StepRecord | None = None,
    ) -> None:
        """Remember a finished step for compensation, in the order its effect happened."""
        self.completed.append(
            _Done(node=node, scope=scope, argument=argument, result=result, order=self._order(row))
        )

    def _source(self, item: Any, has_item: bool) -> Any:
        """A selector's first argument: the flow input, or the element inside a for_each."""
        return item if has_item else self.input

    def _context(self, node: Node, scope: str, attempt: int, **kw: Any) -> StepContext:
        return StepContext(
            instance_id=self.instance_id,
            flow_id=self.plan.flow_id,
            flow_version=self.plan.version,
            scope=scope,
            step_id=node.step_id,
            step_name=node.name,
            attempt=attempt,
            clock=self.clock,
            **kw,
        )

    async def _step(self, node: StepNode, scope: str, item: Any, has_item: bool) -> Any:
        key = (scope, node.step_id)
        a = self._attempts.get(key) or _Attempts()
        try:
            argument = (
                node.argument(self._source(item, has_item), self.state)
                if node.argument is not None
                else (item if has_item else self.input)
            )
        except Exception as exc:
            if a.success is None and not a.failures:
                self._forward(node, scope)
                await self._fail_node(
                    node,
                    scope,
                    a.last_attempt + 1,
                    f"step {node.name!r}: argument= raised {type(exc).__name__}: {exc}",
                    "step.argument_failed",
                )
            if a.success is None:
                raise _StepFailed(node, scope, a.failures[-1]) from exc
            log.warning(
                "instance %s: argument= of replayed step %r raised %r; its compensation gets None",
                self.instance_id,
                node.name,
                exc,
            )
            argument = None
        if a.success is not None:
            return self._replay_done(node, scope, a.success, argument)
        cap = self._pinned(node, a)
        policy = node.retry if cap.idempotent else NO_RETRY
        failures = list(a.failures)
        if _exhausted(failures, policy):
            raise _StepFailed(node, scope, failures[-1])
        self._forward(node, scope)
        if self._should_yield is not None and self._should_yield():
            # A fenced write like any other: a node that lost the lease hands back nothing.
            await self._transition(InstanceState.PENDING)
            raise _Yield
        self._check_deadline(node, scope)
        attempt = a.last_attempt + 1
        drawn = a.last_failure_drawn
        if failures:
            await self.clock.sleep(policy.delay(len(failures)))
            self._check_deadline(node, scope)
            self._forward(node, scope)
        if self._poisoned:
            self._poisoned = False
            error = error_payload(
                FlowXError(
                    f"the worker running this step was lost {self._resume_count} times in a "
                    "row without committing anything; the step is failed instead of run again",
                    code="step.poison",
                ),
                retryable=False,
            )
            await self._write(key, self._row(node, cap, scope, attempt, Outcome.FAILURE, error))
            raise _StepFailed(node, scope, error)
        while True:
            ctx = self._context(node, scope, attempt, recorded=drawn)
            self._live()
            started = time.monotonic()
            try:
                limit, by_deadline = attempt_limit(node.timeout, self._deadline_at, self.clock)
                raw = await invoke_bounded(
                    cap,
                    ctx,
                    argument,
                    self._executor,
                    limit=limit,
                    by_deadline=by_deadline,
                    what=f"step {node.name!r} ({cap.ref})",
                )
                # R9.5: checked here, so an unstorable result fails this step, never the commit.
                whose = f"step {node.name!r}: the result of {cap.ref}"
                text = codec.dumps(raw, root="result", code=RESULT_UNSTORABLE, context=whose)
                value = codec.loads(text)
                base = self.state
                new_state = self._applied(node.into, value)  # the result must fit its field
                bag = (
                    codec.dumps(new_state, root="state", code=RESULT_UNSTORABLE, context=whose)
                    if node.into is not None
                    else None
                )
            except Exception as exc:
                if isinstance(exc, DeadlineReached):
                    assert self._deadline_at is not None
                    raise _DeadlineExceeded(node, scope, self._deadline_at, running=True) from exc
                if isinstance(exc, ValidationError):
                    exc = FlowXError(
                        f"step {node.name!r}: the result of {cap.ref} does not fit state "
                        f"field {node.into!r}: {exc.errors()[0].get('msg')}",
                        code="step.result_invalid",
                    )
                    error = error_payload(exc, retryable=False)
                else:
                    error = error_payload(exc)
                failures.append(error)
                await self._write(
                    key,
                    self._row(node, cap, scope, attempt, Outcome.FAILURE, error, ctx, started),
                )
                if _exhausted(failures, policy):
                    raise _StepFailed(node, scope, error) from exc
                await self.clock.sleep(policy.delay(len(failures)))
                self._check_deadline(node, scope)
                self._forward(node, scope)  # a fork sibling may have failed meanwhile
                attempt += 1
                drawn = ctx.drawn()
                continue
            final = scope == "" and node is self._final_node
            await self._write(
                key,
                self._row(node, cap, scope, attempt, Outcome.SUCCESS, text, ctx, started),
                apply=(node.into, value),
                prepared=(base, new_state, bag),
                snapshot=final,
                state=InstanceState.COMPLETED if final else None,
            )
            self._completed = final
            self._keep(node, scope, argument, value)
            self.executed += 1
            return value

    def _row(
        self,
        node: Node,
        cap: Capability | _ChildUndo | None,
        scope: str,
        attempt: int,
        outcome: Outcome,
        result: str | dict[str, Any],
        ctx: StepContext | None = None,
        started: float | None = None,
    ) -> StepWrite:
        drawn = ctx.drawn() if ctx is not None else None
        return StepWrite(
            scope=scope,
            step_id=node.step_id,
            attempt=attempt,
            step_name=node.name,
            outcome=outcome,
            result=result if isinstance(result, str) else codec.dumps(result),
            capability_id=cap.id if cap else None,
            capability_version=cap.version if cap else None,
            nondeterministic=codec.dumps(drawn) if drawn else None,
            duration_ms=int((time.monotonic() - started) * 1000) if started else 0,
        )

    async def _emit(self, node: EmitNode, scope: str, item: Any, has_item: bool) -> Any:
        key = (scope, node.step_id)
        a = self._attempts.get(key)
        if a is not None and a.success is not None:
            self.replayed += 1
            return codec.loads(a.success.result)
        if a is not None and a.failures:
            raise _StepFailed(node, scope, a.failures[-1])
        self._forward(node, scope)
        self._check_deadline(node, scope)
        attempt = (a.last_attempt if a else 0) + 1
        source = self._source(item, has_item)
        try:
            built = node.build(source, self.state)
            if not isinstance(built, node.event_type):
                raise NonRetryableError(
                    f"emit {node.name!r} built a {type(built).__name__}, not the declared "
                    f"{node.event_type.__name__}"
                )
            contract = contract_of(node.event_type)
            assert contract is not None  # FLOWX1024 guarantees it at build time
            payload = contract.encode(built)
            if node.partition_key is not None:
                partition_key = node.partition_key(source, self.state)
                if partition_key is not None:  # R9.5: a text column, checked before the commit
                    partition_key = codec.text(str(partition_key), root="partition_key")
            else:
                partition_key = self.tenant_id
        except Exception as exc:
            error = error_payload(exc, retryable=False)
            await self._write(key, self._row(node, None, scope, attempt, Outcome.FAILURE, error))
            raise _StepFailed(node, scope, error) from exc
        final = scope == "" and node is self._final_node
        event_id = str(uuid.uuid5(EVENT_NAMESPACE, f"{self.instance_id}/{scope}/{node.step_id}"))
        await self._write(
            key,
            self._row(node, None, scope, attempt, Outcome.SUCCESS, payload),
            snapshot=final,
            state=InstanceState.COMPLETED if final else None,
            events=(
                EventWrite(
                    event_id=event_id,
                    type=contract.type,
                    schema_version=contract.schema_version,
                    partition_key=None if partition_key is None else str(partition_key),
                    payload=payload,
                ),
            ),
        )
        self._completed = final
        self.executed += 1
        return codec.loads(payload)

    async def _for_each(self, node: ForEachNode, scope: str, item: Any, has_item: bool) -> Any:
        a = self._attempts.get((scope, node.step_id))
        if a is not None and a.failures:
            raise _StepFailed(node, scope, a.failures[-1])
        try:
            items = list(node.items(self._source(item, has_item), self.state))
        except Exception as exc:
            self._forward(node, scope)
            await self._fail_node(
                node,
                scope,
                (a.last_attempt if a else 0) + 1,
                f"for_each {node.name!r}: items= raised {type(exc).__name__}: {exc}",
                "for_each.items_failed",
            )
        collected: list[Any] = []
        for index, element in enumerate(items):
            child = f"{scope}/{index}" if scope else str(index)
            collected.append(await self._nodes(node.body, child, element, has_item=True))
        if node.into is not None:
            # Derived, not journaled: a replay computes the same list from the same rows.
            try:
                self.state = self._applied(node.into, collected)
            except ValidationError as exc:
                self._forward(node, scope)
                await self._fail_node(
                    node,
                    scope,
                    (a.last_attempt if a else 0) + 1,
                    f"for_each {node.name!r}: the collected results do not fit state field "
                    f"{node.into!r}: {exc.errors()[0].get('msg')}",
                    "for_each.result_invalid",
                )
        return collected

    async def _fail_node(
        self,
        node: Node,
        scope: str,
        attempt: int,
        message: str,
        code: str,
        **facts: Any,
    ) -> NoReturn:
        """Journal a failure no retry can fix as this node's row, and fail the flow with it."""
        error = {**error_payload(FlowXError(message, code=code), retryable=False), **facts}
        await self._write(
            (scope, node.step_id), self._row(node, None, scope, attempt, Outcome.FAILURE, error)
        )
        raise _StepFailed(node, scope, error)

    # -- waits ---------------------------------------------------------------------------

    async def _await_signal(
        self, node: AwaitSignalNode, scope: str, item: Any, has_item: bool
    ) -> Any:
        """R2.10: the delivered signal becomes this step's own row, so a second delivery
        to this wait has nowhere to go; a signal that came early waits in the inbox."""
        key = (scope, node.step_id)
        a = self._attempts.get(key) or _Attempts()
        if a.success is not None:
            self.replayed += 1
            taken = codec.loads(a.success.result)
            if taken.get("timed_out"):
                return await self._nodes(node.on_timeout, scope, item, has_item=has_item)
            self.state = self._applied(node.into, taken["payload"])
            return taken["payload"]
        if a.failures:
            raise _StepFailed(node, scope, a.failures[-1])
        self._forward(node, scope)
        self._check_deadline(node, scope)
        assert self._waits is not None  # FLOWX1017
        timeout_at = (
            self._wait_until(node, scope, node.timeout) if node.timeout is not None else None
        )
        attempt = a.last_attempt + 1
        consumed = self._consumed.setdefault(node.signal, set())
        # Reaching the wait for the first time, try to seal at once: the seal itself refuses
        # when a signal is already waiting, so the inbox is read only when there is one (or
        # when a wake brought the run back here).
        w = self._last_wake
        look = w is not None and w.step_id == node.step_id and w.scope == scope
        while True:
            if not look and (timeout_at is None or self.clock.now() < timeout_at):
                await self._suspend(node, scope, at=timeout_at, signal=node.signal, child=None)
            look = False
            inbox = await self._waits.signals(node.signal)
            arrived = next((sig for sig in inbox if sig.seq not in consumed), None)
            if arrived is not None:
                try:
                    value = codec.loads(
                        codec.dumps(TypeAdapter(node.payload_type).validate_json(arrived.payload))
                    )
                    self._applied(node.into, value)  # it must fit its state field too
                except ValidationError as exc:
                    await self._fail_node(
                        node,
                        scope,
                        attempt,
                        f"signal {node.signal!r} #{arrived.seq} does not fit "
                        f"{node.payload_type!r}: {exc.errors()[0].get('msg')}",
                        "signal.payload_invalid",
                    )
                taken = {"seq": arrived.seq, "key": arrived.key, "payload": value}
                await self._write(
                    key,
                    self._row(node, None, scope, attempt, Outcome.SUCCESS, taken),
                    apply=(node.into, value),
                    state=InstanceState.RUNNING,
                )
                consumed.add(arrived.seq)
                self.executed += 1
                return value
            if timeout_at is not None and self.clock.now() >= timeout_at:
                return await self._signal_timed_out(node, scope, item, has_item, attempt)
            # Nothing for us yet: seal (and loop to read the inbox if a signal beat the seal).

    async def _signal_timed_out(
        self, node: AwaitSignalNode, scope: str, item: Any, has_item: bool, attempt: int
    ) -> Any:
        key = (scope, node.step_id)
        if node.on_timeout:
            await self._write(
                key,
                self._row(
                    node,
                    None,
                    scope,
                    attempt,
                    Outcome.SUCCESS,
                    {"timed_out": True, "at": self.clock.now().isoformat()},
                ),
                state=InstanceState.RUNNING,
            )
            self.executed += 1
            return await self._nodes(node.on_timeout, scope, item, has_item=has_item)
        await self._fail_node(
            node,
            scope,
            attempt,
            f"no {node.signal!r} signal arrived within {node.timeout}",
            "signal.timed_out",
        )

    async def _sleep(self, node: SleepNode, scope: str) -> Any:
        """R2.11: parking and scheduling the wake are one write; the timer service, on any
        node, resumes the instance when it is due (late after an outage, never not at all)."""
        key = (scope, node.step_id)
        a = self._attempts.get(key) or _Attempts()
        if a.success is not None:
            self.replayed += 1
            return None
        self._forward(node, scope)
        self._check_deadline(node, scope)
        until = self._wait_until(node, scope, node.duration)
        while self.clock.now() < until:
            await self._suspend(node, scope, at=until, signal=None, child=None)
        await self._write(
            key,
            self._row(
                node,
                None,
                scope,
                a.last_attempt + 1,
                Outcome.SUCCESS,
                {"slept_until": until.isoformat()},
            ),
            state=InstanceState.RUNNING,
        )
        self.executed += 1
        return None

    async def _sub_flow(self, node: SubFlowNode, scope: str, item: Any, has_item: bool) -> Any:
        """The child is an instance of its own (its own row, lease and recovery); the parent
        waits for it durably and its end wakes the parent in the child's last commit."""
        key = (scope, node.step_id)
        a = self._attempts.get(key) or _Attempts()
        if a.success is not None:
            return self._replay_done(node, scope, a.success, None)
        if a.failures:
            raise _StepFailed(node, scope, a.failures[-1])
        self._forward(node, scope)
        assert self._waits is not None and node.plan is not None
        attempt = a.last_attempt + 1
        child_id = child_instance_id(self.instance_id, scope, node.step_id)
        while True:
            child = await self._waits.child(child_id)
            if child is None:
                self._check_deadline(node, scope)
                try:
                    raw = node.input(self._source(item, has_item), self.state)
                    value = (
                        raw
                        if isinstance(raw, node.plan.input_model)
                        else node.plan.input_model.model_validate(raw)
                    )
                except Exception as exc:
                    await self._fail_node(
                        node,
                        scope,
                        attempt,
                        f"sub_flow {node.name!r}: the input for {node.plan.ref} is not "
                        f"valid: {exc}",
                        "sub_flow.input_invalid",
                    )
                try:
                    await self._waits.start_child(node, child_id, value, scope)
                except InputInvalid as exc:  # the child's partition_key refused its input
                    await self._fail_node(node, scope, attempt, str(exc), "sub_flow.input_invalid")
                continue
            if child.state is InstanceState.COMPLETED:
                # Recorded even past the deadline: the child's effects happened, and only a
                # row puts them in this saga, to be undone if the parent now times out.
                result = codec.loads(child.state_bag)
                try:
                    self._applied(node.into, result)
                except ValidationError as exc:
                    await self._fail_node(
                        node,
                        scope,
                        attempt,
                        f"sub_flow {node.name!r}: the result of {node.plan.ref} does not fit "
                        f"state field {node.into!r}: {exc.errors()[0].get('msg')}",
                        "sub_flow.result_invalid",
                    )
                await self._write(
                    key,
                    self._row(node, None, scope, attempt, Outcome.SUCCESS, child.state_bag),
                    apply=(node.into, result),
                    state=InstanceState.RUNNING,
                )
                self._keep(node, scope, None, result)
                self.executed += 1
                return result
            if child.state.terminal:
                # A child that ended badly past our deadline timed out with us (its deadline
                # is capped at ours): the parent is TimedOut, not failed by its child.
                self._check_deadline(node, scope)
                await self._fail_node(
                    node,
                    scope,
                    attempt,
                    f"sub_flow {node.name!r}: child instance {child_id} of {node.plan.ref} "
                    f"ended {child.state.value}",
                    "sub_flow.failed",
                    child_instance_id=child_id,
                    child_state=child.state.value,
                    child_error=codec.loads(child.error) if child.error else None,
                )
            # Past the deadline with the child still going, the parent waits on for it (with
            # no timer: the child's deadline is capped at ours, so it ends soon): only its
            # end says whether there are effects of its to undo with the rest.
            late = self._deadline_at is not None and self.clock.now() >= self._deadline_at
            await self._suspend(
                node, scope, at=None, signal=CHILD_WAIT, child=child_id, clamp=not late
            )

    async def _fork(self, node: ForkNode, scope: str, item: Any, has_item: bool) -> Any:
        """Branches run concurrently, each in a scope of its own, and join. A branch that
        fails stops its siblings at their next boundary; then the usual path compensates
        every step that finished, in any branch, newest first."""
        prefix = f"{scope}/" if scope else ""
        tasks = [
            asyncio.get_running_loop().create_task(
                self._nodes(branch, f"{prefix}{node.step_id}.{i}", item, has_item=has_item)
            )
            for i, branch in enumerate(node.branches)
        ]
        try:
            _done, running = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            if running:
                self._halted = True
                await asyncio.wait(running)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        outcomes = [t.exception() if not t.cancelled() else None for t in tasks]
        for kind in (_Abort, _Yield, _DeadlineExceeded, _StepFailed):
            first = next((e for e in outcomes if isinstance(e, kind)), None)
            if first is not None:
                raise first
        other = next((e for e in outcomes if e is not None and not isinstance(e, _Halted)), None)
        if other is not None:
            raise other
        halted = next((e for e in outcomes if isinstance(e, _Halted)), None)
        if halted is not None:  # compensating: nothing forward ran in any branch
            raise halted
        return [t.result() for t in tasks]

    # -- compensation --------------------------------------------------------------------

    async def _compensate(self, error: dict[str, Any]) -> tuple[CompensationAlert, bool] | None:
        """Undo completed steps newest first. Every attempt is a journal row.

        ``None`` when all are undone; otherwise the alert for the one that ran out, and
        whether its last attempt's commit already ended the instance: that row, the
        ``CompensationFailed`` transition and the alert event are one write, so the alert is
        durable exactly when the instance is terminal."""
        for done in sorted(self.completed, key=lambda d: d.order, reverse=True):
            node = done.node
            comp: Capability | _ChildUndo
            if not compensable(node):
                continue
            if isinstance(node, SubFlowNode):
                assert self._waits is not None
                child_id = child_instance_id(self.instance_id, done.scope, node.step_id)
                comp = _ChildUndo(self._waits, child_id, node)
                policy = DEFAULT_COMPENSATION_RETRY
            elif node.compensate is not None:
                comp, policy = node.compensate, node.compensate_retry
            else:
                continue
            key = (done.scope, node.step_id)
            a = self._attempts.setdefault(key, _Attempts())
            if a.compensated:
                continue
            failures = list(a.compensation_failures)
            if _exhausted(failures, policy):
                return self._compensation_alert(done, comp, failures), False
            attempt = a.last_attempt + 1
            while True:
                ctx = self._context(
                    node, done.scope, attempt, step_result=done.result, compensating=True
                )
                self._live()
                started = time.monotonic()
                try:
                    if isinstance(comp, Capability):
                        # No timeout (compensations have none), but a thread cut by a drain
                        # is counted stuck like a step's.
                        await invoke_bounded(
                            comp,
                            ctx,
                            done.argument,
                            self._executor,
                            limit=None,
                            by_deadline=False,
                            what=f"compensation of {node.name!r} ({comp.ref})",
                        )
                    else:
                        await comp.invoke(ctx, done.argument, self._executor)
                except (FencedOut, LeaseLost) as exc:  # undoing a child: this run lost its lease
                    raise _Abort(str(exc)) from exc
                except Exception as exc:
                    failure = error_payload(exc)
                    failures.append(failure)
                    row = self._row(
                        node,
                        comp,
                        done.scope,
                        attempt,
                        Outcome.COMPENSATION_FAILURE,
                        failure,
                        ctx,
                        started,
                    )
                    if _exhausted(failures, policy):
                        alert = self._compensation_alert(done, comp, failures)
                        await self._write(
                            key,
                            row,
                            snapshot=True,
                            state=InstanceState.COMPENSATION_FAILED,
                            error={**error, "compensation": alert.as_dict()},
                            events=(self._alert_event(alert, attempt),),
                        )
                        return alert, True
                    await self._write(key, row)
                    await self.clock.sleep(policy.delay(len(failures)))
                    attempt = self._attempts[key].last_attempt + 1
                    continue
                await self._write(
                    key,
                    self._row(
                        node, comp, done.scope, attempt, Outcome.COMPENSATED, "null", ctx, started
                    ),
                )
                self.executed += 1
                break
        return None

    def _compensation_alert(
        self, done: _Done, comp: Capability | _ChildUndo, failures: list[dict[str, Any]]
    ) -> CompensationAlert:
        return CompensationAlert(
            flow_id=self.plan.flow_id,
            flow_version=self.plan.version,
            instance_id=self.instance_id,
            tenant_id=self.tenant_id,
            step=done.node.name,
            scope=done.scope,
            capability=comp.ref,
            attempts=len(failures),
            last_error=failures[-1],
        )
