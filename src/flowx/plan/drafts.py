"""What the author wrote, as the builder records it: one frozen draft per node kind.

The builder checks nothing while it records (a flow reads top to bottom, and a mistake is best
reported with the whole plan in view), so a draft holds the arguments exactly as given, junk
included; ``build()`` checks them all and turns each draft into its plan node (R2.12). A typed
draft per kind, rather than a dict of arguments, lets each kind's compile function name the
fields it reads, and mypy check that it reads only fields the kind has. Not slotted: the
compile table's test lists ``NodeDraft.__subclasses__()``, which a slotted dataclass (a copy
of the class) would list twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeAlias, TypeVar

from pydantic import BaseModel

from flowx.capability import Capability, CapabilityRegistry
from flowx.durations import DurationLike
from flowx.plan.model import Plan, Profile, Retry, Selector

InputT = TypeVar("InputT", bound=BaseModel)
#: The ``state=`` model a flow declares (``NoState`` when it declares none).
StateT = TypeVar("StateT", bound=BaseModel)

#: What a step or a compensation names: a decorated function, a ``Capability`` or its id.
Target: TypeAlias = Callable[..., Any] | Capability | str


@dataclass(frozen=True, kw_only=True)
class FlowHeader(Generic[InputT]):
    """What ``flowx.flow(...)`` was given: the options of the flow as a whole."""

    flow_id: str
    version: str
    input: type[InputT]
    state: type[BaseModel] | None = None
    profile: Profile = Profile.DURABLE
    deadline: DurationLike | None = None
    partition_key: Callable[[InputT], str | None] | None = None
    #: ``None``: the process-wide default registry, looked up when the plan is built.
    registry: CapabilityRegistry | None = None
    #: The bound of every step attempt that names no ``timeout=`` of its own.
    step_timeout: DurationLike | None = None


@dataclass(frozen=True, kw_only=True)
class NodeDraft:
    """What every draft has: the kind it compiles to and the name the author gave, if any."""

    kind: ClassVar[str]
    #: ``None``: the compiled node derives its name (the capability id, the signal, …).
    name: str | None = None

    def bodies(self) -> tuple[Drafts, ...]:
        """The nested bodies (loop body, branches, timeout branch) in step-id order."""
        return ()


#: A recorded body: the drafts of a flow, a ``for_each`` body or a branch, in order.
Drafts: TypeAlias = tuple[NodeDraft, ...]


@dataclass(frozen=True, kw_only=True)
class StepDraft(NodeDraft):
    """``.step(target, ...)``: call a capability."""

    kind: ClassVar[str] = "step"
    target: Target
    version: str | None = None
    into: str | None = None
    retry: Retry | None = None
    compensate: Target | None = None
    compensate_retry: Retry | None = None
    argument: Selector | None = None
    timeout: DurationLike | None = None


@dataclass(frozen=True, kw_only=True)
class EmitDraft(NodeDraft):
    """``.emit(event_type, build, ...)``: stage an event in the outbox."""

    kind: ClassVar[str] = "emit"
    event_type: type[BaseModel]
    build: Selector
    partition_key: Selector | None = None


@dataclass(frozen=True, kw_only=True)
class ForEachDraft(NodeDraft):
    """``.for_each(name, items, body, ...)``: run ``body`` once per item."""

    kind: ClassVar[str] = "for_each"
    items: Selector
    body: Drafts
    into: str | None = None

    def bodies(self) -> tuple[Drafts, ...]:
        return (self.body,)


@dataclass(frozen=True, kw_only=True)
class ForkDraft(NodeDraft):
    """``.fork(name, *branches)``: run branches concurrently and join them."""

    kind: ClassVar[str] = "fork"
    branches: tuple[Drafts, ...]

    def bodies(self) -> tuple[Drafts, ...]:
        return self.branches


@dataclass(frozen=True, kw_only=True)
class AwaitSignalDraft(NodeDraft):
    """``.await_signal(signal, payload_type, ...)``: suspend until a signal or a timeout.

    ``name`` is recorded as ``name or signal``, so a wait named after its signal is told
    apart (by identity) from one the author named.
    """

    kind: ClassVar[str] = "await_signal"
    signal: str
    payload_type: Any
    timeout: DurationLike | None = None
    into: str | None = None
    #: The ``on_timeout=`` branch; ``None`` when the author gave none.
    on_timeout: Drafts | None = None

    def bodies(self) -> tuple[Drafts, ...]:
        return () if self.on_timeout is None else (self.on_timeout,)


@dataclass(frozen=True, kw_only=True)
class SleepDraft(NodeDraft):
    """``.sleep(duration)``: park the instance durably."""

    kind: ClassVar[str] = "sleep"
    duration: DurationLike


@dataclass(frozen=True, kw_only=True)
class SubFlowDraft(NodeDraft):
    """``.sub_flow(plan, input, ...)``: run a child instance and wait for it."""

    kind: ClassVar[str] = "sub_flow"
    plan: Plan
    input: Selector
    into: str | None = None
