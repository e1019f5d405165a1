"""Plan nodes: what a built flow is made of. Static, immutable, numbered.

Every node has a ``step_id`` — its position in a depth-first walk of the whole plan, starting
at 1 — and a unique ``name``. Repetition (``for_each``) does not need new ids: a repeated body
runs in a child *scope* (``'7'`` for the eighth element, ``'7/2'`` nested), and the journal key
``(instance, scope, step_id, attempt)`` tells every execution apart. A fork's branches have
distinct ids; each still runs in a scope of its own (``'4.0'``, ``'4.1'`` for the branches
of fork 4, ``'4.1/2'`` inside a loop in a branch), so its steps' idempotency keys say which
branch they belong to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any, Generic, Literal

from pydantic import BaseModel
from typing_extensions import TypeVar

from flowx.capability import Capability
from flowx.durations import DurationLike, parse_duration
from flowx.plan.checks import capped_delay, check_retry


class Profile(StrEnum):
    """How much a flow keeps. Durable journals every step boundary; Ephemeral nothing."""

    DURABLE = "Durable"
    EPHEMERAL = "Ephemeral"


Durable = Profile.DURABLE
Ephemeral = Profile.EPHEMERAL


@dataclass(frozen=True, kw_only=True, slots=True)
class Retry:
    """How often a failed step is tried again, and how long to wait between tries.

    ``attempts`` counts every try, the first included: ``Retry(attempts=1)`` never retries.
    A capability declared ``idempotent=False`` is never retried whatever this says (R4.2).
    """

    attempts: int = 3
    backoff: Literal["exponential", "fixed", "none"] = "exponential"
    initial: DurationLike = "1s"
    maximum: DurationLike = "5m"
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        # FLOWX1027 (also a ValueError): out-of-range arguments are refused here, not met as
        # an OverflowError when a failed step computes its next delay.
        check_retry(
            attempts=self.attempts,
            backoff=self.backoff,
            initial=self.initial,
            maximum=self.maximum,
            multiplier=self.multiplier,
        )

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failure before the next try."""
        if self.backoff == "none":
            return 0.0
        initial = parse_duration(self.initial)
        cap = parse_duration(self.maximum)
        if self.backoff == "fixed":
            return min(initial, cap).total_seconds()
        return capped_delay(initial, cap, self.multiplier, failures)


NO_RETRY = Retry(attempts=1, backoff="none")
DEFAULT_STEP_RETRY = Retry(attempts=3)
DEFAULT_COMPENSATION_RETRY = Retry(attempts=5)

