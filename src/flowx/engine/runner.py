"""The step loop: run one instance of a plan, or resume it from its journal.

A fresh run and a resume are the same loop (R2.8). The loop walks the plan; at each node it
looks up the rows already committed for ``(scope, step_id)``. A ``Success`` row is replayed —
its recorded result is applied to the state exactly as a live result is, without calling the
capability — and anything else is executed and committed. So the frontier (what to skip) is
derived from the rows, never stored.

The loop does no I/O of its own: it commits through a ``Committer``, which the host binds to a
journal and a lease (Durable) or to nothing (Ephemeral).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ValidationError

from flowx import codec
from flowx.capability import Capability, CapabilityRegistry, default_registry
from flowx.clock import Clock
from flowx.engine.context import StepContext
from flowx.errors import (
    CapabilityNotFound,
    FlowXError,
    NonDeterminismError,
    NonRetryableError,
    SerialisationError,
)
from flowx.plan.events import contract_of
from flowx.plan.model import (
    NO_RETRY,
    EmitNode,
    ForEachNode,
    Node,
    Plan,
    Retry,
    StepNode,
    walk,
)
from flowx.stores.errors import FencedOut, LeaseLost
from flowx.stores.records import EventWrite, InstanceState, Outcome, StepRecord, StepWrite

log = logging.getLogger("flowx.engine")

#: Event ids are derived, so an emit re-executed after a crash stages the same id.
EVENT_NAMESPACE = uuid.UUID("6f1c3b8e-2b0a-4c57-9d3e-4e1f0c9a7d21")


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
    ) -> Awaitable[None]: ...


RunOutcome = Literal["completed", "failed", "compensation_failed", "aborted", "yielded"]


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

    @property
    def final_state(self) -> InstanceState | None:
        return {
            "completed": InstanceState.COMPLETED,
            "failed": InstanceState.FAILED,
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


class _Abort(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(kw_only=True, slots=True)
class _Done:
    node: StepNode
    scope: str
    argument: Any
    result: Any


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
    return {
        "type": type(exc).__qualname__,
        "message": str(exc)[:4000],
        "code": getattr(exc, "code", None),
        "retryable": retryable,
    }


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
        # R4.3 hazard: a step that kills its process would be resumed for ever. Every takeover
        # without a step commit in between is counted by the journal; past the limit, the step
        # about to run is failed instead of run again.
        self._poisoned = resume_count > max_resumes
        self._resume_count = resume_count
        self._attempts: dict[tuple[str, int], _Attempts] = {}
        # The last body node's success commit also completes the instance: one write fewer
        # per flow on the hot path, and no window in which the last step is in but the
        # instance is not yet Completed.
        last = plan.body[-1]
        self._final_node: Node | None = last if isinstance(last, StepNode | EmitNode) else None
        self._completed = False
        names = {n.step_id: n.name for n in walk(plan.body)}
        for row in history:
            expected = names.get(row.step_id)
            if expected != row.step_name:
                raise NonDeterminismError(
                    f"instance {instance_id} has a journal row for step {row.step_id} "
                    f"named {row.step_name!r}, but {plan.ref} names that step "
                    f"{expected!r}; a running instance's plan changed without a new version. "
                    "Deploy the old version beside the new one until its instances finish"
                )
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
        if outcome is Outcome.SUCCESS:
            a.success = row
            a.capability_version = version
        elif outcome is Outcome.FAILURE:
            a.failures.append(codec.loads(result))
            a.last_failure_drawn = codec.loads(drawn) if drawn else None
            a.capability_version = a.capability_version or version
        elif outcome is Outcome.COMPENSATED:
            a.compensated = True
        else:
            a.compensation_failures.append(codec.loads(result))

    async def _write(
        self,
        key: tuple[str, int],
        step: StepWrite,
        *,
        state_bag: str | None = None,
        events: tuple[EventWrite, ...] = (),
        state: InstanceState | None = None,
    ) -> None:
        try:
            await self.commit(step=step, state_bag=state_bag, events=events, state=state)
        except (FencedOut, LeaseLost) as exc:
            raise _Abort(str(exc)) from exc
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
        self, state: InstanceState, *, error: dict[str, Any] | None = None
    ) -> None:
        try:
            await self.commit(
                state=state,
                state_bag=codec.dumps(self.state),
                error=codec.dumps(error) if error is not None else None,
            )
        except (FencedOut, LeaseLost) as exc:
            raise _Abort(str(exc)) from exc

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

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> RunResult:
        """Run to the end, or until this node loses the right to write."""
        try:
            try:
                await self._nodes(self.plan.body, "", None, has_item=False)
            except _StepFailed as failed:
                return await self._fail(failed)
            if not self._completed:
                await self._transition(InstanceState.COMPLETED)
            return self._result("completed")
        except _Yield:
            return self._result("yielded")
        except _Abort as abort:
            # R3.5: another node owns this instance now. Discard, and never compensate.
            log.warning(
                "instance %s: aborting without compensation: %s", self.instance_id, abort.reason
            )
            return self._result("aborted", abort_reason=abort.reason)

    def _result(self, outcome: RunOutcome, **extra: Any) -> RunResult:
        return RunResult(
            outcome=outcome,
            state_bag=codec.dumps(self.state),
            executed=self.executed,
            replayed=self.replayed,
            **extra,
        )

    async def _fail(self, failed: _StepFailed) -> RunResult:
        error = {**failed.error, "step": failed.node.name, "scope": failed.scope}
        if any(d.node.compensate is not None for d in self.completed):
            await self._transition(InstanceState.COMPENSATING)
            if not await self._compensate():
                await self._transition(InstanceState.COMPENSATION_FAILED, error=error)
                return self._result("compensation_failed", error=error)
        await self._transition(InstanceState.FAILED, error=error)
        return self._result("failed", error=error)

    async def _nodes(
        self, nodes: tuple[Node, ...], scope: str, item: Any, *, has_item: bool
    ) -> Any:
        last: Any = None
        for node in nodes:
            if isinstance(node, StepNode):
                last = await self._step(node, scope, item, has_item)
            elif isinstance(node, EmitNode):
                last = await self._emit(node, scope)
            elif isinstance(node, ForEachNode):
                last = await self._for_each(node, scope)
            else:
                raise FlowXError(
                    f"{node.kind} {node.name!r} is declared in {self.plan.ref}, but this "
                    "release of FlowX does not execute it yet",
                    code="flow.construct_not_supported",
                )
        return last

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
        argument = (
            node.argument(self.input, self.state)
            if node.argument is not None
            else (item if has_item else self.input)
        )
        if a.success is not None:
            value = codec.loads(a.success.result)
            self.state = self._applied(node.into, value)
            self.completed.append(_Done(node=node, scope=scope, argument=argument, result=value))
            self.replayed += 1
            return value
        if self._should_yield is not None and self._should_yield():
            # A fenced write like any other: a node that lost the lease hands back nothing.
            await self._transition(InstanceState.PENDING)
            raise _Yield
        cap = self._pinned(node, a)
        policy = node.retry if cap.idempotent else NO_RETRY
        failures = list(a.failures)
        if _exhausted(failures, policy):
            raise _StepFailed(node, scope, failures[-1])
        attempt = a.last_attempt + 1
        drawn = a.last_failure_drawn
        if failures:
            await self.clock.sleep(policy.delay(len(failures)))
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
            started = time.monotonic()
            try:
                raw = await cap.invoke(ctx, argument, self._executor)
                text = codec.dumps(raw)
                value = codec.loads(text)
                new_state = self._applied(node.into, value)
            except Exception as exc:
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
                attempt += 1
                drawn = ctx.drawn()
                continue
            final = scope == "" and node is self._final_node
            await self._write(
                key,
                self._row(node, cap, scope, attempt, Outcome.SUCCESS, text, ctx, started),
                state_bag=codec.dumps(new_state) if node.into is not None or final else None,
                state=InstanceState.COMPLETED if final else None,
            )
            self._completed = final
            self.state = new_state
            self.completed.append(_Done(node=node, scope=scope, argument=argument, result=value))
            self.executed += 1
            return value

    def _row(
        self,
        node: Node,
        cap: Capability | None,
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

    async def _emit(self, node: EmitNode, scope: str) -> Any:
        key = (scope, node.step_id)
        a = self._attempts.get(key)
        if a is not None and a.success is not None:
            self.replayed += 1
            return codec.loads(a.success.result)
        attempt = (a.last_attempt if a else 0) + 1
        try:
            built = node.build(self.input, self.state)
            if not isinstance(built, node.event_type):
                raise NonRetryableError(
                    f"emit {node.name!r} built a {type(built).__name__}, not the declared "
                    f"{node.event_type.__name__}"
                )
            contract = contract_of(node.event_type)
            assert contract is not None  # FLOWX1024 guarantees it at build time
            payload = contract.encode(built)
            if node.partition_key is not None:
                partition_key = node.partition_key(self.input, self.state)
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
            state_bag=codec.dumps(self.state) if final else None,
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

    async def _for_each(self, node: ForEachNode, scope: str) -> Any:
        items = list(node.items(self.input, self.state))
        collected: list[Any] = []
        for index, item in enumerate(items):
            child = f"{scope}/{index}" if scope else str(index)
            collected.append(await self._nodes(node.body, child, item, has_item=True))
        if node.into is not None:
            # Derived, not journaled: a replay computes the same list from the same rows.
            self.state = self._applied(node.into, collected)
        return collected

    async def _compensate(self) -> bool:
        """Undo completed steps in reverse order; ``False`` if one ran out of attempts."""
        for done in reversed(self.completed):
            node, comp = done.node, done.node.compensate
            if comp is None:
                continue
            key = (done.scope, node.step_id)
            a = self._attempts.setdefault(key, _Attempts())
            if a.compensated:
                continue
            policy = node.compensate_retry
            failures = list(a.compensation_failures)
            if _exhausted(failures, policy):
                return False
            attempt = a.last_attempt + 1
            while True:
                ctx = self._context(
                    node, done.scope, attempt, step_result=done.result, compensating=True
                )
                started = time.monotonic()
                try:
                    await comp.invoke(ctx, done.argument, self._executor)
                except Exception as exc:
                    error = error_payload(exc)
                    failures.append(error)
                    await self._write(
                        key,
                        self._row(
                            node,
                            comp,
                            done.scope,
                            attempt,
                            Outcome.COMPENSATION_FAILURE,
                            error,
                            ctx,
                            started,
                        ),
                    )
                    if _exhausted(failures, policy):
                        return False
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
        return True
