"""The plan builder: ``flowx.flow(...).step(...).emit(...).build()``.

The builder only records what the author wrote, one typed draft per node (``drafts``);
``build()`` numbers the nodes and checks the whole plan (``compile``), so every mistake
surfaces at registration time with a ``FLOWX`` code and the fix (R2.12), not halfway through
a production instance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast, overload

from pydantic import BaseModel

from flowx.capability import Capability, CapabilityRegistry
from flowx.durations import DurationLike
from flowx.plan.compile import compile_plan
from flowx.plan.drafts import (
    AwaitSignalDraft,
    Drafts,
    EmitDraft,
    FlowHeader,
    ForEachDraft,
    ForkDraft,
    InputT,
    NodeDraft,
    SleepDraft,
    StateT,
    StepDraft,
    SubFlowDraft,
)
from flowx.plan.model import NoState, Plan, Profile, Retry, Selector

B = TypeVar("B", bound="Body")


def _recorded(write: Callable[[Body], Body]) -> Drafts:
    """The drafts ``write`` records in a fresh body (a loop body or a branch)."""
    inner = Body()
    write(inner)
    return tuple(inner._drafts)


class Body:
    """The nodes of a flow body, or of a ``for_each`` / ``fork`` branch body."""

    def __init__(self) -> None:
        self._drafts: list[NodeDraft] = []

    def _add(self: B, draft: NodeDraft) -> B:
        self._drafts.append(draft)
        return self

    def step(
        self: B,
        target: Callable[..., Any] | Capability | str,
        *,
        name: str | None = None,
        version: str | None = None,
        into: str | None = None,
        retry: Retry | None = None,
        compensate: Callable[..., Any] | Capability | str | None = None,
        compensate_retry: Retry | None = None,
        argument: Selector | None = None,
        timeout: DurationLike | None = None,
    ) -> B:
        """Call a capability. Its argument is the flow input (the item, in a ``for_each``)
        unless ``argument=lambda input, state: ...`` says otherwise; its result goes into the
        state field ``into``. On a later failure, ``compensate`` runs with the same argument
        and ``ctx.step_result`` set to this step's result. ``timeout`` bounds each attempt
        (default: the flow's ``step_timeout``); past it the attempt fails ``step.timed_out``
        and is retried under ``retry``."""
        return self._add(
            StepDraft(
                name=name,
                target=target,
                version=version,
                into=into,
                retry=retry,
                compensate=compensate,
                compensate_retry=compensate_retry,
                argument=argument,
                timeout=timeout,
            )
        )

    def emit(
        self: B,
        event_type: type[BaseModel],
        build: Selector,
        *,
        name: str | None = None,
        partition_key: Selector | None = None,
    ) -> B:
        """Stage an event built by ``build(input, state)`` in the outbox, atomically with this
        node's journal row."""
        return self._add(
            EmitDraft(name=name, event_type=event_type, build=build, partition_key=partition_key)
        )

    def for_each(
        self: B,
        name: str,
        items: Selector,
        body: Callable[[Body], Body],
        *,
        into: str | None = None,
    ) -> B:
        """Run ``body`` once for each of ``items(input, state)``; element ``i`` runs in scope
        ``i``. ``into`` (a list field) collects each element's last result."""
        return self._add(ForEachDraft(name=name, items=items, body=_recorded(body), into=into))

    def await_signal(
        self: B,
        signal: str,
        payload_type: type[Any],
        *,
        timeout: DurationLike | None = None,
        name: str | None = None,
        into: str | None = None,
        on_timeout: Callable[[Body], Body] | None = None,
    ) -> B:
        """Suspend the instance until ``signal`` is delivered (its payload, validated as
        ``payload_type``, goes into the state field ``into``), or until ``timeout`` passes.

        On a timeout the ``on_timeout`` branch runs and the flow goes on after it; with no
        branch, the timeout fails the step (``signal.timed_out``) and the flow compensates.
        """
        return self._add(
            AwaitSignalDraft(
                name=name or signal,
                signal=signal,
                payload_type=payload_type,
                timeout=timeout,
                into=into,
                on_timeout=None if on_timeout is None else _recorded(on_timeout),
            )
        )

    def sleep(self: B, duration: DurationLike, *, name: str | None = None) -> B:
        """Park the instance durably for ``duration``; it holds no worker meanwhile."""
        return self._add(SleepDraft(name=name, duration=duration))

    def sub_flow(
        self: B,
        plan: Plan,
        input: Selector,
        *,
        name: str | None = None,
        into: str | None = None,
    ) -> B:
        """Start ``plan`` as a child instance with ``input(input, state)`` and wait for it."""
        return self._add(SubFlowDraft(name=name, plan=plan, input=input, into=into))

    def fork(self: B, name: str, *branches: Callable[[Body], Body]) -> B:
        """Run the branches concurrently and continue when all have finished."""
        return self._add(
            ForkDraft(name=name, branches=tuple(_recorded(branch) for branch in branches))
        )


class FlowBuilder(Body, Generic[InputT, StateT]):
    """A flow being defined; start one with ``flowx.flow(...)``. ``build()`` validates it and
    returns the ``Plan``, typed with the flow's input and state models."""

    def __init__(self, header: FlowHeader[InputT]) -> None:
        super().__init__()
        self._header = header

    def build(self) -> Plan[InputT, StateT]:
        """Check the whole flow and number its nodes: a ``PlanError`` with a ``FLOWX`` code
        and the fix at the first mistake, else the immutable ``Plan`` a host registers."""
        plan = compile_plan(self._header, tuple(self._drafts))
        # compile_plan builds the plan from the header's `input=` and `state=` (or NoState),
        # the very models flow()'s overloads bound InputT and StateT to.
        return cast("Plan[InputT, StateT]", plan)


@overload
def flow(
    flow_id: str,
    *,
    version: str,
    input: type[InputT],
    state: None = None,
    profile: Profile = ...,
    deadline: DurationLike | None = ...,
    partition_key: Callable[[InputT], str | None] | None = ...,
    registry: CapabilityRegistry | None = ...,
    step_timeout: DurationLike | None = ...,
) -> FlowBuilder[InputT, NoState]: ...


@overload
def flow(
    flow_id: str,
    *,
    version: str,
    input: type[InputT],
    state: type[StateT],
    profile: Profile = ...,
    deadline: DurationLike | None = ...,
    partition_key: Callable[[InputT], str | None] | None = ...,
    registry: CapabilityRegistry | None = ...,
    step_timeout: DurationLike | None = ...,
) -> FlowBuilder[InputT, StateT]: ...


def flow(
    flow_id: str,
    *,
    version: str,
    input: type[InputT],
    state: type[BaseModel] | None = None,
    profile: Profile = Profile.DURABLE,
    deadline: DurationLike | None = None,
    partition_key: Callable[[InputT], str | None] | None = None,
    registry: CapabilityRegistry | None = None,
    step_timeout: DurationLike | None = None,
) -> FlowBuilder[InputT, Any]:
    """Start defining a flow. ``partition_key(input)`` becomes the instance's ``tenant_id``
    (R2.7) and the default partition key of the events it emits. ``step_timeout`` bounds
    every attempt of a step that names no ``timeout=`` of its own; ``deadline`` bounds the
    whole instance, running steps included."""
    header = FlowHeader(
        flow_id=flow_id,
        version=version,
        input=input,
        state=state,
        profile=profile,
        deadline=deadline,
        partition_key=partition_key,
        registry=registry,
        step_timeout=step_timeout,
    )
    return FlowBuilder(header)