#: ``(flow_input, state) -> value``: how plan nodes compute what they need from a flow.
Selector = Callable[[Any, Any], Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class Node:
    step_id: int
    name: str

    @property
    def kind(self) -> str:
        raise NotImplementedError

    def children(self) -> tuple[tuple[Node, ...], ...]:
        return ()


@dataclass(frozen=True, kw_only=True, slots=True)
class StepNode(Node):
    """Call a capability; put its result in the state field ``into``."""

    capability: Capability
    into: str | None = None
    retry: Retry = DEFAULT_STEP_RETRY
    compensate: Capability | None = None
    compensate_retry: Retry = DEFAULT_COMPENSATION_RETRY
    argument: Selector | None = field(default=None, compare=False)
    #: How long one attempt of the capability may run (the flow's ``step_timeout`` when the
    #: step names none); past it the attempt fails ``step.timed_out``. ``None``: unbounded.
    timeout: timedelta | None = None

    @property
    def kind(self) -> str:
        return "step"


@dataclass(frozen=True, kw_only=True, slots=True)
class EmitNode(Node):
    """Stage an event in the outbox, in this node's own commit (R5.1)."""

    event_type: type[BaseModel]
    build: Selector = field(compare=False)
    partition_key: Selector | None = field(default=None, compare=False)

    @property
    def kind(self) -> str:
        return "emit"


@dataclass(frozen=True, kw_only=True, slots=True)
class ForEachNode(Node):
    """Run ``body`` once per item, element ``i`` in child scope ``i``."""

    items: Selector = field(compare=False)
    body: tuple[Node, ...]
    into: str | None = None

    @property
    def kind(self) -> str:
        return "for_each"

    def children(self) -> tuple[tuple[Node, ...], ...]:
        return (self.body,)


@dataclass(frozen=True, kw_only=True, slots=True)
class AwaitSignalNode(Node):
    """Suspend until a named signal arrives (or ``timeout`` passes) (R2.10)."""

    signal: str
    payload_type: Any
    timeout: timedelta | None = None
    into: str | None = None
    #: Run when ``timeout`` passes with no signal; with none, the timeout fails the step.
    on_timeout: tuple[Node, ...] = ()

    @property
    def kind(self) -> str:
        return "await_signal"

    def children(self) -> tuple[tuple[Node, ...], ...]:
        return (self.on_timeout,) if self.on_timeout else ()


@dataclass(frozen=True, kw_only=True, slots=True)
class SleepNode(Node):
    """Park the instance durably for ``duration`` (R2.11)."""

    duration: timedelta

    @property
    def kind(self) -> str:
        return "sleep"


@dataclass(frozen=True, kw_only=True, slots=True)
class SubFlowNode(Node):
    """Start a child flow as its own instance and wait for it."""

    flow_id: str
    flow_version: str
    input: Selector = field(compare=False)
    into: str | None = None
    #: The child's plan, so a host that registers the parent carries the child too.
    plan: Plan | None = field(default=None, compare=False, repr=False)

    @property
    def kind(self) -> str:
        return "sub_flow"


@dataclass(frozen=True, kw_only=True, slots=True)
class ForkNode(Node):
    """Run branches concurrently and join them."""

    branches: tuple[tuple[Node, ...], ...]

    @property
    def kind(self) -> str:
        return "fork"

    def children(self) -> tuple[tuple[Node, ...], ...]:
        return self.branches


def walk(nodes: tuple[Node, ...]) -> Iterator[Node]:
    """Every node, depth first, in ``step_id`` order."""
    for node in nodes:
        yield node
        for child in node.children():
            yield from walk(child)


def bound_for(nodes: tuple[Node, ...], fields: frozenset[str]) -> frozenset[int]:
    """The step ids of the nodes whose value ends up in one of the state ``fields``: each
    node whose own ``into`` names one, and, in a for_each whose collected list goes into one,
    each node whose value its body gives back for an element (``_given_back``). A value bound
    for a sealed field is sealed in every row that journals it (R9.8): the engine asks this
    of a plan's sealed fields."""
    if not fields:
        return frozenset()
    found: set[int] = set()
    for node in walk(nodes):
        if getattr(node, "into", None) in fields:
            found.add(node.step_id)
            if isinstance(node, ForEachNode):
                found.update(n.step_id for n in _given_back(node.body))
    return frozenset(found)


def _given_back(nodes: tuple[Node, ...]) -> Iterator[Node]:
    """The nodes whose value a walk of ``nodes`` gives back: the last node's, and what makes
    it up — a fork's value is the list of its branches' last values, a for_each's the list of
    its body's, and an await_signal that timed out gives back its timeout path's. Not an
    emit: its value is its event, which leaves for brokers as its type declares it (its
    sensitive members redacted), and its row is that event."""
    if not nodes:
        return
    last = nodes[-1]
    if not isinstance(last, EmitNode):
        yield last
    if isinstance(last, ForkNode):
        for branch in last.branches:
            yield from _given_back(branch)
    elif isinstance(last, ForEachNode):
        yield from _given_back(last.body)
    elif isinstance(last, AwaitSignalNode):
        yield from _given_back(last.on_timeout)


class NoState(BaseModel):
    """The state model of a flow that declares none."""


#: A plan's input model. Invariant, so a type checker refuses ``host.start(plan, x)`` when
#: ``x`` is another model; a bare ``Plan`` (any input) is ``Plan[Any, BaseModel]``.
PlanInput = TypeVar("PlanInput", bound=BaseModel, default=Any)
#: A plan's state model: what ``await handle.result()`` gives. Covariant: a
#: ``Plan[Order, OrderState]`` is a ``Plan`` wherever any plan is accepted.
PlanState = TypeVar("PlanState", bound=BaseModel, covariant=True, default=BaseModel)


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan(Generic[PlanInput, PlanState]):
    """A built, validated flow. Create one with ``flowx.flow(...)...build()``.

    ``Plan[Order, OrderState]``: its input is an ``Order``, its final state an
    ``OrderState``, as ``flowx.flow(..., input=Order, state=OrderState)`` declared them, so a
    user's type checker sees both through ``FlowHost.start`` and ``FlowHandle.result``.
    """

    flow_id: str
    version: str
    input_model: type[PlanInput]
    state_model: type[PlanState]
    profile: Profile
    body: tuple[Node, ...]
    deadline: timedelta | None = None
    partition_key: Callable[[Any], str | None] | None = field(default=None, compare=False)
    #: The default ``timeout`` of the plan's steps (already applied to each ``StepNode``).
    step_timeout: timedelta | None = None

    @property
    def ref(self) -> str:
        """``flow_id@version``: how the journal, the CLI and logs name this plan."""
        return f"{self.flow_id}@{self.version}"

    @property
    def durable(self) -> bool:
        """Whether instances of this plan are journaled and recovered (the Durable profile)."""
        return self.profile is Profile.DURABLE

    def nodes(self) -> list[Node]:
        """Every node of the plan, nested ones included, in step-id order: for tools
        that list or check a plan's steps."""
        return list(walk(self.body))

    def node(self, step_id: int) -> Node:
        """The node with ``step_id`` (``KeyError`` if none): how a journal row maps back to
        the plan."""
        for n in walk(self.body):
            if n.step_id == step_id:
                return n
        raise KeyError(step_id)

    def node_named(self, name: str) -> Node | None:
        """The node called ``name``, or ``None``: how ``flowx replay --from`` finds a step."""
        return next((n for n in walk(self.body) if n.name == name), None)
