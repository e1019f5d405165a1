"""What one ``build()`` carries from node to node, and the checks every node kind shares.

Each node kind has its own compile function (``compile_steps``, ``compile_waits``); what they
have in common lives here: the flow being built, the step-id counter and the names taken so
far (step ids are depth-first positions, so nodes must be compiled in order), the fork branch
being compiled (waits are refused inside one), the payload type of each signal, and the
checks of ``into=``, selectors and capabilities, so every kind words the same mistake the
same way (R2.12). The kinds are looked up in a table handed in by ``flowx.plan.compile``, so
this module knows no kind and no kind module knows another.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from flowx.capability import Capability, capability_of, default_registry
from flowx.errors import CapabilityNotFound, PlanError
from flowx.plan.drafts import Drafts, FlowHeader, NodeDraft
from flowx.plan.model import Node, NoState, Profile

#: One node kind's compile function: its draft, checked, as a plan node.
NodeCompiler = Callable[["Compiler", Any], Node]


def plan_error(flow_id: str, code: str, message: str) -> PlanError:
    """A diagnostic of flow ``flow_id``: every message starts by naming the flow."""
    return PlanError(code, f"flow {flow_id!r}: {message}", flow_id=flow_id)


class Compiler:
    """The state of one ``build()``; a fresh one per build, so a builder may build twice."""

    def __init__(
        self,
        header: FlowHeader[Any],
        state_model: type[BaseModel],
        step_timeout: timedelta | None,
        compilers: Mapping[type[NodeDraft], NodeCompiler],
    ) -> None:
        self.flow_id = header.flow_id
        self.profile: Profile = header.profile
        self.state_model = state_model
        #: The flow's default step timeout, already checked.
        self.step_timeout = step_timeout
        self._compilers = compilers
        self._registry = header.registry or default_registry
        self._next_id = 1
        self._names: dict[str, int] = {}
        #: The fork branch being compiled, if any: waits are refused inside one (FLOWX1019).
        self.in_fork: str | None = None
        #: Signal name -> payload type: a signal is checked against one type when it is sent.
        self.signal_types: dict[str, Any] = {}

    def error(self, code: str, message: str) -> PlanError:
        """The diagnostic to raise; a kind's compile function words ``message``."""
        return plan_error(self.flow_id, code, message)

    def nodes(self, drafts: Drafts) -> tuple[Node, ...]:
        """Compile a body in order, each draft by its kind's function."""
        return tuple(self._compilers[type(d)](self, d) for d in drafts)

    def claim(self, name: str) -> int:
        """Take ``name`` and the next step id (FLOWX1003 if the name is taken)."""
        if name in self._names:
            raise self.error(
                "FLOWX1003",
                f"the name {name!r} is used by step {self._names[name]} and again by step "
                f"{self._next_id}; pass name='...' to tell them apart",
            )
        step_id = self._next_id
        self._names[name] = step_id
        self._next_id += 1
        return step_id

    def check_into(self, into: str | None, where: str) -> None:
        """``into=`` must name a field of the flow's state model (FLOWX1015, FLOWX1004)."""
        if into is None:
            return
        state_model = self.state_model
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
        """A selector must be callable (FLOWX1016); ``None`` means "not given"."""
        if value is not None and not callable(value):
            raise self.error(
                "FLOWX1016", f"{where}: {what} must be a function (input, state) -> value"
            )

    def capability(self, target: object, version: str | None, where: str, code: str) -> Capability:
        """The capability ``target`` names: decorated, a ``Capability``, or a registered id."""
        cap = capability_of(target)
        if cap is None and isinstance(target, str):
            try:
                cap = self._registry.resolve(target, version)
            except CapabilityNotFound as exc:
                raise self.error("FLOWX1018", f"{where}: {exc}") from exc
        if cap is None:
            raise self.error(
                code,
                f"{where}: {target!r} is not a capability; decorate it with "
                "@flowx.capability('id', version='1.0.0') or pass a registered id",
            )
        return cap


def is_model_class(cls: object) -> bool:
    """Whether ``cls`` is a pydantic model class (input=, state=, an event type)."""
    return isinstance(cls, type) and issubclass(cls, BaseModel)
