"""The state of one run, and the only code that writes it: commits, seals, the state model.

Node kinds (``engine/nodes``) and the saga (``engine/saga.py``) all act on a ``Run``: they
read the history index, compute, and commit through ``Run.write`` — which makes commits take
turns once fork branches commit concurrently (a lock from ``Run.branching`` on), applies
results to the state in the same turn, and feeds each commit back into the index. Losing the
right to write, at any of these points, becomes ``Halt.abort``; nothing here decides what a
halt means for the instance.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any, NoReturn, Protocol, cast

from pydantic import BaseModel
from pydantic_core import SchemaValidator

from flowx import codec
from flowx.capability import Capability, CapabilityRegistry, default_registry
from flowx.engine.context import StepAttempt, StepContext
from flowx.engine.failures import error_payload
from flowx.engine.halt import Halt
from flowx.engine.history import Attempts, Done, History, journal_order
from flowx.engine.ports import RunPorts
from flowx.engine.spec import RunSpec
from flowx.engine.stops import StopWatch
from flowx.errors import CapabilityNotFound, CapabilityVersionMissing, FlowXError
from flowx.plan.model import EmitNode, Node, StepNode, SubFlowNode, bound_for
from flowx.sealing import sealed_fields
from flowx.stores.errors import FencedOut, LeaseLost
from flowx.stores.records import (
    EventWrite,
    InstanceState,
    Outcome,
    StepRecord,
    StepWrite,
    Wake,
    blank,
)

#: Event ids are derived (emits, alerts), so one re-staged after a crash keeps its id.
EVENT_NAMESPACE = uuid.UUID("6f1c3b8e-2b0a-4c57-9d3e-4e1f0c9a7d21")

#: Walks a sequence of nodes in a scope (the dispatcher, a module function of the runner):
#: node kinds with bodies (for_each, fork, a signal's timeout path) recurse through it. A plain
#: function taking the run, never a bound method: a run holding its ``Execution`` would be a
#: reference cycle, freed only by the cyclic GC, on every instance of the hot path.
Walk = Callable[["Run", tuple[Node, ...], str, Any, bool], Coroutine[Any, Any, Any]]


class _Alone:
    """The turns of a run nothing else writes to: every run, until a fork starts branches
    that commit concurrently (``Run.branching``). Entering it costs two empty coroutines;
    an ``asyncio.Lock``, entered on every commit, costs about twice as much for nothing."""

    __slots__ = ()

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


_ALONE = _Alone()

_set = object.__setattr__
_new = object.__new__
#: Whether a state model class copies itself (its own ``__copy__``, ``model_copy`` or
#: ``__new__``). State models are a plan's, made once: the classes this keeps are kept by
#: their plans anyway.
_COPIES_ITSELF: dict[type, bool] = {}
#: Per state model class, what assigns one field of a copy: its validator, or ``None`` for a
#: frozen model (rebuilt whole). Looked up once a class: a pydantic model class's own
#: attributes cost a few dict lookups each, and this runs on every step commit.
_ASSIGNS: dict[type, SchemaValidator | None] = {}


def _copied(model: BaseModel) -> BaseModel:
    """``model.model_copy()``: a shallow copy, made as pydantic's ``__copy__`` makes it but
    without its three ``copy.copy`` calls (each a generic dispatch on a dict, a set, a
    ``None``) — this runs on every step commit that writes the state. A model with private
    attributes, or a ``__copy__`` or ``model_copy`` of its own, is copied by pydantic (and
    its own method) as before."""
    cls = type(model)
    own = _COPIES_ITSELF.get(cls)
    if own is None:  # asked once a class: a model class's attributes are slow to look up
        own = (
            cls.__copy__ is not BaseModel.__copy__
            or cls.model_copy is not BaseModel.model_copy
            or cls.__new__ is not _new
        )
        _COPIES_ITSELF[cls] = own
    if own or getattr(model, "__pydantic_private__", None) is not None:
        return model.model_copy()
    fresh = _new(cls)
    _set(fresh, "__dict__", model.__dict__.copy())
    extra = model.__pydantic_extra__
    _set(fresh, "__pydantic_extra__", None if extra is None else extra.copy())
    _set(fresh, "__pydantic_fields_set__", model.__pydantic_fields_set__.copy())
    _set(fresh, "__pydantic_private__", None)
    return fresh


_UNKNOWN: Any = object()


def _assigner(model: type[BaseModel]) -> SchemaValidator | None:
    """What ``Run.applied`` assigns a field of ``model`` with (see ``_ASSIGNS``); kept once
    the class's validator is built (a model still waiting for ``model_rebuild`` has a
    stand-in, asked again next time)."""
    if model.model_config.get("frozen"):
        _ASSIGNS[model] = None
        return None
    validator = model.__pydantic_validator__
    if isinstance(validator, SchemaValidator):
        _ASSIGNS[model] = validator
    return cast(SchemaValidator, validator)


class Versioned(Protocol):
    """What a journal row names of whatever ran: a capability or a child's undo."""

    @property
    def id(self) -> str: ...

    @property
    def version(self) -> str: ...


