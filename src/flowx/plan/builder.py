"""The plan builder: ``flowx.flow(...).step(...).emit(...).build()``.

The builder only records what the author wrote; ``build()`` numbers the nodes and checks the
whole plan, so every mistake surfaces at registration time with a ``FLOWX`` code and the fix
(R2.12), not halfway through a production instance.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from flowx.capability import Capability, CapabilityRegistry, capability_of, default_registry
from flowx.durations import DurationLike, parse_duration
from flowx.errors import CapabilityNotFound, PlanError
from flowx.plan.annotations import STEP_OPTIONS, compile_step
from flowx.plan.checks import check_drafts
from flowx.plan.events import contract_of
from flowx.plan.model import (
    AwaitSignalNode,
    EmitNode,
    ForEachNode,
    ForkNode,
    Node,
    NoState,
    Plan,
    Profile,
    Retry,
    Selector,
    SleepNode,
    SubFlowNode,
    walk,
)
from flowx.plan.timeouts import STEP_TIMEOUT_INVALID, step_timeout

_FLOW_ID = re.compile(r"^[a-z0-9][a-z0-9_.\-]*$")
_FLOW_VERSION = re.compile(r"^\d+(\.\d+){0,2}([-+][0-9A-Za-z.\-]+)?$")

B = TypeVar("B", bound="Body")


@dataclass(kw_only=True)
class _Draft:
    kind: str
    name: str | None
    args: dict[str, Any] = field(default_factory=dict)
    bodies: list[list[_Draft]] = field(default_factory=list)


class Body:
    """The nodes of a flow body, or of a ``for_each`` / ``fork`` branch body."""

    def __init__(self) -> None:
        self._drafts: list[_Draft] = []

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
        values = (target, version, into, retry, compensate, compensate_retry, argument, timeout)
        self._drafts.append(
            _Draft(kind="step", name=name, args=dict(zip(STEP_OPTIONS, values, strict=True)))
        )
        return self

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
        self._drafts.append(
            _Draft(
                kind="emit",
                name=name,
                args={"event_type": event_type, "build": build, "partition_key": partition_key},
            )
        )
        return self

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
        inner = Body()
        body(inner)
        self._drafts.append(
            _Draft(
                kind="for_each",
                name=name,
                args={"items": items, "into": into},
                bodies=[inner._drafts],
            )
        )
        return self

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
        bodies = []
        if on_timeout is not None:
            inner = Body()
            on_timeout(inner)
            bodies.append(inner._drafts)
        self._drafts.append(
            _Draft(
                kind="await_signal",
                name=name or signal,
                args={
                    "signal": signal,
                    "payload_type": payload_type,
                    "timeout": timeout,
                    "into": into,
                    "on_timeout": on_timeout is not None,
                },
                bodies=bodies,
            )
        )
        return self

    def sleep(self: B, duration: DurationLike, *, name: str | None = None) -> B:
        """Park the instance durably for ``duration``; it holds no worker meanwhile."""
        self._drafts.append(_Draft(kind="sleep", name=name, args={"duration": duration}))
        return self

    def sub_flow(
        self: B,
        plan: Plan,
        input: Selector,
        *,
        name: str | None = None,
        into: str | None = None,
    ) -> B:
        """Start ``plan`` as a child instance with ``input(input, state)`` and wait for it."""
        self._drafts.append(
            _Draft(kind="sub_flow", name=name, args={"plan": plan, "input": input, "into": into})
        )
        return self

    def fork(self: B, name: str, *branches: Callable[[Body], Body]) -> B:
        """Run the branches concurrently and continue when all have finished."""
        bodies = []
        for branch in branches:
            inner = Body()
            branch(inner)
            bodies.append(inner._drafts)
        self._drafts.append(_Draft(kind="fork", name=name, bodies=bodies))
        return self


InputT = TypeVar("InputT", bound=BaseModel)


class FlowBuilder(Body, Generic[InputT]):
    """A flow being defined. ``build()`` validates it and returns the ``Plan``."""

    def __init__(
        self,
        flow_id: str,
        *,
        version: str,
        input: type[InputT],
        state: type[BaseModel] | None = None,
        profile: Profile = Profile.DURABLE,
        deadline: DurationLike | None = None,
        partition_key: Callable[[InputT], str | None] | None = None,
        registry: CapabilityRegistry | None = None,
    ) -> None:
        super().__init__()
        self._flow_id = flow_id
        self._version = version
        self._input = input
        self._state = state
        self._profile = profile
        self._deadline = deadline
        self._partition_key = partition_key
        self._registry = registry or default_registry
        # Set by ``flow(step_timeout=...)``: a constructor of eight options is enough.
        self._step_timeout: DurationLike | None = None

    def build(self) -> Plan:
        return _Compiler(self).compile()


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
) -> FlowBuilder[InputT]:
    """Start defining a flow. ``partition_key(input)`` becomes the instance's ``tenant_id``
    (R2.7) and the default partition key of the events it emits. ``step_timeout`` bounds
    every attempt of a step that names no ``timeout=`` of its own; ``deadline`` bounds the
    whole instance, running steps included."""
    builder = FlowBuilder(
        flow_id,
        version=version,
        input=input,
        state=state,
        profile=profile,
        deadline=deadline,
        partition_key=partition_key,
        registry=registry,
    )
    builder._step_timeout = step_timeout
    return builder


def _is_model(cls: object) -> bool:
    return isinstance(cls, type) and issubclass(cls, BaseModel)


def _is_list_annotation(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin is list or annotation is list:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_is_list_annotation(a) for a in typing.get_args(annotation))
    return False


class _Compiler:
    def __init__(self, builder: FlowBuilder[Any]) -> None:
        self.b = builder
        self.next_id = 1
        self.names: dict[str, int] = {}
        # The fork branch being compiled, if any: waits are refused inside one (FLOWX1019).
        self.in_fork: str | None = None
        # Signal name -> payload type: a signal is checked against one type when it is sent.
        self.signal_types: dict[str, Any] = {}
        # The flow's default step timeout, checked once in ``compile``.
        self.step_timeout: timedelta | None = None

    def error(self, code: str, message: str) -> PlanError:
        return PlanError(code, f"flow {self.b._flow_id!r}: {message}", flow_id=self.b._flow_id)

    def compile(self) -> Plan:
        b = self.b
        check_drafts(b._flow_id, b._version, b._drafts)  # FLOWX1026/1027: names, retries
        if not _FLOW_ID.match(b._flow_id):
            raise self.error(
                "FLOWX1014",
                "the flow id must be lower-case letters, digits, '.', '_' or '-' "
                "(e.g. 'order.place')",
            )
        if not _FLOW_VERSION.match(b._version):
            raise self.error(
                "FLOWX1014", f"version {b._version!r} must look like '1', '1.2' or '1.2.3'"
            )
        if not _is_model(b._input):
            raise self.error(
                "FLOWX1007", "input= must be a pydantic BaseModel subclass describing the input"
            )
        if b._state is not None and not _is_model(b._state):
            raise self.error("FLOWX1007", "state= must be a pydantic BaseModel subclass")
        state_model = b._state or NoState
        try:
            state_model()
        except ValidationError as exc:
            raise self.error(
                "FLOWX1006",
                f"state model {state_model.__name__} must be constructible with no arguments "
                f"(give every field a default): {exc.errors()[0]['loc']}",
            ) from exc
        deadline = None
        if b._deadline is not None:
            try:
                deadline = parse_duration(b._deadline, what="deadline")
            except ValueError as exc:
                raise self.error("FLOWX1009", str(exc)) from exc
        try:
            self.step_timeout = step_timeout(b._step_timeout, where="step_timeout=")
        except ValueError as exc:
            raise self.error(STEP_TIMEOUT_INVALID, str(exc)) from exc
        if not b._drafts:
            raise self.error("FLOWX1001", "add at least one .step(...) before .build()")
        body = self.nodes(b._drafts, state_model)
        return Plan(
            flow_id=b._flow_id,
            version=b._version,
            input_model=b._input,
            state_model=state_model,
            profile=b._profile,
            body=body,
            deadline=deadline,
            partition_key=b._partition_key,
            step_timeout=self.step_timeout,
        )

    def nodes(self, drafts: list[_Draft], state_model: type[BaseModel]) -> tuple[Node, ...]:
        return tuple(self.node(d, state_model) for d in drafts)

    def claim(self, name: str) -> int:
        if name in self.names:
            raise self.error(
                "FLOWX1003",
                f"the name {name!r} is used by step {self.names[name]} and again by step "
                f"{self.next_id}; pass name='...' to tell them apart",
            )
        step_id = self.next_id
        self.names[name] = step_id
        self.next_id += 1
        return step_id

    def check_into(self, into: str | None, state_model: type[BaseModel], where: str) -> None:
        if into is None:
            return
        if state_model is NoState:
            raise self.error(
                "FLOWX1015",
                f"{where} has into={into!r} but the flow declares no state=; "
                "add state=YourStateModel to flowx.flow(...)",
            )
        if into not in state_model.model_fields:
            fields = ", ".join(state_model.model_fields) or "none"
            raise self.error(
                "FLOWX1004",
                f"{where} has into={into!r}, which is not a field of {state_model.__name__} "
                f"(fields: {fields}); add the field or fix the name",
            )

    def check_callable(self, value: object, what: str, where: str) -> None:
        if value is not None and not callable(value):
            raise self.error(
                "FLOWX1016", f"{where}: {what} must be a function (input, state) -> value"
            )

    def capability(self, target: object, version: str | None, where: str, code: str) -> Capability:
        cap = capability_of(target)
        if cap is None and isinstance(target, str):
            try:
                cap = self.b._registry.resolve(target, version)
            except CapabilityNotFound as exc:
                raise self.error("FLOWX1018", f"{where}: {exc}") from exc
        if cap is None:
            raise self.error(
                code,
                f"{where}: {target!r} is not a capability; decorate it with "
                "@flowx.capability('id', version='1.0.0') or pass a registered id",
            )
        return cap

    def node(self, d: _Draft, state_model: type[BaseModel]) -> Node:
        a = d.args
        if d.kind == "step":
            return compile_step(self, d, state_model, self.step_timeout)
        if d.kind == "emit":
            event_type = a["event_type"]
            name = d.name or f"emit:{getattr(event_type, '__name__', event_type)}"
            where = f"emit {name!r}"
            if self.b._profile is Profile.EPHEMERAL:
                raise self.error(
                    "FLOWX1024",
                    f"{where} is in an Ephemeral flow, which keeps no journal, so there is no "
                    "transaction to stage the event in; make the flow Durable or publish from "
                    "a capability",
                )
            if not _is_model(event_type) or contract_of(event_type) is None:
                raise self.error(
                    "FLOWX1024",
                    f"{where}: {event_type!r} has no declared event contract; decorate a "
                    "pydantic model with @flowx.event('type.name', version='1')",
                )
            self.check_callable(a["build"], "build", where)
            self.check_callable(a["partition_key"], "partition_key=", where)
            return EmitNode(
                step_id=self.claim(name),
                name=name,
                event_type=event_type,
                build=a["build"],
                partition_key=a["partition_key"],
            )
        if d.kind == "for_each":
            name = d.name or "for_each"
            where = f"for_each {name!r}"
            step_id = self.claim(name)
            self.check_callable(a["items"], "items", where)
            self.check_into(a["into"], state_model, where)
            if a["into"] is not None and not _is_list_annotation(
                state_model.model_fields[a["into"]].annotation
            ):
                raise self.error("FLOWX1011", f"{where}: into={a['into']!r} must be a list field")
            if not d.bodies[0]:
                raise self.error("FLOWX1010", f"{where} has an empty body; add a step to it")
            return ForEachNode(
                step_id=step_id,
                name=name,
                items=a["items"],
                body=self.nodes(d.bodies[0], state_model),
                into=a["into"],
            )
        if d.kind in ("await_signal", "sleep", "sub_flow") and self.in_fork is not None:
            raise self.error(
                "FLOWX1019",
                f"{d.kind} {d.name or ''!s} is inside a branch of fork {self.in_fork!r}; an "
                "instance waits at one place at a time, so a branch cannot suspend it while "
                "its siblings run. Put the wait before or after the fork",
            )
        if d.kind in ("await_signal", "sleep"):
            if self.b._profile is Profile.EPHEMERAL:
                raise self.error(
                    "FLOWX1017",
                    f"{d.kind} {d.name or ''!s} is in an Ephemeral flow, which journals "
                    "nothing, so nothing could wake it after a restart; make the flow Durable",
                )
            if d.kind == "sleep":
                try:
                    duration = parse_duration(a["duration"], what="sleep duration")
                except ValueError as exc:
                    raise self.error("FLOWX1009", str(exc)) from exc
                name = d.name or f"sleep:{a['duration']}"
                return SleepNode(step_id=self.claim(name), name=name, duration=duration)
            name = d.name or a["signal"]
            self.check_into(a["into"], state_model, f"await_signal {name!r}")
            timeout = None
            if a["timeout"] is not None:
                try:
                    timeout = parse_duration(a["timeout"], what="signal timeout")
                except ValueError as exc:
                    raise self.error("FLOWX1009", str(exc)) from exc
            where = f"await_signal {name!r}"
            if (
                not isinstance(a["signal"], str)
                or not a["signal"]
                or a["signal"].startswith("flowx.")
            ):
                raise self.error(
                    "FLOWX1023",
                    f"{where}: signal name {a['signal']!r} must be a non-empty string not "
                    "starting with 'flowx.' (FlowX's own waits use that prefix)",
                )
            known = self.signal_types.setdefault(a["signal"], a["payload_type"])
            if known != a["payload_type"]:
                raise self.error(
                    "FLOWX1021",
                    f"{where}: signal {a['signal']!r} is awaited elsewhere in this flow as "
                    f"{known!r}; one signal name has one payload type, so use another name",
                )
            try:
                TypeAdapter(a["payload_type"])
            except Exception as exc:
                raise self.error(
                    "FLOWX1021",
                    f"{where}: payload type {a['payload_type']!r} cannot be validated "
                    f"({exc}); use a pydantic model or a plain type such as dict or str",
                ) from exc
            if a["on_timeout"]:
                if timeout is None:
                    raise self.error(
                        "FLOWX1009", f"{where} has on_timeout= but no timeout=; give it one"
                    )
                if not d.bodies[0]:
                    raise self.error("FLOWX1010", f"{where} has an empty on_timeout branch")
            step_id = self.claim(name)
            return AwaitSignalNode(
                step_id=step_id,
                name=name,
                signal=a["signal"],
                payload_type=a["payload_type"],
                timeout=timeout,
                into=a["into"],
                on_timeout=self.nodes(d.bodies[0], state_model) if d.bodies else (),
            )
        if d.kind == "sub_flow":
            child = a["plan"]
            if not isinstance(child, Plan):
                raise self.error(
                    "FLOWX1012", "sub_flow(plan=...) must be a built plan (call .build())"
                )
            name = d.name or f"sub_flow:{child.flow_id}"
            where = f"sub_flow {name!r}"
            if self.b._profile is Profile.EPHEMERAL or not child.durable:
                raise self.error(
                    "FLOWX1022",
                    f"{where}: a parent waits for its child durably, so both must be Durable "
                    f"({self.b._flow_id} is {self.b._profile.value}, {child.ref} is "
                    f"{child.profile.value})",
                )
            self.check_callable(a["input"], "input", where)
            self.check_into(a["into"], state_model, where)
            return SubFlowNode(
                step_id=self.claim(name),
                name=name,
                flow_id=child.flow_id,
                flow_version=child.version,
                input=a["input"],
                into=a["into"],
                plan=child,
            )
        if d.kind == "fork":
            name = d.name or "fork"
            step_id = self.claim(name)
            if len(d.bodies) < 2:
                raise self.error(
                    "FLOWX1013",
                    f"fork {name!r} has {len(d.bodies)} branch(es); give it two or "
                    "more, or write the steps inline",
                )
            for i, branch in enumerate(d.bodies):
                if not branch:
                    raise self.error("FLOWX1010", f"fork {name!r} branch {i} is empty")
            outer, self.in_fork = self.in_fork, name
            try:
                branches = tuple(self.nodes(branch, state_model) for branch in d.bodies)
            finally:
                self.in_fork = outer
            writers: dict[str, int] = {}
            for i, branch_nodes in enumerate(branches):
                written = {getattr(n, "into", None) for n in walk(branch_nodes)} - {None}
                for field_name in sorted(str(f) for f in written):
                    if field_name in writers:
                        raise self.error(
                            "FLOWX1020",
                            f"fork {name!r}: branches {writers[field_name]} and {i} both write "
                            f"state field {field_name!r}; concurrent branches would race for "
                            "it, so give each branch fields of its own",
                        )
                    writers[field_name] = i
            return ForkNode(step_id=step_id, name=name, branches=branches)
        raise AssertionError(d.kind)
