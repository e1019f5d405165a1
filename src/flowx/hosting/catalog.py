"""The plans a node carries, by flow id and version (R7.3).

A node may carry several versions of one flow at once: an instance runs on the version it
started on, and a start without a version takes the highest. Kept apart from the host so the
runner, the signal path and recovery all ask one catalog whether this node can run an instance.
"""

from __future__ import annotations

from flowx.errors import FlowNotFound, FlowXError, PlanError
from flowx.plan.model import AwaitSignalNode, Plan, SubFlowNode, walk
from flowx.sealing import declares_sensitive


class PlanCatalog:
    """Every plan this node carries, and the highest version of each flow."""

    def __init__(self) -> None:
        self._plans: dict[tuple[str, str], Plan] = {}
        self._latest: dict[str, Plan] = {}

    def register(self, plan: Plan) -> None:
        """Carry ``plan``, and every sub-flow it starts (a node that runs the parent must be
        able to run its children)."""
        if not isinstance(plan, Plan):
            raise FlowXError(
                f"{plan!r} is not a built plan; call .build() on the flow definition",
                code="flow.not_a_plan",
            )
        self._plans[(plan.flow_id, plan.version)] = plan
        for node in walk(plan.body):
            if (
                isinstance(node, SubFlowNode)
                and node.plan is not None
                and not self.carries(node.plan.flow_id, node.plan.version)
            ):
                self.register(node.plan)
        latest = self._latest.get(plan.flow_id)
        if latest is None or version_key(plan.version) > version_key(latest.version):
            self._latest[plan.flow_id] = plan

    def plan(self, flow: Plan | str, version: str | None = None) -> Plan:
        """The carried plan for a flow id (and version; the highest one by default)."""
        if isinstance(flow, Plan):
            version, flow = flow.version, flow.flow_id
        found = self._plans.get((flow, version)) if version else self._latest.get(flow)
        if found is None:
            raise FlowNotFound(flow, version, self.refs())
        return found

    def carries(self, flow_id: str, version: str) -> bool:
        return (flow_id, version) in self._plans

    def all(self) -> list[Plan]:
        """Every carried plan, by flow id then version."""
        return sorted(self._plans.values(), key=lambda p: (p.flow_id, version_key(p.version)))

    def refs(self) -> list[str]:
        """Every carried ``flow@version``, for errors and for the timer service's filter."""
        return [p.ref for p in self._plans.values()]


def sensitive_members(plan: Plan) -> list[str]:
    """Where ``plan`` holds sensitive members: its input, its state, a signal's payload."""
    found = [
        f"{what} ({model.__name__})"
        for what, model in (("input", plan.input_model), ("state", plan.state_model))
        if declares_sensitive(model)
    ]
    for node in walk(plan.body):
        if isinstance(node, AwaitSignalNode) and declares_sensitive(node.payload_type):
            found.append(f"the payload of signal {node.signal!r}")
    return found


def refuse_unsealable(plans: list[Plan]) -> None:
    """FLOWX1028: a flow whose members are sensitive is not run where they cannot be sealed
    (R9.8): pydantic would store them masked (lost) and plain text would leak them."""
    for plan in plans:
        where = sensitive_members(plan)
        if where:
            raise PlanError(
                "FLOWX1028",
                f"flow {plan.ref} has sensitive members ({', '.join(where)}) and this host "
                "has no encryption keys to seal them at rest; set encryption_keys "
                "(FLOWX_ENCRYPTION_KEYS; make one with `flowx keys generate`)",
                flow_id=plan.flow_id,
            )


def version_key(version: str) -> tuple[int, ...]:
    """``1.2.3-rc+build`` as ``(1, 2, 3)``: versions compare by their numeric core."""
    core = version.split("-")[0].split("+")[0]
    return tuple(int(p) for p in core.split("."))