class Run:
    """One run's mutable state: the instance state model, counters, the history index, and
    the flags that say whether anything new may still run."""

    def __init__(self, spec: RunSpec, ports: RunPorts, walk: Walk) -> None:
        plan = spec.plan
        self.spec = spec
        self.plan = plan
        self.instance_id = spec.instance_id
        self.input = spec.input_value
        self.tenant_id = spec.tenant_id
        self.deadline_at = spec.deadline_at
        self.clock = ports.clock
        self.registry: CapabilityRegistry = ports.registry or default_registry
        self.executor = ports.executor
        self.waits = ports.waits
        self.should_yield = ports.should_yield
        self.stop = ports.stop
        #: ``stop_cut(by_cancel=True)``, made once: what every step attempt passes on.
        self.step_cut: tuple[StopWatch, bool] | None = (
            (ports.stop, True) if ports.stop is not None else None
        )
        self._ports = ports
        self._walk = walk
        self.state: BaseModel = plan.state_model()
        # The state as last written (a commit, a transition, a seal), with its encoding: the
        # run's result reuses it rather than encoding the same state again as the instance ends.
        self._encoded: tuple[BaseModel, str] | None = None
        # The nodes whose value is bound for a sealed state field (none, for most plans).
        self._sealed = bound_for(plan.body, sealed_fields(plan.state_model))
        self.executed = 0
        self.replayed = 0
        self.last_wake = spec.last_wake
        # Fork branches commit concurrently: commits (and the state they snapshot) then take
        # turns under a lock (``branching``); until then there is no one to take turns with.
        self._turns: asyncio.Lock | _Alone = _ALONE
        self.commits = 0
        #: A fork sibling failed: the other branches stop at their next boundary.
        self.halted = False
        # Every takeover without a step commit in between is counted by the journal; past
        # the limit, the step about to run is failed instead of run again (R4.3).
        self.poisoned = spec.resume_count > spec.max_resumes
        self.history = History(
            plan, spec.instance_id, spec.history, spec.replay_sequence, spec.replay_from
        )
        # The last body node's success commit also completes the instance: one write fewer
        # per flow on the hot path, and no window in which the last step is in but the
        # instance is not yet Completed.
        last = plan.body[-1]
        self.final_node: Node | None = last if isinstance(last, StepNode | EmitNode) else None
        self.completed = False
        # Set once this run is ending the instance (failing, compensating, timing out): a run
        # cut from then on is not handed back ``Pending`` — it resumes from its own rows.
        self.ending = False
        # Once compensation has begun, nothing forward runs again: a resumed (or replayed)
        # run only replays what committed, finds the failure again, and compensates. Without
        # this a fork's healthy branch would run its next step before its sibling's
        # journaled failure is reached.
        self.compensating = (
            spec.undo
            or self.history.compensation_began
            or spec.state in (InstanceState.COMPENSATING, InstanceState.COMPENSATION_FAILED)
        )

    # -- writing -------------------------------------------------------------------------

    def branching(self) -> None:
        """Fork branches are about to run: from now on commits take turns. Called before the
        branches start, from the one task that runs the instance until then, so no commit is
        under way when the turns change; a nested fork finds the lock already there."""
        if self._turns is _ALONE:
            self._turns = asyncio.Lock()

    async def walk(self, nodes: tuple[Node, ...], scope: str, item: Any, has_item: bool) -> Any:
        """Run ``nodes`` in ``scope`` through the runner's dispatcher."""
        return await self._walk(self, nodes, scope, item, has_item)

    async def write(
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
        """Commit one row. ``apply=(into, value)`` puts a result into the state in the
        commit's turn, so concurrent fork branches never overwrite each other's fields.
        ``prepared=(base, new, bag)`` is that state (and its encoding, if known) already
        computed from ``base``: used as is when no other branch moved the state meanwhile
        (always, outside a fork). Alone, the run takes no turns: not even ``_Alone``'s two
        empty coroutines, on the step path."""
        turns = self._turns
        lock = turns if isinstance(turns, asyncio.Lock) else None
        if lock is not None:
            await lock.acquire()
        try:
            bag = None
            if apply is None:
                new_state = self.state
            elif prepared is not None and prepared[0] is self.state:
                new_state, bag = prepared[1], prepared[2]
            else:
                new_state = self.applied(*apply)
            wants_bag = snapshot or (apply is not None and apply[0] is not None)
            if wants_bag and bag is None:
                bag = codec.dumps(new_state, root="state")
            notify = self.spec.is_child and state is not None and state.terminal
            try:
                await self._ports.committer(
                    step=step,
                    state_bag=bag if wants_bag else None,
                    events=events,
                    state=state,
                    error=codec.dumps(error) if error is not None else None,
                    notify_parent=notify,
                )
            except (FencedOut, LeaseLost) as exc:
                raise Halt.abort(str(exc)) from exc
            self.state = new_state
            if bag is not None:
                self._encoded = (new_state, bag)
            self.commits += 1
        finally:
            if lock is not None:
                lock.release()
        self.history.committed(key, step)
        if self._ports.on_step is not None:
            self._ports.on_step(self.instance_id, step)

    async def transition(
        self,
        state: InstanceState,
        *,
        error: dict[str, Any] | None = None,
        events: tuple[EventWrite, ...] = (),
    ) -> None:
        """Move the instance to ``state`` with no step row (snapshotting the state)."""
        async with self._turns:
            bag = codec.dumps(self.state, root="state")
            try:
                await self._ports.committer(
                    state=state,
                    state_bag=bag,
                    error=codec.dumps(error) if error is not None else None,
                    events=events,
                    notify_parent=self.spec.is_child and state.terminal,
                )
            except (FencedOut, LeaseLost) as exc:
                raise Halt.abort(str(exc)) from exc
            self._encoded = (self.state, bag)

    async def suspend(
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
        assert self.waits is not None  # nosec B101  # invariant, FLOWX1017: waits are Durable-only
        if clamp and self.deadline_at is not None:
            at = self.deadline_at if at is None else min(at, self.deadline_at)
        wake = Wake(step_id=node.step_id, scope=scope, at=at, signal=signal)
        async with self._turns:
            bag = codec.dumps(self.state, root="state")
            try:
                sealed = await self.waits.suspend(
                    wake,
                    state_bag=bag,
                    consumed=tuple(sorted(self.history.consumed.get(signal or "", ()))),
                    child=child,
                )
            except (FencedOut, LeaseLost) as exc:
                raise Halt.abort(str(exc)) from exc
            if sealed:
                self._encoded = (self.state, bag)
        if sealed:
            self.last_wake = wake
            raise Halt.suspended(at)
        return False

    async def fail_node(
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
        await self.write(
            (scope, node.step_id), self.row(node, None, scope, attempt, Outcome.FAILURE, error)
        )
        raise Halt.failed(node, scope, error)

    def row(
        self,
        node: Node,
        cap: Versioned | None,
        scope: str,
        attempt: int,
        outcome: Outcome,
        result: str | dict[str, Any],
        ctx: StepContext | None = None,
        started: float | None = None,
    ) -> StepWrite:
        """The journal row for one attempt of ``node``."""
        drawn = ctx.drawn() if ctx is not None else None
        row = blank(StepWrite)  # one per attempt: built as ``blank`` says, without a dict
        StepWrite.__init__(
            row,
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
            node_id=self._ports.node_id,
        )
        return row

    # -- state and history ----------------------------------------------------------------

    def encoded_state(self) -> str:
        """The state, encoded (``codec.dumps``): the last write's encoding (a commit, a
        transition, a seal) while the state is still the object it wrote, so the run's result
        is what the journal holds."""
        encoded = self._encoded
        if encoded is not None and encoded[0] is self.state:
            return encoded[1]
        return codec.dumps(self.state, root="state")

    def seals(self, node: Node) -> bool:
        """Whether ``node``'s value is bound for a sealed state field — its own ``into``, or
        a for_each's that collects it — and so must be sealed whole in the row that journals
        it too (R9.8): a capability that returns a plain ``str`` into a ``Sensitive[str]``
        field would otherwise leave it in the clear."""
        return node.step_id in self._sealed

    def applied(self, into: str | None, value: Any) -> BaseModel:
        """The state with ``value`` in field ``into`` (validated), not yet committed.

        Only that field is validated, as an assignment to a copy is (its field validators and
        the model's own validators run; the other fields were validated when they were set).
        Re-validating the whole state per step would make replaying an instance of N rows
        cost N times its state (issue 14 item 6). A frozen state model cannot be assigned
        to: it is rebuilt whole, as before."""
        if into is None:
            return self.state
        model = self.plan.state_model
        assigns = _ASSIGNS.get(model, _UNKNOWN)
        if assigns is _UNKNOWN:
            assigns = _assigner(model)
        if assigns is None:
            # Through the codec, not model_dump: that would mask secrets and drop excluded
            # fields (``flowx.sealing``).
            data = codec.loads(codec.dumps(self.state, root="state"), root="state")
            data[into] = value
            return model.model_validate(data)
        fresh = _copied(self.state)
        assigns.validate_assignment(fresh, into, value)
        return fresh

    def replay_done(
        self, node: StepNode | SubFlowNode, scope: str, row: StepRecord, argument: Any
    ) -> Any:
        """A committed result, applied as a live one is and kept for compensation."""
        value = codec.loads(row.result, root="result", at=f"{row.scope}/{row.step_id}")
        self.state = self.applied(node.into, value)
        self.keep(node, scope, argument, value, row)
        self.replayed += 1
        return value

    def keep(
        self,
        node: StepNode | SubFlowNode,
        scope: str,
        argument: Any,
        result: Any,
        row: StepRecord | None = None,
    ) -> None:
        """Remember a finished step for compensation, in the order its effect happened. A
        step with no compensation is not kept: nothing would ever undo it
        (``saga.compensable``), and its argument and result need not be held for the run."""
        if isinstance(node, StepNode) and node.compensate is None:
            return
        order = journal_order(row) if row is not None else (1, self.commits)
        done = blank(Done)  # one per step: built as ``blank`` says, without a dict
        Done.__init__(done, node=node, scope=scope, argument=argument, result=result, order=order)
        self.history.keep(done)

    def pinned(self, node: StepNode, attempts: Attempts) -> Capability:
        """The capability version the journal ran this step with (R2.6)."""
        version = attempts.capability_version
        if version is None or version == node.capability.version:
            return node.capability
        try:
            return self.registry.resolve(node.capability.id, version)
        except CapabilityNotFound as exc:
            raise CapabilityVersionMissing(
                f"instance {self.instance_id} ran step {node.name!r} with "
                f"{node.capability.id}@{version}, which this node does not carry (R2.6)"
            ) from exc

    def source(self, item: Any, has_item: bool) -> Any:
        """A selector's first argument: the flow input, or the element inside a for_each."""
        return item if has_item else self.input

    def context(
        self,
        node: Node,
        scope: str,
        attempt: int,
        *,
        recorded: dict[str, list[Any]] | None = None,
        step_result: Any = None,
        compensating: bool = False,
        generation: int | None = None,
    ) -> StepContext:
        """The context of one attempt of ``node``. Built for every attempt: the tuple through
        its ``__new__`` (a class called with keywords packs them into a dict and unpacks
        them again on CPython 3.11; 0.28 against 0.75 µs), the context without ``**kw``.
        ``generation``: the step's, when the caller has its ``Attempts`` at hand already."""
        if generation is None:
            generation = self.history.of((scope, node.step_id)).generation
        where = StepAttempt.__new__(
            StepAttempt,
            instance_id=self.instance_id,
            flow_id=self.plan.flow_id,
            flow_version=self.plan.version,
            scope=scope,
            step_id=node.step_id,
            step_name=node.name,
            attempt=attempt,
            generation=generation,
        )
        if recorded is None and step_result is None and not compensating:  # the usual one
            return StepContext(where, self.clock)
        return StepContext(
            where,
            self.clock,
            recorded=recorded,
            step_result=step_result,
            compensating=compensating,
        )

    # -- policy at a boundary --------------------------------------------------------------

    def live(self) -> None:
        """Before a capability: stop (abort) if this node may no longer write, or if an
        operator terminated the instance (a compensation included: R9.4)."""
        request = self.stop.request if self.stop is not None else None
        if request is not None and request.mode == "terminate":
            raise Halt.stopped(None, "", request)
        if self._ports.guard is not None:
            try:
                self._ports.guard()
            except (FencedOut, LeaseLost) as exc:
                raise Halt.abort(str(exc)) from exc

    def forward(self, node: Node, scope: str) -> None:
        """About to run ``node`` anew: refused while compensating, or once a sibling failed,
        or once an operator stopped the instance (R9.4: a cancel stops forward progress,
        so it no longer applies once the instance is compensating; a terminate always)."""
        request = self.stop.request if self.stop is not None else None
        if request is not None and (
            request.mode == "terminate" or not (self.compensating or self.halted or self.ending)
        ):
            raise Halt.stopped(node, scope, request)
        if self.compensating or self.halted:
            raise Halt.halted(node, scope)

    async def backoff(self, seconds: float, *, by_cancel: bool = True) -> None:
        """Wait out a retry's backoff; an operator's stop that applies ends the wait early
        (the caller's next boundary check then stops the run), so a cancel is not held up
        by a backoff of minutes."""
        if self.stop is None:
            await self.clock.sleep(seconds)
            return
        armed = self.stop.arm(by_cancel=by_cancel)
        try:
            await self.clock.sleep(seconds)
        except asyncio.CancelledError:
            if self.stop.cut(armed) is None:
                raise
        finally:
            self.stop.disarm(armed)

    def stop_forward(self, *, halted: bool = False) -> None:
        """This run goes no further forward: it is ending the instance (or, ``halted``, a
        fork branch failed and its siblings stop at their next boundary). A cancel then has
        nothing left to stop, so it no longer cuts an attempt still running."""
        if halted:
            self.halted = True
        else:
            self.ending = True
        if self.stop is not None:
            self.stop.forward_over()

    def stop_cut(self, *, by_cancel: bool) -> tuple[StopWatch, bool] | None:
        """What lets an operator's stop cut the attempt about to run (``invoke_bounded``)."""
        return (self.stop, by_cancel) if self.stop is not None else None

    def check_deadline(self, node: Node, scope: str) -> None:
        """SPEC §8: a flow past its deadline runs no further step; it compensates and ends
        ``TimedOut``. Checked at every step boundary; a step already running is cut by
        ``invoke_bounded`` when the deadline comes first (issue 12 item 4)."""
        if self.deadline_at is not None and self.clock.now() >= self.deadline_at:
            raise Halt.deadline(node, scope, self.deadline_at)

    def wait_until(self, node: Node, scope: str, duration: Any) -> datetime:
        """When a wait reached now ends: the same moment as when it was sealed, if it was."""
        w = self.last_wake
        if w is not None and w.step_id == node.step_id and w.scope == scope and w.at is not None:
            return w.at
        moment: datetime = self.clock.now() + duration
        return moment
