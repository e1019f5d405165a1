"""Flow definitions: the builder, the plan nodes, and build-time diagnostics (pure)."""

from flowx.plan.builder import Body, FlowBuilder, flow
from flowx.plan.diagnostics import CODES
from flowx.plan.events import EventContract, contract_of, event
from flowx.plan.model import (
    AwaitSignalNode,
    Durable,
    EmitNode,
    Ephemeral,
    ForEachNode,
    ForkNode,
    Node,
    NoState,
    Plan,
    Profile,
    Retry,
    SleepNode,
    StepNode,
    SubFlowNode,
    walk,
)

__all__ = [
    "CODES",
    "AwaitSignalNode",
    "Body",
    "Durable",
    "EmitNode",
    "Ephemeral",
    "EventContract",
    "FlowBuilder",
    "ForEachNode",
    "ForkNode",
    "NoState",
    "Node",
    "Plan",
    "Profile",
    "Retry",
    "SleepNode",
    "StepNode",
    "SubFlowNode",
    "contract_of",
    "event",
    "flow",
    "walk",
]
